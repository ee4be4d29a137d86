use std::time::Duration;

use super::*;
use crate::bounds::MAX_CODE_BYTES;
use crate::env;

fn spec() -> Spec {
    Spec::new(Language::Python, "print(1)", Duration::from_secs(5))
}

fn field_of(s: Spec) -> String {
    s.check(&NodePolicy::default()).unwrap_err().field
}

#[test]
fn unset_limits_take_the_node_defaults_and_set_ones_are_kept() {
    assert_eq!(spec().check(&NodePolicy::default()).unwrap(), NodePolicy::default().defaults);
    let mut all = NodePolicy::default().maxima;
    all.pids = 100;
    assert_eq!(Spec { limits: all.into(), ..spec() }.check(&NodePolicy::default()).unwrap(), all);
}

#[test]
fn malformed_specs_name_their_field() {
    let env = |name: &str| Spec { env: [(name.to_string(), "v".to_string())].into(), ..spec() };
    let rule = EgressRule { host: "api.example.com".into(), ports: vec![] };
    let cases: Vec<(Spec, &str)> = vec![
        (Spec { code: String::new(), ..spec() }, "code"),
        (Spec { code: "x".repeat(MAX_CODE_BYTES + 1), ..spec() }, "code"),
        (Spec { code: "a\0b".into(), ..spec() }, "code"),
        (Spec { timeout: Duration::ZERO, ..spec() }, "timeout"),
        (Spec { timeout: Duration::from_secs(3601), ..spec() }, "timeout"),
        (Spec { id: "../etc".into(), ..spec() }, "execution_id"),
        (Spec { limits: LimitRequest { memory_bytes: Some(1 << 50), ..Default::default() }, ..spec() }, "limits.memory_bytes"),
        (Spec { limits: LimitRequest { pids: Some(1), ..Default::default() }, ..spec() }, "limits.pids"),
        (Spec { limits: LimitRequest { cpu_millis: Some(99_000), ..Default::default() }, ..spec() }, "limits.cpu_millis"),
        (env("PATH"), "env_vars.PATH"),
        (env("LD_PRELOAD"), "env_vars.LD_PRELOAD"),
        (Spec { egress: vec![rule.clone()], ..spec() }, "egress"),
    ];
    for (s, field) in cases {
        assert_eq!(field_of(s), field);
    }
    assert!(Spec { egress: vec![rule], network: Network::Unrestricted, ..spec() }.check(&NodePolicy::default()).is_ok());
}

#[test]
fn code_of_exactly_one_mebibyte_is_accepted() {
    assert!(Spec { code: "#".repeat(MAX_CODE_BYTES), ..spec() }.check(&NodePolicy::default()).is_ok());
}

#[test]
fn env_rules() {
    let one = |name: &str, value: &str| check_env([(name.to_string(), value.to_string())].iter().map(|(k, v)| (k, v)));
    for name in ["PATH", "LD_PRELOAD", "LC_ALL", "PYTHONPATH", "HTTPS_PROXY", "WARREN_X", "_X", "lower", "1A", "A-B", ""] {
        assert!(one(name, "v").is_err(), "{name} should be refused");
    }
    assert!(one("API_BASE_URL", "https://x").is_ok());
    assert!(one("A", "a\u{1b}b").is_err());
    assert!(one("A", "line1\nline2\t").is_ok());
    assert!(one("A", &"x".repeat(env::MAX_VALUE_BYTES + 1)).is_err());
    let many: BTreeMap<String, String> = (0..=env::MAX_MERGED_VARS).map(|i| (format!("V{i}"), String::new())).collect();
    assert!(check_env(many.iter()).is_err());
}

#[test]
fn only_host_images_are_warm_everywhere() {
    let image = |reference: &str, digest: Option<&str>| Image { reference: reference.into(), digest: digest.map(Into::into), pull: None };
    assert_eq!(image("host", None).warm_key(), None);
    assert_eq!(image("", None).warm_key(), None);
    assert_eq!(image("r/x:1", Some("sha256:ab")).warm_key(), Some("sha256:ab"));
    assert_eq!(image("r/x:1", None).warm_key(), Some("r/x:1"));
}
