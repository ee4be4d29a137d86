//! Sandboxes on OCI images through the real node-agent: an image pushed to
//! a real registry (Debian's docker-registry on loopback), pulled on
//! demand, its interpreters discovered, code run inside it read-only, a
//! language it lacks refused, and nothing left mounted after the agent.

use std::time::Duration;

use warren_e2e::registry::{bash_python_image, tar_entries, Registry, TestImage};
use warren_e2e::{request, skip_unless_root, Agent};
use warren_proto::agent::{self as pb, RefusalReason as Reason};
use warren_proto::refusal::refusal_of;

fn mounts_below(dir: &std::path::Path) -> usize {
    let dir = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&dir))).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_runs_inside_a_pulled_image_with_its_interpreters() {
    if skip_unless_root("code_runs_inside_a_pulled_image_with_its_interpreters") {
        return;
    }
    let registry = Registry::start().unwrap();
    let reference = registry.reference("warren/lite:1");
    let digest = bash_python_image().push(&reference).await.unwrap();
    let mut agent = Agent::start(&[]).await.unwrap();
    let mut client = agent.client().await.unwrap();

    // Warm first, as the operator does: digest and interpreters come back.
    let warm = client.warm_image(pb::WarmImageRequest { image: reference.clone(), image_pull: None, warm: vec![] }).await.unwrap().into_inner();
    assert_eq!(warm.digest, digest);
    let langs: Vec<(i32, String)> = warm.languages.iter().map(|l| (l.language, l.version.clone())).collect();
    assert_eq!(langs.len(), 2, "python and bash, no node: {langs:?}");
    assert!(langs[0].0 == pb::Language::Python as i32 && langs[0].1.starts_with("3.11."), "{langs:?}");
    assert!(langs[1].0 == pb::Language::Bash as i32 && langs[1].1.starts_with("5."), "{langs:?}");
    let status = client.status(pb::StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(status.images, [pb::WarmImageInfo { reference: reference.clone(), digest: digest.clone() }]);

    let in_image = |language, code: &str| {
        let mut req = request(language, code, Duration::from_secs(20));
        req.image = reference.clone();
        req.image_digest = digest.clone();
        req
    };
    let probe = r#"
import os, sys
print(sys.version_info[:2] == (3, 11))
print(os.path.exists("/usr/bin/node"), os.path.exists("/etc/os-release"))
print(os.environ.get("IMAGE_FLAVOUR"), os.getuid(), open("/etc/passwd").read().count("sandbox:x:1000"))
for path in ("/usr/bin/pwned", "/etc/pwned", "/pwned", "/run/warren/pwned"):
    try:
        open(path, "w")
        print("WROTE", path)
    except OSError as e:
        print(e.errno)
open("/tmp/ok", "w").write("x")
open(os.path.expanduser("~/ok"), "w").write("x")
print("writable zones ok")
"#;
    let run = agent.run_request(in_image(pb::Language::Python, probe)).await.unwrap();
    assert_eq!(run.exited.exit_code, 0, "{run:?}");
    assert_eq!(
        run.stdout,
        "True\nFalse False\nlite 1000 1\n30\n30\n30\n30\nwritable zones ok\n",
        "the image's own files (no host node, no host os-release), its env, the sandbox user; root and script dir read-only"
    );

    let bash = agent.run_request(in_image(pb::Language::Bash, "id -u; cat /etc/hostname; echo ${BASH_VERSION:0:1}; command -v cut || echo no-cut")).await.unwrap();
    assert_eq!((bash.exited.exit_code, bash.stdout.as_str()), (0, "1000\nsandbox\n5\nno-cut\n"), "{bash:?}");

    // The image has no node: refused before anything runs, naming the language.
    let err = agent.run_request(in_image(pb::Language::Node, "console.log(1)")).await.unwrap_err();
    let status = err.downcast_ref::<tonic::Status>().expect("a gRPC status");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(refusal_of(status), (Reason::LanguageUnavailable, "language".to_string()));

    // A digest the registry does not have for this repository: refused, nothing ran.
    let mut wrong = in_image(pb::Language::Python, "print(1)");
    wrong.image = registry.reference("warren/lite");
    wrong.image_digest = format!("sha256:{}", "0".repeat(64));
    let err = agent.run_request(wrong).await.unwrap_err();
    let status = err.downcast_ref::<tonic::Status>().expect("a gRPC status");
    assert_eq!((status.code(), refusal_of(status).0), (tonic::Code::FailedPrecondition, Reason::Image), "{status:?}");

    let state = agent.state_dir();
    assert!(mounts_below(&state) > 0, "the image root is mounted while the agent runs");
    agent.stop();
    assert_eq!(mounts_below(&state), 0, "the agent unmounts image roots when it stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_images_are_refused_at_the_call_and_the_host_image_still_works() {
    if skip_unless_root("hostile_images_are_refused_at_the_call_and_the_host_image_still_works") {
        return;
    }
    let registry = Registry::start().unwrap();
    let reference = registry.reference("evil/escape:1");
    // A hard link to the host's shadow file, by absolute path.
    let layer = tar_entries(&[(tar::EntryType::Link, "shadow", &b"/etc/shadow"[..]), (tar::EntryType::Directory, "bin/", &b""[..])]);
    TestImage { layers: vec![layer], ..TestImage::default() }.push(&reference).await.unwrap();

    let agent = Agent::start(&[]).await.unwrap();
    let mut req = request(pb::Language::Python, "print(1)", Duration::from_secs(10));
    req.image = reference;
    let err = agent.run_request(req).await.unwrap_err();
    let status = err.downcast_ref::<tonic::Status>().expect("a gRPC status");
    assert_eq!((status.code(), refusal_of(status).0), (tonic::Code::FailedPrecondition, Reason::Image), "{status:?}");
    assert!(status.message().contains("hard link"), "{}", status.message());
    let layers = agent.state_dir().join("images/layers");
    assert_eq!(std::fs::read_dir(&layers).unwrap().count(), 0, "no partial layer kept");

    let ok = agent.run(pb::Language::Python, "print(6 * 7)", Duration::from_secs(10)).await.unwrap();
    assert_eq!(ok.stdout, "42\n", "the host image is unaffected");
}

/// The attack: a second tenant names the digest of an image a first tenant
/// pulled (privately) — through a registry that does not exist, or through
/// a repository that does not hold it — and runs it from the node's warm
/// copy. A warm image serves a caller
/// only after the registry served its manifest to the caller's own
/// credentials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_image_serves_only_callers_the_registry_serves() {
    if skip_unless_root("a_warm_image_serves_only_callers_the_registry_serves") {
        return;
    }
    let registry = Registry::start().unwrap();
    let private = registry.reference("team-a/private:1");
    let digest = bash_python_image().push(&private).await.unwrap();
    let agent = Agent::start(&[]).await.unwrap();
    let run = |image: String, digest: String| {
        let mut req = request(pb::Language::Bash, "echo ran", Duration::from_secs(20));
        req.image = image;
        req.image_digest = digest;
        agent.run_request(req)
    };
    // Tenant A pulls and runs it: the node holds it warm.
    let first = run(private.clone(), digest.clone()).await.unwrap();
    assert_eq!(first.stdout, "ran\n", "{first:?}");
    // A registry nobody runs (a closed loopback port).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let elsewhere = [format!("{closed}/team-a/private"), registry.reference("team-b/anything")];
    for image in elsewhere {
        let err = run(image.clone(), digest.clone()).await.expect_err("ran another tenant's warm image");
        let status = err.downcast_ref::<tonic::Status>().expect("a gRPC status");
        assert_eq!((status.code(), refusal_of(status).0), (tonic::Code::FailedPrecondition, Reason::Image), "{image}: {status:?}");
    }
    // The owner keeps running it from the warm copy.
    assert_eq!(run(private.clone(), digest.clone()).await.unwrap().stdout, "ran\n");
}

// The test registries answer one request per connection, then close it;
// each answer says `connection: close`, or the agent's client could send
// its next request on the pooled connection as the close arrives (a
// failure of the test's server, not of the agent: found flaking in CI).

/// The request line of the next HTTP/1.1 request on `s` (its head read
/// whole, at most 16 KiB), or `None` when the client is gone.
async fn request_line(s: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(n @ 1..) if head.len() < 16 << 10 => head.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).lines().next().unwrap_or_default().to_string())
}

/// A registry that answers every manifest request with an endless manifest
/// and every blob request with an endless body (1 GiB at most, stopping
/// when the client hangs up), over plain HTTP/1.1 on loopback.
async fn endless_registry(config_digest: String) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let config_digest = config_digest.clone();
            tokio::spawn(async move {
                let Some(line) = request_line(&mut s).await else { return };
                let is_manifest = line.contains("/manifests/");
                if line.contains(" /v2/ ") {
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n").await;
                    return;
                }
                let kind = if is_manifest { "application/vnd.oci.image.manifest.v1+json" } else { "application/octet-stream" };
                if is_manifest && line.contains("endless-config") {
                    // A finite manifest whose config blob never ends.
                    let layer = format!("sha256:{}", "e".repeat(64));
                    let body = format!(r#"{{"schemaVersion":2,"config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_digest}","size":100}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"{layer}","size":100}}]}}"#);
                    let _ = s.write_all(format!("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\r\n{body}", body.len()).as_bytes()).await;
                    return;
                }
                let _ = s.write_all(format!("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: {kind}\r\ntransfer-encoding: chunked\r\n\r\n").as_bytes()).await;
                // A manifest that starts well (naming a small config) and never ends.
                let start = format!(r#"{{"schemaVersion":2,"config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_digest}","size":100}},"layers":[],"annotations":{{"x":""#);
                let filler = vec![b'a'; 1 << 20];
                let mut first = is_manifest.then(|| start.into_bytes());
                for _ in 0..1024 {
                    let chunk = first.take().unwrap_or_else(|| filler.clone());
                    let framed = [format!("{:x}\r\n", chunk.len()).into_bytes(), chunk, b"\r\n".to_vec()].concat();
                    if s.write_all(&framed).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, task)
}

/// Peak resident memory of a process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok()).unwrap();
    kb * 1024
}

/// The attack: a registry (anyone's: a tenant names it) serves a manifest
/// that never ends — 1 GiB drove the agent to 2.9 GB RSS — or a config blob
/// that does. The agent reads a manifest up to 4 MiB and a config up to its
/// declared size, refuses, and stays small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_manifests_and_configs_are_cut_while_streaming() {
    if skip_unless_root("endless_manifests_and_configs_are_cut_while_streaming") {
        return;
    }
    let (addr, server) = endless_registry(format!("sha256:{}", "c".repeat(64))).await;
    let agent = Agent::start(&["--pool-size", "0"]).await.unwrap();
    let before = peak_rss(agent.pid());
    for image in [format!("{addr}/evil/endless:manifest"), format!("{addr}/evil/endless@sha256:{}", "d".repeat(64)), format!("{addr}/evil/endless-config:1")] {
        let mut req = request(pb::Language::Bash, "echo ran", Duration::from_secs(20));
        req.image = image.clone();
        let err = agent.run_request(req).await.expect_err("an endless manifest was accepted");
        let status = err.downcast_ref::<tonic::Status>().expect("a gRPC status");
        assert_eq!((status.code(), refusal_of(status).0), (tonic::Code::FailedPrecondition, Reason::Image), "{image}: {status:?}");
        assert!(status.message().contains("larger than"), "{image}: {}", status.message());
    }
    let grown = peak_rss(agent.pid()).saturating_sub(before);
    assert!(grown < 64 << 20, "the agent's peak memory grew by {} MiB", grown >> 20);
    server.abort();
}

/// A registry serving exactly `routes` (path → content type, body) over
/// plain HTTP/1.1 on loopback, 404 for everything else.
async fn fixed_registry(routes: std::collections::HashMap<String, (String, Vec<u8>)>) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let (addr, _, task) = logged_registry(routes).await;
    (addr, task)
}

/// Paths a test registry was asked for, in order.
type RequestLog = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// [`fixed_registry`], also logging every path it is asked for.
async fn logged_registry(routes: std::collections::HashMap<String, (String, Vec<u8>)>) -> (std::net::SocketAddr, RequestLog, tokio::task::JoinHandle<()>) {
    scripted_server("127.0.0.1:0", move |path| match routes.get(path) {
        Some((kind, body)) => [format!("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes(), body.clone()].concat(),
        None if path == "/v2/" => b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n".to_vec(),
        None => b"HTTP/1.1 404 Not Found\r\nconnection: close\r\ncontent-length: 0\r\n\r\n".to_vec(),
    })
    .await
}

/// An HTTP/1.1 server on `bind` answering each request with what `answer`
/// says for its path, logging every path.
async fn scripted_server(bind: &str, answer: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static) -> (std::net::SocketAddr, RequestLog, tokio::task::JoinHandle<()>) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answer = std::sync::Arc::new(answer);
    let log = RequestLog::default();
    let seen = log.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let (answer, seen) = (answer.clone(), seen.clone());
            tokio::spawn(async move {
                loop {
                    let Some(line) = request_line(&mut s).await else { return };
                    let path = line.split(' ').nth(1).unwrap_or_default().to_string();
                    seen.lock().unwrap().push(path.clone());
                    if s.write_all(&answer(&path)).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, log, task)
}

/// The attack: a tenant's image names the node itself — the agent's or
/// another service's loopback port, by address or by name — or a registry
/// of the tenant's whose token realm or redirect points there, and reads
/// the HTTP status back from the refusal. Registries are held to the same
/// endpoint policy as storage and connectors: nothing is sent to a refused
/// destination unless an admin allowed it (`--allow-endpoint`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registries_never_reach_the_node_itself() {
    if skip_unless_root("registries_never_reach_the_node_itself") {
        return;
    }
    let ok = |_: &str| b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n".to_vec();
    let (victim, victim_log, victim_task) = scripted_server("127.0.0.2:0", ok).await;
    async fn run(agent: &Agent, image: String) -> anyhow::Result<warren_e2e::Run> {
        let mut req = request(pb::Language::Bash, "echo ran", Duration::from_secs(20));
        req.image = image;
        agent.run_request(req).await
    }
    // An agent whose admin allowed no loopback address.
    let strict = Agent::start(&["--allow-endpoint", "192.0.2.1/32"]).await.unwrap();
    for image in [format!("{victim}/agent/port:1"), format!("localhost:{}/agent/port:1", victim.port()), "169.254.169.254/meta/data:1".to_string()] {
        let err = run(&strict, image.clone()).await.expect_err("a registry on the node was reached");
        let status = err.downcast_ref::<tonic::Status>().expect("a gRPC status");
        assert!(matches!(status.code(), tonic::Code::PermissionDenied | tonic::Code::FailedPrecondition), "{image}: {status:?}");
        assert!(status.message().contains("--allow-endpoint"), "{image}: the refusal names the grant: {}", status.message());
        assert!(!status.message().contains("200"), "{image}: no status of the node's service comes back: {}", status.message());
    }
    // A registry the admin allowed (127.0.0.1 only) pointing its token
    // realm, or a redirect, at the node's other loopback address.
    let allowed = Agent::start(&["--allow-endpoint", "127.0.0.1/32"]).await.unwrap();
    let realm = format!("HTTP/1.1 401 Unauthorized\r\nconnection: close\r\nwww-authenticate: Bearer realm=\"http://{victim}/token\",service=\"x\"\r\ncontent-length: 0\r\n\r\n").into_bytes();
    let redirect = format!("HTTP/1.1 307 Temporary Redirect\r\nconnection: close\r\nlocation: http://{victim}/v2/x\r\ncontent-length: 0\r\n\r\n").into_bytes();
    for (what, answer) in [("token realm", realm), ("redirect", redirect)] {
        let (addr, _, task) = scripted_server("127.0.0.1:0", move |_| answer.clone()).await;
        let err = run(&allowed, format!("{addr}/tenant/image:1")).await.expect_err(what);
        let status = err.downcast_ref::<tonic::Status>().expect("a gRPC status");
        assert!(matches!(status.code(), tonic::Code::PermissionDenied | tonic::Code::FailedPrecondition), "{what}: {status:?}");
        task.abort();
    }
    assert_eq!(victim_log.lock().unwrap().len(), 0, "the node's service saw no request: {:?}", victim_log.lock().unwrap());
    victim_task.abort();
}

/// What tenant B can hold of tenant A's image `private` without its
/// layers (a leaked pull log, a CI artefact): the exact manifest bytes and
/// the config, with the config's digest.
async fn manifest_and_config(private: &str) -> (Vec<u8>, String, Vec<u8>) {
    let client = oci_client::Client::new(oci_client::client::ClientConfig { protocol: oci_client::client::ClientProtocol::Http, ..Default::default() });
    let reference: oci_client::Reference = private.parse().unwrap();
    let auth = oci_client::secrets::RegistryAuth::Anonymous;
    let (manifest, _) = client.pull_manifest_raw(&reference, &auth, &["application/vnd.oci.image.manifest.v1+json"]).await.unwrap();
    let parsed: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    let config_desc: oci_client::manifest::OciDescriptor = serde_json::from_value(parsed["config"].clone()).unwrap();
    let mut config = Vec::new();
    client.pull_blob(&reference, &config_desc, &mut config).await.unwrap();
    (manifest.to_vec(), config_desc.digest, config)
}

/// The attack: tenant A's private image is warm on the node (A ran it,
/// and the operator warmed it by tag). Tenant B serves A's exact manifest
/// bytes under a tag of B's own registry — no layers, no credentials — and
/// names that tag (alone, or pinned `tag@digest`) in a call and in the
/// operator's `WarmImage`. The tag path used to return the warm digest
/// without the layer proof and record a verdict for B that later
/// digest-pinned calls accepted too: B read A's `/secret.txt`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_warm_image_is_not_served_through_a_tag() {
    if skip_unless_root("another_tenants_warm_image_is_not_served_through_a_tag") {
        return;
    }
    let registry = Registry::start().unwrap();
    let (private, digest, _) = team_a_private_image(&registry).await;
    let agent = Agent::start(&["--pool-size", "0"]).await.unwrap();
    let mut client = agent.client().await.unwrap();
    let run = |image: String| agent.run_request(cat_secret(image));
    // A's image warm both ways: the operator's warm-up by tag, and a call.
    let warmed = client.warm_image(pb::WarmImageRequest { image: private.clone(), image_pull: None, warm: vec![] }).await.unwrap().into_inner();
    assert_eq!(warmed.digest, digest);
    assert_eq!(run(private.clone()).await.unwrap().stdout, "team-a-secret");

    let (manifest, config_digest, config) = manifest_and_config(&private).await;
    let kind = "application/vnd.oci.image.manifest.v1+json".to_string();
    let routes = [
        ("/v2/team-b/copy/manifests/1".to_string(), (kind.clone(), manifest.clone())),
        (format!("/v2/team-b/copy/manifests/{digest}"), (kind, manifest)),
        (format!("/v2/team-b/copy/blobs/{config_digest}"), ("application/octet-stream".to_string(), config)),
    ];
    let (addr, log, server) = logged_registry(routes.into_iter().collect()).await;
    let refused = |what: &str, status: &tonic::Status| {
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{what}: {status:?}");
        assert!(status.message().contains("does not serve layer"), "{what}: {}", status.message());
    };
    for image in [format!("{addr}/team-b/copy:1"), format!("{addr}/team-b/copy:1@{digest}")] {
        let err = run(image.clone()).await.expect_err("B ran A's image through a tag");
        let status = err.downcast_ref::<tonic::Status>().expect("a gRPC status");
        refused(&format!("call {image}"), status);
        assert_eq!(refusal_of(status).0, Reason::Image);
        let warm = client.warm_image(pb::WarmImageRequest { image: image.clone(), image_pull: None, warm: vec![] }).await;
        refused(&format!("WarmImage {image}"), &warm.expect_err("B's tag warmed A's image"));
    }
    // Nothing above left B a verdict that a digest-pinned call could use.
    let err = run(format!("{addr}/team-b/copy@{digest}")).await.expect_err("a verdict was recorded for B");
    refused("the digest after the tags", err.downcast_ref::<tonic::Status>().expect("a gRPC status"));
    let asked = log.lock().unwrap().clone();
    assert!(asked.iter().any(|p| p.starts_with("/v2/team-b/copy/blobs/") && !p.ends_with(&config_digest)), "B's registry was asked for the layers: {asked:?}");
    // The owner is unaffected.
    assert_eq!(run(format!("{private}@{digest}")).await.unwrap().stdout, "team-a-secret");
    server.abort();
}

/// Tenant A's private image (bash and python, and a layer holding
/// `/secret.txt`) pushed to `registry` as `team-a/private:1`: its reference,
/// digest and content.
async fn team_a_private_image(registry: &Registry) -> (String, String, warren_e2e::registry::TestImage) {
    let private = registry.reference("team-a/private:1");
    let mut image = bash_python_image();
    image.layers.push(warren_e2e::registry::tar_of(&[("secret.txt", b"team-a-secret")]));
    let digest = image.push(&private).await.unwrap();
    (private, digest, image)
}

/// A call that prints `/secret.txt` of `image`.
fn cat_secret(image: String) -> pb::ExecuteRequest {
    let mut req = request(pb::Language::Bash, "cat /secret.txt", Duration::from_secs(30));
    req.image = image;
    req
}

/// The attack: tenant A's private image holds a secret layer; tenant B has
/// only A's manifest and config (a leaked pull log, a CI artefact) and a
/// registry of its own that serves them — the exact manifest (the warm
/// image's digest) or one altered to be new — but none of the layers. The
/// node used to run B's calls on A's warm layers. A warm layer now serves
/// new credentials only after their registry streamed its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_layers_serve_only_who_proves_the_registry_serves_them() {
    if skip_unless_root("warm_layers_serve_only_who_proves_the_registry_serves_them") {
        return;
    }
    let registry = Registry::start().unwrap();
    let (private, digest, image) = team_a_private_image(&registry).await;
    let agent = Agent::start(&["--pool-size", "0"]).await.unwrap();
    let run = |image: String| agent.run_request(cat_secret(image));
    assert_eq!(run(format!("{private}@{digest}")).await.unwrap().stdout, "team-a-secret");

    // What tenant B holds: A's manifest and config bytes.
    let (manifest, config_digest, config) = manifest_and_config(&private).await;
    let parsed: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    let mut altered = parsed.clone();
    altered["annotations"] = serde_json::json!({"org.example": "b"});
    let altered = serde_json::to_vec(&altered).unwrap();
    let kind = "application/vnd.oci.image.manifest.v1+json".to_string();
    let routes = [
        (format!("/v2/team-b/copy/manifests/{digest}"), (kind.clone(), manifest.clone())),
        ("/v2/team-b/altered/manifests/1".to_string(), (kind.clone(), altered)),
        (format!("/v2/team-b/altered/blobs/{config_digest}"), ("application/octet-stream".to_string(), config.clone())),
        (format!("/v2/team-b/copy/blobs/{config_digest}"), ("application/octet-stream".to_string(), config)),
    ];
    let (addr, server) = fixed_registry(routes.into_iter().collect()).await;
    for image in [format!("{addr}/team-b/copy@{digest}"), format!("{addr}/team-b/altered:1")] {
        let err = run(image.clone()).await.expect_err("B ran on A's warm layers");
        let status = err.downcast_ref::<tonic::Status>().expect("a gRPC status");
        assert_eq!((status.code(), refusal_of(status).0), (tonic::Code::FailedPrecondition, Reason::Image), "{image}: {status:?}");
        assert!(status.message().contains("does not serve layer"), "{image}: {}", status.message());
    }
    // The owner is unaffected, and a second repository that does hold the
    // layers (pushed by someone who has them) is served after its proof.
    assert_eq!(run(format!("{private}@{digest}")).await.unwrap().stdout, "team-a-secret");
    let mirror = registry.reference("team-c/mirror:1");
    assert_eq!(image.push(&mirror).await.unwrap(), digest);
    assert_eq!(run(format!("{mirror}@{digest}")).await.unwrap().stdout, "team-a-secret");
    server.abort();
}

/// Apparent bytes of the regular files below `dir`.
fn bytes_below(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else { continue };
            if meta.is_dir() {
                stack.push(e.path());
            } else if meta.is_file() {
                total += meta.len();
            }
        }
    }
    total
}

/// The attack: two decompression bombs pulled at once (#26: each checked
/// against `--image-disk` only after its pull, 2 GiB landed against 1 GiB).
/// Every pull's unpacking is now charged, as it streams, to one budget:
/// they cannot both land, and the node's image disk stays within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pulls_share_the_image_disk_budget_while_they_unpack() {
    if skip_unless_root("concurrent_pulls_share_the_image_disk_budget_while_they_unpack") {
        return;
    }
    let registry = Registry::start().unwrap();
    let zeros = vec![0u8; 40 << 20];
    let mut references = Vec::new();
    for name in ["bomb-a", "bomb-b"] {
        let reference = registry.reference(&format!("evil/{name}:1"));
        TestImage { layers: vec![warren_e2e::registry::tar_of(&[(name, &zeros)])], ..TestImage::default() }.push(&reference).await.unwrap();
        references.push(reference);
    }
    let agent = Agent::start(&["--image-disk", "64Mi", "--pool-size", "0"]).await.unwrap();
    let pull = |image: String| {
        let mut req = request(pb::Language::Bash, "true", Duration::from_secs(60));
        req.image = image;
        agent.run_request(req)
    };
    let (a, b) = tokio::join!(pull(references[0].clone()), pull(references[1].clone()));
    let refused_for_disk = |r: &anyhow::Result<warren_e2e::Run>| {
        r.as_ref().err().and_then(|e| e.downcast_ref::<tonic::Status>()).is_some_and(|s| s.message().contains("image disk"))
    };
    assert!(refused_for_disk(&a) || refused_for_disk(&b), "both 40 MiB layers landed under a 64 MiB image disk: {a:?} / {b:?}");
    let on_disk = bytes_below(&agent.state_dir().join("images/layers"));
    assert!(on_disk <= 64 << 20, "the image disk holds {} MiB against 64 MiB", on_disk >> 20);
}
