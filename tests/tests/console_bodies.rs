//! The console's request bodies against the real gateway process, which
//! also serves the execute API: bodies sent without a session are never
//! read (answered at once, connection closed, no memory held), a signed-in
//! user's slow body meets the body deadline, and the playground takes
//! programs up to the execute API's code limit.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use warren_e2e::gateway::{ended, wait_for, Gateway};
use warren_e2e::{http, skip_unless_root, Agent};

/// Connections of the attack (the review's own number).
const ATTACKERS: usize = 64;
/// Body bytes each sends before it stalls: under axum's default limit, so
/// a handler reading `Bytes` before its session check would buffer them.
const SENT: usize = 1_900_000;

/// A gateway serving the console in single-machine mode on a free port.
async fn gateway(agents: &[String], dir: &Path, extra: &[&str]) -> (Gateway, SocketAddr) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let link = dir.join("console-link");
    let args = [&["--console-listen", &listen, "--console-link-file", link.to_str().unwrap()][..], extra].concat();
    let gw = Gateway::start(agents, &args, false).await.unwrap();
    let console: SocketAddr = listen.parse().unwrap();
    assert!(wait_for(Duration::from_secs(20), || TcpStream::connect(console).is_ok()), "the console never listened");
    (gw, console)
}

/// Signs the local admin in with the one-time link: the session cookie.
fn sign_in(console: SocketAddr, dir: &Path) -> String {
    let link = std::fs::read_to_string(dir.join("console-link")).unwrap();
    let path = link.trim().replace(&format!("http://{console}"), "");
    let r = http::get(console, &path);
    assert_eq!(r.status, 303, "{}", r.text());
    r.header("set-cookie").unwrap().split(';').next().unwrap().to_string()
}

/// The gateway's resident memory now, bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches("kB").trim().parse::<u64>().unwrap();
    kb * 1024
}

/// One attacker: a form POST declaring 2 MB, [`SENT`] bytes of it written
/// (from another thread, errors ignored: the gateway may close first),
/// then nothing. Its connection and what came back within `wait`.
fn attack(console: SocketAddr, wait: Duration) -> (TcpStream, String) {
    let mut s = TcpStream::connect(console).unwrap();
    let head = "POST /playground HTTP/1.1\r\nHost: console\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 2000000\r\n\r\n";
    s.write_all(head.as_bytes()).unwrap();
    let mut writer = s.try_clone().unwrap();
    writer.set_write_timeout(Some(wait)).unwrap();
    std::thread::spawn(move || {
        let chunk = vec![b'a'; 64 << 10];
        let mut sent = 0;
        while sent < SENT && writer.write_all(&chunk).is_ok() {
            sent += chunk.len();
        }
    });
    s.set_read_timeout(Some(wait)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // Up to the end of the headers (or the connection, or the wait).
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    (s, String::from_utf8_lossy(&got).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cookieless_posts_with_large_slow_bodies_are_refused_unread_and_hold_no_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, console) = gateway(&[format!("unix:{}/no-agent.sock", dir.path().display())], dir.path(), &[]).await;
    // Warm up the console's code paths (and the allocator) before measuring.
    for _ in 0..4 {
        drop(attack(console, Duration::from_secs(10)));
    }
    let before = rss(gw.pid());
    let started = Instant::now();
    let held: Vec<(TcpStream, String)> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..ATTACKERS).map(|_| scope.spawn(|| attack(console, Duration::from_secs(15)))).collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let answered_in = started.elapsed();
    // The attackers' sockets are still open: nothing of their bodies is in the gateway's memory.
    let grown = rss(gw.pid()).saturating_sub(before);
    assert!(grown < 24 << 20, "the gateway grew by {} MiB holding cookie-less bodies", grown >> 20);
    for (_, head) in &held {
        let head = head.to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 303") && head.contains("location: /signin"), "sent to sign in before any body was read: {head:?}");
        assert!(head.contains("connection: close"), "the unread body's connection is closed: {head:?}");
    }
    assert!(answered_in < Duration::from_secs(15), "answered at once, not after the bodies: {answered_in:?}");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_in_users_slow_body_meets_the_body_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (_gw, console) = gateway(&[format!("unix:{}/no-agent.sock", dir.path().display())], dir.path(), &["--body-timeout-ms", "1000"]).await;
    let cookie = sign_in(console, dir.path());
    // A form declaring 100 bytes that sends 5 and then nothing, with a valid session.
    let request = format!("POST /signout HTTP/1.1\r\nHost: console\r\nCookie: {cookie}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ncsrf=");
    let (_open, head) = http::open_until(console, request.as_bytes(), "\r\n\r\n").unwrap();
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 408") && head.contains("connection: close"), "{head}");
    // Still signed in: the refused form changed nothing.
    let account = http::raw(console, format!("GET /account HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    assert_eq!(account.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_kib_program_runs_from_the_playground() {
    if skip_unless_root("a_500_kib_program_runs_from_the_playground") {
        return;
    }
    let agent = Agent::start(&["--pool-size", "0"]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (gw, console) = gateway(&[agent.address()], dir.path(), &[]).await;
    gw.wait_ready(Duration::from_secs(20)).unwrap();
    let cookie = sign_in(console, dir.path());
    let form = http::raw(console, format!("GET /playground HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n").as_bytes()).unwrap().text();
    let csrf = form.split("name=\"csrf\" value=\"").nth(1).and_then(|s| s.split('"').next()).expect("the form's CSRF token").to_string();
    let post = |code: &str| {
        let body = url::form_urlencoded::Serializer::new(String::new()).append_pair("csrf", &csrf).append_pair("key", "default/main").append_pair("language", "python").append_pair("code", code).finish();
        http::post(console, "/playground", &[("Cookie", &cookie), ("Content-Type", "application/x-www-form-urlencoded")], body.as_bytes())
    };
    // 500 KiB of program (a long comment line, then the work), far over a 4 KiB form.
    let program = format!("# {}\nprint('big-program-ran', {})\n", "x".repeat(500 << 10), 500 << 10);
    let ran = post(&program);
    assert_eq!(ran.status, 303, "{}", ran.text());
    let id = ran.header("location").and_then(|l| l.strip_prefix("/executions/")).expect("sent to the run's page").to_string();
    let record = gw.record_when("main", &id, ended);
    assert_eq!(record["stdout"].as_str(), Some("big-program-ran 512000\n"), "{record}");
    // Over the execute API's 1 MiB: refused with the API's reason, not as a forged form.
    let over = post(&"#".repeat(warren_core::bounds::MAX_CODE_BYTES + 1));
    assert_eq!(over.status, 400, "{}", over.text());
    assert!(over.text().contains("the limit is") && !over.text().contains("did not come from your console session"), "{}", over.text());
}
