//! thread_id end to end through the real gateway and node-agent: the home
//! persists (files, a venv, sqlite, deletions, links, modes), /tmp does not,
//! threads belong to their key, one execution per thread (also across two
//! gateways), size cap, DELETE, 50 MB round trip, retention collector.

use std::time::Duration;

use serde_json::{json, Value};
use warren_e2e::gateway::{key, Gateway};
use warren_e2e::http;
use warren_e2e::{skip_unless_root, Agent};

async fn setup(test: &str, agent_args: &[&str]) -> Option<(Agent, Gateway)> {
    if skip_unless_root(test) {
        return None;
    }
    let agent = Agent::start(agent_args).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    Some((agent, gw))
}

/// Runs `code` on `thread` (if any) with key `k`; returns the result object.
fn run(gw: &Gateway, k: &str, language: &str, code: &str, thread: Option<&str>) -> Value {
    let mut body = json!({"code": code, "language": language, "timeout": 60});
    if let Some(t) = thread {
        body["thread_id"] = json!(t);
    }
    let r = gw.execute(&key(k), &body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn ok(v: &Value) -> &str {
    assert_eq!((v["exit_code"].as_i64(), v["error"].as_str()), (Some(0), None), "{v}");
    v["stdout"].as_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn home_persists_packages_venv_sqlite_links_and_deletions() {
    let Some((_agent, gw)) = setup("home_persists_packages_venv_sqlite_links_and_deletions", &[]).await else { return };
    let t = Some("session-1");
    let first = r#"
set -e
mkdir -p ~/.local/lib/python3.11/site-packages/mypkg
echo 'VALUE = 42' > ~/.local/lib/python3.11/site-packages/mypkg/__init__.py
python3 -m venv --without-pip ~/venv
python3 -c "import sqlite3, os; c = sqlite3.connect(os.path.expanduser('~/app.db')); c.execute('create table t(x)'); c.execute('insert into t values (7)'); c.commit()"
echo doomed > ~/doomed.txt
mkdir -p ~/olddir/sub && echo x > ~/olddir/sub/f
echo secret > ~/private && chmod 600 ~/private
echo linked > ~/orig && ln ~/orig ~/hard && ln -s orig ~/soft
echo ephemeral > /tmp/scratch
echo done"#;
    assert_eq!(ok(&run(&gw, "thr", "bash", first, t)), "done\n");
    let check = r#"
import os, sqlite3, stat, subprocess
from mypkg import VALUE
h = os.path.expanduser('~')
print(VALUE)
print(subprocess.run([h + '/venv/bin/python', '-c', 'import sys; print(sys.prefix != sys.base_prefix)'], capture_output=True, text=True).stdout.strip())
print(sqlite3.connect(h + '/app.db').execute('select x from t').fetchall())
print(oct(stat.S_IMODE(os.stat(h + '/private').st_mode)))
print(os.stat(h + '/orig').st_ino == os.stat(h + '/hard').st_ino, os.readlink(h + '/soft'), open(h + '/soft').read().strip())
print(os.path.exists('/tmp/scratch'), os.stat(h).st_uid, os.stat(h + '/app.db').st_uid)
"#;
    assert_eq!(ok(&run(&gw, "thr", "python", check, t)), "42\nTrue\n[(7,)]\n0o600\nTrue orig linked\nFalse 1000 1000\n");
    // Deletions, a directory replaced by a file and a file by a directory.
    let change = "rm ~/doomed.txt && rm -r ~/olddir && echo now-a-file > ~/olddir && rm ~/private && mkdir ~/private && echo in > ~/private/x && echo changed";
    assert_eq!(ok(&run(&gw, "thr", "bash", change, t)), "changed\n");
    let after = "ls -A ~ | sort | tr '\\n' ' '; echo; cat ~/olddir ~/private/x; test -d ~/olddir/sub || echo no-sub";
    assert_eq!(ok(&run(&gw, "thr", "bash", after, t)), ".local app.db hard olddir orig private soft venv \nnow-a-file\nin\nno-sub\n");
    // Without thread_id nothing is kept, and nothing of the thread shows.
    assert_eq!(ok(&run(&gw, "thr", "bash", "ls -A ~ | wc -l", None)), "0\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_belong_to_their_key_and_delete_resets_them() {
    let Some((_agent, gw)) = setup("threads_belong_to_their_key_and_delete_resets_them", &[]).await else { return };
    assert_eq!(ok(&run(&gw, "thr", "bash", "echo mine > ~/f; echo ok", Some("shared-name"))), "ok\n");
    // Another key cannot tell the thread exists: the same 404 as for an id never used...
    let foreign = gw.delete(&key("thr2"), "/v1/threads/shared-name");
    let never = gw.delete(&key("thr2"), "/v1/threads/never-used");
    assert_eq!((foreign.status, never.status), (404, 404), "{}", foreign.text());
    assert_eq!(foreign.json()["error"], never.json()["error"]);
    // ...and with the same id it gets a fresh home of its own.
    assert_eq!(ok(&run(&gw, "thr2", "bash", "ls -A ~ | wc -l; echo theirs > ~/f", Some("shared-name"))), "0\n");
    assert_eq!(ok(&run(&gw, "thr", "bash", "cat ~/f", Some("shared-name"))), "mine\n");
    let r = gw.delete(&key("thr"), "/v1/threads/shared-name");
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(ok(&run(&gw, "thr", "bash", "ls -A ~ | wc -l", Some("shared-name"))), "0\n");
    let bad = gw.delete(&key("thr"), "/v1/threads/bad.id");
    assert_eq!((bad.status, bad.json()["error"].as_str()), (400, Some("invalid_request")));
    assert_eq!(gw.delete("sk-wrn-unknownunknownunknownunknownunknown", "/v1/threads/x").status, 401);
}

/// One execution holds the thread (its stream is open and running); twenty
/// more, through two gateway replicas, are refused at once. Nothing here
/// depends on timing: the holder runs until the test disconnects it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_thread_refuses_every_other_request_across_gateways() {
    let Some((agent, gw)) = setup("a_busy_thread_refuses_every_other_request_across_gateways", &[]).await else { return };
    let gw2 = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let holder = json!({"code": "echo holding; sleep 600", "language": "bash", "thread_id": "busy", "timeout": 600});
    let (conn, head) = http::open_until(gw.addr, &http::execute_request(gw.addr, &key("thr"), &holder, true), "holding").unwrap();
    let attempts: Vec<_> = (0..20)
        .map(|i| {
            let g = if i % 2 == 0 { gw.addr } else { gw2.addr };
            std::thread::spawn(move || {
                let body = json!({"code": "echo ran", "language": "bash", "thread_id": "busy"});
                http::raw(g, &http::execute_request(g, &key("thr"), &body, false)).unwrap()
            })
        })
        .collect();
    for a in attempts {
        let r = a.join().unwrap();
        assert_eq!((r.status, r.json()["error"].as_str()), (409, Some("thread_busy")), "{}", r.text());
    }
    // Other threads run in parallel meanwhile.
    assert_eq!(ok(&run(&gw2, "thr", "bash", "echo free", Some("other"))), "free\n");
    // Cancelling the holder (its client only detaches by disconnecting) frees the thread.
    drop(conn);
    let trace = http::trace_id(&head);
    let c = gw.post(&key("thr"), &format!("/v1/executions/{trace}/cancel"));
    assert_eq!((c.status, c.json()["status"].as_str()), (200, Some("cancelled")), "{}", c.text());
    let mut last = None;
    for _ in 0..300 {
        let r = gw2.execute(&key("thr"), &json!({"code": "echo ran", "language": "bash", "thread_id": "busy"}));
        if r.status != 409 {
            last = Some(r);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = last.expect("the thread stayed busy 30 s after its holder was cancelled");
    assert_eq!((r.status, r.json()["stdout"].as_str()), (200, Some("ran\n")), "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_megabytes_round_trip() {
    let Some((_agent, gw)) = setup("fifty_megabytes_round_trip", &[]).await else { return };
    let write = "head -c 52428800 /dev/urandom > ~/big.bin && sha256sum ~/big.bin | cut -d' ' -f1";
    let sum = ok(&run(&gw, "thr", "bash", write, Some("big"))).to_string();
    assert_eq!(sum.len(), 65, "{sum}");
    let read = "stat -c %s ~/big.bin; sha256sum ~/big.bin | cut -d' ' -f1";
    assert_eq!(ok(&run(&gw, "thr", "bash", read, Some("big"))), format!("52428800\n{sum}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_size_cap_the_call_fails_and_the_previous_state_stays() {
    let Some((_agent, gw)) = setup("over_the_size_cap_the_call_fails_and_the_previous_state_stays", &[]).await else { return };
    assert_eq!(ok(&run(&gw, "tiny", "bash", "echo v1 > ~/keep; echo ok", Some("capped"))), "ok\n");
    let v = run(&gw, "tiny", "bash", "echo v2 > ~/keep; head -c 2097152 /dev/zero > ~/big; echo wrote", Some("capped"));
    assert_eq!((v["success"].as_bool(), v["error"].as_str(), v["stdout"].as_str()), (Some(false), Some("thread_state_too_large"), Some("wrote\n")), "{v}");
    assert_eq!(ok(&run(&gw, "tiny", "bash", "cat ~/keep; ls ~", Some("capped"))), "v1\nkeep\n");
}

/// The ApiKey's `maxThreads` reaches the agent: a third thread of a key
/// allowed two is refused before it runs, until one is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_keeps_at_most_its_max_threads() {
    let Some((_agent, gw)) = setup("a_key_keeps_at_most_its_max_threads", &[]).await else { return };
    for t in ["t1", "t2"] {
        assert_eq!(ok(&run(&gw, "few", "bash", "echo x > ~/f; echo ok", Some(t))), "ok\n");
    }
    let over = run(&gw, "few", "bash", "echo ran", Some("t3"));
    assert_eq!((over["error"].as_str(), over["exit_code"].as_i64(), over["stdout"].as_str()), (Some("thread_limit_reached"), Some(-1), Some("")), "{over}");
    assert_eq!(ok(&run(&gw, "thr", "bash", "echo x > ~/f; echo ok", Some("t3"))), "ok\n", "another key has its own count");
    assert_eq!(gw.delete(&key("few"), "/v1/threads/t1").status, 204);
    assert_eq!(ok(&run(&gw, "few", "bash", "echo ok", Some("t3"))), "ok\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_symlink_replaced_by_a_directory_cannot_hide_the_size() {
    let test = "a_saved_symlink_replaced_by_a_directory_cannot_hide_the_size";
    let Some((_agent, gw)) = setup(test, &[]).await else { return };
    // The saved home links to a big host directory (the agent sees the host's /usr).
    assert_eq!(ok(&run(&gw, "tiny", "bash", "ln -s /usr ~/x; echo ok", Some("sym"))), "ok\n");
    // Replacing the link by a directory with the same names must not charge
    // the host's /usr/lib off: 2 MiB stays over the 1 MiB cap.
    let v = run(&gw, "tiny", "bash", "rm ~/x; mkdir -p ~/x/lib; head -c 2097152 /dev/zero > ~/x/lib/big; echo wrote", Some("sym"));
    assert_eq!((v["success"].as_bool(), v["error"].as_str()), (Some(false), Some("thread_state_too_large")), "{v}");
    assert_eq!(ok(&run(&gw, "tiny", "bash", "readlink ~/x", Some("sym"))), "/usr\n", "the previous state stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_collector_removes_threads_past_their_retention() {
    let Some((agent, gw)) = setup("the_collector_removes_threads_past_their_retention", &["--thread-gc-interval-secs", "1"]).await else { return };
    assert_eq!(ok(&run(&gw, "thr", "bash", "echo old > ~/f; echo ok", Some("aging"))), "ok\n");
    assert_eq!(ok(&run(&gw, "thr", "bash", "echo kept > ~/f; echo ok", Some("fresh"))), "ok\n");
    let store = agent.state_dir().join("thread-store/threads/default/thr");
    let manifest = store.join("aging/manifest.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    assert_eq!(m["retentionSecs"], 86400, "the Sandbox's 24h retention is recorded");
    // Last used 25 hours ago.
    m["updatedAt"] = json!(m["updatedAt"].as_u64().unwrap() - 25 * 3600);
    std::fs::write(&manifest, m.to_string()).unwrap();
    // Collected: the layers are gone and the manifest is a tombstone (kept a
    // day, so a save racing the deletion on another node cannot land).
    let tars = |dir: &std::path::Path| -> usize {
        let mut n = 0;
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                if e.path().is_dir() {
                    stack.push(e.path());
                } else if e.path().extension().is_some_and(|x| x == "tar") {
                    n += 1;
                }
            }
        }
        n
    };
    assert!(tars(&store.join("aging")) > 0);
    let collected = (0..300).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        let m: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap_or_default()).unwrap_or_default();
        tars(&store.join("aging")) == 0 && m["retentionSecs"] == 0 && m["layers"] == json!([])
    });
    assert!(collected, "the expired thread's layers are still there after 30 s");
    assert!(store.join("fresh/manifest.json").exists(), "a thread within its retention stays");
    assert_eq!(ok(&run(&gw, "thr", "bash", "ls -A ~ | wc -l", Some("aging"))), "0\n");
    assert_eq!(ok(&run(&gw, "thr", "bash", "cat ~/f", Some("fresh"))), "kept\n");
}

/// Two nodes sharing a store: a thread always goes to the same node, and
/// when that node dies the other restores the thread from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_stays_on_its_node_and_moves_when_the_node_is_gone() {
    if skip_unless_root("a_thread_stays_on_its_node_and_moves_when_the_node_is_gone") {
        return;
    }
    let (_store, mut agents, gw) = warren_e2e::gateway::two_nodes_sharing_a_store().await;
    for i in 0..5 {
        assert_eq!(ok(&run(&gw, "thr", "bash", &format!("echo {i} >> ~/log; echo ok"), Some("sticky"))), "ok\n");
    }
    let nodes = || -> Vec<String> {
        gw.audit_records().iter().filter(|a| a["thread_id"] == "sticky").map(|a| a["node"].as_str().unwrap_or_default().to_string()).collect()
    };
    assert!(warren_e2e::gateway::wait_for(Duration::from_secs(10), || nodes().len() == 5));
    let seen = nodes();
    assert!(seen.iter().all(|n| *n == seen[0]), "one node ran every call: {seen:?}");
    let home = if seen[0] == "node-a" { 0 } else { 1 };
    agents[home].kill_hard();
    // The next calls may see the dead node once (502/503) until it is marked down.
    let mut moved = None;
    for _ in 0..100 {
        let r = gw.execute(&key("thr"), &json!({"code": "cat ~/log | tr '\\n' ' '", "language": "bash", "thread_id": "sticky"}));
        if r.status == 200 {
            moved = Some(r.json());
            break;
        }
        assert!([502, 503].contains(&r.status), "{}", r.text());
        std::thread::sleep(Duration::from_millis(100));
    }
    let v = moved.expect("the thread never moved to the surviving node");
    assert_eq!(ok(&v), "0 1 2 3 4 ");
    assert!(warren_e2e::gateway::wait_for(Duration::from_secs(10), || nodes().last().is_some_and(|n| *n != seen[0])), "{:?}", nodes());
}

/// What a hostile program can leave in its home: special files, names that
/// look like whiteouts, a 0000 directory, deep nesting, many files, symlinks
/// pointing out. The save neither hangs nor follows anything, the next call
/// sees a consistent home, and the host keeps no mount of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_homes_are_saved_safely_and_leave_nothing_mounted() {
    let Some((agent, gw)) = setup("hostile_homes_are_saved_safely_and_leave_nothing_mounted", &[]).await else { return };
    let hostile = r#"
import os, socket
h = os.path.expanduser('~')
os.mkfifo(h + '/fifo')
s = socket.socket(socket.AF_UNIX); s.bind(h + '/sock')
open(h + '/.wh.looks-like-a-whiteout', 'w').write('x')
os.symlink('/etc/passwd', h + '/outside'); os.symlink('loop', h + '/loop')
os.makedirs(h + '/locked/inner'); open(h + '/locked/inner/f', 'w').write('kept'); os.chmod(h + '/locked', 0)
d = h + '/deep'
for i in range(200):
    d += '/d'
os.makedirs(d); open(d + '/bottom', 'w').write('bottom')
os.makedirs(h + '/many')
for i in range(5000):
    open(h + '/many/%d' % i, 'w').close()
print(sorted(os.listdir('/home')))
try:
    open('/home/intruder', 'w')
except OSError as e:
    print('home parent', e.strerror)
"#;
    assert_eq!(ok(&run(&gw, "thr", "python", hostile, Some("hostile"))), "['sandbox']\nhome parent Read-only file system\n");
    let check = r#"
import os
h = os.path.expanduser('~')
print(sorted(n for n in os.listdir(h)))
print(os.readlink(h + '/outside'), os.readlink(h + '/loop'))
os.chmod(h + '/locked', 0o700); print(open(h + '/locked/inner/f').read())
print(open(h + '/deep' + '/d' * 200 + '/bottom').read(), len(os.listdir(h + '/many')))
"#;
    assert_eq!(
        ok(&run(&gw, "thr", "python", check, Some("hostile"))),
        "['deep', 'locked', 'loop', 'many', 'outside']\n/etc/passwd loop\nkept\nbottom 5000\n",
        "fifo, socket and the whiteout-like name are not kept; the rest is"
    );
    let state = agent.state_dir();
    let mounted: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&state.display().to_string()))
        .collect();
    // Only the agent's own shared homes directory (and its pool of FUSE
    // sessions, which serve nothing until a call with storage takes one)
    // stays mounted and no scratch is left; homes are released right after
    // each answer (bounded wait for that).
    let homes = state.join("homes").display().to_string();
    let pool = state.join("fuse-pool");
    let released = || {
        let unmounted = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&state.display().to_string()) && !std::path::Path::new(m).starts_with(&pool))
            .all(|m| m == homes);
        unmounted && std::fs::read_dir(state.join("work")).unwrap().count() == 0
    };
    assert!(warren_e2e::gateway::wait_for(Duration::from_secs(10), released), "mounts or scratch left: {mounted:?}, work: {:?}", std::fs::read_dir(state.join("work")).unwrap().collect::<Vec<_>>());
}

/// `POST path` with a JSON body and the key.
fn post_json(gw: &Gateway, k: &str, path: &str, body: &Value) -> http::Response {
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        gw.addr,
        key(k),
        body.len()
    );
    http::raw(gw.addr, req.as_bytes()).unwrap()
}

/// `GET` of a signed URL (no key: the URL is the credential).
fn get_url(gw: &Gateway, url: &str) -> http::Response {
    let path = &url[url.find("/v1/").unwrap()..];
    http::raw(gw.addr, format!("GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", gw.addr).as_bytes()).unwrap()
}

/// #26: the file-URL signing key sat in the record database (a leaked
/// records file minted URLs to every tenant's files) and never rotated. It
/// now lives in a file of its own, is re-read when the file changes, and a
/// rotation ends the URLs signed with the old key; the records hold no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_urls_are_signed_outside_the_records_and_end_when_the_key_rotates() {
    if skip_unless_root("file_urls_are_signed_outside_the_records_and_end_when_the_key_rotates") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("files-signing.key");
    let records = dir.path().join("records.db");
    let records_url = format!("sqlite://{}", records.display());
    let args = ["--files-signing-key-file", key_file.to_str().unwrap(), "--records", records_url.as_str()];
    let gw = Gateway::start(&[agent.address()], &args, true).await.unwrap();
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key_file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the gateway creates the key file for itself only");
    assert_eq!(ok(&run(&gw, "thr", "bash", "echo kept > ~/note; echo ok", Some("files"))), "ok\n");
    let url = || {
        let r = post_json(&gw, "thr", "/v1/files/download_url", &json!({"source": "thread", "id": "files", "path": "note"}));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["url"].as_str().unwrap().to_string()
    };
    let old = url();
    let got = get_url(&gw, &old);
    assert_eq!((got.status, got.text().as_str()), (200, "kept\n"));
    // Rotation: the old URL stops working at once, a new one works.
    std::fs::write(&key_file, "r".repeat(64)).unwrap();
    assert_eq!(get_url(&gw, &old).status, 403, "a URL signed with the rotated key still works");
    let new = url();
    assert_eq!(get_url(&gw, &new).status, 200);
    // Nothing of the key in the records.
    let rows = std::process::Command::new("python3")
        .args(["-c", "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute(\"select count(*) from warren_settings where k like '%sign%'\").fetchone()[0])"])
        .arg(&records)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&rows.stdout).trim(), "0", "{}", String::from_utf8_lossy(&rows.stderr));
}
