//! What stops the gateway at start.

use std::os::unix::fs::PermissionsExt as _;

use clap::Parser as _;

/// The attack: a signing key file others on the machine may read (the
/// default 0644 of a file written by hand) gives them every file URL and
/// every E2B sandbox. The gateway does not start, and says which file,
/// its mode and the fix.
#[tokio::test]
async fn the_gateway_refuses_to_start_with_a_signing_key_file_others_may_read() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("signing.key");
    std::fs::write(&key, "k".repeat(64)).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let records = format!("sqlite://{}/records.db", dir.path().display());
    let (manifests, agent) = (dir.path().display().to_string(), format!("unix:{}/no-agent.sock", dir.path().display()));
    let args = super::Args::parse_from([
        "warren-gateway", "--listen", "127.0.0.1:0", "--manifests", &manifests, "--agent", &agent, "--records", &records,
        "--files-signing-key-file", key.to_str().unwrap(),
    ]);
    let e = tokio::time::timeout(std::time::Duration::from_secs(60), super::run(args)).await.expect("the gateway stopped at start").unwrap_err();
    let text = format!("{e:#}");
    assert!(text.contains(key.to_str().unwrap()) && text.contains("mode 0644") && text.contains("chmod 600"), "{text}");
}
