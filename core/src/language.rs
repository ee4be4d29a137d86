//! The interpreters a sandbox can offer.

use serde::{Deserialize, Serialize};

/// Interpreter the code runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// `python3`.
    Python,
    /// `node`.
    Node,
    /// `bash`.
    Bash,
}

impl Language {
    /// All languages, in API order.
    pub const ALL: [Language; 3] = [Language::Python, Language::Node, Language::Bash];

    /// Lower-case name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Node => "node",
            Language::Bash => "bash",
        }
    }

    /// Parses the wire name.
    pub fn parse(s: &str) -> Option<Language> {
        Language::ALL.into_iter().find(|l| l.as_str() == s)
    }
}

impl std::fmt::Display for Language {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for l in Language::ALL {
            assert_eq!(Language::parse(l.as_str()), Some(l));
        }
        assert_eq!(Language::parse("Python"), None);
        assert_eq!(Language::parse("ruby"), None);
    }
}
