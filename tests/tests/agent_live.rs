//! Live sandboxes against the real agent binary: processes side by side
//! and in the background, re-attaching, stdin, signals, terminals, the
//! home saved at the end, lifetimes, and the walls between sandboxes.

use std::time::Duration;

use tonic::Code;
use warren_e2e::{request, skip_unless_root, Agent};
use warren_proto::agent::{self as pb, live_event::Event as Ev, node_agent_client::NodeAgentClient, Language};

type Client = NodeAgentClient<tonic::transport::Channel>;

const T: Duration = Duration::from_secs(30);

fn live_ref(key: &str, id: &str) -> pb::LiveRef {
    pb::LiveRef { r#ref: Some(pb::ThreadRef { namespace: "default".into(), key_name: key.into(), thread_id: id.into() }) }
}

fn thread(key: &str, id: &str) -> pb::ThreadOptions {
    pb::ThreadOptions { r#ref: live_ref(key, id).r#ref, retention_seconds: 0, max_bytes: 64 << 20, max_threads: 0, history_versions: 0 }
}

/// Creates a live sandbox whose home is the thread `id` of `key`.
async fn create(c: &mut Client, key: &str, id: &str, lifetime: Duration, limits: Option<pb::Limits>) -> Result<(), tonic::Status> {
    let mut sandbox = request(Language::Bash, "", T);
    sandbox.thread = Some(thread(key, id));
    sandbox.limits = limits;
    let req = pb::LiveCreateRequest { live: Some(live_ref(key, id)), sandbox: Some(sandbox), lifetime_ms: lifetime.as_millis() as u64 };
    c.live_create(req).await.map(drop)
}

fn start(key: &str, id: &str, script: &str) -> pb::LiveStartRequest {
    pb::LiveStartRequest { live: Some(live_ref(key, id)), argv: vec!["/bin/bash".into(), "-c".into(), script.into()], ..Default::default() }
}

/// What one process printed and how it ended.
#[derive(Debug, Default)]
struct Seen {
    pid: i32,
    stdout: String,
    stderr: String,
    pty: String,
    ended: Option<(i32, i32)>,
}

async fn collect(mut s: tonic::Streaming<pb::LiveEvent>) -> Seen {
    let mut seen = Seen::default();
    while let Some(ev) = s.message().await.expect("the stream broke") {
        match ev.event {
            Some(Ev::Started(st)) => seen.pid = st.pid,
            Some(Ev::Stdout(b)) => seen.stdout.push_str(&String::from_utf8_lossy(&b)),
            Some(Ev::Stderr(b)) => seen.stderr.push_str(&String::from_utf8_lossy(&b)),
            Some(Ev::Pty(b)) => seen.pty.push_str(&String::from_utf8_lossy(&b)),
            Some(Ev::Ended(e)) => seen.ended = Some((e.exit_code, e.signal)),
            None => {}
        }
    }
    seen
}

/// Runs `script` to its end.
async fn run(c: &mut Client, key: &str, id: &str, script: &str) -> Seen {
    let s = c.live_start(start(key, id, script)).await.expect("started").into_inner();
    tokio::time::timeout(T, collect(s)).await.expect("the process ended")
}

/// The first event of a started process: its pid.
async fn pid_of(s: &mut tonic::Streaming<pb::LiveEvent>) -> i32 {
    match s.message().await.unwrap().and_then(|e| e.event) {
        Some(Ev::Started(st)) => st.pid,
        other => panic!("expected started, got {other:?}"),
    }
}

/// Reads `s` until its output holds `want`.
async fn read_until(s: &mut tonic::Streaming<pb::LiveEvent>, want: &str) -> String {
    read_while(s, want, |text| text.contains(want)).await
}

/// Reads until `want` and, after it, the shell's next prompt: readline
/// has then set the terminal up (it reads the size and writes it back,
/// which would undo a resize landing between the two).
async fn read_to_prompt_after(s: &mut tonic::Streaming<pb::LiveEvent>, want: &str) -> String {
    read_while(s, want, |text| text.find(want).is_some_and(|i| prompted(&text[i..]))).await
}

fn prompted(shown: &str) -> bool {
    shown.trim_end_matches(' ').ends_with(['$', '#'])
}

async fn read_while(s: &mut tonic::Streaming<pb::LiveEvent>, want: &str, done: impl Fn(&str) -> bool) -> String {
    let mut text = String::new();
    let read = async {
        while !done(&text) {
            match s.message().await.unwrap().and_then(|e| e.event) {
                Some(Ev::Stdout(b) | Ev::Pty(b) | Ev::Stderr(b)) => text.push_str(&String::from_utf8_lossy(&b)),
                Some(Ev::Ended(e)) => panic!("ended ({e:?}) before {want:?} in {text:?}"),
                _ => {}
            }
        }
    };
    tokio::time::timeout(T, read).await.unwrap_or_else(|_| panic!("no {want:?} in {text:?}"));
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_share_the_sandbox_run_side_by_side_and_outlive_their_requests() {
    if skip_unless_root("processes_share_the_sandbox_run_side_by_side_and_outlive_their_requests") {
        return;
    }
    let agent = Agent::start(&["--pool-size", "0"]).await.unwrap();
    let mut c = agent.client().await.unwrap();
    create(&mut c, "k", "live-1", T * 4, None).await.unwrap();

    // A background server: its request goes away, it keeps running.
    let mut bg = c.live_start(start("k", "live-1", "echo up; exec sleep 600")).await.unwrap().into_inner();
    let bg_pid = pid_of(&mut bg).await;
    read_until(&mut bg, "up").await;
    drop(bg);

    // /tmp, /var/tmp and the home are the sandbox's, shared by its processes.
    let w = run(&mut c, "k", "live-1", "echo t > /tmp/a; echo v > /var/tmp/b; echo h > ~/c; export X=1").await;
    assert_eq!(w.ended, Some((0, 0)), "{w:?}");
    let r = run(&mut c, "k", "live-1", "cat /tmp/a /var/tmp/b ~/c; echo \"x=${X:-unset}\"").await;
    assert_eq!(r.stdout, "t\nv\nh\nx=unset\n", "files persist, shell variables do not: {r:?}");

    // The background process is still listed, and visible to the others.
    let listed = c.live_list(live_ref("k", "live-1")).await.unwrap().into_inner().processes;
    assert_eq!(listed.iter().map(|p| p.pid).collect::<Vec<_>>(), vec![bg_pid]);
    let ps = run(&mut c, "k", "live-1", &format!("test -d /proc/{bg_pid} && echo seen")).await;
    assert_eq!(ps.stdout, "seen\n");

    // Re-attaching replays what it printed and follows it to its end.
    let mut again = c.live_connect(pb::LiveProcessRequest { live: Some(live_ref("k", "live-1")), pid: bg_pid }).await.unwrap().into_inner();
    assert_eq!(pid_of(&mut again).await, bg_pid);
    read_until(&mut again, "up").await;
    c.live_signal(pb::LiveSignalRequest { live: Some(live_ref("k", "live-1")), pid: bg_pid, signal: libc::SIGTERM }).await.unwrap();
    let rest = tokio::time::timeout(T, collect(again)).await.unwrap();
    assert_eq!(rest.ended, Some((128 + libc::SIGTERM, libc::SIGTERM)));
    assert!(c.live_list(live_ref("k", "live-1")).await.unwrap().into_inner().processes.is_empty());

    // A process that prints and exits at once: its output is never lost to its end.
    for i in 0..200 {
        let quick = run(&mut c, "k", "live-1", &format!("echo quick-{i}")).await;
        assert_eq!((quick.stdout, quick.ended), (format!("quick-{i}\n"), Some((0, 0))));
    }

    // Two at once: each waits for the other's file.
    let a = c.live_start(start("k", "live-1", "touch /tmp/from-a; while [ ! -e /tmp/from-b ]; do sleep 0.05; done; echo a")).await.unwrap().into_inner();
    let b = c.live_start(start("k", "live-1", "touch /tmp/from-b; while [ ! -e /tmp/from-a ]; do sleep 0.05; done; echo b")).await.unwrap().into_inner();
    let (a, b) = tokio::time::timeout(T, async { tokio::join!(collect(a), collect(b)) }).await.expect("both ended");
    assert_eq!((a.stdout.as_str(), b.stdout.as_str()), ("a\n", "b\n"));

    // Ending the sandbox saves its home into the thread; /tmp is gone.
    let end = c.live_end(live_ref("k", "live-1")).await.unwrap().into_inner();
    assert!(!end.save_failed);
    let gone = c.live_start(start("k", "live-1", "true")).await.unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    let mut after = request(Language::Bash, "cat ~/c; ls /tmp", T);
    after.thread = Some(thread("k", "live-1"));
    let after = agent.run_request(after).await.unwrap();
    assert_eq!(after.stdout, "h\n", "{after:?}");
    wait_no_processes(&agent).await;
}

async fn wait_no_processes(agent: &Agent) -> bool {
    for _ in 0..200 {
        if agent.sandbox_processes().is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("sandbox processes left: {:?}", agent.sandbox_processes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_terminals_and_refusals() {
    if skip_unless_root("stdin_terminals_and_refusals") {
        return;
    }
    let agent = Agent::start(&["--pool-size", "0"]).await.unwrap();
    let mut c = agent.client().await.unwrap();
    create(&mut c, "k", "live-2", T * 4, None).await.unwrap();
    let lref = || Some(live_ref("k", "live-2"));
    let input = |pid, input| pb::LiveInputRequest { live: lref(), pid, input: Some(input) };

    // stdin: sent in pieces, then closed.
    let mut req = start("k", "live-2", "tr a-z A-Z");
    req.stdin = true;
    let mut s = c.live_start(req).await.unwrap().into_inner();
    let pid = pid_of(&mut s).await;
    use pb::live_input_request::Input;
    c.live_input(input(pid, Input::Data(b"hello ".to_vec()))).await.unwrap();
    c.live_input(input(pid, Input::Data(b"world\n".to_vec()))).await.unwrap();
    c.live_input(input(pid, Input::Close(true))).await.unwrap();
    let seen = tokio::time::timeout(T, collect(s)).await.unwrap();
    assert_eq!((seen.stdout.as_str(), seen.ended), ("HELLO WORLD\n", Some((0, 0))));

    // Without stdin it reads nothing, and input is refused.
    let mut s = c.live_start(start("k", "live-2", "cat; echo eof")).await.unwrap().into_inner();
    let pid = pid_of(&mut s).await;
    let refused = c.live_input(input(pid, Input::Data(b"x".to_vec()))).await;
    assert!(matches!(refused.as_ref().map_err(|e| e.code()), Err(Code::FailedPrecondition | Code::NotFound)), "{refused:?}");
    assert_eq!(tokio::time::timeout(T, collect(s)).await.unwrap().stdout, "eof\n");

    // A terminal: an interactive shell, typed into and resized.
    let req = pb::LiveStartRequest { live: lref(), argv: vec!["/bin/bash".into(), "-i".into()], pty: Some(pb::PtySize { rows: 24, cols: 80 }), ..Default::default() };
    let mut s = c.live_start(req).await.unwrap().into_inner();
    let pid = pid_of(&mut s).await;
    c.live_input(input(pid, Input::Data(b"tty; stty size; echo $((6*7))\n".to_vec()))).await.unwrap();
    let text = read_to_prompt_after(&mut s, "42").await;
    assert!(text.contains("/dev/pts/0") && text.contains("24 80"), "{text:?}");
    c.live_input(input(pid, Input::Resize(pb::PtySize { rows: 50, cols: 132 }))).await.unwrap();
    c.live_input(input(pid, Input::Data(b"stty size\n".to_vec()))).await.unwrap();
    read_until(&mut s, "50 132").await;
    c.live_input(input(pid, Input::Data(b"exit 7\n".to_vec()))).await.unwrap();
    assert_eq!(tokio::time::timeout(T, collect(s)).await.unwrap().ended, Some((7, 0)));

    // Refusals: no program, a relative cwd, a signal that is not offered, an unknown pid.
    let missing = c.live_start(pb::LiveStartRequest { live: lref(), argv: vec!["no-such-program".into()], ..Default::default() }).await.unwrap_err();
    assert_eq!(missing.code(), Code::FailedPrecondition);
    assert!(missing.message().contains("not found"), "{missing:?}");
    let mut rel = start("k", "live-2", "true");
    rel.cwd = "tmp".into();
    assert_eq!(c.live_start(rel).await.unwrap_err().code(), Code::InvalidArgument);
    let sig = c.live_signal(pb::LiveSignalRequest { live: lref(), pid: 1, signal: 31 }).await.unwrap_err();
    assert_eq!(sig.code(), Code::InvalidArgument);
    let unknown = c.live_signal(pb::LiveSignalRequest { live: lref(), pid: 99_999, signal: libc::SIGKILL }).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    // Its home's thread is the live sandbox's while it lives.
    assert_eq!(create(&mut c, "k", "live-2", T, None).await.unwrap_err().code(), Code::Aborted);

    // A server's port, reached through the agent: only the sandbox's own loopback.
    let mut srv = c.live_start(start("k", "live-2", "echo -n hello > /tmp/i.txt; cd /tmp && exec python3 -m http.server 8000 --bind 127.0.0.1")).await.unwrap().into_inner();
    pid_of(&mut srv).await;
    let body = async {
        loop {
            let first = pb::LivePortRequest { live: lref(), port: 8000, data: b"GET /i.txt HTTP/1.0\r\n\r\n".to_vec() };
            match c.live_port(futures_util::stream::iter([first])).await {
                Ok(r) => {
                    let mut s = r.into_inner();
                    let mut got = Vec::new();
                    while let Some(m) = s.message().await.unwrap() {
                        got.extend(m.data);
                    }
                    return String::from_utf8_lossy(&got).into_owned();
                }
                // Not listening yet.
                Err(e) if e.code() == Code::FailedPrecondition => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => panic!("{e:?}"),
            }
        }
    };
    let answer = tokio::time::timeout(T, body).await.expect("the server answered");
    assert!(answer.starts_with("HTTP/1.0 200") && answer.ends_with("hello"), "{answer}");
    let nothing = pb::LivePortRequest { live: lref(), port: 8001, data: vec![] };
    assert_eq!(c.live_port(futures_util::stream::iter([nothing])).await.unwrap_err().code(), Code::FailedPrecondition);
    c.live_end(live_ref("k", "live-2")).await.unwrap();
    wait_no_processes(&agent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_are_walled_off_and_end_with_their_lifetime() {
    if skip_unless_root("sandboxes_are_walled_off_and_end_with_their_lifetime") {
        return;
    }
    let agent = Agent::start(&["--pool-size", "0"]).await.unwrap();
    let mut c = agent.client().await.unwrap();
    let limits = pb::Limits { pids: 32, ..Default::default() };
    create(&mut c, "a", "wall", T * 4, Some(limits)).await.unwrap();
    create(&mut c, "b", "wall", T * 4, None).await.unwrap();

    // B's process, and what A sees of it: nothing (own pid namespace, own /tmp).
    let mut b = c.live_start(start("b", "wall", "echo secret > /tmp/s; echo up; exec sleep 600")).await.unwrap().into_inner();
    let b_pid = pid_of(&mut b).await;
    read_until(&mut b, "up").await;
    let seen = run(&mut c, "a", "wall", "ls /proc | grep -c '^[0-9]'; cat /tmp/s 2>&1; kill -9 -1; echo done").await;
    let procs: u32 = seen.stdout.lines().next().unwrap().parse().unwrap();
    assert!(procs <= 4, "A sees only its own processes: {seen:?}");
    assert!(seen.stdout.contains("No such file") && !seen.stdout.contains("secret"), "{seen:?}");
    // A's `kill -9 -1` reached none of B's processes.
    let b_list = |c: &mut Client| {
        let mut c = c.clone();
        async move { c.live_list(live_ref("b", "wall")).await.unwrap().into_inner().processes.iter().map(|p| p.pid).collect::<Vec<_>>() }
    };
    assert_eq!(b_list(&mut c).await, vec![b_pid]);

    // A at its pids limit (the whole sandbox's): forks fail in A, B is unharmed.
    let mut bomb = c.live_start(start("a", "wall", "for i in $(seq 64); do sleep 300 & done; wait")).await.unwrap().into_inner();
    let bomb_pid = pid_of(&mut bomb).await;
    read_until(&mut bomb, "Resource temporarily unavailable").await;
    assert_eq!(run(&mut c, "b", "wall", "echo ok").await.stdout, "ok\n");
    assert_eq!(b_list(&mut c).await, vec![b_pid]);
    // Killing a process kills its group: what it started goes with it.
    let _ = c.live_signal(pb::LiveSignalRequest { live: Some(live_ref("a", "wall")), pid: bomb_pid, signal: libc::SIGKILL }).await;
    let _ = tokio::time::timeout(T, collect(bomb)).await.expect("the bomb ended");
    // SIGKILL reaches every member at once, but each exits and is reaped by the sandbox's init in
    // its own time: wait (bounded) for their /proc entries to go rather than race the reaper.
    let mut after = Seen::default();
    for _ in 0..100 {
        after = run(&mut c, "a", "wall", "ls /proc | grep -c '^[0-9]'").await;
        if after.stdout.trim().parse::<u32>().unwrap() <= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(after.stdout.trim().parse::<u32>().unwrap() <= 4, "its sleeps went with it: {after:?}");

    // A sandbox ends with its lifetime: its processes end by SIGKILL, its name is gone.
    create(&mut c, "c", "short", Duration::from_secs(1), None).await.unwrap();
    let s = c.live_start(start("c", "short", "exec sleep 600")).await.unwrap().into_inner();
    let rest = tokio::time::timeout(T, collect(s)).await.expect("it ended with its lifetime");
    assert_eq!(rest.ended, Some((128 + libc::SIGKILL, libc::SIGKILL)));
    for _ in 0..200 {
        if c.live_list(live_ref("c", "short")).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(c.live_list(live_ref("c", "short")).await.unwrap_err().code(), Code::NotFound);
    c.live_end(live_ref("a", "wall")).await.unwrap();
    c.live_end(live_ref("b", "wall")).await.unwrap();
    wait_no_processes(&agent).await;
    wait_no_cgroups(&agent).await;
}

async fn wait_no_cgroups(agent: &Agent) -> bool {
    for _ in 0..200 {
        if agent.leftover_cgroups().is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("cgroups left: {:?}", agent.leftover_cgroups());
}

/// Asks `port` of live sandbox `key/id` for `/`; the error's code when refused.
async fn dial(c: &mut Client, key: &str, id: &str, port: u32) -> Result<String, Code> {
    let first = pb::LivePortRequest { live: Some(live_ref(key, id)), port, data: b"GET / HTTP/1.0\r\n\r\n".to_vec() };
    let mut s = c.live_port(futures_util::stream::iter([first])).await.map_err(|e| e.code())?.into_inner();
    let mut got = Vec::new();
    while let Ok(Some(m)) = s.message().await {
        got.extend(m.data);
    }
    Ok(String::from_utf8_lossy(&got).into_owned())
}

/// The attacks on a live sandbox's ports and limits: a port number can lead
/// only to the sandbox's own loopback — never to a server on the node's
/// loopback, nor to another sandbox listening on the same port — and a
/// sandbox at its memory limit harms no other. The node's status reports
/// each live sandbox (busy with a caller's process, not with Warren's
/// helpers; not idle while a stream of it is open) and why one ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_reaches_only_its_own_sandbox_and_a_memory_hog_harms_no_other() {
    if skip_unless_root("a_port_reaches_only_its_own_sandbox_and_a_memory_hog_harms_no_other") {
        return;
    }
    let agent = Agent::start(&["--pool-size", "0"]).await.unwrap();
    let mut c = agent.client().await.unwrap();
    // A server on the node's own loopback, which no sandbox port may reach.
    let node = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    node.set_nonblocking(true).unwrap();
    let node_port = u32::from(node.local_addr().unwrap().port());
    create(&mut c, "a", "ports", T * 4, Some(pb::Limits { memory_bytes: 64 << 20, ..Default::default() })).await.unwrap();
    create(&mut c, "b", "ports", T * 4, None).await.unwrap();
    let mut srv = c.live_start(start("b", "ports", "cd /tmp && exec python3 -m http.server 8000 --bind 127.0.0.1")).await.unwrap().into_inner();
    pid_of(&mut srv).await;
    let up = async {
        loop {
            match dial(&mut c.clone(), "b", "ports", 8000).await {
                Ok(a) => return a,
                Err(Code::FailedPrecondition) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => panic!("{e:?}"),
            }
        }
    };
    assert!(tokio::time::timeout(T, up).await.expect("B's server answered").starts_with("HTTP/1.0 200"));

    // A's port 8000 is A's own loopback: B's server is not there; nor is the node's.
    assert_eq!(dial(&mut c, "a", "ports", 8000).await, Err(Code::FailedPrecondition));
    assert_eq!(dial(&mut c, "a", "ports", node_port).await, Err(Code::FailedPrecondition));
    assert_eq!(node.accept().map(drop).unwrap_err().kind(), std::io::ErrorKind::WouldBlock, "a connection reached the node's loopback");
    for bad in [0, 65_536, u32::MAX] {
        assert_eq!(dial(&mut c, "a", "ports", bad).await, Err(Code::InvalidArgument), "port {bad}");
    }

    // The node's status: B busy (its server, a caller's process) and not idle
    // while its stream is open; A not busy; a helper process is not business.
    let mut helper = start("a", "ports", "exec sleep 600");
    helper.tag = "warren-context-x".into();
    let mut helper = c.live_start(helper).await.unwrap().into_inner();
    pid_of(&mut helper).await;
    let status = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
    let of = |key: &str| status.live.iter().find(|l| l.live.as_ref().and_then(|r| r.r#ref.as_ref()).is_some_and(|t| t.key_name == key)).cloned().unwrap();
    assert!(status.reports_live);
    assert_eq!((of("b").busy, of("b").idle_ms), (1, 0), "{status:?}");
    assert_eq!(of("a").busy, 0, "{status:?}");

    // A at its memory limit: its hog is killed (or A dies); B serves on.
    let hog = run(&mut c, "a", "ports", "python3 -c 'b = bytearray(512 << 20); print(len(b))'").await;
    assert!(hog.ended != Some((0, 0)) && !hog.stdout.contains("536870912"), "{hog:?}");
    assert!(dial(&mut c, "b", "ports", 8000).await.unwrap().starts_with("HTTP/1.0 200"));

    // Ended, each is gone from the status and listed as ended, with why.
    let _ = c.live_end(live_ref("a", "ports")).await;
    c.live_end(live_ref("b", "ports")).await.unwrap();
    let status = c.status(pb::StatusRequest {}).await.unwrap().into_inner();
    assert!(status.live.is_empty(), "{status:?}");
    let ended: Vec<_> = status.live_ended.iter().filter_map(|e| Some((e.live.as_ref()?.r#ref.as_ref()?.key_name.clone(), e.reason.clone()))).collect();
    assert!(ended.contains(&("b".to_string(), "ended".to_string())), "{ended:?}");
    wait_no_processes(&agent).await;
}
