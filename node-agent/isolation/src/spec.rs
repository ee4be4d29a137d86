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

use crate::wire::{WarmKind, WarmStart};

/// One value per variable: the last one given wins, at the place of the
/// first. (Given twice, `execve` would pass both and interpreters disagree on
/// which counts: Python takes the first, bash the last.)
pub fn dedupe_env(env: &mut Vec<(String, String)>) {
    let mut last: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, (k, _)) in env.iter().enumerate() {
        last.insert(k, i);
    }
    let mut seen = std::collections::HashSet::new();
    let values: Vec<Option<String>> = env.iter().map(|(k, _)| seen.insert(k.clone()).then(|| env[last[k.as_str()]].1.clone())).collect();
    let mut values = values.into_iter();
    env.retain_mut(|(_, v)| match values.next().flatten() {
        Some(last) => {
            *v = last;
            true
        }
        None => false,
    });
}

/// The variables that shape an interpreter's startup (flags, paths, locale
/// and encodings, the user site; Node's options, OpenSSL's configuration
/// read when it starts): a warm interpreter serves only calls whose values
/// are the ones it started with.
fn startup_var(kind: WarmKind, name: &str) -> bool {
    match kind {
        WarmKind::Python => name.starts_with("PYTHON") || name.starts_with("LC_") || matches!(name, "LANG" | "LANGUAGE" | "HOME"),
        WarmKind::Node => {
            ["NODE_", "UV_", "OPENSSL_", "SSL_", "LC_"].iter().any(|p| name.starts_with(p)) || matches!(name, "LANG" | "LANGUAGE" | "HOME" | "TZ")
        }
    }
}

/// What a warm interpreter for a call with `env` starts with, when the call
/// can have one: Python and Node, and not when the call's own startup
/// variables take the place the warm start's hook needs.
pub fn warm_start(language: Language, interpreter: &str, env: &[(String, String)], modules: &[String]) -> Option<WarmStart> {
    let kind = match language {
        Language::Python => WarmKind::Python,
        Language::Node => WarmKind::Node,
        Language::Bash => return None,
    };
    let env = startup_env(kind, env);
    let taken: &[&str] = match kind {
        WarmKind::Python => &["PYTHONUSERBASE", "PYTHONNOUSERSITE", "PYTHONSTARTUP", "PYTHONINSPECT"],
        WarmKind::Node => &["NODE_OPTIONS"],
    };
    if env.iter().any(|(k, _)| taken.contains(&k.as_str())) {
        return None;
    }
    Some(WarmStart { kind, interpreter: interpreter.into(), script_name: language.script_name().into(), env, modules: modules.to_vec() })
}

/// The startup variables of `env` for `kind` (deduplicated, in order).
pub fn startup_env(kind: WarmKind, env: &[(String, String)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = env.iter().filter(|(k, _)| startup_var(kind, k)).cloned().collect();
    dedupe_env(&mut env);
    env
}

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
    fn env_keeps_the_last_value_at_the_first_place() {
        let v = |pairs: &[(&str, &str)]| pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        let mut env = v(&[("PATH", "/bin"), ("A", "1"), ("PATH", "/usr/bin"), ("B", "2"), ("A", "3")]);
        dedupe_env(&mut env);
        assert_eq!(env, v(&[("PATH", "/usr/bin"), ("A", "3"), ("B", "2")]));
    }

    #[test]
    fn warm_starts_are_keyed_by_startup_variables() {
        let v = |pairs: &[(&str, &str)]| pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        let env = v(&[("PATH", "/bin"), ("HOME", "/home/sandbox"), ("LANG", "C.UTF-8"), ("PYTHONUNBUFFERED", "1"), ("TOKEN", "s3cret"), ("LC_ALL", "C")]);
        let w = warm_start(Language::Python, "/usr/bin/python3", &env, &[]).unwrap();
        assert_eq!(w.env, v(&[("HOME", "/home/sandbox"), ("LANG", "C.UTF-8"), ("PYTHONUNBUFFERED", "1"), ("LC_ALL", "C")]));
        assert_eq!(w.script_name, "main.py");
        assert!(warm_start(Language::Bash, "/bin/bash", &env, &[]).is_none());
        let node = [env.clone(), v(&[("NODE_ENV", "production"), ("TZ", "UTC")])].concat();
        let n = warm_start(Language::Node, "/usr/bin/node", &node, &[]).unwrap();
        assert_eq!((n.kind, n.env), (WarmKind::Node, v(&[("HOME", "/home/sandbox"), ("LANG", "C.UTF-8"), ("LC_ALL", "C"), ("NODE_ENV", "production"), ("TZ", "UTC")])));
        let node_options = [env.clone(), v(&[("NODE_OPTIONS", "--inspect")])].concat();
        assert!(warm_start(Language::Node, "/usr/bin/node", &node_options, &[]).is_none());
        let moved = [env.clone(), v(&[("PYTHONUSERBASE", "/tmp/u")])].concat();
        assert!(warm_start(Language::Python, "/usr/bin/python3", &moved, &[]).is_none());
    }

    #[test]
    fn execution_ids_are_unique() {
        let a = new_execution_id();
        let b = new_execution_id();
        assert_ne!(a, b);
    }
}
