//! proto ⇄ domain conversions (errors become statuses in `crate::refusal`).

use std::time::Duration;

use tonic::Status;
use warren_isolation::features::Features;
use warren_isolation::spec::{ExecRequest, Language, LimitRequest};
use warren_proto::agent as pb;

use crate::executor::NetworkRequest;
use crate::refusal::{self, invalid};
use crate::threads::{ThreadKey, ThreadOptions};

/// Request → domain request (validation happens in `ExecRequest::validate`).
/// Parts of the contract this agent does not offer yet are refused here,
/// never silently dropped.
pub fn exec_request(req: pb::ExecuteRequest) -> Result<ExecRequest, Status> {
    if let Some(field) = unsupported(&req) {
        return Err(refusal::unsupported(field, format!("{field}: not offered by this node-agent")));
    }
    let language = pb::Language::try_from(req.language).ok().and_then(|l| Language::try_from(l).ok());
    let mut env: Vec<(String, String)> = req.env.into_iter().collect();
    env.sort();
    let l = req.limits.unwrap_or_default();
    let nz32 = |v: u32| (v != 0).then_some(v);
    let nz64 = |v: u64| (v != 0).then_some(v);
    Ok(ExecRequest {
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
    })
}

/// The first requested capability this agent cannot provide.
fn unsupported(req: &pb::ExecuteRequest) -> Option<&'static str> {
    // A value this agent does not know is refused like one it cannot provide.
    pb::NetworkPolicy::try_from(req.network).is_err().then_some("network")
}

/// The connectors of a request, checked.
pub fn connectors(raw: Vec<pb::ConnectorGrant>) -> Result<Vec<crate::connectors::Grant>, Status> {
    let invalid = |msg: String| refusal::invalid("connectors", &msg);
    if raw.len() > crate::connectors::MAX_CONNECTORS {
        return Err(invalid(format!("at most {}", crate::connectors::MAX_CONNECTORS)));
    }
    let grants: Vec<crate::connectors::Grant> = raw
        .into_iter()
        .map(|c| {
            crate::connectors::check(crate::connectors::RawGrant {
                name: c.name,
                kind: warren_proto::kinds::connector_kind(c.kind_enum, &c.kind),
                host: c.host,
                port: c.port,
                database: c.database,
                username: c.username,
                project: c.project,
                endpoint: c.endpoint,
                region: c.region,
                custody: c.custody,
                tls_disabled: c.tls_disabled,
                tls_ca_pem: c.tls_ca_pem,
                tls_server_name: c.tls_server_name,
                weak_auth: c.weak_auth,
                credentials: c.credentials.map(|c| c.values.into_iter().collect()).unwrap_or_default(),
            })
        })
        .collect::<Result<_, String>>()
        .map_err(invalid)?;
    for (i, g) in grants.iter().enumerate() {
        if grants[..i].iter().any(|o| o.name == g.name) {
            return Err(invalid(format!("{:?} is named twice", g.name)));
        }
    }
    Ok(grants)
}

/// The network a request asks for, its allowlist checked.
pub fn network(req: &pb::ExecuteRequest) -> Result<NetworkRequest, Status> {
    let invalid = |msg: String| refusal::invalid("egress", &msg);
    match pb::NetworkPolicy::try_from(req.network) {
        Ok(pb::NetworkPolicy::Unrestricted) => {}
        _ if req.egress.is_empty() => return Ok(NetworkRequest::Blocked),
        _ => return Err(invalid("an allowlist needs NETWORK_POLICY_UNRESTRICTED".into())),
    }
    if req.egress.is_empty() {
        return Ok(NetworkRequest::Unrestricted { allow: None });
    }
    let rules = req
        .egress
        .iter()
        .map(|r| {
            let ports = r.ports.iter().map(|p| u16::try_from(*p).map_err(|_| format!("{:?}: port {p} is out of range", r.host))).collect::<Result<_, _>>()?;
            Ok(warren_core::egress::EgressRule { host: r.host.clone(), ports })
        })
        .collect::<Result<Vec<_>, String>>()
        .map_err(invalid)?;
    let allow = warren_core::egress::parse_rules(&rules).map_err(invalid)?;
    Ok(NetworkRequest::Unrestricted { allow: Some(allow) })
}

/// The mounts of a request, validated (their names become host paths).
pub fn mounts(raw: Vec<pb::StorageMount>) -> Result<Vec<warren_storage::MountSpec>, Status> {
    let raw = raw
        .into_iter()
        .map(|m| warren_storage::spec::RawMount {
            read_only: m.mode() != pb::MountMode::ReadWrite,
            mount_path: m.mount_path,
            provider: warren_proto::kinds::provider(m.provider_kind, &m.provider),
            bucket: m.bucket,
            prefix: m.prefix,
            endpoint: m.endpoint,
            region: m.region,
            credentials: m.credentials.map(|c| c.values.into_iter().collect()).unwrap_or_default(),
            max_write_bytes: m.max_write_bytes,
            ambient_identity: m.ambient_identity,
        })
        .collect();
    warren_storage::spec::validate(raw).map_err(|e| refusal::status(&e))
}

/// Registry credentials: none, or a `username` and `password`.
pub fn pull_auth(c: Option<pb::Credentials>) -> Result<warren_image::PullAuth, Status> {
    let Some(mut c) = c.filter(|c| !c.values.is_empty()) else { return Ok(warren_image::PullAuth::Anonymous) };
    match (c.values.remove("username"), c.values.remove("password")) {
        (Some(username), Some(password)) if c.values.is_empty() && username.len() <= 1024 && password.len() <= 16384 => {
            Ok(warren_image::PullAuth::Basic { username, password })
        }
        _ => Err(invalid("image_pull", "must hold exactly a username and a password")),
    }
}

/// A warm image → proto.
pub fn warmed(w: crate::executor::WarmedImage) -> pb::WarmImageResponse {
    pb::WarmImageResponse {
        digest: w.digest,
        languages: w.languages.into_iter().map(|(l, version)| pb::ImageLanguage { language: pb::Language::from(l) as i32, version }).collect(),
        bytes: w.bytes,
    }
}

/// The thread part of a request, validated (it becomes paths and object keys).
pub fn thread_options(t: Option<pb::ThreadOptions>) -> Result<Option<ThreadOptions>, Status> {
    let Some(t) = t else { return Ok(None) };
    let key = thread_key(t.r#ref)?;
    if t.max_bytes == 0 {
        return Err(invalid("thread.max_bytes", "must be > 0"));
    }
    let retention = (t.retention_seconds > 0).then(|| Duration::from_secs(t.retention_seconds));
    let max_threads = (t.max_threads > 0).then_some(t.max_threads);
    Ok(Some(ThreadOptions { key, retention, max_bytes: t.max_bytes, max_threads }))
}

/// A thread reference, validated.
pub fn thread_key(r: Option<pb::ThreadRef>) -> Result<ThreadKey, Status> {
    let r = r.ok_or_else(|| invalid("thread.ref", "required"))?;
    ThreadKey::new(&r.namespace, &r.key_name, &r.thread_id).map_err(|e| invalid("thread.ref", &e.to_string()))
}

/// Features → proto.
pub fn features(f: &Features, network: bool) -> pb::IsolationFeatures {
    pb::IsolationFeatures {
        cgroup_version: f.cgroup_version,
        cgroup_controllers: f.cgroup_controllers.clone(),
        user_namespaces: f.user_namespaces,
        seccomp: f.seccomp,
        overlayfs: f.overlayfs,
        missing: f.missing.clone(),
        network,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;
    use warren_proto::agent::RefusalReason as Reason;
    use warren_proto::refusal::refusal_of;

    #[test]
    fn zero_limits_mean_node_defaults_and_unknown_language_is_none() {
        let req = pb::ExecuteRequest { language: 42, code: "x".into(), timeout_ms: 1500, ..Default::default() };
        let r = exec_request(req).unwrap();
        assert_eq!(r.language, None);
        assert_eq!(r.limits, LimitRequest::default());
        assert_eq!(r.timeout, Duration::from_millis(1500));
    }

    #[test]
    fn capabilities_this_agent_lacks_are_refused_not_dropped() {
        let base = || pb::ExecuteRequest { language: 1, code: "x".into(), timeout_ms: 1000, ..Default::default() };
        let cases: Vec<(pb::ExecuteRequest, &str)> = vec![
            (pb::ExecuteRequest { network: 99, ..base() }, "network"),
        ];
        for (req, field) in cases {
            let s = exec_request(req).unwrap_err();
            assert_eq!(s.code(), Code::FailedPrecondition);
            assert_eq!(warren_proto::refusal::refusal_of(&s), (Reason::Unsupported, field.to_string()));
        }
        assert!(exec_request(pb::ExecuteRequest { network: pb::NetworkPolicy::Blocked as i32, ..base() }).is_ok());
    }

    #[test]
    fn connectors_are_checked_and_named_once() {
        let grant = |name: &str| pb::ConnectorGrant {
            name: name.into(),
            kind: "redis".into(),
            host: "cache".into(),
            credentials: Some(pb::Credentials { values: [("password".to_string(), "x".to_string())].into() }),
            ..Default::default()
        };
        assert_eq!(connectors(vec![grant("a"), grant("b")]).unwrap().len(), 2);
        for bad in [vec![grant("a"), grant("a")], vec![grant("A")], vec![pb::ConnectorGrant { kind: "ftp".into(), ..grant("a") }], (0..17).map(|i| grant(&format!("c{i}"))).collect()] {
            let s = connectors(bad).unwrap_err();
            assert_eq!((s.code(), refusal_of(&s)), (Code::InvalidArgument, (Reason::InvalidField, "connectors".to_string())));
        }
    }

    #[test]
    fn network_and_allowlists_are_checked() {
        let base = || pb::ExecuteRequest { language: 1, code: "x".into(), timeout_ms: 1000, ..Default::default() };
        let rule = |host: &str, ports: Vec<u32>| pb::EgressRule { host: host.into(), ports };
        assert_eq!(network(&base()).unwrap(), NetworkRequest::Blocked);
        let open = pb::ExecuteRequest { network: pb::NetworkPolicy::Unrestricted as i32, ..base() };
        assert_eq!(network(&open).unwrap(), NetworkRequest::Unrestricted { allow: None });
        let listed = pb::ExecuteRequest { egress: vec![rule("api.example.com", vec![443])], ..open.clone() };
        assert!(matches!(network(&listed).unwrap(), NetworkRequest::Unrestricted { allow: Some(r) } if r.len() == 1));
        for bad in [
            pb::ExecuteRequest { egress: vec![rule("api.example.com", vec![])], ..base() },
            pb::ExecuteRequest { egress: vec![rule("api.example.com", vec![70000])], ..open.clone() },
            pb::ExecuteRequest { egress: vec![rule("*", vec![])], ..open.clone() },
            pb::ExecuteRequest { egress: vec![rule("fd00::/8", vec![])], ..open.clone() },
        ] {
            let s = network(&bad).unwrap_err();
            assert_eq!((s.code(), refusal_of(&s)), (Code::InvalidArgument, (Reason::InvalidField, "egress".to_string())));
        }
    }

    #[test]
    fn mounts_are_validated_and_unknown_providers_refused_as_unsupported() {
        let m = |provider: &str, path: &str| pb::StorageMount { mount_path: path.into(), provider: provider.into(), bucket: "b".into(), mode: pb::MountMode::ReadWrite as i32, ..Default::default() };
        let ok = mounts(vec![m("s3", "/data/in"), pb::StorageMount { mode: pb::MountMode::Unspecified as i32, ..m("s3", "/data/ref") }]).unwrap();
        assert_eq!((ok[0].read_only, ok[1].read_only), (false, true), "only READ_WRITE writes");
        let s = mounts(vec![m("ftp", "/data/x")]).unwrap_err();
        assert_eq!((s.code(), refusal_of(&s)), (Code::FailedPrecondition, (Reason::Unsupported, "mounts[0].provider".to_string())));
        let s = mounts(vec![m("s3", "/data/../etc")]).unwrap_err();
        assert_eq!((s.code(), refusal_of(&s)), (Code::InvalidArgument, (Reason::InvalidField, "mounts[0].mount_path".to_string())));
    }

    #[test]
    fn thread_options_are_validated() {
        let r = |ns: &str, id: &str| Some(pb::ThreadRef { namespace: ns.into(), key_name: "k".into(), thread_id: id.into() });
        let ok = thread_options(Some(pb::ThreadOptions { r#ref: r("default", "t-1"), retention_seconds: 0, max_bytes: 10, max_threads: 0 })).unwrap().unwrap();
        assert_eq!((ok.retention, ok.max_bytes, ok.max_threads, ok.key.rel().as_str()), (None, 10, None, "default/k/t-1"));
        let week = thread_options(Some(pb::ThreadOptions { r#ref: r("default", "t"), retention_seconds: 604800, max_bytes: 1, max_threads: 5 })).unwrap().unwrap();
        assert_eq!((week.retention, week.max_threads), (Some(Duration::from_secs(604800)), Some(5)));
        for bad in [
            pb::ThreadOptions { r#ref: r("default", "../x"), retention_seconds: 0, max_bytes: 1, max_threads: 0 },
            pb::ThreadOptions { r#ref: r("Bad", "t"), retention_seconds: 0, max_bytes: 1, max_threads: 0 },
            pb::ThreadOptions { r#ref: r("default", "t"), retention_seconds: 0, max_bytes: 0, max_threads: 0 },
            pb::ThreadOptions { r#ref: None, retention_seconds: 0, max_bytes: 1, max_threads: 0 },
        ] {
            let s = thread_options(Some(bad)).unwrap_err();
            assert_eq!(s.code(), tonic::Code::InvalidArgument);
            assert_eq!(warren_proto::refusal::refusal_of(&s).0, Reason::InvalidField);
        }
    }
}
