//! proto ⇄ domain conversions and the one mapping from errors to gRPC status.

use std::time::Duration;

use tonic::Status;
use warren_isolation::features::Features;
use warren_isolation::spec::{ExecRequest, Language, LimitRequest};
use warren_proto::agent as pb;

use crate::executor::ExecError;
use crate::threads::{ThreadError, ThreadKey, ThreadOptions};
use crate::sandbox::Outcome;

/// Request → domain request (validation happens in `ExecRequest::validate`).
pub fn exec_request(req: pb::ExecuteRequest) -> ExecRequest {
    let language = match pb::Language::try_from(req.language) {
        Ok(pb::Language::Python) => Some(Language::Python),
        Ok(pb::Language::Node) => Some(Language::Node),
        Ok(pb::Language::Bash) => Some(Language::Bash),
        _ => None,
    };
    let mut env: Vec<(String, String)> = req.env.into_iter().collect();
    env.sort();
    let l = req.limits.unwrap_or_default();
    let nz32 = |v: u32| (v != 0).then_some(v);
    let nz64 = |v: u64| (v != 0).then_some(v);
    ExecRequest {
        id: req.execution_id,
        language,
        code: req.code,
        env,
        timeout: Duration::from_millis(req.timeout_ms.into()),
        limits: LimitRequest {
            cpu_millis: nz32(l.cpu_millis),
            memory_bytes: nz64(l.memory_bytes),
            pids: nz32(l.pids),
            tmp_bytes: nz64(l.tmp_bytes),
            home_bytes: nz64(l.home_bytes),
            max_output_bytes: nz64(l.max_output_bytes),
            open_files: nz32(l.open_files),
            file_size_bytes: nz64(l.file_size_bytes),
        },
        image: req.image,
    }
}

/// The thread part of a request, validated (it becomes paths and object keys).
pub fn thread_options(t: Option<pb::ThreadOptions>) -> Result<Option<ThreadOptions>, Status> {
    let Some(t) = t else { return Ok(None) };
    let key = thread_key(t.r#ref)?;
    if t.max_bytes == 0 {
        return Err(Status::invalid_argument("thread.max_bytes: must be > 0"));
    }
    let retention = (t.retention_seconds > 0).then(|| Duration::from_secs(t.retention_seconds));
    Ok(Some(ThreadOptions { key, retention, max_bytes: t.max_bytes }))
}

/// A thread reference, validated.
pub fn thread_key(r: Option<pb::ThreadRef>) -> Result<ThreadKey, Status> {
    let r = r.ok_or_else(|| Status::invalid_argument("thread.ref: required"))?;
    ThreadKey::new(&r.namespace, &r.key_name, &r.thread_id).map_err(|e| Status::invalid_argument(e.to_string()))
}

/// The thread errors of `DeleteThread` as statuses.
pub fn thread_status(e: &ThreadError) -> Status {
    match e {
        ThreadError::Busy | ThreadError::Conflict => Status::aborted(e.to_string()),
        ThreadError::NotFound => Status::not_found(e.to_string()),
        ThreadError::TooLarge { .. } => Status::failed_precondition(e.to_string()),
        ThreadError::Io { .. } => Status::unavailable("the thread store failed; retry shortly"),
    }
}

/// Domain language → proto.
pub fn language(l: Language) -> pb::Language {
    match l {
        Language::Python => pb::Language::Python,
        Language::Node => pb::Language::Node,
        Language::Bash => pb::Language::Bash,
    }
}

/// The single error → status mapping of the agent (codes documented in agent.proto).
pub fn to_status(e: &ExecError) -> Status {
    match e {
        ExecError::Invalid(_) | ExecError::LanguageUnavailable(_) => Status::invalid_argument(e.to_string()),
        ExecError::MissingFeature(_) => Status::failed_precondition(e.to_string()),
        ExecError::Busy(_) => Status::resource_exhausted(e.to_string()),
        ExecError::Sandbox(crate::sandbox::SandboxError::NoSlot) => Status::resource_exhausted(e.to_string()),
        // Details go to the agent's log; the caller gets a short message.
        ExecError::Sandbox(_) => Status::internal("sandbox setup failed on this node"),
        ExecError::ThreadBusy => Status::aborted(e.to_string()),
    }
}

/// Outcome → final event.
pub fn exited(o: &Outcome) -> pb::Exited {
    pb::Exited {
        exit_code: o.exit_code,
        signal: o.signal,
        timed_out: o.timed_out,
        oom_killed: o.oom_killed,
        wall_micros: o.wall.as_micros() as u64,
        cpu_micros: o.cpu_micros,
        peak_memory_bytes: o.peak_memory_bytes,
        stdout_truncated: o.stdout_truncated,
        stderr_truncated: o.stderr_truncated,
        error: o.error.clone().unwrap_or_default(),
    }
}

/// Features → proto.
pub fn features(f: &Features) -> pb::IsolationFeatures {
    pb::IsolationFeatures {
        cgroup_version: f.cgroup_version,
        cgroup_controllers: f.cgroup_controllers.clone(),
        user_namespaces: f.user_namespaces,
        seccomp: f.seccomp,
        overlayfs: f.overlayfs,
        missing: f.missing.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_limits_mean_node_defaults_and_unknown_language_is_none() {
        let req = pb::ExecuteRequest { language: 42, code: "x".into(), timeout_ms: 1500, ..Default::default() };
        let r = exec_request(req);
        assert_eq!(r.language, None);
        assert_eq!(r.limits, LimitRequest::default());
        assert_eq!(r.timeout, Duration::from_millis(1500));
    }

    #[test]
    fn statuses_follow_the_contract() {
        use tonic::Code;
        let invalid = ExecError::Invalid(warren_isolation::spec::SpecError { field: "code".into(), message: "empty".into() });
        assert_eq!(to_status(&invalid).code(), Code::InvalidArgument);
        assert_eq!(to_status(&ExecError::MissingFeature("seccomp".into())).code(), Code::FailedPrecondition);
        assert!(to_status(&ExecError::MissingFeature("seccomp".into())).message().contains("seccomp"));
        assert_eq!(to_status(&ExecError::Busy(4)).code(), Code::ResourceExhausted);
        let internal = ExecError::Sandbox(crate::sandbox::SandboxError::Timeout);
        assert_eq!(to_status(&internal).code(), Code::Internal);
        assert_eq!(to_status(&ExecError::ThreadBusy).code(), Code::Aborted);
    }

    #[test]
    fn thread_options_are_validated() {
        let r = |ns: &str, id: &str| Some(pb::ThreadRef { namespace: ns.into(), key_name: "k".into(), thread_id: id.into() });
        let ok = thread_options(Some(pb::ThreadOptions { r#ref: r("default", "t-1"), retention_seconds: 0, max_bytes: 10 })).unwrap().unwrap();
        assert_eq!((ok.retention, ok.max_bytes, ok.key.rel().as_str()), (None, 10, "default/k/t-1"));
        let week = thread_options(Some(pb::ThreadOptions { r#ref: r("default", "t"), retention_seconds: 604800, max_bytes: 1 })).unwrap().unwrap();
        assert_eq!(week.retention, Some(Duration::from_secs(604800)));
        for bad in [
            pb::ThreadOptions { r#ref: r("default", "../x"), retention_seconds: 0, max_bytes: 1 },
            pb::ThreadOptions { r#ref: r("Bad", "t"), retention_seconds: 0, max_bytes: 1 },
            pb::ThreadOptions { r#ref: r("default", "t"), retention_seconds: 0, max_bytes: 0 },
            pb::ThreadOptions { r#ref: None, retention_seconds: 0, max_bytes: 1 },
        ] {
            assert_eq!(thread_options(Some(bad)).unwrap_err().code(), tonic::Code::InvalidArgument);
        }
    }
}
