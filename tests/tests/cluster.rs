//! Warren on a real API server: the operator reconciles the example
//! manifests, the gateway in cluster mode serves the keys it publishes, and
//! two real node-agents run the code. kube-envtest (Kubernetes 1.20) provides
//! the API server; everything else runs as local processes.

use std::time::Duration;

use serde_json::json;
use warren_e2e::gateway::{wait_for, Gateway};
use warren_e2e::kube::{EnvTest, Operator};
use warren_e2e::{skip_unless_root, Agent};

const NS: &str = "warren-system";
/// Where the keys are published: a namespace of their own, as the chart sets it up.
const KEYS: &str = "warren-system-keys";

/// The quickstart on `host`: these tests are about the control plane with
/// local agents (`cluster_images.rs` and `real_node.rs` run the example's image).
fn quickstart_on_host() -> tempfile::TempDir {
    warren_e2e::kube::quickstart_with_image("host")
}

fn secret_value(k: &EnvTest, secret: &str) -> Option<String> {
    secret_entry(k, secret, "key")
}

fn secret_entry(k: &EnvTest, secret: &str, entry: &str) -> Option<String> {
    use base64::Engine as _;
    let path = format!("go-template={{{{index .data \"{entry}\"}}}}");
    let out = k.kubectl(&["get", "secret", secret, "-o", &path]);
    let b64 = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    (out.status.success() && !bytes.is_empty()).then(|| String::from_utf8_lossy(&bytes).into_owned())
}

fn status(gw: &Gateway, key: &str) -> u16 {
    gw.execute(key, &json!({"code": "print(6 * 7)"})).status
}

fn ready(k: &EnvTest, kind: &str, name: &str) -> (String, String) {
    let path = r#"{.status.conditions[?(@.type=="Ready")].status}/{.status.conditions[?(@.type=="Ready")].reason}"#;
    let out = k.kubectl_ok(&["get", kind, name, "-o", &format!("jsonpath={path}")]);
    let (s, r) = out.split_once('/').unwrap_or(("", ""));
    (s.to_string(), r.to_string())
}

fn resource_versions(k: &EnvTest) -> String {
    let mut all = String::new();
    for (kind, ns) in [("sandboxes", "default"), ("apikeys", "default"), ("secrets", "default"), ("secrets", KEYS)] {
        all += &k.kubectl_ok(&["get", kind, "-n", ns, "-o", r#"jsonpath={range .items[*]}{.metadata.name}={.metadata.resourceVersion} {end}"#]);
        all.push('\n');
    }
    all
}

/// An API server with the CRDs, Warren's namespace and a running operator.
fn cluster() -> (EnvTest, Operator) {
    let k = EnvTest::start().unwrap();
    k.install_crds();
    k.kubectl_ok(&["create", "namespace", NS]);
    k.kubectl_ok(&["create", "namespace", KEYS]);
    let operator = Operator::start(&k, NS, KEYS).unwrap();
    (k, operator)
}

/// A gateway in cluster mode in front of `agents`, ready.
async fn cluster_gateway(k: &EnvTest, agents: &[String], extra: &[&str]) -> Gateway {
    let kubeconfig = k.kubeconfig_for_rustls().display().to_string();
    let env = [("KUBECONFIG", kubeconfig.as_str())];
    let args = [&["--cluster", "--namespace", NS, "--keys-namespace", KEYS][..], extra].concat();
    let gw = Gateway::start_with_env(agents, &args, &env, false).await.unwrap();
    // Ready once the published keys were listed, even when there are none yet.
    gw.wait_ready(Duration::from_secs(20)).unwrap();
    gw
}

/// Applies the quickstart and returns the key the operator generated for it.
fn quickstart_key(k: &EnvTest, operator: &Operator) -> String {
    k.kubectl_ok(&["apply", "-f", quickstart_on_host().path().to_str().unwrap()]);
    let mut key = None;
    assert!(wait_for(Duration::from_secs(30), || {
        key = secret_value(k, "agent-key");
        key.is_some()
    }), "no key generated; operator logs:\n{}", operator.logs().join("\n"));
    key.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_gateway_and_agents_on_a_real_api_server() {
    if skip_unless_root("operator_gateway_and_agents_on_a_real_api_server") {
        return;
    }
    let (k, operator) = cluster();
    let a = Agent::start(&["--node-name", "node-a"]).await.unwrap();
    let b = Agent::start(&["--node-name", "node-b"]).await.unwrap();
    let gw = cluster_gateway(&k, &[a.address(), b.address()], &["--webhook-allow-host", "127.0.0.1"]).await;

    // The example: the operator generates the key, marks the ApiKey Ready and publishes it.
    let key = quickstart_key(&k, &operator);
    assert!(key.starts_with("sk-wrn-") && key.len() == 47, "{key}");
    assert!(wait_for(Duration::from_secs(10), || status(&gw, &key) == 200), "key never served; operator:\n{}\ngateway:\n{}", operator.logs().join("\n"), gw.logs().join("\n"));
    // Generated with it: the webhook signing secret, which reaches the gateway (a
    // webhook is accepted; its target, a closed loopback port, is allowed for the test).
    let whsec = secret_entry(&k, "agent-key", "webhook-secret").unwrap_or_default();
    assert!(whsec.starts_with("whsec_") && whsec.len() == 49, "{whsec}");
    let hooked = json!({"code": "print(1)", "webhook_url": "https://127.0.0.1:1/hook"}).to_string();
    let r = warren_e2e::http::post(gw.addr, "/v1/sandbox/execute", &[("Authorization", &format!("Bearer {key}")), ("Content-Type", "application/json"), ("Prefer", "respond-async")], hooked.as_bytes());
    assert_eq!(r.status, 202, "{}", r.text());
    // And the key's E2B alias, which the gateway accepts from the E2B SDKs
    // (through the hash the operator published, never the alias itself).
    let alias = secret_entry(&k, "agent-key", "e2b-key").unwrap_or_default();
    assert_eq!(alias, warren_config::key::e2b_alias(&key));
    let r = warren_e2e::http::post(gw.addr, "/v2/sandboxes", &[("X-API-KEY", &alias), ("Content-Type", "application/json")], br#"{"templateID": "base"}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = gw.execute(&key, &json!({"code": "import os; print(os.environ['APP_ENV'])"}));
    assert_eq!(r.json()["stdout"], "production\n");
    assert_eq!(ready(&k, "apikey", "agent"), ("True".into(), "Published".into()));
    assert_eq!(ready(&k, "sandbox", "default"), ("True".into(), "Valid".into()));
    // Published only in the keys namespace: the gateway needs no Secret anywhere else.
    let label = format!("{}=true", warren_config::published::LABEL);
    assert!(!k.kubectl_ok(&["get", "secrets", "-n", KEYS, "-l", &label, "-o", "name"]).trim().is_empty());
    assert_eq!(k.kubectl_ok(&["get", "secrets", "-n", NS, "-l", &label, "-o", "name"]).trim(), "");
    // The operator's own endpoint: ready, and the reconciles it just did are counted.
    let ops = operator.ops_addr().unwrap();
    assert_eq!(warren_e2e::http::get(ops, "/readyz").status, 200);
    let metrics = warren_e2e::http::get(ops, "/metrics").text();
    for kind in ["ApiKey", "Sandbox"] {
        assert!(metrics.contains(&format!(r#"warren_operator_reconciles_total{{kind="{kind}",result="ok"}}"#)), "{metrics}");
    }
    let prefix = k.kubectl_ok(&["get", "apikey", "agent", "-o", "jsonpath={.status.keyPrefix}"]);
    assert!(key.starts_with(prefix.trim_end_matches('…')) && !prefix.contains(&key), "{prefix}");
    // Both agents serve: idle capacity is spread (distinct node names in the audit log).
    assert!(warren_e2e::http::get(gw.addr, "/metrics").text().contains("warren_gateway_healthy_nodes 2"));
    for _ in 0..8 {
        assert_eq!(status(&gw, &key), 200);
    }
    let both = wait_for(Duration::from_secs(10), || {
        let nodes: std::collections::BTreeSet<String> =
            gw.audit_records().iter().filter_map(|r| r["node"].as_str().map(str::to_string)).collect();
        nodes.contains("node-a") && nodes.contains("node-b")
    });
    assert!(both, "both agents should have run code: {:?}", gw.audit_records());

    // Re-applying the same manifests changes nothing: no status churn, no new key.
    let before = resource_versions(&k);
    k.kubectl_ok(&["apply", "-f", quickstart_on_host().path().to_str().unwrap()]);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(resource_versions(&k), before, "re-applying changed objects");
    assert_eq!(secret_value(&k, "agent-key").as_deref(), Some(key.as_str()));

    // Disabled → 403 within 5 s; enabled again → 200.
    k.kubectl_ok(&["patch", "apikey", "agent", "--type", "merge", "-p", r#"{"spec":{"disabled":true}}"#]);
    assert!(wait_for(Duration::from_secs(5), || status(&gw, &key) == 403), "disable did not reach the gateway");
    k.kubectl_ok(&["patch", "apikey", "agent", "--type", "merge", "-p", r#"{"spec":{"disabled":false}}"#]);
    assert!(wait_for(Duration::from_secs(5), || status(&gw, &key) == 200));

    // A key that widens its Sandbox is not Ready and its key is refused.
    let dir = tempfile::tempdir().unwrap();
    let wide = dir.path().join("wide.yaml");
    std::fs::write(&wide, "apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {name: wide}\nspec: {sandboxRef: {name: default}, maxTimeoutSeconds: 600}\n").unwrap();
    k.kubectl_ok(&["apply", "-f", wide.to_str().unwrap()]);
    assert!(wait_for(Duration::from_secs(15), || ready(&k, "apikey", "wide") == ("False".into(), "InvalidNarrowing".into())));
    let wide_key = secret_value(&k, "wide-key").expect("the key is still generated");
    assert_eq!(status(&gw, &wide_key), 401);
    let msg = k.kubectl_ok(&["get", "apikey", "wide", "-o", r#"jsonpath={.status.conditions[?(@.type=="Ready")].message}"#]);
    assert!(msg.contains("spec.maxTimeoutSeconds"), "{msg}");

    // Rotating a referenced Secret takes effect; the old value stops working.
    let k1 = format!("sk-wrn-{}", "R".repeat(40));
    let k2 = format!("sk-wrn-{}", "S".repeat(40));
    k.kubectl_ok(&["create", "secret", "generic", "rotating", &format!("--from-literal=key={k1}")]);
    k.kubectl_ok(&["label", "secret", "rotating", "warren.dev/consumable=true"]);
    let rot = dir.path().join("rot.yaml");
    std::fs::write(&rot, "apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {name: rot}\nspec: {sandboxRef: {name: default}, secretRef: {name: rotating}}\n").unwrap();
    k.kubectl_ok(&["apply", "-f", rot.to_str().unwrap()]);
    assert!(wait_for(Duration::from_secs(15), || status(&gw, &k1) == 200));
    let patch = format!(r#"{{"stringData":{{"key":"{k2}"}}}}"#);
    k.kubectl_ok(&["patch", "secret", "rotating", "--type", "merge", "-p", &patch]);
    assert!(wait_for(Duration::from_secs(10), || status(&gw, &k2) == 200), "rotation not applied");
    assert_eq!(status(&gw, &k1), 401);
    // Another ApiKey pointing at the same Secret is refused, with the reason;
    // the key that holds it keeps working.
    let thief = dir.path().join("thief.yaml");
    std::fs::write(&thief, "apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {name: thief}\nspec: {sandboxRef: {name: default}, secretRef: {name: rotating}}\n").unwrap();
    k.kubectl_ok(&["apply", "-f", thief.to_str().unwrap()]);
    assert!(wait_for(Duration::from_secs(15), || ready(&k, "apikey", "thief") == ("False".into(), "SecretInUse".into())));
    let msg = k.kubectl_ok(&["get", "apikey", "thief", "-o", r#"jsonpath={.status.conditions[?(@.type=="Ready")].message}"#]);
    assert!(msg.contains("ApiKey default/rot already holds this key value"), "{msg}");
    assert_eq!(ready(&k, "apikey", "rot"), ("True".into(), "Published".into()));
    assert_eq!(status(&gw, &k2), 200);

    // A Connector is Ready once its Secret holds the entries its type needs.
    let cn = dir.path().join("cn.yaml");
    std::fs::write(&cn, "apiVersion: warren.dev/v1alpha1\nkind: Connector\nmetadata: {name: gh}\nspec: {type: GitHub, credentialsSecretRef: {name: gh-creds}}\n").unwrap();
    k.kubectl_ok(&["apply", "-f", cn.to_str().unwrap()]);
    assert!(wait_for(Duration::from_secs(15), || ready(&k, "connector", "gh") == ("False".into(), "SecretNotFound".into())));
    // The attack (#26): a tenant names a Secret of its namespace that was
    // never meant for Warren (another application's); its entries would end
    // up in the tenant's sandboxes. Unlabelled, it is not used at all.
    k.kubectl_ok(&["create", "secret", "generic", "gh-creds", "--from-literal=user=x"]);
    assert!(wait_for(Duration::from_secs(15), || ready(&k, "connector", "gh") == ("False".into(), "SecretNotConsumable".into())));
    let msg = k.kubectl_ok(&["get", "connector", "gh", "-o", r#"jsonpath={.status.conditions[?(@.type=="Ready")].message}"#]);
    assert!(msg.contains("warren.dev/consumable"), "{msg}");
    k.kubectl_ok(&["label", "secret", "gh-creds", "warren.dev/consumable=true"]);
    assert!(wait_for(Duration::from_secs(15), || ready(&k, "connector", "gh") == ("False".into(), "SecretIncomplete".into())));
    k.kubectl_ok(&["patch", "secret", "gh-creds", "--type", "merge", "-p", r#"{"stringData":{"token":"ghp-not-real"}}"#]);
    assert!(wait_for(Duration::from_secs(15), || ready(&k, "connector", "gh") == ("True".into(), "Valid".into())));
    // Outside the tenant namespaces the operator reads no Secret at all,
    // labelled or not (Warren's own namespace, with its CA keys, is never one).
    k.kubectl_ok(&["create", "namespace", "other-team"]);
    let elsewhere = dir.path().join("elsewhere.yaml");
    std::fs::write(
        &elsewhere,
        "apiVersion: v1\nkind: Secret\nmetadata: {name: gh-creds, namespace: other-team, labels: {warren.dev/consumable: \"true\"}}\nstringData: {token: t}\n---\n\
         apiVersion: warren.dev/v1alpha1\nkind: Connector\nmetadata: {name: gh, namespace: other-team}\nspec: {type: GitHub, credentialsSecretRef: {name: gh-creds}}\n",
    )
    .unwrap();
    k.kubectl_ok(&["apply", "-f", elsewhere.to_str().unwrap()]);
    let reason = || k.kubectl_ok(&["get", "connector", "gh", "-n", "other-team", "-o", r#"jsonpath={.status.conditions[?(@.type=="Ready")].reason}/{.status.conditions[?(@.type=="Ready")].message}"#]);
    assert!(wait_for(Duration::from_secs(15), || reason().starts_with("SecretNotConsumable/namespace other-team is not a tenant namespace")), "{}", reason());
    // A key of a Sandbox offering it gets its credentials in every call,
    // published with the key by the operator (never in a log).
    let with_gh = dir.path().join("with-gh.yaml");
    std::fs::write(
        &with_gh,
        "apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {name: with-gh}\nspec: {image: host, languages: [bash], connectors: [{name: gh}]}\n---\n\
         apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {name: gh-user}\nspec: {sandboxRef: {name: with-gh}}\n",
    )
    .unwrap();
    k.kubectl_ok(&["apply", "-f", with_gh.to_str().unwrap()]);
    assert!(wait_for(Duration::from_secs(30), || ready(&k, "apikey", "gh-user") == ("True".into(), "Published".into())));
    let gh_key = secret_value(&k, "gh-user-key").expect("the key is generated");
    let token = || gw.execute(&gh_key, &json!({"language": "bash", "code": "echo \"$GH_TOKEN\""})).json()["stdout"].as_str().map(str::to_string);
    assert!(wait_for(Duration::from_secs(10), || token().as_deref() == Some("ghp-not-real\n")), "{:?}", token());

    // Deleted → 401 (the finalizer withdraws the published key).
    k.kubectl_ok(&["delete", "apikey", "agent", "--wait=true", "--timeout=30s"]);
    assert!(wait_for(Duration::from_secs(5), || status(&gw, &key) == 401));
    for line in operator.logs().iter().chain(gw.logs().iter()) {
        assert!(!line.contains(&key) && !line.contains(&k2) && !line.contains("ghp-not-real"), "a log line holds a secret: {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_finds_agent_pods_by_label() {
    if skip_unless_root("the_gateway_finds_agent_pods_by_label") {
        return;
    }
    let (k, _operator) = cluster();
    // An agent serving TCP with mutual TLS and a token, as the DaemonSet's pods do.
    let dir = tempfile::tempdir().unwrap();
    let tcp = warren_e2e::TcpAgent::start("node-pod").unwrap();
    let (port, token, pki) = (tcp.port, &tcp.token, &tcp.pki);
    let kubeconfig = k.kubeconfig_for_rustls().display().to_string();
    let gateway_tls = pki.gateway_args();
    let port = port.to_string();
    let mut args = vec![
        "--cluster",
        "--namespace",
        NS,
        "--keys-namespace",
        KEYS,
        "--agent-selector",
        "app.kubernetes.io/component=node-agent",
        "--agent-daemonset",
        "warren-node-agent",
        "--agent-port",
        &port,
        "--agent-token-file",
        token.to_str().unwrap(),
    ];
    args.extend(gateway_tls.iter().map(String::as_str));
    let gw = Gateway::start_with_env(&[], &args, &[("KUBECONFIG", kubeconfig.as_str())], false).await.unwrap();
    k.kubectl_ok(&["apply", "-f", quickstart_on_host().path().to_str().unwrap()]);
    let mut key = None;
    assert!(wait_for(Duration::from_secs(30), || {
        key = secret_value(&k, "agent-key");
        key.is_some()
    }));
    let key = key.unwrap();
    // No agent pod yet: nothing can run it.
    assert!(wait_for(Duration::from_secs(10), || status(&gw, &key) == 503));
    // No controller-manager here: the namespace's default ServiceAccount is made by hand.
    k.kubectl_ok(&["create", "serviceaccount", "default", "-n", NS]);
    // First a pod with the agents' labels that the DaemonSet does not control,
    // then a pod of the DaemonSet (no kubelet here: statuses are set by hand).
    let owner = "ownerReferences: [{apiVersion: apps/v1, kind: DaemonSet, name: warren-node-agent, uid: 5f0c1a2e-0000-4000-8000-000000000001, controller: true}]";
    for (name, ip, owned) in [("impostor", "127.0.0.2", false), ("agent-1", "127.0.0.1", true)] {
        let pod = dir.path().join(format!("{name}.yaml"));
        let owner = if owned { format!(", {owner}") } else { String::new() };
        std::fs::write(
            &pod,
            format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {NS}, labels: {{app.kubernetes.io/component: node-agent}}{owner}}}\nspec: {{nodeName: node-x, automountServiceAccountToken: false, containers: [{{name: a, image: warren}}]}}\n"),
        )
        .unwrap();
        k.kubectl_ok(&["apply", "-f", pod.to_str().unwrap()]);
        let running = format!(r#"{{"status":{{"phase":"Running","podIP":"{ip}"}}}}"#);
        k.kubectl_ok(&["patch", "pod", name, "-n", NS, "--subresource=status", "--type=merge", "-p", &running]);
    }
    assert!(wait_for(Duration::from_secs(10), || status(&gw, &key) == 200), "gateway:\n{}", gw.logs().join("\n"));
    // Watch events arrive in order: the impostor was seen before the agent, and never counted.
    let counts: Vec<u64> = gw.logs().iter().filter(|l| l.contains("node-agent pods changed")).filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["agents"].as_u64()).collect();
    assert_eq!(counts.last(), Some(&1), "{counts:?}");
    assert!(!counts.contains(&2), "the impostor pod was taken for an agent: {counts:?}");
    // The audit record is written as the response completes: wait for it.
    assert!(wait_for(Duration::from_secs(10), || gw.audit_records().iter().any(|r| r["node"] == "node-pod")));
    // The operator reports the `host` Sandbox warm where the agent pod runs.
    assert!(wait_for(Duration::from_secs(10), || {
        k.kubectl_ok(&["get", "sandbox", "default", "-o", "jsonpath={.status.warmNodes}"]).contains("node-x")
    }));
    // The pod goes away: so does the agent.
    k.kubectl_ok(&["delete", "pod", "agent-1", "-n", NS, "--grace-period=0", "--force"]);
    assert!(wait_for(Duration::from_secs(10), || status(&gw, &key) == 503));
}

/// An admin's ceiling on the tenant's namespace: the operator refuses the
/// key over it (status names the annotation; the published key is withdrawn)
/// and publishes it again once the ceiling allows it — woken by the
/// Namespace watch, not a resync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_ceiling_withdraws_a_key_over_it_and_lifting_it_restores_the_key() {
    if skip_unless_root("a_namespace_ceiling_withdraws_a_key_over_it_and_lifting_it_restores_the_key") {
        return;
    }
    let (k, _operator) = cluster();
    k.kubectl_ok(&["apply", "-f", quickstart_on_host().path().to_str().unwrap()]);
    let published = |k: &EnvTest| !k.kubectl(&["get", "secrets", "-n", KEYS, "-o", "name"]).stdout.is_empty();
    assert!(wait_for(Duration::from_secs(30), || ready(&k, "apikey", "agent") == ("True".into(), "Published".into()) && published(&k)));
    // The example key asks for maxConcurrency 16.
    k.kubectl_ok(&["annotate", "namespace", "default", "warren.dev/max-concurrency=4"]);
    assert!(wait_for(Duration::from_secs(10), || ready(&k, "apikey", "agent") == ("False".into(), "CeilingExceeded".into())), "{:?}", ready(&k, "apikey", "agent"));
    let message = k.kubectl_ok(&["get", "apikey", "agent", "-o", r#"jsonpath={.status.conditions[?(@.type=="Ready")].message}"#]);
    assert!(message.contains("warren.dev/max-concurrency=4"), "{message}");
    assert!(wait_for(Duration::from_secs(10), || !published(&k)), "the key is withdrawn from the gateways");
    k.kubectl_ok(&["annotate", "namespace", "default", "warren.dev/max-concurrency=16", "--overwrite"]);
    assert!(wait_for(Duration::from_secs(10), || ready(&k, "apikey", "agent") == ("True".into(), "Published".into()) && published(&k)));
}

/// The API server gone for a minute: every call with a published key keeps
/// working (gateways serve what they last listed), and a change made once it
/// is back (the key disabled) reaches the gateway through the operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_outage_keeps_keys_working_and_changes_apply_when_it_returns() {
    if skip_unless_root("an_api_server_outage_keeps_keys_working_and_changes_apply_when_it_returns") {
        return;
    }
    let (k, operator) = cluster();
    let a = Agent::start(&["--node-name", "node-a"]).await.unwrap();
    let gw = cluster_gateway(&k, &[a.address()], &[]).await;
    let key = quickstart_key(&k, &operator);
    assert!(wait_for(Duration::from_secs(10), || status(&gw, &key) == 200), "key never served");

    let api_server = k.stop_api_server();
    let outage = std::time::Instant::now();
    let mut calls = 0;
    while outage.elapsed() < Duration::from_secs(60) {
        assert_eq!(status(&gw, &key), 200, "a call failed {:?} into the outage; gateway:\n{}", outage.elapsed(), gw.logs().join("\n"));
        calls += 1;
        std::thread::sleep(Duration::from_secs(2));
    }
    assert!(calls >= 20, "{calls}");
    k.start_api_server(&api_server);

    // Every watch (the operator's, the gateway's) retries at most every 2 s
    // (`warren_config::watch::ShortBackoff`): the change arrives within
    // seconds. kube-runtime's default pauses (up to 30 s per error, shared
    // by a controller's watches) missed this bound by minutes.
    k.kubectl_ok(&["patch", "apikey", "agent", "--type", "merge", "-p", r#"{"spec":{"disabled":true}}"#]);
    assert!(
        wait_for(Duration::from_secs(30), || status(&gw, &key) == 403),
        "the change did not reach the gateway after the outage; ApiKey:\n{}\npublished:\n{}\noperator:\n{}\ngateway:\n{}",
        k.kubectl_ok(&["get", "apikey", "agent", "-o", "yaml"]),
        k.kubectl_ok(&["get", "secrets", "-n", KEYS, "-o", "yaml"]),
        operator.logs().join("\n"),
        gw.logs().join("\n")
    );
}

/// Storage declared with kubectl: the StorageConnection's Ready reflects a
/// real listing (and says why not), the ApiKey carries the resolved mount,
/// and code through the gateway in cluster mode reads and writes the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_connection_is_checked_and_mounted_from_the_cluster() {
    use warren_e2e::s3::{S3Server, BUCKET};
    if skip_unless_root("a_storage_connection_is_checked_and_mounted_from_the_cluster") {
        return;
    }
    let (k, operator) = cluster();
    let s3 = S3Server::start().unwrap();
    s3.put("tenants/a/in.txt", b"from the bucket");
    let agent = Agent::start(&[]).await.unwrap();
    let gw = cluster_gateway(&k, &[agent.address()], &[]).await;
    let creds: String = s3.credentials().iter().map(|(k, v)| format!("{k}: {v}, ")).collect();
    let connection = |name: &str, bucket: &str, secret: &str| {
        format!("apiVersion: warren.dev/v1alpha1\nkind: StorageConnection\nmetadata: {{name: {name}}}\nspec: {{provider: S3, bucket: {bucket}, prefix: tenants, endpoint: '{}', region: us-east-1, credentialsSecretRef: {{name: {secret}}}}}\n---\n", s3.endpoint())
    };
    let manifests = format!(
        "{}{}{}apiVersion: v1\nkind: Secret\nmetadata: {{name: lake-creds, labels: {{warren.dev/consumable: \"true\"}}}}\nstringData: {{{creds}}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: wrong-creds, labels: {{warren.dev/consumable: \"true\"}}}}\nstringData: {{accessKeyId: nobody, secretAccessKey: wrong}}\n---\n\
         apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {{name: with-data}}\nspec: {{image: host, storage: [{{name: lake, connectionRef: {{name: lake}}, mode: ReadWrite, prefix: a}}]}}\n---\n\
         apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {{name: data}}\nspec: {{sandboxRef: {{name: with-data}}}}\n",
        connection("lake", BUCKET, "lake-creds"),
        connection("denied", BUCKET, "wrong-creds"),
        connection("missing", "no-such-bucket", "lake-creds"),
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("storage.yaml"), manifests).unwrap();
    k.kubectl_ok(&["apply", "-f", dir.path().join("storage.yaml").to_str().unwrap()]);
    for (name, want) in [("lake", "Reachable"), ("denied", "CredentialsRefused"), ("missing", "BucketNotFound")] {
        let ok = wait_for(Duration::from_secs(30), || ready(&k, "storageconnection", name).1 == want);
        assert!(ok, "{name}: {:?}; operator:\n{}", ready(&k, "storageconnection", name), operator.logs().join("\n"));
    }
    assert!(wait_for(Duration::from_secs(30), || ready(&k, "sandbox", "with-data") == ("True".into(), "Valid".into())));
    let mut key = None;
    assert!(wait_for(Duration::from_secs(30), || {
        key = secret_value(&k, "data-key");
        key.is_some()
    }));
    let key = key.unwrap();
    assert!(wait_for(Duration::from_secs(20), || status(&gw, &key) == 200), "operator:\n{}", operator.logs().join("\n"));
    let r = gw.execute(&key, &json!({"code": "print(open('/data/lake/in.txt').read()); open('/data/lake/out.txt', 'w').write('back')"}));
    assert_eq!(r.json()["stdout"], "from the bucket\n", "{}", r.text());
    assert_eq!(s3.get("tenants/a/out.txt").as_deref(), Some(&b"back"[..]));
    assert!(!operator.logs().iter().any(|l| l.contains(s3.secret_key())), "a credential reached the operator's log");
}
