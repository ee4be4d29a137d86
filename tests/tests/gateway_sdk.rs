//! The public Baponi Python SDK, unmodified, against Warren: `execute`,
//! `execute_stream`, the async client and the exceptions it maps
//! and its Anthropic tool integration (tests/sdk/check_sdk.py). The
//! virtualenv is made by this test with `pip install baponi[anthropic]==0.5.1`.

use std::path::Path;
use std::process::Command;

use warren_e2e::gateway::{key, Gateway};
use warren_e2e::{skip_unless_root, Agent};

/// The SDK with its Anthropic integration (`anthropic` is a real dependency
/// of that module; no model is called: the test drives its tool handler).
const SDK: &str = "baponi[anthropic]==0.5.1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_baponi_sdk_works_against_warren() {
    if skip_unless_root("the_baponi_sdk_works_against_warren") {
        return;
    }
    let venv = warren_e2e::python::venv("sdk-venv", SDK);
    // A Local storage mount for check_sub_paths, declared like any other
    // (its directory allowed by the agent's admin).
    let data = tempfile::tempdir().unwrap();
    let root = data.path().canonicalize().unwrap().display().to_string();
    let agent = Agent::start(&["--local-storage-root", &root]).await.unwrap();
    // A key at its limit waits the queue wait before its 429: 2 s here, far
    // from the 30 s the held execution lasts, so the SDK sees the 429 and
    // never the slot coming back.
    let gw = Gateway::start(&[agent.address()], &["--queue-wait-ms", "2000"], true).await.unwrap();
    std::fs::create_dir(data.path().join("in")).unwrap();
    std::fs::write(data.path().join("in/a.txt"), "a").unwrap();
    let storage = format!(
        "apiVersion: warren.dev/v1alpha1\nkind: StorageConnection\nmetadata: {{name: files}}\nspec: {{provider: Local, bucket: {}}}\n---\n\
         apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {{name: with-files}}\nspec: {{image: host, storage: [{{name: files, connectionRef: {{name: files}}, mode: ReadWrite}}]}}\n---\n\
         apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {{name: files}}\nspec: {{sandboxRef: {{name: with-files}}}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: files-key}}\nstringData: {{key: {}}}\n---\n\
         apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {{name: with-volume}}\nspec: {{image: host, storage: [{{name: work, volume: work, mode: ReadWrite}}]}}\n---\n\
         apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {{name: vol}}\nspec: {{sandboxRef: {{name: with-volume}}}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: vol-key}}\nstringData: {{key: {}}}\n",
        root,
        key("files"),
        key("vol")
    );
    std::fs::write(gw.manifest_dir().join("storage.yaml"), storage).unwrap();
    let loaded = warren_e2e::gateway::wait_for(std::time::Duration::from_secs(20), || gw.execute(&key("files"), &serde_json::json!({"code": "print(1)"})).status == 200 && gw.execute(&key("vol"), &serde_json::json!({"code": "print(1)"})).status == 200);
    assert!(loaded, "the storage manifests never loaded: {:?}", gw.logs());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("sdk/check_sdk.py");
    let mut cmd = Command::new(venv.join("bin/python"));
    cmd.arg(&script).env("WARREN_URL", format!("http://{}", gw.addr));
    for k in ["main", "single", "off", "bashonly", "files", "vol"] {
        cmd.env(format!("WARREN_KEY_{}", k.to_uppercase()), key(k));
    }
    let out = tokio::task::spawn_blocking(move || cmd.output()).await.unwrap().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(std::fs::read_to_string(data.path().join("out.txt")).ok().as_deref(), Some("from the sdk"), "{stdout}");
    let warnings: Vec<String> = gw.logs().into_iter().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    assert!(out.status.success(), "SDK checks failed:\n{stdout}\n{}\ngateway warnings: {warnings:#?}", String::from_utf8_lossy(&out.stderr));
    for check in ["check_execute", "check_stream", "check_async", "check_errors", "check_rate_limit_and_thread_busy", "check_anthropic_tool", "check_sub_paths", "check_async_execution", "check_cancel", "check_files", "check_volume_files"] {
        assert!(stdout.contains(&format!("ok {check}")), "{check} did not run:\n{stdout}");
    }
}
