use super::*;
use warren_config::key::KeyHash;
use warren_config::EffectiveKey;
use crate::exec::{Delivery, ExecError, ExecuteRequest, ExecutionSpec};

/// The body read and checked, as the HTTP edge answers.
fn parse(body: &[u8]) -> Result<ExecuteRequest, ApiError> {
    let r = read(body)?;
    r.check()?;
    Ok(r)
}

fn field_of(body: &str) -> Option<String> {
    parse(body.as_bytes()).err().and_then(|e| e.body.field)
}

fn key() -> EffectiveKey {
    EffectiveKey {
        namespace: "default".into(),
        name: "k".into(),
        sandbox: "sb".into(),
        hash: KeyHash::of("x"),
        e2b_hash: None,
        display_prefix: "sk-wrn-xxxx…".into(),
        disabled: false,
        max_timeout_seconds: 30,
        max_concurrency: 2,
        max_threads: 1000,
        max_live_sandboxes: 100,
        max_live_seconds: 86_400,
        live_idle_seconds: 0,
        public_ports: false,
        audit_namespace: false,
        webhook_secret: None,
        storage: Vec::new(),
        image: "host".into(),
        image_digest: None,
        image_pull: None,
        languages: vec![Language::Python, Language::Bash],
        limits: warren_config::Limits {
            cpu_millis: 1000,
            memory_bytes: 1 << 30,
            pids: 64,
            tmp_bytes: 1 << 20,
            home_bytes: 1 << 20,
            max_output_bytes: 1 << 20,
            ..Default::default()
        },
        network: warren_config::Network::Blocked,
        egress: None,
        connectors: Vec::new(),
        warm: Default::default(),
        env: vec![("A".into(), "key".into()), ("B".into(), "key".into())],
        thread_retention: Default::default(),
        thread_max_bytes: 1 << 30,
        thread_history: 50,
    }
}

#[test]
fn minimal_request_gets_defaults() {
    let r = parse(br#"{"code":"print(1)"}"#).unwrap();
    assert_eq!((r.language, r.timeout), (Language::Python, None));
    let p = plan(r, &key()).unwrap();
    assert_eq!(p.contract.timeout.as_secs(), 30, "the default is capped by the key's maximum");
}

#[test]
fn nulls_are_absent_for_optional_fields_only() {
    assert!(parse(br#"{"code":"x","thread_id":null,"metadata":null}"#).is_ok());
    assert_eq!(field_of(r#"{"code":null}"#).as_deref(), Some("code"));
}

#[test]
fn fields_are_named() {
    let cases = [
        (r#"{"code":"x","timout":5}"#, "timout"),
        (r#"{"code":1}"#, "code"),
        (r#"{"code":"x","timeout":1.5}"#, "timeout"),
        (r#"{"code":"x","timeout":0}"#, "timeout"),
        (r#"{"code":"x","language":"ruby"}"#, "language"),
        (r#"{"code":"x","thread_id":"-a"}"#, "thread_id"),
        (r#"{"code":"x","metadata":{"k":1}}"#, "metadata.k"),
        (r#"{"code":"x","env_vars":{"PATH":"/x"}}"#, "env_vars.PATH"),
        (r#"{"code":"x","sub_paths":["/data/a/../b"]}"#, "sub_paths[0]"),
        (r#"{"code":"x","webhook_url":"https://x y"}"#, "webhook_url"),
    ];
    for (body, field) in cases {
        assert_eq!(field_of(body).as_deref(), Some(field), "{body}");
    }
}

#[test]
fn plan_enforces_the_key() {
    let k = key();
    let r = parse(br#"{"code":"x","language":"node"}"#).unwrap();
    assert_eq!(field_of_refusal(plan(r, &k)).as_deref(), Some("language"));
    let r = parse(br#"{"code":"x","timeout":31}"#).unwrap();
    assert_eq!(field_of_refusal(plan(r, &k)).as_deref(), Some("timeout"));
    let r = parse(br#"{"code":"x","sub_paths":["/data/m/x"]}"#).unwrap();
    assert_eq!(field_of_refusal(plan(r, &k)).as_deref(), Some("sub_paths[0]"));
}

#[test]
fn request_env_wins_over_key_env() {
    let r = parse(br#"{"code":"x","env_vars":{"B":"request","C":"request"}}"#).unwrap();
    let env = plan(r, &key()).unwrap().contract.env;
    let want: std::collections::BTreeMap<String, String> =
        [("A", "key"), ("B", "request"), ("C", "request")].iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    assert_eq!(env, want);
}

fn plan(mut r: ExecuteRequest, key: &EffectiveKey) -> Result<ExecutionSpec, ExecError> {
    ExecutionSpec::new("trc_test".into(), key, &mut r, Delivery::Collected)
}

fn field_of_refusal(r: Result<ExecutionSpec, ExecError>) -> Option<String> {
    match r {
        Err(ExecError::Invalid { field, .. }) => Some(field),
        other => panic!("expected an invalid field, got {other:?}"),
    }
}

#[test]
fn the_spec_carries_the_keys_network_limits_and_thread() {
    let mut k = key();
    k.network = warren_core::Network::Unrestricted;
    let r = parse(br#"{"code":"x","thread_id":"t-1"}"#).unwrap();
    let s = plan(r, &k).unwrap();
    assert_eq!(s.contract.network, warren_core::Network::Unrestricted, "the key's network is not dropped on the way");
    k.egress = Some(vec![warren_core::egress::EgressRule { host: "api.example.com".into(), ports: vec![443] }]);
    let wire = warren_proto::agent::ExecuteRequest::from(plan(parse(br#"{"code":"x"}"#).unwrap(), &k).unwrap().contract);
    assert_eq!(wire.network, warren_proto::agent::NetworkPolicy::Unrestricted as i32);
    assert_eq!((wire.egress[0].host.as_str(), wire.egress[0].ports.as_slice()), ("api.example.com", &[443u32][..]), "nor its allowlist");
    assert_eq!(s.contract.limits, k.limits.into());
    assert_eq!(s.max_output_bytes(), k.limits.max_output_bytes);
    let t = s.contract.thread.as_ref().unwrap();
    assert_eq!((t.namespace.as_str(), t.key_name.as_str(), t.id.as_str(), t.max_bytes), ("default", "k", "t-1", k.thread_max_bytes));
    assert_eq!(s.placement().as_deref(), Some("default/k/t-1"));
    assert_eq!(s.contract.code, "x");
}

#[test]
fn sub_paths_narrow_their_mount_for_one_call() {
    use warren_core::contract::Mount;
    let mut k = key();
    let m = |name: &str| Mount { prefix: "tenants/a".into(), ..Mount::new(name, warren_core::kinds::Provider::S3, "b") };
    k.storage = vec![m("lake"), m("ref")];
    let r = parse(br#"{"code":"x","sub_paths":["/data/lake/reports/2024"]}"#).unwrap();
    let s = plan(r, &k).unwrap();
    let prefixes: Vec<(&str, &str)> = s.contract.mounts.iter().map(|m| (m.name.as_str(), m.prefix.as_str())).collect();
    assert_eq!(prefixes, [("lake", "tenants/a/reports/2024"), ("ref", "tenants/a")], "only the named mount narrows");
    for (body, field) in [
        (&br#"{"code":"x","sub_paths":["/data/lake/a","/data/lake/b"]}"#[..], "sub_paths[1]"),
        (br#"{"code":"x","sub_paths":["/data/nope/a"]}"#, "sub_paths[0]"),
    ] {
        assert_eq!(field_of_refusal(plan(parse(body).unwrap(), &k)).as_deref(), Some(field));
    }
}
