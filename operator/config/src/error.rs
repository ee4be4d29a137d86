//! Configuration errors name the file, the object and the field.

use warren_api::reasons;

/// One problem found while compiling manifests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// File the object came from.
    pub file: String,
    /// `Kind namespace/name`, when known.
    pub object: Option<String>,
    /// Dotted path of the offending field (empty for the whole object).
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// True for YAML syntax errors: the file could not be read at all.
    pub syntax: bool,
    /// The `Ready` condition reason it sets (`warren_api::reasons`).
    pub reason: &'static str,
}

impl ConfigError {
    pub(crate) fn syntax(file: &str, message: String) -> Self {
        ConfigError { file: file.to_string(), object: None, field: String::new(), message, syntax: true, reason: reasons::INVALID_SPEC }
    }

    pub(crate) fn invalid(file: &str, object: Option<String>, field: &str, message: impl Into<String>) -> Self {
        ConfigError { file: file.to_string(), object, field: field.to_string(), message: message.into(), syntax: false, reason: reasons::INVALID_SPEC }
    }

    /// The same error with another condition reason.
    pub fn because(self, reason: &'static str) -> Self {
        ConfigError { reason, ..self }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if !self.file.is_empty() {
            parts.push(self.file.as_str());
        }
        if let Some(o) = &self.object {
            parts.push(o.as_str());
        }
        write!(f, "{}", parts.join(": "))?;
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}
