//! The console in a cluster, in a real browser (chromium over WebDriver):
//! kube-envtest's API server with the operator publishing one key in each
//! of two tenant namespaces, the gateway in cluster mode in front of a real
//! node-agent, and a real OpenID provider. Two users sign in through the
//! provider's login page: bob (group team-a, a RoleBinding in team-a) sees
//! team-a's executions and keys only — team-b's execution page and a
//! filter naming team-b answer not found — and ada (platform-admins, a
//! ClusterRoleBinding) sees both.

use std::time::Duration;

use serde_json::json;
use warren_e2e::browser::{screenshot_dir, Browser};
use warren_e2e::gateway::{ended, wait_for, Gateway};
use warren_e2e::idp::{Idp, SECRET};
use warren_e2e::kube::{EnvTest, Operator, CONSOLE_RBAC};
use warren_e2e::{skip_unless_root, Agent};

const NS: &str = "warren-system";
const KEYS: &str = "warren-system-keys";

/// A Sandbox on the host's root and one ApiKey in `ns`.
fn tenant(ns: &str) -> String {
    format!("apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {{name: sb, namespace: {ns}}}\nspec: {{image: host}}\n---\napiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {{name: agent, namespace: {ns}}}\nspec: {{sandboxRef: {{name: sb}}}}\n")
}

/// The key the operator generated for `ns`'s ApiKey.
fn key_of(k: &EnvTest, ns: &str) -> Option<String> {
    use base64::Engine as _;
    let out = k.kubectl(&["get", "secret", "agent-key", "-n", ns, "-o", "go-template={{.data.key}}"]);
    let bytes = base64::engine::general_purpose::STANDARD.decode(String::from_utf8_lossy(&out.stdout).trim()).ok()?;
    (out.status.success() && !bytes.is_empty()).then(|| String::from_utf8_lossy(&bytes).into_owned())
}

/// Signs `user` in through the provider's login page; the browser ends on `path`.
fn sign_in(b: &Browser, console: &str, path: &str, user_index: usize) {
    b.goto(&format!("{console}{path}")).unwrap();
    assert!(b.url().unwrap().contains("/interaction/"), "at the provider's login page: {}", b.url().unwrap());
    b.click(&b.find(&format!("select[name=user] option:nth-child({user_index})")).unwrap()).unwrap();
    let back = format!("{console}{path}");
    b.click_to(&b.find("button[type=submit]").unwrap(), |u| u == back).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_user_sees_only_the_namespaces_rbac_gives_them() {
    if skip_unless_root("each_user_sees_only_the_namespaces_rbac_gives_them") {
        return;
    }
    let k = EnvTest::start().unwrap();
    k.install_crds();
    let dir = tempfile::tempdir().unwrap();
    let manifests = dir.path().join("tenants.yaml");
    std::fs::write(&manifests, format!("{CONSOLE_RBAC}\n---\n{}---\n{}", tenant("team-a"), tenant("team-b"))).unwrap();
    for ns in [NS, KEYS] {
        k.kubectl_ok(&["create", "namespace", ns]);
    }
    k.kubectl_ok(&["apply", "-f", manifests.to_str().unwrap()]);
    let tenants = ["--tenant-namespace".to_string(), "team-a,team-b".to_string()];
    let operator = Operator::start_with(&k, NS, KEYS, &tenants).unwrap();
    let mut keys = (None, None);
    assert!(wait_for(Duration::from_secs(30), || {
        keys = (key_of(&k, "team-a"), key_of(&k, "team-b"));
        keys.0.is_some() && keys.1.is_some()
    }), "keys not generated; operator:\n{}", operator.logs().join("\n"));
    let (key_a, key_b) = (keys.0.unwrap(), keys.1.unwrap());

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let console = format!("http://127.0.0.1:{port}");
    let idp = Idp::start_for(&format!("{console}/callback"));
    let secret = dir.path().join("client-secret");
    std::fs::write(&secret, SECRET).unwrap();
    let agent = Agent::start(&["--pool-size", "0"]).await.unwrap();
    let kubeconfig = k.kubeconfig_for_rustls().display().to_string();
    let listen = format!("127.0.0.1:{port}");
    let args = ["--cluster", "--namespace", NS, "--keys-namespace", KEYS, "--console-listen", &listen, "--console-url", &console, "--console-oidc-issuer", &idp.issuer, "--console-oidc-client-secret-file", secret.to_str().unwrap()];
    let gw = Gateway::start_with_env(&[agent.address()], &args, &[("KUBECONFIG", kubeconfig.as_str())], false).await.unwrap();
    gw.wait_ready(Duration::from_secs(20)).unwrap();

    // One execution per tenant, through the API.
    let mut traces = Vec::new();
    for (key, word) in [(&key_a, "from-team-a"), (&key_b, "from-team-b")] {
        let mut r = None;
        assert!(wait_for(Duration::from_secs(20), || {
            r = Some(gw.execute(key, &json!({"code": format!("print('{word}')")})));
            r.as_ref().is_some_and(|r| r.status == 200)
        }), "the key is never served: {}", r.map(|r| r.text()).unwrap_or_default());
        traces.push(r.unwrap().json()["trace_id"].as_str().unwrap().to_string());
    }
    let (trace_a, trace_b) = (traces[0].clone(), traces[1].clone());
    gw.record_when_with(&key_a, &trace_a, ended);
    gw.record_when_with(&key_b, &trace_b, ended);
    let shots = screenshot_dir();

    // bob (team-a): team-a only, also when he types team-b's URLs.
    let b = Browser::start().unwrap();
    sign_in(&b, &console, "/executions", 2);
    let list = b.text().unwrap();
    assert!(list.contains("bob@example.test") && list.contains(&trace_a) && !list.contains(&trace_b), "{list}");
    b.screenshot(&shots, "cluster-executions-team-a").unwrap();
    b.goto(&format!("{console}/executions/{trace_b}")).unwrap();
    assert!(b.text().unwrap().contains("There is no such page") && !b.source().unwrap().contains("from-team-b"), "another tenant's execution is not found");
    b.goto(&format!("{console}/executions?namespace=team-b")).unwrap();
    assert!(b.text().unwrap().contains("There is no such page"), "a filter naming another tenant is not found");
    b.goto(&format!("{console}/executions/{trace_a}")).unwrap();
    assert!(b.text().unwrap().contains("from-team-a"), "his own execution's output");
    b.goto(&format!("{console}/keys")).unwrap();
    let keys_page = b.text().unwrap();
    assert!(keys_page.contains("team-a") && !keys_page.contains("team-b"), "{keys_page}");
    assert!(!keys_page.contains("Disable"), "viewing is not changing: no button without patch on ApiKeys");
    // Posted anyway, with his own session and token: his RBAC refuses; another tenant's key is not found.
    let csrf = csrf_of(&b.source().unwrap());
    let form = format!("csrf={csrf}");
    let cookie = b.cookie("warren_console").unwrap();
    let console_addr: std::net::SocketAddr = listen.parse().unwrap();
    let post = |path: &str| warren_e2e::http::post(console_addr, path, &[("Cookie", &cookie), ("Content-Type", "application/x-www-form-urlencoded")], form.as_bytes()).status;
    assert_eq!(post("/keys/team-a/agent/disable"), 403);
    assert_eq!(post("/keys/team-b/agent/disable"), 404);
    assert_eq!(gw.execute(&key_a, &json!({"code": "print(1)"})).status, 200, "nothing changed");
    // The playground offers team-a's key only (he may `use` its Sandboxes) and records the run as his.
    b.goto(&format!("{console}/playground")).unwrap();
    let options = b.source().unwrap();
    assert!(options.contains("value=\"team-a/agent\"") && !options.contains("team-b"), "{options}");
    b.type_into(&b.find("textarea[name=code]").unwrap(), "print('played-by-bob')").unwrap();
    b.click_to(&b.find("form.playground button").unwrap(), |u| u.contains("/executions/trc_")).unwrap();
    let played = b.url().unwrap().rsplit('/').next().unwrap().to_string();
    let v = gw.record_when_with(&key_a, &played, ended);
    assert_eq!((v["stdout"].as_str(), v["delivery_mode"].as_str(), v["metadata"]["console.user"].as_str()), (Some("played-by-bob\n"), Some("console"), Some("bob@example.test")), "{v}");
    b.goto(&format!("{console}/executions/{played}")).unwrap();
    assert!(b.text().unwrap().contains("played-by-bob"));
    // Objects from the API server: Ready, the manifest for Git, events; another tenant's: not found.
    b.goto(&format!("{console}/objects/apikeys")).unwrap();
    let objects = b.text().unwrap();
    assert!(objects.contains("team-a/agent") && objects.contains("True") && !objects.contains("team-b"), "{objects}");
    b.click_to(&b.find("a[href='/objects/apikeys/team-a/agent']").unwrap(), |u| u.ends_with("/team-a/agent")).unwrap();
    let object = b.text().unwrap();
    assert!(object.contains("sandboxRef") && object.contains("kind: ApiKey") && !object.contains("managedFields") && !object.contains(&key_a), "{object}");
    b.screenshot(&shots, "cluster-object-apikey").unwrap();
    b.goto(&format!("{console}/objects/apikeys/team-b/agent")).unwrap();
    assert!(b.text().unwrap().contains("There is no such page"));
    let forged = format!("csrf={csrf}&key=team-b%2Fagent&language=python&code=print(1)");
    let r = warren_e2e::http::post(console_addr, "/playground", &[("Cookie", &cookie), ("Content-Type", "application/x-www-form-urlencoded")], forged.as_bytes());
    assert_eq!(r.status, 403, "another tenant's key is refused");
    drop(b);

    // ada (platform-admins): every tenant.
    let b = Browser::start().unwrap();
    sign_in(&b, &console, "/executions", 1);
    let list = b.text().unwrap();
    assert!(list.contains("ada@example.test") && list.contains(&trace_a) && list.contains(&trace_b), "{list}");
    b.goto(&format!("{console}/executions/{trace_b}")).unwrap();
    assert!(b.text().unwrap().contains("from-team-b"));
    b.goto(&format!("{console}/")).unwrap();
    b.screenshot(&shots, "cluster-overview-admin").unwrap();

    // ada disables team-b's key in an emergency: the gateway refuses it within moments.
    b.goto(&format!("{console}/keys")).unwrap();
    b.click_to(&b.find("form[action='/keys/team-b/agent/disable'] button").unwrap(), |u| u.ends_with("/keys")).unwrap();
    assert!(wait_for(Duration::from_secs(20), || gw.execute(&key_b, &json!({"code": "print(1)"})).status == 403), "the disabled key is still served");
    assert_eq!(gw.execute(&key_a, &json!({"code": "print(1)"})).status, 200, "the other tenant's key is untouched");
    // Applied under the console's own field manager, so GitOps sees the drift.
    let managers = k.kubectl_ok(&["get", "apikey", "agent", "-n", "team-b", "-o", "jsonpath={.metadata.managedFields[*].manager}"]);
    assert!(managers.contains("warren-console"), "{managers}");
    assert_eq!(k.kubectl_ok(&["get", "apikey", "agent", "-n", "team-b", "-o", "jsonpath={.spec.disabled}"]).trim(), "true");
    b.goto(&format!("{console}/keys")).unwrap();
    assert!(wait_for(Duration::from_secs(20), || {
        let _ = b.goto(&format!("{console}/keys"));
        b.find("form[action='/keys/team-b/agent/enable'] button").is_ok()
    }), "the key shows as disabled");
    b.screenshot(&shots, "cluster-keys-admin").unwrap();
    b.goto(&format!("{console}/activity")).unwrap();
    let activity = b.text().unwrap();
    assert!(activity.contains("ada@example.test") && activity.contains("disable-key") && activity.contains("team-b/agent"), "{activity}");
    // And enables it again.
    b.goto(&format!("{console}/keys")).unwrap();
    b.click_to(&b.find("form[action='/keys/team-b/agent/enable'] button").unwrap(), |u| u.ends_with("/keys")).unwrap();
    assert!(wait_for(Duration::from_secs(20), || gw.execute(&key_b, &json!({"code": "print(1)"})).status == 200), "the enabled key is not served");
}

/// The session's CSRF token, from a page's sign-out form.
fn csrf_of(source: &str) -> String {
    source.split("name=\"csrf\" value=\"").nth(1).and_then(|s| s.split('"').next()).expect("a CSRF token").to_string()
}
