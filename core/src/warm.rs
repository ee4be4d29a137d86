//! Warm imports: modules a Sandbox declares (`spec.warm.python.imports`,
//! `spec.warm.node.modules`) that its warm interpreters load before their
//! call arrives. One rule for every layer that accepts them (the Sandbox's
//! compiler, the gateway, the node-agent's own check).

use serde::{Deserialize, Serialize};

use crate::Language;

/// Most modules one language may warm.
pub const MAX_MODULES: usize = 32;
/// Longest module name, in bytes.
pub const MAX_NAME_BYTES: usize = 214;

/// The modules warm per language.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmModules {
    /// Python modules (`numpy`, `pandas`, `os.path`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub python: Vec<String>,
    /// Node packages (`lodash`, `@scope/pkg`, `pkg/sub`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node: Vec<String>,
}

impl WarmModules {
    /// Nothing is warmed.
    pub fn is_empty(&self) -> bool {
        self.python.is_empty() && self.node.is_empty()
    }

    /// The modules of `language` (none for bash).
    pub fn of(&self, language: Language) -> &[String] {
        match language {
            Language::Python => &self.python,
            Language::Node => &self.node,
            Language::Bash => &[],
        }
    }
}

/// Checks a list of `language`'s modules; the error names the bad entry.
pub fn check(language: Language, modules: &[String]) -> Result<(), String> {
    if modules.len() > MAX_MODULES {
        return Err(format!("at most {MAX_MODULES} modules"));
    }
    if language == Language::Bash && !modules.is_empty() {
        return Err("bash has no modules".into());
    }
    for m in modules {
        let ok = match language {
            Language::Python => is_python_module(m),
            _ => is_node_module(m),
        };
        if !ok || m.len() > MAX_NAME_BYTES {
            let what = match language {
                Language::Python => "a dotted Python module name (numpy, os.path)",
                _ => "an npm package name, optionally with a path inside it (lodash, @scope/pkg, pkg/sub); never a file path",
            };
            return Err(format!("{m:?} is not {what}"));
        }
    }
    Ok(())
}

/// `numpy`, `os.path`: identifiers joined by dots.
fn is_python_module(m: &str) -> bool {
    !m.is_empty()
        && m.split('.').all(|part| {
            let mut chars = part.chars();
            chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// `lodash`, `@scope/pkg`, `pkg/sub/path`: never relative, absolute, a
/// `node:` builtin spec or `..`.
fn is_node_module(m: &str) -> bool {
    let part = |p: &str| !p.is_empty() && p != "." && p != ".." && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-._~".contains(c));
    let rest = match m.strip_prefix('@') {
        Some(scoped) => match scoped.split_once('/') {
            Some((scope, rest)) if part(scope) => rest,
            _ => return false,
        },
        None => m,
    };
    !rest.starts_with('.') && rest.split('/').all(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_are_names_never_paths() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(check(Language::Python, &s(&["numpy", "os.path", "_private", "pandas"])).is_ok());
        for bad in ["", "1abc", "os..path", "os/path", "a-b", "import os"] {
            assert!(check(Language::Python, &s(&[bad])).is_err(), "{bad:?}");
        }
        assert!(check(Language::Node, &s(&["lodash", "@scope/pkg", "pkg/sub/x.js", "left-pad"])).is_ok());
        for bad in ["./x", "../x", "/etc/passwd", "pkg/../../x", "@scope", "node:fs:x", "Upper", ".hidden"] {
            assert!(check(Language::Node, &s(&[bad])).is_err(), "{bad:?}");
        }
        assert!(check(Language::Bash, &s(&["x"])).is_err());
        assert!(check(Language::Python, &vec!["m".to_string(); MAX_MODULES + 1]).is_err());
        let w = WarmModules { python: s(&["numpy"]), node: vec![] };
        assert_eq!((w.of(Language::Python), w.of(Language::Bash), w.is_empty()), (&s(&["numpy"])[..], &[][..], false));
    }
}
