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
    let warm = client.warm_image(pb::WarmImageRequest { image: reference.clone(), image_pull: None }).await.unwrap().into_inner();
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
