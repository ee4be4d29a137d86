//! Webhooks end to end: a real gateway and node-agent deliver async results
//! to an HTTPS receiver on loopback (a test CA the gateway is told to trust;
//! the operator's `--webhook-allow-host 127.0.0.1`), signed, retried with
//! backoff, the outcome recorded — and SSRF refused: private and metadata
//! addresses, names that resolve to loopback, redirects to either.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::json;
use warren_e2e::gateway::{key, wait_for, webhook_secret, Gateway};
use warren_e2e::{http, skip_unless_root, Agent};

/// The receiver (tests/support/webhook_receiver.py); killed on drop.
struct Receiver {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Receiver {
    fn start(dir: &Path, cert: &Path, key: &Path) -> Receiver {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("support/webhook_receiver.py");
        let log = dir.join("requests.jsonl");
        let mut child = Command::new("python3").arg(script).arg(cert).arg(key).arg(&log).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("python3");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("receiver port");
        Receiver { port: line.trim().parse().expect("a port"), child, log }
    }

    fn url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.port)
    }

    /// Requests received so far on `path`.
    fn requests(&self, path: &str) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).filter(|r| r["path"] == path).collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// POSTs an async execution with `webhook_url`; the response.
fn submit(gw: &Gateway, key_name: &str, url: &str) -> http::Response {
    let body = json!({"code": "echo hooked", "language": "bash", "webhook_url": url}).to_string();
    let k = key(key_name);
    http::post(gw.addr, "/v1/sandbox/execute", &[("Authorization", &format!("Bearer {k}")), ("Content-Type", "application/json"), ("Prefer", "respond-async")], body.as_bytes())
}

/// The record once its webhook is no longer pending.
fn settled(gw: &Gateway, trace: &str) -> serde_json::Value {
    gw.record_when("main", trace, |v| v["webhook_delivery_status"].as_str().is_some_and(|s| s != "pending"))
}

fn accepted(r: &http::Response) -> String {
    assert_eq!(r.status, 202, "{}", r.text());
    r.json()["trace_id"].as_str().unwrap().to_string()
}

/// A receiver with a fresh test CA, and the gateway flags that trust it and
/// allow its host (directory, receiver, flags).
fn lab() -> (tempfile::TempDir, Receiver, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let (ca, leaf) = warren_e2e::pki::loopback_server(dir.path());
    let rx = Receiver::start(dir.path(), &leaf.cert, &leaf.key);
    let flags = vec!["--webhook-allow-host".into(), "127.0.0.1".into(), "--webhook-ca-file".into(), ca.display().to_string()];
    (dir, rx, flags)
}

fn redirect(to: &str) -> String {
    format!("/redirect/{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(to))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_signed_retried_recorded_and_never_reach_private_addresses() {
    if skip_unless_root("webhooks_are_signed_retried_recorded_and_never_reach_private_addresses") {
        return;
    }
    let (_dir, rx, mut flags) = lab();
    let agent = Agent::start(&[]).await.unwrap();
    flags.extend(["--webhook-retry-base-ms", "100", "--webhook-attempts", "4"].map(String::from));
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let gw = Gateway::start(&[agent.address()], &args, true).await.unwrap();

    // Two failures, then delivered: three signed attempts, the result in the body.
    let trace = accepted(&submit(&gw, "main", &rx.url("127.0.0.1", "/flaky")));
    let v = settled(&gw, &trace);
    assert_eq!((v["status"].as_str(), v["webhook_delivery_status"].as_str(), v["webhook_attempts"].as_u64()), (Some("success"), Some("delivered"), Some(3)), "{v}");
    let got = rx.requests("/flaky");
    assert_eq!(got.len(), 3, "{got:?}");
    for r in &got {
        let h = &r["headers"];
        let (ts, sig, body) = (h["warren-webhook-timestamp"].as_str().unwrap(), h["warren-signature"].as_str().unwrap(), r["body"].as_str().unwrap());
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(webhook_secret("main").as_bytes()).unwrap();
        mac.update(format!("{ts}.{body}").as_bytes());
        let hex: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(sig, format!("v1={hex}"), "the signature verifies with the key's webhook secret");
        assert_eq!(h["warren-webhook-id"], trace.as_str());
        let payload: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!((payload["trace_id"].as_str(), payload["status"].as_str(), payload["stdout"].as_str()), (Some(trace.as_str()), Some("success"), Some("hooked\n")));
    }

    // A rejection (410) is final: one attempt, `failed`.
    let trace = accepted(&submit(&gw, "main", &rx.url("127.0.0.1", "/gone")));
    let v = settled(&gw, &trace);
    assert_eq!((v["webhook_delivery_status"].as_str(), v["webhook_attempts"].as_u64()), (Some("failed"), Some(1)), "{v}");

    // Literal private, metadata and loopback addresses, http, credentials: refused at submit.
    for url in ["https://10.200.0.10/hook", "https://169.254.169.254/latest/meta-data", "https://[::1]:1/x", "http://example.com/hook", "https://u:p@example.com/"] {
        let r = submit(&gw, "main", url);
        assert_eq!((r.status, r.json()["field"].as_str()), (400, Some("webhook_url")), "{url}: {}", r.text());
    }
    // A name that resolves to loopback is not the allowed host: refused at delivery, never sent.
    let trace = accepted(&submit(&gw, "main", &rx.url("localhost", "/by-name")));
    assert_eq!(settled(&gw, &trace)["webhook_delivery_status"], "refused");
    assert!(rx.requests("/by-name").is_empty());
    // Redirects from the allowed receiver to the metadata address and to a
    // loopback name are refused on the hop: only the first request is made.
    for (path, to) in [(redirect("https://169.254.169.254/latest/meta-data"), "metadata"), (redirect(&rx.url("localhost", "/after-redirect")), "loopback name")] {
        let trace = accepted(&submit(&gw, "main", &rx.url("127.0.0.1", &path)));
        let v = settled(&gw, &trace);
        assert_eq!((v["webhook_delivery_status"].as_str(), v["webhook_attempts"].as_u64()), (Some("refused"), Some(1)), "redirect to {to}: {v}\n{:?}", gw.logs().iter().filter(|l| l.contains("webhook")).collect::<Vec<_>>());
        assert_eq!(rx.requests(&path).len(), 1);
    }
    assert!(rx.requests("/after-redirect").is_empty());

    // A key whose Secret has no webhook secret cannot ask for webhooks.
    let manifest = format!(
        "apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {{name: nohook}}\nspec: {{sandboxRef: {{name: sb}}}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: nohook-key}}\nstringData: {{key: {}}}\n",
        key("nohook")
    );
    std::fs::write(gw.manifest_dir().join("nohook.yaml"), manifest).unwrap();
    assert!(wait_for(Duration::from_secs(20), || gw.execute(&key("nohook"), &json!({"code": "true", "language": "bash"})).status == 200));
    let r = submit(&gw, "nohook", &rx.url("127.0.0.1", "/ok"));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("webhook signing secret"), "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_gateways_webhook_is_delivered_by_another() {
    if skip_unless_root("a_stopped_gateways_webhook_is_delivered_by_another") {
        return;
    }
    let (dir, rx, mut flags) = lab();
    let agent = Agent::start(&[]).await.unwrap();
    flags.extend(["--records".into(), format!("sqlite://{}/records.db", dir.path().display()), "--record-lease-secs".into(), "2".into()]);
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut first = Gateway::start(&[agent.address()], &args, true).await.unwrap();
    let second = Gateway::start(&[agent.address()], &args, true).await.unwrap();
    let body = json!({"code": "echo up; sleep 50", "language": "bash", "webhook_url": rx.url("127.0.0.1", "/ok")}).to_string();
    let k = key("main");
    let r = http::post(first.addr, "/v1/sandbox/execute", &[("Authorization", &format!("Bearer {k}")), ("Content-Type", "application/json"), ("Prefer", "respond-async")], body.as_bytes());
    let trace = accepted(&r);
    assert!(wait_for(Duration::from_secs(20), || second.get(&k, &format!("/v1/executions/{trace}")).status == 200));
    first.kill();
    // The second gateway ends the record (the sandbox died with the stream) and delivers it.
    let v = settled(&second, &trace);
    assert_eq!((v["status"].as_str(), v["error"].as_str(), v["webhook_delivery_status"].as_str()), (Some("failed"), Some("gateway_lost"), Some("delivered")), "{v}");
    let got = rx.requests("/ok");
    assert_eq!(got.len(), 1, "{got:?}");
    let payload: serde_json::Value = serde_json::from_str(got[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!((payload["trace_id"].as_str(), payload["error"].as_str()), (Some(trace.as_str()), Some("gateway_lost")));
}
