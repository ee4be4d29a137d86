//! A spec checked against what one node offers (pure): the last gate before
//! the sandbox, whoever sent the spec.

use std::time::Duration;

use super::{LimitRequest, Spec};
use crate::bounds::{self, MAX_CODE_BYTES};
use crate::{env, ids, Limits, Network};

/// What a node offers: defaults for unset limits and the range accepted.
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
    /// The shared bounds of `crate::bounds`: a node accepts exactly what a
    /// manifest may declare.
    fn default() -> Self {
        NodePolicy {
            defaults: Limits::from_bounds(|b| b.default),
            minima: Limits::from_bounds(|b| b.min),
            maxima: Limits::from_bounds(|b| b.max),
            max_timeout: Duration::from_secs(bounds::TIMEOUT_SECS.max.into()),
        }
    }
}

/// Why a spec was refused; `field` names the offending input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// Offending field, e.g. `code` or `env_vars.PATH`.
    pub field: String,
    /// Human-readable reason.
    pub message: String,
}

impl SpecError {
    /// A refusal of `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> SpecError {
        SpecError { field: field.into(), message: message.into() }
    }
}

impl Spec {
    /// Checks the program, id, timeout, environment, limits and network
    /// against `policy`; the limits the sandbox gets.
    pub fn check(&self, policy: &NodePolicy) -> Result<Limits, SpecError> {
        check_code(&self.code)?;
        if !self.id.is_empty() && !ids::is_execution_id(&self.id) {
            return Err(SpecError::new("execution_id", "must match [a-zA-Z0-9_-]{1,64}"));
        }
        if self.timeout.is_zero() {
            return Err(SpecError::new("timeout", "must be greater than zero"));
        }
        if self.timeout > policy.max_timeout {
            return Err(SpecError::new("timeout", format!("must be at most {}s on this node", policy.max_timeout.as_secs())));
        }
        check_env(self.env.iter())?;
        crate::warm::check(self.language, &self.warm_modules).map_err(|why| SpecError::new("warm_modules", why))?;
        if self.network != Network::Unrestricted && !self.egress.is_empty() {
            return Err(SpecError::new("egress", "an allowlist needs network Unrestricted"));
        }
        resolve_limits(&self.limits, policy)
    }
}

fn check_code(code: &str) -> Result<(), SpecError> {
    if code.is_empty() {
        return Err(SpecError::new("code", "must not be empty"));
    }
    if code.len() > MAX_CODE_BYTES {
        return Err(SpecError::new("code", format!("is {} bytes; the limit is {MAX_CODE_BYTES}", code.len())));
    }
    if code.contains('\0') {
        return Err(SpecError::new("code", "must not contain NUL bytes"));
    }
    Ok(())
}

/// Checks the environment handed to a sandbox (all scopes merged): count,
/// names, values.
pub fn check_env<'a>(vars: impl ExactSizeIterator<Item = (&'a String, &'a String)>) -> Result<(), SpecError> {
    if vars.len() > env::MAX_MERGED_VARS {
        return Err(SpecError::new("env_vars", format!("at most {} variables", env::MAX_MERGED_VARS)));
    }
    for (name, value) in vars {
        env::check_var(name, value).map_err(|e| SpecError::new(format!("env_vars.{}", env::printable(name)), e.to_string()))?;
    }
    Ok(())
}

fn resolve_limits(req: &LimitRequest, policy: &NodePolicy) -> Result<Limits, SpecError> {
    let (d, lo, hi) = (&policy.defaults, &policy.minima, &policy.maxima);
    Ok(Limits {
        cpu_millis: pick("limits.cpu_millis", req.cpu_millis, d.cpu_millis, lo.cpu_millis, hi.cpu_millis)?,
        memory_bytes: pick("limits.memory_bytes", req.memory_bytes, d.memory_bytes, lo.memory_bytes, hi.memory_bytes)?,
        pids: pick("limits.pids", req.pids, d.pids, lo.pids, hi.pids)?,
        tmp_bytes: pick("limits.tmp_bytes", req.tmp_bytes, d.tmp_bytes, lo.tmp_bytes, hi.tmp_bytes)?,
        home_bytes: pick("limits.home_bytes", req.home_bytes, d.home_bytes, lo.home_bytes, hi.home_bytes)?,
        max_output_bytes: pick("limits.max_output_bytes", req.max_output_bytes, d.max_output_bytes, lo.max_output_bytes, hi.max_output_bytes)?,
        open_files: pick("limits.open_files", req.open_files, d.open_files, lo.open_files, hi.open_files)?,
        file_size_bytes: pick("limits.file_size_bytes", req.file_size_bytes, d.file_size_bytes, lo.file_size_bytes, hi.file_size_bytes)?,
    })
}

fn pick<T: PartialOrd + Copy + std::fmt::Display>(field: &str, requested: Option<T>, default: T, min: T, max: T) -> Result<T, SpecError> {
    let value = requested.unwrap_or(default);
    if value > max {
        return Err(SpecError::new(field, format!("{value} exceeds this node's maximum of {max}")));
    }
    if value < min {
        return Err(SpecError::new(field, format!("{value} is below the minimum of {min}")));
    }
    Ok(value)
}
