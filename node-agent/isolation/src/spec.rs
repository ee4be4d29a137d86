//! What the sandbox runs: a spec checked against the node's policy
//! ([`warren_core::contract::Spec::check`]), and what the sandbox needs to
//! know about each language.

use std::time::Duration;

use warren_core::ids;

pub use warren_core::bounds::MAX_CODE_BYTES;
pub use warren_core::contract::{NodePolicy, SpecError};

/// Interpreter the code runs under (the one type every layer shares).
pub use warren_core::Language;

/// What the sandbox needs to know about each language.
pub trait LanguageExt {
    /// Interpreter candidates inside the sandbox's root filesystem, first found wins.
    fn interpreter_candidates(self) -> &'static [&'static str];
    /// File name the program text is written to inside the sandbox.
    fn script_name(self) -> &'static str;
    /// Environment the interpreter needs to behave well in a sandbox.
    fn interpreter_env(self) -> &'static [(&'static str, &'static str)];
    /// A program printing the interpreter's version (`3.11.2`) and nothing else.
    fn version_probe(self) -> &'static str;
}

impl LanguageExt for Language {
    fn interpreter_candidates(self) -> &'static [&'static str] {
        match self {
            Language::Python => &["/usr/bin/python3", "/usr/local/bin/python3"],
            Language::Node => &["/usr/bin/node", "/usr/local/bin/node", "/usr/bin/nodejs"],
            Language::Bash => &["/bin/bash", "/usr/bin/bash"],
        }
    }

    fn version_probe(self) -> &'static str {
        match self {
            Language::Python => "import sys; print('%d.%d.%d' % sys.version_info[:3])",
            Language::Node => "console.log(process.versions.node)",
            Language::Bash => "echo \"${BASH_VERSINFO[0]}.${BASH_VERSINFO[1]}.${BASH_VERSINFO[2]}\"",
        }
    }

    fn script_name(self) -> &'static str {
        match self {
            Language::Python => "main.py",
            Language::Node => "main.js",
            Language::Bash => "main.sh",
        }
    }

    /// Python block-buffers stdout into a pipe; unbuffered output is what makes
    /// a timed-out program's partial output reach the caller.
    fn interpreter_env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Language::Python => &[("PYTHONUNBUFFERED", "1"), ("PYTHONDONTWRITEBYTECODE", "1")],
            Language::Node => &[],
            Language::Bash => &[],
        }
    }
}

pub use warren_core::{Limits, Network};

/// A checked execution: safe to hand to the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSpec {
    /// Execution id, `[a-zA-Z0-9_-]{1,64}`.
    pub id: String,
    /// Interpreter.
    pub language: Language,
    /// Program text.
    pub code: String,
    /// Environment, checked.
    pub env: Vec<(String, String)>,
    /// Wall-clock limit.
    pub timeout: Duration,
    /// Resolved limits.
    pub limits: Limits,
    /// Network policy.
    pub network: Network,
}

impl ExecSpec {
    /// The sandbox's part of `spec`, checked against `policy` (an empty id
    /// gets a fresh one); the rest of the spec stays with the caller.
    pub fn check(spec: &mut warren_core::contract::Spec, policy: &NodePolicy) -> Result<ExecSpec, SpecError> {
        let limits = spec.check(policy)?;
        let id = match std::mem::take(&mut spec.id) {
            id if id.is_empty() => new_execution_id(),
            id => id,
        };
        Ok(ExecSpec {
            id,
            language: spec.language,
            code: std::mem::take(&mut spec.code),
            env: std::mem::take(&mut spec.env).into_iter().collect(),
            timeout: spec.timeout,
            limits,
            network: spec.network,
        })
    }
}

/// A fresh random execution id (`exe_` + 20 base62 characters).
pub fn new_execution_id() -> String {
    ids::random_id("exe_", ids::ID_CHARS, &mut fill_random)
}

fn fill_random(buf: &mut [u8]) {
    // getrandom(2) does not fail for small buffers once the pool is
    // initialised; fall back to a time-based value rather than panic.
    // SAFETY: the kernel writes at most buf.len() bytes into buf.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < buf.len() as isize {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (t >> ((i % 16) * 8)) as u8 ^ i as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checked_spec_gets_an_id_and_the_node_defaults() {
        let mut spec = warren_core::contract::Spec::new(Language::Python, "print(1)", Duration::from_secs(5));
        spec.env.insert("A".into(), "1".into());
        let run = ExecSpec::check(&mut spec, &NodePolicy::default()).unwrap();
        assert_eq!(run.limits, NodePolicy::default().defaults);
        assert!(run.id.starts_with("exe_") && run.id.len() == 24, "{}", run.id);
        assert_eq!((run.code.as_str(), run.env), ("print(1)", vec![("A".to_string(), "1".to_string())]));
        spec.code = String::new();
        assert_eq!(ExecSpec::check(&mut spec, &NodePolicy::default()).unwrap_err().field, "code");
    }

    #[test]
    fn execution_ids_are_unique() {
        let a = new_execution_id();
        let b = new_execution_id();
        assert_ne!(a, b);
    }
}
