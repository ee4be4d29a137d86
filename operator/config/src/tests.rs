//! Compiler tests: valid configurations, narrowing rules, error naming.

use crate::{compile, Source};

const KEY_A: &str = "sk-wrn-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
const KEY_B: &str = "sk-wrn-BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB";

fn sandbox(extra: &str) -> String {
    format!("apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {{name: sb}}\nspec:\n  image: host\n{extra}")
}

fn api_key(name: &str, extra: &str) -> String {
    format!("apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {{name: {name}}}\nspec:\n  sandboxRef: {{name: sb}}\n{extra}")
}

fn secret(name: &str, key: &str) -> String {
    format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}}}\nstringData:\n  key: {key}\n")
}

fn run(files: &[(&str, String)]) -> crate::Compiled {
    let sources: Vec<Source> = files.iter().map(|(f, t)| Source { file: f, text: t }).collect();
    compile(&sources)
}

fn one_error(files: &[(&str, String)]) -> String {
    let c = run(files);
    assert_eq!(c.errors.len(), 1, "{:?}", c.errors);
    c.errors[0].to_string()
}

#[test]
fn minimal_config_gets_defaults() {
    let c = run(&[("a.yaml", format!("{}---\n{}---\n{}", sandbox(""), api_key("k", ""), secret("k-key", KEY_A)))]);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    let k = &c.keys[0];
    assert_eq!((k.namespace.as_str(), k.name.as_str(), k.sandbox.as_str()), ("default", "k", "sb"));
    assert_eq!(k.limits.cpu_millis, 1000);
    assert_eq!(k.limits.memory_bytes, 1 << 30);
    assert_eq!(k.max_timeout_seconds, 3600);
    assert_eq!(k.max_concurrency, 10);
    assert_eq!(k.languages.len(), 3);
    assert!(k.hash.ct_eq(&crate::key::KeyHash::of(KEY_A)));
    assert_eq!(k.display_prefix, "sk-wrn-AAAA…");
}

#[test]
fn memory_scales_with_cpu_unless_set() {
    let c = run(&[("a.yaml", format!("{}---\n{}---\n{}", sandbox("  resources: {cpu: 2}\n"), api_key("k", ""), secret("k-key", KEY_A)))]);
    assert_eq!(c.keys[0].limits.memory_bytes, 2 << 30);
    let c = run(&[(
        "a.yaml",
        format!("{}---\n{}---\n{}", sandbox("  resources: {cpu: 500m, memory: 256Mi}\n"), api_key("k", ""), secret("k-key", KEY_A)),
    )]);
    assert_eq!((c.keys[0].limits.cpu_millis, c.keys[0].limits.memory_bytes), (500, 256 << 20));
}

#[test]
fn env_merges_sandbox_then_key() {
    let sb = sandbox("  env: [{name: A, value: sandbox}, {name: B, value: sandbox}]\n");
    let k = api_key("k", "  env: [{name: B, value: key}]\n");
    let c = run(&[("a.yaml", format!("{sb}---\n{k}---\n{}", secret("k-key", KEY_A)))]);
    assert_eq!(c.keys[0].env, vec![("A".into(), "sandbox".into()), ("B".into(), "key".into())]);
}

#[test]
fn a_key_may_not_widen_its_timeout() {
    let sb = sandbox("  maxTimeoutSeconds: 60\n");
    let e = one_error(&[("a.yaml", format!("{sb}---\n{}---\n{}", api_key("k", "  maxTimeoutSeconds: 61\n"), secret("k-key", KEY_A)))]);
    assert_eq!(e, "a.yaml: ApiKey default/k: spec.maxTimeoutSeconds: 61 is outside 1–60");
    let c = run(&[("a.yaml", format!("{sb}---\n{}---\n{}", api_key("k", "  maxTimeoutSeconds: 30\n"), secret("k-key", KEY_A)))]);
    assert_eq!(c.keys[0].max_timeout_seconds, 30);
}

#[test]
fn an_idle_pause_is_off_unless_a_key_sets_it_within_its_range() {
    let c = run(&[("a.yaml", format!("{}---\n{}---\n{}", sandbox(""), api_key("k", ""), secret("k-key", KEY_A)))]);
    assert_eq!(c.keys[0].live_idle_seconds, 0, "never paused for idleness by default");
    let c = run(&[("a.yaml", format!("{}---\n{}---\n{}", sandbox(""), api_key("k", "  liveIdleSeconds: 900\n"), secret("k-key", KEY_A)))]);
    assert_eq!(c.keys[0].live_idle_seconds, 900);
    let e = one_error(&[("a.yaml", format!("{}---\n{}---\n{}", sandbox(""), api_key("k", "  liveIdleSeconds: 5\n"), secret("k-key", KEY_A)))]);
    assert_eq!(e, "a.yaml: ApiKey default/k: spec.liveIdleSeconds: 5 is outside 30–86400");
}

#[test]
fn errors_name_file_object_and_field() {
    let cases: Vec<(String, &str)> = vec![
        (sandbox("  timout: 5\n"), "Sandbox default/sb: spec.timout: unknown field `timout`"),
        (sandbox("  resources: {cpu: 8}\n"), "spec.resources.cpu (millicores): 8000 is outside 500–4000"),
        (sandbox("  resources: {memory: lots}\n"), "spec.resources.memory: not a byte quantity"),
        (sandbox("  resources: {pids: 1}\n"), "spec.resources.pids: 1 is outside 8–4096"),
        (sandbox("  env: [{name: LD_PRELOAD, value: x}]\n"), "spec.env[0]: LD_PRELOAD: is reserved"),
        (sandbox("  env: [{name: A, value: x}, {name: A, value: y}]\n"), "spec.env[1]: A is set twice"),
        (sandbox("  network: Open\n"), "spec.network: unknown variant `Open`"),
        (sandbox("  languages: []\n"), "spec.languages: must list at least one language"),
        (sandbox("").replace("image: host", "image: Docker.io/Python"), "spec.image: not an OCI image reference or `host`"),
        (sandbox("").replace("image: host", "image: \"python:\""), "spec.image: not an OCI image reference or `host`: tag"),
        (sandbox("  imagePullSecret: {name: regcred}\n"), "spec.imagePullSecret: the `host` image is not pulled"),
    ];
    for (sb, want) in cases {
        let e = one_error(&[("sb.yaml", sb)]);
        assert!(e.starts_with("sb.yaml: "), "{e}");
        assert!(e.contains(want), "{e:?} should contain {want:?}");
    }
}

#[test]
fn oci_images_compile_with_their_pull_secret() {
    let sb = sandbox("  imagePullSecret: {name: regcred}\n").replace("image: host", "image: 127.0.0.1:5000/warren/runtime:1");
    let auth = "{\"auths\":{\"127.0.0.1:5000\":{\"username\":\"robot\",\"password\":\"hunter2\"}}}";
    let regcred = format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: regcred}}\ntype: kubernetes.io/dockerconfigjson\nstringData:\n  .dockerconfigjson: '{auth}'\n");
    let c = run(&[("a.yaml", format!("{sb}---\n{}---\n{}---\n{regcred}", api_key("k", ""), secret("k-key", KEY_A)))]);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    let k = &c.keys[0];
    assert_eq!(k.image, "127.0.0.1:5000/warren/runtime:1");
    assert_eq!(k.image_digest, None, "single-machine mode: the agent resolves the tag");
    let pull = k.image_pull.as_ref().expect("pull credentials");
    assert_eq!((pull.0["username"].as_str(), pull.0["password"].as_str()), ("robot", "hunter2"));
    assert!(!format!("{k:?}").contains("hunter2"), "credentials never print");

    // A pull secret that is not there refuses the Sandbox, and so its keys.
    let c = run(&[("a.yaml", format!("{sb}---\n{}---\n{}", api_key("k", ""), secret("k-key", KEY_A)))]);
    assert!(c.keys.is_empty());
    assert!(c.errors.iter().any(|e| e.to_string().contains("spec.imagePullSecret: Secret \"regcred\"")), "{:?}", c.errors);
}

#[test]
fn key_errors() {
    let ok_sb = sandbox("");
    let cases: Vec<(String, String, &str)> = vec![
        (api_key("k", ""), String::new(), "spec.secretRef: Secret default/k-key not found"),
        (api_key("k", ""), secret("k-key", "sk-wrn-short"), "is not a Warren key"),
        (api_key("k", ""), secret("k-key", "hunter2hunter2hunter2hunter2hunter2hunter2"), "is not a Warren key"),
        (api_key("k", "  maxConcurrency: 0\n"), secret("k-key", KEY_A), "spec.maxConcurrency: 0 is outside 1–1024"),
        (api_key("k", "  env: [{name: PATH, value: /evil}]\n"), secret("k-key", KEY_A), "spec.env[0]: PATH: is reserved"),
        (api_key("k", "  colour: blue\n"), secret("k-key", KEY_A), "unknown field `colour`"),
        (api_key("k", "").replace("name: sb", "name: nope"), secret("k-key", KEY_A), "spec.sandboxRef.name: no valid Sandbox \"nope\""),
    ];
    for (k, s, want) in cases {
        let e = one_error(&[("sb.yaml", ok_sb.clone()), ("k.yaml", format!("{k}---\n{s}"))]);
        assert!(e.starts_with("k.yaml: ApiKey default/k: "), "{e}");
        assert!(e.contains(want), "{e:?} should contain {want:?}");
        assert!(!e.contains("hunter2"), "secret value leaked: {e}");
    }
}

#[test]
fn base64_data_and_explicit_secret_ref() {
    let s = format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: creds}}\ndata:\n  token: {}\n", "c2std3JuLUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQQ==");
    let k = api_key("k", "  secretRef: {name: creds, key: token}\n");
    let c = run(&[("a.yaml", format!("{}---\n{k}---\n{s}", sandbox("")))]);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    assert!(c.keys[0].hash.ct_eq(&crate::key::KeyHash::of(KEY_A)));
}

#[test]
fn a_key_pointing_at_another_key_s_secret_is_refused_and_the_first_keeps_working() {
    // k2 names k1's Secret; k1 (first in the manifests) keeps its key.
    let k2 = api_key("k2", "  secretRef: {name: k1-key, key: key}\n");
    let c = run(&[("a.yaml", format!("{}---\n{}---\n{k2}---\n{}", sandbox(""), api_key("k1", ""), secret("k1-key", KEY_A)))]);
    assert_eq!(c.keys.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), ["k1"]);
    let e = c.errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n");
    assert_eq!(c.errors.len(), 1, "{e}");
    assert!(e.contains("ApiKey default/k2: spec.secretRef") && e.contains("ApiKey default/k1 already holds this key value"), "{e}");
    // A copied value in a Secret of its own: the same.
    let c = run(&[("a.yaml", format!("{}---\n{}---\n{}---\n{}---\n{}", sandbox(""), api_key("k1", ""), api_key("k2", ""), secret("k1-key", KEY_A), secret("k2-key", KEY_A)))]);
    assert_eq!((c.keys.len(), c.errors.len()), (1, 1));
    let c = run(&[("a.yaml", format!("{}---\n{}---\n{}---\n{}---\n{}", sandbox(""), api_key("k1", ""), api_key("k2", ""), secret("k1-key", KEY_A), secret("k2-key", KEY_B)))]);
    assert_eq!(c.keys.len(), 2);
}

#[test]
fn the_oldest_claim_on_a_secret_holds_it() {
    let own: crate::types::ApiKeySpec = serde_yaml::from_str("sandboxRef: {name: sb}").unwrap();
    let theirs: crate::types::ApiKeySpec = serde_yaml::from_str("sandboxRef: {name: sb}\nsecretRef: {name: a-key, key: key}").unwrap();
    let a = crate::SecretClaim { name: "a", spec: &own, created: 100 };
    let b = crate::SecretClaim { name: "b", spec: &theirs, created: 200 };
    let all = [a, b];
    assert_eq!(crate::secret_holder(&b, &all), Some("a"), "the later claim is refused");
    assert_eq!(crate::secret_holder(&a, &all), None, "the first keeps its key");
    // Created in the same second: the lower name wins, deterministically.
    let b_same = crate::SecretClaim { created: 100, ..b };
    assert_eq!(crate::secret_holder(&b_same, &[a, b_same]), Some("a"));
    let other: crate::types::ApiKeySpec = serde_yaml::from_str("sandboxRef: {name: sb}\nsecretRef: {name: a-key, key: other}").unwrap();
    let c = crate::SecretClaim { name: "c", spec: &other, created: 300 };
    assert_eq!(crate::secret_holder(&c, &[a, c]), None, "another entry of the Secret is another key");
}

#[test]
fn one_bad_object_does_not_take_down_the_others() {
    let c = run(&[
        ("a.yaml", format!("{}---\n{}---\n{}", sandbox(""), api_key("good", ""), secret("good-key", KEY_A))),
        ("b.yaml", api_key("bad", "  maxConcurrency: -1\n")),
    ]);
    assert_eq!(c.keys.len(), 1);
    assert_eq!(c.errors.len(), 1);
    assert!(!c.has_syntax_errors());
}

#[test]
fn syntax_errors_and_envelopes() {
    let c = run(&[("bad.yaml", "kind: [unclosed\n".to_string())]);
    assert!(c.has_syntax_errors());
    assert!(c.errors[0].to_string().starts_with("bad.yaml: "));
    let e = one_error(&[("x.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n".into())]);
    assert!(e.contains("unsupported apiVersion/kind apps/v1/Deployment"), "{e}");
    let e = one_error(&[("x.yaml", sandbox("").replace("name: sb", "name: Bad_Name"))]);
    assert!(e.contains("metadata.name"), "{e}");
    let e = one_error(&[("x.yaml", format!("{}---\n{}", sandbox(""), sandbox("")))]);
    assert!(e.contains("duplicate; first defined in x.yaml"), "{e}");
}

#[test]
fn namespaces_are_separate_tenants() {
    let other = api_key("k", "").replace("metadata: {name: k}", "metadata: {name: k, namespace: other}");
    let e = one_error(&[("a.yaml", format!("{}---\n{other}---\n{}", sandbox(""), secret("k-key", KEY_A)))]);
    assert!(e.contains("no valid Sandbox \"sb\" in namespace other"), "{e}");
}

#[test]
fn storage_narrows_and_resolves_its_connection() {
    let conn = "apiVersion: warren.dev/v1alpha1\nkind: StorageConnection\nmetadata: {name: c}\nspec: {provider: S3, bucket: b, prefix: shared, endpoint: 'http://s3.local:9000', credentialsSecretRef: {name: c-creds}}\n";
    let creds = "apiVersion: v1\nkind: Secret\nmetadata: {name: c-creds}\nstringData: {accessKeyId: AK, secretAccessKey: SK}\n";
    let sb = format!("{conn}---\n{creds}---\n{}", sandbox("  storage: [{name: data, connectionRef: {name: c}, mode: ReadWrite, prefix: acme}]\n"));
    let cases = [
        ("  storage: [{name: data, prefix: other}]\n", "spec.storage[0]: \"other\" is not under"),
        ("  storage: [{name: nope}]\n", "spec.storage[0].name: the Sandbox has no mount named"),
        ("  connectors: [{name: gh}]\n", "spec.connectors: connector \"gh\" is not one of the Sandbox's"),
        ("  storage: [{name: data, prefix: acme/t1}]\n", "spec.storage[0]: \"acme/t1\" is not under the mount's prefix \"shared/acme\""),
    ];
    let errors = |files: String| run(&[("a.yaml", files)]).errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n");
    for (extra, want) in cases {
        let e = errors(format!("{sb}---\n{}---\n{}", api_key("k", extra), secret("k-key", KEY_A)));
        assert!(e.contains(want), "{e:?} should contain {want:?}");
    }
    // A key that narrows: the deeper prefix, read-only; credentials resolved.
    let c = run(&[("a.yaml", format!("{sb}---\n{}---\n{}", api_key("k", "  storage: [{name: data, prefix: shared/acme/t1, mode: ReadOnly}]\n"), secret("k-key", KEY_A)))]);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    let m = &c.keys[0].storage[0];
    assert_eq!((m.name.as_str(), m.provider.as_str(), m.bucket.as_str(), m.prefix.as_str(), m.read_only), ("data", "s3", "b", "shared/acme/t1", true));
    assert_eq!((m.endpoint.as_deref(), m.credentials.0.get("secretAccessKey").map(String::as_str)), (Some("http://s3.local:9000"), Some("SK")));
    assert!(!format!("{:?}", c.keys[0]).contains("SK"), "credentials never print");
    // A key that does not mention the mount gets it as the Sandbox declares it.
    let c = run(&[("a.yaml", format!("{sb}---\n{}---\n{}", api_key("k", ""), secret("k-key", KEY_A)))]);
    assert_eq!((c.keys[0].storage[0].prefix.as_str(), c.keys[0].storage[0].read_only), ("shared/acme", false));
    // Missing credentials, providers not served yet, connectors.
    let no_creds = format!("{conn}---\n{}", sandbox("  storage: [{name: data, connectionRef: {name: c}}]\n"));
    let e = errors(format!("{no_creds}---\n{}---\n{}", api_key("k", ""), secret("k-key", KEY_A)));
    assert!(e.contains("credentials Secret \"c-creds\" was not found"), "{e}");
    // GCS without a Secret: nothing sent but the bucket, and the node's
    // identity only where the Namespace's admin lent it.
    let gcs = "apiVersion: warren.dev/v1alpha1\nkind: StorageConnection\nmetadata: {name: g}\nspec: {provider: GCS, bucket: b}\n";
    let with = |ns: &str| run(&[("a.yaml", format!("{ns}{gcs}---\n{}---\n{}---\n{}", sandbox("  storage: [{name: data, connectionRef: {name: g}}]\n"), api_key("k", ""), secret("k-key", KEY_A)))]);
    let c = with("");
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    let m = &c.keys[0].storage[0];
    assert_eq!((m.provider.as_str(), m.credentials.0.len(), m.ambient_identity), ("gcs", 0, false), "a tenant's manifest never borrows the node's identity");
    let lent = with(&format!("{}---\n", namespace("default", "warren.dev/ambient-identity: 'true'")));
    assert!(lent.keys[0].storage[0].ambient_identity, "the admin's annotation lends it");
    let elsewhere = with(&format!("{}---\n", namespace("other", "warren.dev/ambient-identity: 'true'")));
    assert!(!elsewhere.keys[0].storage[0].ambient_identity, "another namespace's grant");
}

#[test]
fn connectors_resolve_with_their_secrets_and_keys_choose_a_subset() {
    let pg = "apiVersion: warren.dev/v1alpha1\nkind: Connector\nmetadata: {name: pg}\nspec: {type: PostgreSQL, host: db.internal, database: app, username: agent, custody: true, credentialsSecretRef: {name: pg-creds}}\n";
    let gh = "apiVersion: warren.dev/v1alpha1\nkind: Connector\nmetadata: {name: gh}\nspec: {type: GitHub, credentialsSecretRef: {name: gh-creds}}\n";
    let creds = "apiVersion: v1\nkind: Secret\nmetadata: {name: pg-creds}\nstringData: {password: hunter2}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: gh-creds}\nstringData: {token: ghp_x}\n";
    let sb = sandbox("  connectors: [{name: pg}, {name: gh}]\n");
    let compile = |key_extra: &str, extra_objects: &str| run(&[("a.yaml", format!("{pg}---\n{gh}---\n{creds}---\n{sb}---\n{}---\n{}{extra_objects}", api_key("k", key_extra), secret("k-key", KEY_A)))]);
    let c = compile("", "");
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    let names: Vec<&str> = c.keys[0].connectors.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["pg", "gh"]);
    let p = &c.keys[0].connectors[0];
    assert_eq!((p.kind.as_str(), p.host.as_deref(), p.port, p.custody), ("postgresql", Some("db.internal"), Some(5432), true));
    assert_eq!(p.credentials.0.get("password").map(String::as_str), Some("hunter2"));
    assert!(!format!("{:?}", c.keys[0]).contains("hunter2"), "credentials never print");
    let c = compile("  connectors: [{name: gh}]\n", "");
    assert_eq!(c.keys[0].connectors.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["gh"]);
    let e = compile("  connectors: [{name: s3}]\n", "").errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n");
    assert!(e.contains("connector \"s3\" is not one of the Sandbox's"), "{e}");
    // A missing Connector or credentials Secret refuses the key, naming it.
    let e = run(&[("a.yaml", format!("{pg}---\n{sb}---\n{}---\n{}", api_key("k", ""), secret("k-key", KEY_A)))]).errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n");
    assert!(e.contains("Connector \"pg\": its credentials Secret \"pg-creds\" was not found"), "{e}");
    // A Connector checks its own fields.
    let bad = "apiVersion: warren.dev/v1alpha1\nkind: Connector\nmetadata: {name: r}\nspec: {type: Redis, host: cache, custody: true, credentialsSecretRef: {name: r}}\n";
    let e = run(&[("a.yaml", bad.to_string())]).errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n");
    assert!(e.contains("Connector default/r: spec.custody: credential custody is offered for PostgreSQL only"), "{e}");
}

#[test]
fn a_managed_volume_is_scoped_to_its_namespace_and_narrowed_like_a_connection() {
    let sb = sandbox("  storage: [{name: scratch, volume: work, mode: ReadWrite, maxWriteBytes: 2Gi}]\n").replace("{name: sb}", "{name: sb, namespace: team-a}");
    let key = |extra: &str| api_key("k", extra).replace("{name: k}", "{name: k, namespace: team-a}");
    let sec = secret("k-key", KEY_A).replace("{name: k-key}", "{name: k-key, namespace: team-a}");
    let c = run(&[("a.yaml", format!("{sb}---\n{}---\n{sec}", key("  storage: [{name: scratch, prefix: volumes/team-a/work/agent1}]\n")))]);
    assert!(c.errors.is_empty(), "{:?}", c.errors);
    let m = &c.keys[0].storage[0];
    assert_eq!((m.provider.as_str(), m.bucket.as_str(), m.prefix.as_str(), m.read_only), ("volume", "", "volumes/team-a/work/agent1", false));
    assert_eq!(m.max_write_bytes, 2 << 30);
    assert!(m.credentials.0.is_empty() && m.endpoint.is_none(), "the agent's own store: nothing to send");
    let errors = |sb_storage: &str| {
        let sb = sandbox(sb_storage);
        run(&[("a.yaml", format!("{sb}---\n{}---\n{}", api_key("k", ""), secret("k-key", KEY_A)))]).errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
    };
    let e = errors("  storage: [{name: s, volume: work, connectionRef: {name: c}}]\n");
    assert!(e.contains("spec.storage[0]: give exactly one of connectionRef and volume"), "{e}");
    let e = errors("  storage: [{name: s}]\n");
    assert!(e.contains("give exactly one"), "{e}");
    let e = errors("  storage: [{name: s, volume: Work_1}]\n");
    assert!(e.contains("spec.storage[0].volume"), "{e}");
    let e = errors("  storage: [{name: s, volume: work, maxWriteBytes: 100Gi}]\n");
    assert!(e.contains("spec.storage[0].maxWriteBytes"), "{e}");
}

#[test]
fn every_error_carries_its_condition_reason() {
    use warren_api::reasons;
    let reason = |files: &[(&str, String)]| {
        let c = run(files);
        assert_eq!(c.errors.len(), 1, "{:?}", c.errors);
        c.errors[0].reason
    };
    let key = |extra: &str| api_key("k", extra);
    assert_eq!(reason(&[("a", format!("{}---\n{}", key(""), secret("k-key", KEY_A)))]), reasons::SANDBOX_NOT_FOUND);
    assert_eq!(reason(&[("a", format!("{}---\n{}", sandbox(""), key("")))]), reasons::SECRET_INVALID);
    assert_eq!(reason(&[("a", format!("{}---\n{}---\n{}", sandbox(""), key("  maxTimeoutSeconds: 0\n"), secret("k-key", KEY_A)))]), reasons::INVALID_NARROWING);
    let c = run(&[("a", format!("{}---\n{}---\n{}", sandbox("  pids: 1\n"), key(""), secret("k-key", KEY_A)))]);
    let of = |kind: &str| c.errors.iter().find(|e| e.object.as_deref().is_some_and(|o| o.starts_with(kind))).map(|e| e.reason);
    assert_eq!((of("Sandbox"), of("ApiKey")), (Some(reasons::INVALID_SPEC), Some(reasons::SANDBOX_NOT_FOUND)));
    let shared = format!("{}---\n{}---\n{}---\n{}", sandbox(""), key(""), api_key("k2", "  secretRef: {name: k-key}\n"), secret("k-key", KEY_A));
    assert_eq!(reason(&[("a", shared)]), reasons::SECRET_IN_USE);
}

#[test]
fn secret_data_is_decoded_once_and_bad_base64_names_only_the_entry() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(KEY_A);
    let ok = format!("{}---\n{}---\napiVersion: v1\nkind: Secret\nmetadata: {{name: k-key}}\ndata:\n  key: {b64}\n", sandbox(""), api_key("k", ""));
    assert!(run(&[("a", ok)]).errors.is_empty());
    let bad = format!("{}---\n{}---\napiVersion: v1\nkind: Secret\nmetadata: {{name: k-key}}\ndata:\n  key: '{KEY_A}!'\n", sandbox(""), api_key("k", ""));
    let c = run(&[("a", bad)]);
    let shown: Vec<String> = c.errors.iter().map(|e| e.to_string()).collect();
    assert!(shown.iter().any(|e| e.contains("data.key is not valid base64")), "{shown:?}");
    assert!(shown.iter().all(|e| !e.contains(KEY_A)), "the value is never echoed: {shown:?}");
}

fn namespace(name: &str, annotations: &str) -> String {
    format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  annotations: {{{annotations}}}\n")
}

#[test]
fn namespace_ceilings_refuse_keys_that_would_get_more() {
    use warren_api::reasons;
    let base = |sb_extra: &str, key_extra: &str, ns: String| {
        run(&[("a.yaml", format!("{ns}---\n{}---\n{}---\n{}", sandbox(sb_extra), api_key("k", key_extra), secret("k-key", KEY_A)))])
    };
    // Under every ceiling: published as declared.
    let ok = base(
        "  resources: {cpu: 500m, memory: 512Mi}\n",
        "  maxConcurrency: 2\n  maxThreads: 50\n",
        namespace("default", "warren.dev/max-cpu: '1', warren.dev/max-memory: 1Gi, warren.dev/max-concurrency: '4', warren.dev/max-thread-size: 2Gi, warren.dev/max-threads: '100'"),
    );
    assert!(ok.errors.is_empty(), "{:?}", ok.errors);
    for (sb, key, ann, named) in [
        ("  resources: {cpu: 2}\n", "", "warren.dev/max-cpu: '1'", "warren.dev/max-cpu=1000"),
        ("  resources: {cpu: 500m, memory: 2Gi}\n", "", "warren.dev/max-memory: 1Gi", "warren.dev/max-memory=1073741824"),
        ("", "  maxConcurrency: 8\n", "warren.dev/max-concurrency: '4'", "warren.dev/max-concurrency=4"),
        ("  threadMaxSize: 4Gi\n", "", "warren.dev/max-thread-size: 1Gi", "warren.dev/max-thread-size=1073741824"),
        ("", "  maxThreads: 200\n", "warren.dev/max-threads: '100'", "warren.dev/max-threads=100"),
        // The default of 1000 threads is over a lower ceiling: declare fewer.
        ("", "", "warren.dev/max-threads: '100'", "warren.dev/max-threads=100"),
        // Live sandboxes (#46): how many run at once, how long each may be given.
        ("", "  maxLiveSandboxes: 20\n", "warren.dev/max-live-sandboxes: '10'", "warren.dev/max-live-sandboxes=10"),
        ("", "  maxLiveSeconds: 7200\n", "warren.dev/max-live-seconds: '3600'", "warren.dev/max-live-seconds=3600"),
        // The default of 86 400 s is over a lower ceiling: declare less.
        ("", "", "warren.dev/max-live-seconds: '3600'", "warren.dev/max-live-seconds=3600"),
        // What one mount may spool on the node per call (#26).
        ("  storage: [{name: scratch, volume: work, mode: ReadWrite, maxWriteBytes: 2Gi}]\n", "", "warren.dev/max-storage-write: 1Gi", "warren.dev/max-storage-write=1073741824"),
    ] {
        let c = base(sb, key, namespace("default", ann));
        assert!(c.keys.is_empty(), "{ann}: published over the ceiling");
        assert_eq!(c.errors.len(), 1, "{:?}", c.errors);
        assert_eq!(c.errors[0].reason, reasons::CEILING_EXCEEDED);
        assert!(c.errors[0].to_string().contains(named), "{}", c.errors[0]);
    }
    // A malformed ceiling refuses the namespace's keys (a typo never lifts a
    // limit); another namespace's ceilings do not apply here.
    let c = base("", "", namespace("default", "warren.dev/max-memory: 1 GB"));
    assert_eq!(c.errors.iter().map(|e| e.reason).collect::<Vec<_>>(), [reasons::CEILING_EXCEEDED]);
    let c = base("  resources: {cpu: 2}\n", "", namespace("elsewhere", "warren.dev/max-cpu: '1'"));
    assert!(c.errors.is_empty(), "{:?}", c.errors);
}

#[test]
fn egress_allowlists_need_unrestricted_and_keys_only_narrow_them() {
    let compile = |sb_extra: &str, key_extra: &str| run(&[("a.yaml", format!("{}---\n{}---\n{}", sandbox(sb_extra), api_key("k", key_extra), secret("k-key", KEY_A)))]);
    let errors = |c: &crate::Compiled| c.errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n");
    let open = "  network: Unrestricted\n";
    let listed = "  network: Unrestricted\n  egress: {allow: [{host: '*.example.com', ports: [443]}, {host: 198.51.100.0/24}]}\n";
    // No allowlist: every public destination; the key may introduce one.
    let c = compile(open, "");
    assert!(c.errors.is_empty(), "{}", errors(&c));
    assert_eq!((c.keys[0].network, c.keys[0].egress.clone()), (crate::Network::Unrestricted, None));
    let c = compile(open, "  egress: {allow: [{host: pypi.org}]}\n");
    assert_eq!(c.keys[0].egress.as_ref().map(|e| e[0].host.as_str()), Some("pypi.org"));
    // A listed Sandbox: the key inherits, narrows, or is refused for widening.
    let c = compile(listed, "");
    assert_eq!(c.keys[0].egress.as_ref().map(Vec::len), Some(2));
    let c = compile(listed, "  egress: {allow: [{host: api.example.com, ports: [443]}, {host: 198.51.100.128/25, ports: [22]}]}\n");
    assert!(c.errors.is_empty(), "{}", errors(&c));
    for (key, want) in [
        ("  egress: {allow: [{host: api.example.com}]}\n", "spec.egress.allow: \"api.example.com\" is not within the Sandbox's egress allowlist"),
        ("  egress: {allow: [{host: evil.org, ports: [443]}]}\n", "is not within"),
        ("  network: Blocked\n  egress: {allow: [{host: api.example.com, ports: [443]}]}\n", "spec.egress: an allowlist needs network: Unrestricted"),
    ] {
        let e = errors(&compile(listed, key));
        assert!(e.contains(want), "{e:?} should contain {want:?}");
    }
    // A key downgrading to Blocked drops the allowlist with the network.
    let c = compile(listed, "  network: Blocked\n");
    assert_eq!((c.keys[0].network, c.keys[0].egress.clone()), (crate::Network::Blocked, None));
    // The Sandbox's own section: only with Unrestricted, never a private range.
    for (sb, want) in [
        ("  egress: {allow: [{host: a.test}]}\n", "spec.egress: an allowlist needs network: Unrestricted"),
        ("  network: Unrestricted\n  egress: {allow: [{host: 10.0.0.0/8}]}\n", "reach private services through a Connector"),
        ("  network: Unrestricted\n  egress: {allow: []}\n", "at least one destination"),
        ("  network: Unrestricted\n  egress: {allow: [{host: '*'}]}\n", "spec.egress.allow: \"*\""),
    ] {
        let e = errors(&compile(sb, ""));
        assert!(e.contains(want), "{e:?} should contain {want:?}");
    }
}
