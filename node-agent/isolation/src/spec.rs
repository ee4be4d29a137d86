//! The typed execution spec: what one sandboxed run may do, validated before
//! any syscall. Everything here is pure and unit-tested.

use std::time::Duration;

use warren_core::bounds;
use warren_core::{env, ids};

pub use warren_core::bounds::MAX_CODE_BYTES;
/// Most environment variables one execution gets (all scopes merged).
pub const MAX_ENV_VARS: usize = env::MAX_MERGED_VARS;
/// Longest environment variable value.
pub const MAX_ENV_VALUE_BYTES: usize = env::MAX_VALUE_BYTES;

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

/// Limits as requested: `None` takes the node's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitRequest {
    /// See [`Limits::cpu_millis`].
    pub cpu_millis: Option<u32>,
    /// See [`Limits::memory_bytes`].
    pub memory_bytes: Option<u64>,
    /// See [`Limits::pids`].
    pub pids: Option<u32>,
    /// See [`Limits::tmp_bytes`].
    pub tmp_bytes: Option<u64>,
    /// See [`Limits::home_bytes`].
    pub home_bytes: Option<u64>,
    /// See [`Limits::max_output_bytes`].
    pub max_output_bytes: Option<u64>,
    /// See [`Limits::open_files`].
    pub open_files: Option<u32>,
    /// See [`Limits::file_size_bytes`].
    pub file_size_bytes: Option<u64>,
}

/// What this node offers: defaults for unset limits and the largest values accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePolicy {
    /// Limits used when a request leaves a field unset.
    pub defaults: Limits,
    /// Smallest value accepted for each field.
    pub minima: Limits,
    /// Largest value accepted for each field.
    pub maxima: Limits,
    /// Longest wall-clock timeout accepted.
    pub max_timeout: Duration,
}

impl Default for NodePolicy {
    /// The shared bounds of `warren_core::bounds`: a node accepts exactly
    /// what a manifest may declare.
    fn default() -> Self {
        NodePolicy {
            defaults: Limits::from_bounds(|b| b.default),
            minima: Limits::from_bounds(|b| b.min),
            maxima: Limits::from_bounds(|b| b.max),
            max_timeout: Duration::from_secs(bounds::TIMEOUT_SECS.max.into()),
        }
    }
}

/// A request to run code, before validation.
#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    /// Caller-chosen id; generated when empty.
    pub id: String,
    /// `None` when the caller sent an unknown or unspecified language.
    pub language: Option<Language>,
    /// Program text.
    pub code: String,
    /// Request environment, in the caller's order.
    pub env: Vec<(String, String)>,
    /// Wall-clock limit.
    pub timeout: Duration,
    /// Requested limits.
    pub limits: LimitRequest,
    /// Root filesystem: empty or `host`, or an OCI reference (the node-agent's
    /// executor resolves it; validation here leaves it alone).
    pub image: String,
}

/// A validated execution spec: safe to hand to the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSpec {
    /// Execution id, `[a-zA-Z0-9_-]{1,64}`.
    pub id: String,
    /// Interpreter.
    pub language: Language,
    /// Program text.
    pub code: String,
    /// Request environment, validated.
    pub env: Vec<(String, String)>,
    /// Wall-clock limit.
    pub timeout: Duration,
    /// Resolved limits.
    pub limits: Limits,
    /// Network policy.
    pub network: Network,
}

/// Why a request was refused. `field` names the offending input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// Offending field, e.g. `code` or `env.PATH`.
    pub field: String,
    /// Human-readable reason.
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError { field: field.into(), message: message.into() }
}

impl ExecRequest {
    /// Validates the request against the node's policy.
    pub fn validate(self, policy: &NodePolicy) -> Result<ExecSpec, SpecError> {
        let language = self.language.ok_or_else(|| err("language", "must be python, node or bash"))?;
        validate_code(&self.code)?;
        let id = if self.id.is_empty() { new_execution_id() } else { validate_id(self.id)? };
        if self.timeout.is_zero() {
            return Err(err("timeout", "must be greater than zero"));
        }
        if self.timeout > policy.max_timeout {
            return Err(err("timeout", format!("must be at most {}s on this node", policy.max_timeout.as_secs())));
        }
        validate_env(&self.env)?;
        let limits = resolve_limits(&self.limits, policy)?;
        Ok(ExecSpec {
            id,
            language,
            code: self.code,
            env: self.env,
            timeout: self.timeout,
            limits,
            network: Network::Blocked,
        })
    }
}

fn validate_code(code: &str) -> Result<(), SpecError> {
    if code.is_empty() {
        return Err(err("code", "must not be empty"));
    }
    if code.len() > MAX_CODE_BYTES {
        return Err(err("code", format!("is {} bytes; the limit is {MAX_CODE_BYTES}", code.len())));
    }
    if code.contains('\0') {
        return Err(err("code", "must not contain NUL bytes"));
    }
    Ok(())
}

fn validate_id(id: String) -> Result<String, SpecError> {
    if ids::is_execution_id(&id) { Ok(id) } else { Err(err("execution_id", "must match [a-zA-Z0-9_-]{1,64}")) }
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

/// True when `name` may not be set by a request (the shared list in
/// `warren_core::env`, checked here again as defence in depth).
pub fn is_reserved_env(name: &str) -> bool {
    env::is_reserved(name)
}

/// Checks the environment handed to a sandbox (Sandbox, ApiKey and request
/// scopes already merged by the gateway): count, names, values.
pub fn validate_env(env: &[(String, String)]) -> Result<(), SpecError> {
    if env.len() > MAX_ENV_VARS {
        return Err(err("env_vars", format!("at most {MAX_ENV_VARS} variables")));
    }
    for (name, value) in env {
        env::check_var(name, value).map_err(|e| err(format!("env_vars.{}", env::printable(name)), e.to_string()))?;
    }
    Ok(())
}


fn resolve_limits(req: &LimitRequest, policy: &NodePolicy) -> Result<Limits, SpecError> {
    let (d, lo, hi) = (&policy.defaults, &policy.minima, &policy.maxima);
    Ok(Limits {
        cpu_millis: pick("limits.cpu_millis", req.cpu_millis, d.cpu_millis, hi.cpu_millis, lo.cpu_millis)?,
        memory_bytes: pick("limits.memory_bytes", req.memory_bytes, d.memory_bytes, hi.memory_bytes, lo.memory_bytes)?,
        pids: pick("limits.pids", req.pids, d.pids, hi.pids, lo.pids)?,
        tmp_bytes: pick("limits.tmp_bytes", req.tmp_bytes, d.tmp_bytes, hi.tmp_bytes, lo.tmp_bytes)?,
        home_bytes: pick("limits.home_bytes", req.home_bytes, d.home_bytes, hi.home_bytes, lo.home_bytes)?,
        max_output_bytes: pick("limits.max_output_bytes", req.max_output_bytes, d.max_output_bytes, hi.max_output_bytes, lo.max_output_bytes)?,
        open_files: pick("limits.open_files", req.open_files, d.open_files, hi.open_files, lo.open_files)?,
        file_size_bytes: pick("limits.file_size_bytes", req.file_size_bytes, d.file_size_bytes, hi.file_size_bytes, lo.file_size_bytes)?,
    })
}

fn pick<T: PartialOrd + Copy + std::fmt::Display>(
    field: &str,
    requested: Option<T>,
    default: T,
    max: T,
    min: T,
) -> Result<T, SpecError> {
    let value = requested.unwrap_or(default);
    if value > max {
        return Err(err(field, format!("{value} exceeds this node's maximum of {max}")));
    }
    if value < min {
        return Err(err(field, format!("{value} is below the minimum of {min}")));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> ExecRequest {
        ExecRequest {
            language: Some(Language::Python),
            code: "print(1)".into(),
            timeout: Duration::from_secs(5),
            ..Default::default()
        }
    }

    fn field_of(r: ExecRequest) -> String {
        r.validate(&NodePolicy::default()).unwrap_err().field
    }

    #[test]
    fn valid_request_gets_defaults_and_an_id() {
        let spec = req().validate(&NodePolicy::default()).unwrap();
        assert_eq!(spec.limits, NodePolicy::default().defaults);
        assert!(spec.id.starts_with("exe_") && spec.id.len() == 24, "{}", spec.id);
    }

    #[test]
    fn malformed_requests_name_their_field() {
        let cases: Vec<(ExecRequest, &str)> = vec![
            (ExecRequest { language: None, ..req() }, "language"),
            (ExecRequest { code: String::new(), ..req() }, "code"),
            (ExecRequest { code: "x".repeat(MAX_CODE_BYTES + 1), ..req() }, "code"),
            (ExecRequest { code: "a\0b".into(), ..req() }, "code"),
            (ExecRequest { timeout: Duration::ZERO, ..req() }, "timeout"),
            (ExecRequest { timeout: Duration::from_secs(3601), ..req() }, "timeout"),
            (ExecRequest { id: "../etc".into(), ..req() }, "execution_id"),
            (ExecRequest { limits: LimitRequest { memory_bytes: Some(1 << 50), ..Default::default() }, ..req() }, "limits.memory_bytes"),
            (ExecRequest { limits: LimitRequest { pids: Some(1), ..Default::default() }, ..req() }, "limits.pids"),
            (ExecRequest { limits: LimitRequest { cpu_millis: Some(99_000), ..Default::default() }, ..req() }, "limits.cpu_millis"),
        ];
        for (r, field) in cases {
            assert_eq!(field_of(r), field);
        }
    }

    #[test]
    fn code_of_exactly_one_mebibyte_is_accepted() {
        let r = ExecRequest { code: "#".repeat(MAX_CODE_BYTES), ..req() };
        assert!(r.validate(&NodePolicy::default()).is_ok());
    }

    #[test]
    fn env_rules() {
        let bad = ["PATH", "LD_PRELOAD", "LC_ALL", "PYTHONPATH", "HTTPS_PROXY", "WARREN_X", "_X", "lower", "1A", "A-B", ""];
        for name in bad {
            let r = validate_env(&[(name.to_string(), "v".into())]);
            assert!(r.is_err(), "{name} should be refused");
        }
        assert!(validate_env(&[("API_BASE_URL".into(), "https://x".into())]).is_ok());
        assert!(validate_env(&[("A".into(), "a\u{1b}b".into())]).is_err());
        assert!(validate_env(&[("A".into(), "line1\nline2\t".into())]).is_ok());
        assert!(validate_env(&[("A".into(), "x".repeat(MAX_ENV_VALUE_BYTES + 1))]).is_err());
        let many: Vec<_> = (0..=MAX_ENV_VARS).map(|i| (format!("V{i}"), String::new())).collect();
        assert!(validate_env(&many).is_err());
    }

    #[test]
    fn execution_ids_are_unique() {
        let a = new_execution_id();
        let b = new_execution_id();
        assert_ne!(a, b);
    }
}
