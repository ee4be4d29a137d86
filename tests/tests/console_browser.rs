//! The console in a real browser (Debian's chromium over WebDriver),
//! against the real gateway, node-agent and record store, on one machine:
//! the local admin signs in with the one-time link, sees the overview (the
//! node's running of max, the gateway's queue for node slots), the
//! audit log (filtered, paged), an execution whose output is an XSS
//! payload rendered inert, the keys without their secrets and the
//! Sandboxes; a used link and a form without its CSRF token are refused.
//! Every page is written as a 1280×800 screenshot.

use serde_json::json;
use warren_e2e::browser::{screenshot_dir, Browser};
use warren_e2e::gateway::{ended, key, Gateway};
use warren_e2e::{http, skip_unless_root, Agent};

/// An execution's output that would run script if it were markup.
const XSS: &str = "<script>window.__xss=1</script><img src=x onerror=\"window.__xss=2;alert(2)\">";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_admin_browses_the_console_and_hostile_output_stays_text() {
    if skip_unless_root("the_local_admin_browses_the_console_and_hostile_output_stays_text") {
        return;
    }
    let agent = Agent::start(&["--pool-size", "0"]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let link_file = dir.path().join("console-link");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let gw = Gateway::start(&[agent.address()], &["--console-listen", &listen, "--console-link-file", link_file.to_str().unwrap()], true).await.unwrap();
    let console: std::net::SocketAddr = listen.parse().unwrap();
    let shots = screenshot_dir();
    // A key whose Sandbox mounts a managed volume (in the local platform store).
    let volume = format!(
        "apiVersion: warren.dev/v1alpha1\nkind: Sandbox\nmetadata: {{name: with-volume}}\nspec: {{image: host, storage: [{{name: work, volume: work, mode: ReadWrite}}]}}\n---\n\
         apiVersion: warren.dev/v1alpha1\nkind: ApiKey\nmetadata: {{name: vol}}\nspec: {{sandboxRef: {{name: with-volume}}}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: vol-key}}\nstringData: {{key: {}}}\n",
        key("vol")
    );
    std::fs::write(gw.manifest_dir().join("volume.yaml"), volume).unwrap();
    assert!(warren_e2e::gateway::wait_for(std::time::Duration::from_secs(20), || gw.execute(&key("vol"), &json!({"code": "print(1)"})).status == 200), "the volume's key never loaded");

    // Executions through the API: hostile output, and one tagged to filter on.
    let xss = gw.execute(&key("main"), &json!({"code": format!("print({XSS:?})"), "metadata": {"suite": "console"}}));
    assert_eq!(xss.status, 200, "{}", xss.text());
    let xss_trace = xss.json()["trace_id"].as_str().unwrap().to_string();
    let other = gw.execute(&key("short"), &json!({"code": "exit 3", "language": "bash"}));
    let other_trace = other.json()["trace_id"].as_str().unwrap().to_string();
    gw.record_when("main", &xss_trace, ended);
    gw.record_when("short", &other_trace, ended);

    // Anonymous: sent to sign in, which on one machine points at the link.
    let b = Browser::start().unwrap();
    b.goto(&format!("http://{listen}/executions")).unwrap();
    assert!(b.url().unwrap().contains("/signin?return=%2Fexecutions"), "{}", b.url().unwrap());
    assert!(b.text().unwrap().contains("one-time sign-in link"));

    // The link signs the local admin in, once.
    let link = std::fs::read_to_string(&link_file).unwrap().trim().to_string();
    b.goto(&link).unwrap();
    assert_eq!(b.url().unwrap(), format!("http://{listen}/"));
    let overview = b.text().unwrap();
    assert!(overview.contains("local-admin") && overview.contains("1 of 1") && overview.contains("nodes ready"), "{overview}");
    assert!(overview.contains("success") && overview.contains("failed"), "outcomes of the last day: {overview}");
    // Capacity (#48): the node's running of max (the agent's default 32), the
    // ready nodes' slots summed, and this gateway's queue for a node slot (empty: nothing waits).
    let source = b.source().unwrap();
    for want in ["<th>running of max</th>", " of 32</td>", " of 32</strong>node slots in use", "<strong>0</strong>waiting for a node slot (this gateway)", "executions in flight (this gateway)"] {
        assert!(source.contains(want), "{want} not on the overview: {source}");
    }
    b.screenshot(&shots, "overview").unwrap();
    let again = http::get(console, &link.replace(&format!("http://{listen}"), ""));
    assert_eq!(again.status, 403, "a used link signs nobody in");
    assert_ne!(std::fs::read_to_string(&link_file).unwrap().trim(), link, "the next link is written");

    // The audit log, then filtered by the form.
    b.goto(&format!("http://{listen}/executions")).unwrap();
    let list = b.text().unwrap();
    assert!(list.contains(&xss_trace) && list.contains(&other_trace), "{list}");
    b.screenshot(&shots, "executions").unwrap();
    let metadata = b.find("input[name=metadata]").unwrap();
    b.type_into(&metadata, "suite=console").unwrap();
    b.click_to(&b.find("form.filters button").unwrap(), |u| u.contains("metadata=suite%3Dconsole")).unwrap();
    let filtered = b.text().unwrap();
    assert!(filtered.contains(&xss_trace) && !filtered.contains(&other_trace), "{filtered}");

    // The hostile execution: shown as text, nothing ran.
    b.click_to(&b.find(&format!("a[href='/executions/{xss_trace}']")).unwrap(), |u| u.ends_with(&xss_trace)).unwrap();
    let page = b.text().unwrap();
    assert!(page.contains(XSS), "the payload is shown as text: {page}");
    assert_eq!(b.eval("return [typeof window.__xss, document.scripts.length, document.images.length]").unwrap(), json!(["undefined", 0, 0]));
    assert!(!b.alert_open(), "no dialog opened");
    b.screenshot(&shots, "execution").unwrap();

    // Keys by their prefix only; the Sandboxes as keys narrow them.
    b.goto(&format!("http://{listen}/keys")).unwrap();
    let keys = b.source().unwrap();
    assert!(keys.contains("sk-wrn-main") && !keys.contains(&key("main")), "a key shows as its prefix, never whole");
    assert!(b.text().unwrap().contains("disabled"), "the disabled key says so");
    b.screenshot(&shots, "keys").unwrap();
    b.goto(&format!("http://{listen}/sandboxes")).unwrap();
    assert!(b.text().unwrap().contains("default/sb"));
    b.screenshot(&shots, "sandboxes").unwrap();

    // A running execution: its page reloads itself until it ends; cancelled from the console.
    let running = http::post(gw.addr, "/v1/sandbox/execute", &[("Authorization", &format!("Bearer {}", key("main"))), ("Content-Type", "application/json"), ("Prefer", "respond-async")], br#"{"code": "echo up; sleep 50", "language": "bash"}"#);
    assert_eq!(running.status, 202, "{}", running.text());
    let running = running.json()["trace_id"].as_str().unwrap().to_string();
    gw.record_when("main", &running, |r| r["status"] == "running");
    b.goto(&format!("http://{listen}/executions/{running}")).unwrap();
    assert!(b.text().unwrap().contains("running"));
    b.screenshot(&shots, "execution-running").unwrap();
    b.click_to(&b.find("form[action$='/cancel'] button").unwrap(), |u| u.ends_with(&running)).unwrap();
    let v = gw.record_when("main", &running, ended);
    assert_eq!(v["status"], "cancelled", "{v}");
    b.goto(&format!("http://{listen}/activity")).unwrap();
    let activity = b.text().unwrap();
    assert!(activity.contains("local-admin") && activity.contains("cancel-execution") && activity.contains(&running), "{activity}");

    // The playground: code run with a key, watched on its page while it runs, recorded as the console's.
    b.goto(&format!("http://{listen}/playground")).unwrap();
    b.click(&b.find("option[value='default/main']").unwrap()).unwrap();
    b.click(&b.find("select[name=language] option:nth-child(3)").unwrap()).unwrap();
    b.type_into(&b.find("textarea[name=code]").unwrap(), "echo first; sleep 2; echo 'played-<i>here</i>'; sleep 50").unwrap();
    b.screenshot(&shots, "playground").unwrap();
    b.click_to(&b.find("form.playground button").unwrap(), |u| u.contains("/executions/trc_")).unwrap();
    let played = b.url().unwrap().rsplit('/').next().unwrap().to_string();
    // Followed live (server-sent events, text nodes): the later line arrives without a reload.
    b.eval("window.__same_page = true; return 1").unwrap();
    assert!(warren_e2e::gateway::wait_for(std::time::Duration::from_secs(20), || b.text().is_ok_and(|t| t.contains("played-<i>here</i>"))), "the running execution's output never showed: {}", b.text().unwrap_or_default());
    assert_eq!(b.eval("return [window.__same_page === true, document.querySelectorAll('pre.live i').length, document.scripts.length]").unwrap(), json!([true, 0, 1]), "the same page, the output as text, only the console's own script");
    b.screenshot(&shots, "playground-running").unwrap();
    b.click_to(&b.find("form[action$='/cancel'] button").unwrap(), |u| u.ends_with(&played)).unwrap();
    let v = gw.record_when("main", &played, ended);
    assert_eq!((v["delivery_mode"].as_str(), v["metadata"]["console.user"].as_str()), (Some("console"), Some("local-admin")), "{v}");

    // A thread's files: listed, downloaded as an attachment, and the thread deleted.
    let t = gw.execute(&key("thr"), &json!({"code": "printf 'hello <b>' > ~/report.txt", "language": "bash", "thread_id": "console-t"}));
    assert_eq!(t.status, 200, "{}", t.text());
    let t = t.json()["trace_id"].as_str().unwrap().to_string();
    gw.record_when("thr", &t, ended);
    b.goto(&format!("http://{listen}/executions/{t}")).unwrap();
    b.click_to(&b.find("a[href='/files/default/thr/thread/console-t']").unwrap(), |u| u.ends_with("/thread/console-t")).unwrap();
    assert!(b.text().unwrap().contains("report.txt"), "{}", b.text().unwrap());
    b.screenshot(&shots, "thread-files").unwrap();
    let cookie = b.cookie("warren_console").unwrap();
    let file = http::raw(console, format!("GET /files/default/thr/thread/console-t/download?path=report.txt HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    assert_eq!((file.status, file.text().as_str()), (200, "hello <b>"));
    assert_eq!(file.header("content-disposition"), Some("attachment; filename=\"report.txt\""));
    assert_eq!(file.header("content-type"), Some("application/octet-stream"));
    let escape = http::raw(console, format!("GET /files/default/thr/thread/console-t/download?path=..%2F..%2Fetc%2Fpasswd HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    assert!(escape.status >= 400 && !escape.text().contains("root:"), "no way out of the home: {}", escape.status);
    // Uploaded by the page's form (multipart, in a new directory), and one file deleted by its
    // button: each a save of the thread, as an execution's changes are.
    let local = dir.path().join("notes.txt");
    std::fs::write(&local, "from the console\n").unwrap();
    b.type_into(&b.find("form[action$='/upload'] input[name=path]").unwrap(), "docs/notes.txt").unwrap();
    b.type_into(&b.find("form[action$='/upload'] input[type=file]").unwrap(), local.to_str().unwrap()).unwrap();
    b.click_to_next_page(&b.find("form[action$='/upload'] button").unwrap()).unwrap();
    assert!(b.text().unwrap().contains("docs/notes.txt"), "{}", b.text().unwrap());
    b.click_to_next_page(&b.find("form[action$='/remove']:has(input[value='report.txt']) button").unwrap()).unwrap();
    assert!(!b.text().unwrap().contains("report.txt"), "{}", b.text().unwrap());
    b.screenshot(&shots, "thread-files-changed").unwrap();
    let now = gw.execute(&key("thr"), &json!({"code": "cat ~/docs/notes.txt; test -e ~/report.txt || echo gone", "language": "bash", "thread_id": "console-t"}));
    assert_eq!(now.json()["stdout"].as_str(), Some("from the console\ngone\n"), "{}", now.text());
    // A delete without the session's token, or of a path out of the home, changes nothing.
    let thread_files = "/files/default/thr/thread/console-t";
    let forged = http::post(console, &format!("{thread_files}/remove"), &[("Cookie", &cookie), ("Content-Type", "application/x-www-form-urlencoded")], b"csrf=forged&path=docs%2Fnotes.txt");
    assert_eq!(forged.status, 403);
    let csrf = b.eval("return document.querySelector(\"input[name=csrf]\").value").unwrap();
    let out = format!("csrf={}&path=..%2F..%2Fetc%2Fpasswd", csrf.as_str().unwrap());
    let escape = http::post(console, &format!("{thread_files}/remove"), &[("Cookie", &cookie), ("Content-Type", "application/x-www-form-urlencoded")], out.as_bytes());
    assert_eq!(escape.status, 400, "{}", escape.text());
    assert!(std::path::Path::new("/etc/passwd").exists());
    // Its history: the execution's version restored by its button, and forked by its form.
    b.goto(&format!("http://{listen}{thread_files}")).unwrap();
    let page = b.text().unwrap();
    assert!(page.contains("History") && page.contains(&t) && page.contains("files"), "{page}");
    b.click_to_next_page(&b.find(&format!("form[action$='/restore']:has(input[value='{t}']) button")).unwrap()).unwrap();
    let page = b.text().unwrap();
    assert!(page.contains("report.txt") && !page.contains("docs/notes.txt") && page.contains("restore"), "back to the execution's version: {page}");
    b.type_into(&b.find(&format!("form[action$='/fork']:has(input[value='{t}']) input[name=thread_id]")).unwrap(), "console-fork").unwrap();
    b.click_to(&b.find(&format!("form[action$='/fork']:has(input[value='{t}']) button")).unwrap(), |u| u.ends_with("/thread/console-fork")).unwrap();
    assert!(b.text().unwrap().contains("report.txt"), "{}", b.text().unwrap());
    b.screenshot(&shots, "thread-forked").unwrap();
    let forked = gw.execute(&key("thr"), &json!({"code": "cat ~/report.txt", "language": "bash", "thread_id": "console-fork"}));
    assert_eq!(forked.json()["stdout"].as_str(), Some("hello <b>"), "{}", forked.text());
    let forged = http::post(console, &format!("{thread_files}/restore"), &[("Cookie", &cookie), ("Content-Type", "application/x-www-form-urlencoded")], format!("csrf=forged&at={t}").as_bytes());
    assert_eq!(forged.status, 403, "a restore without the session's token changes nothing");
    b.goto(&format!("http://{listen}{thread_files}")).unwrap();
    b.click_to_next_page(&b.find("form[action$='/delete'] button").unwrap()).unwrap();
    let after = gw.execute(&key("thr"), &json!({"code": "cat ~/docs/notes.txt", "language": "bash", "thread_id": "console-t"}));
    assert_ne!(after.json()["exit_code"], 0, "the deleted thread starts fresh: {}", after.text());

    // A managed volume: linked from the Sandboxes page, a file uploaded and deleted there.
    b.goto(&format!("http://{listen}/sandboxes")).unwrap();
    b.click_to(&b.find("a[href='/files/default/vol/volume/work']").unwrap(), |u| u.ends_with("/volume/work")).unwrap();
    b.type_into(&b.find("form[action$='/upload'] input[type=file]").unwrap(), local.to_str().unwrap()).unwrap();
    b.click_to_next_page(&b.find("form[action$='/upload'] button").unwrap()).unwrap();
    assert!(b.text().unwrap().contains("notes.txt"), "stored under the file's own name: {}", b.text().unwrap());
    let read = gw.execute(&key("vol"), &json!({"code": "cat /data/work/notes.txt", "language": "bash"}));
    assert_eq!(read.json()["stdout"].as_str(), Some("from the console\n"), "{}", read.text());
    b.click_to_next_page(&b.find("form[action$='/remove']:has(input[value='notes.txt']) button").unwrap()).unwrap();
    let gone = gw.execute(&key("vol"), &json!({"code": "test -e /data/work/notes.txt || echo gone", "language": "bash"}));
    assert_eq!(gone.json()["stdout"].as_str(), Some("gone\n"), "{}", gone.text());
    let activity = http::raw(console, format!("GET /activity HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n").as_bytes()).unwrap().text();
    for action in ["upload-file", "delete-file", "delete-thread"] {
        assert!(activity.contains(action), "{action} in the console's activity: {activity}");
    }

    // A form posted without the session's token changes nothing.
    let forged = http::post(console, "/signout", &[("Cookie", &cookie), ("Content-Type", "application/x-www-form-urlencoded")], b"csrf=forged");
    assert_eq!(forged.status, 403);
    b.goto(&format!("http://{listen}/account")).unwrap();
    assert!(b.text().unwrap().contains("local-admin"), "still signed in");
    b.screenshot(&shots, "account").unwrap();
    // Signing out with the page's own form ends the session.
    b.click_to(&b.find("header form button").unwrap(), |u| u.contains("/signin")).unwrap();
    b.goto(&format!("http://{listen}/")).unwrap();
    assert!(b.url().unwrap().contains("/signin?return=%2F"), "signed out: {}", b.url().unwrap());
    println!("screenshots in {}", shots.display());
}

/// A terminal in the console (issue #46): the local admin opens a live
/// sandbox of a key from the Terminal page, types into xterm.js in the
/// real browser and reads the shell's answer back from the page; a
/// WebSocket from another site's page is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_types_into_a_terminal_in_the_browser() {
    if skip_unless_root("a_user_types_into_a_terminal_in_the_browser") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let link_file = dir.path().join("console-link");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let _gw = Gateway::start(&[agent.address()], &["--console-listen", &listen, "--console-link-file", link_file.to_str().unwrap()], true).await.unwrap();
    let shots = screenshot_dir();
    let b = Browser::start().unwrap();
    b.goto(&std::fs::read_to_string(&link_file).unwrap().trim().to_string()).unwrap();
    b.goto(&format!("http://{listen}/terminal")).unwrap();
    b.click(&b.find("form.terminal option[value='default/main']").unwrap()).unwrap();
    b.click_to(&b.find("form.terminal button").unwrap(), |u| u.contains("/terminal/")).unwrap();
    let id = b.url().unwrap().rsplit('/').next().unwrap().to_string();
    let rows = "return (document.querySelector('.xterm-rows') || {}).textContent || ''";
    assert!(warren_e2e::gateway::wait_for(std::time::Duration::from_secs(20), || b.eval(rows).is_ok_and(|t| t.as_str().is_some_and(|t| t.contains('$')))), "no prompt: {:?}", b.eval(rows));
    let input = b.find(".xterm-helper-textarea").unwrap();
    b.send_keys(&input, "echo $((6*7)) from $(hostname)\u{E007}").unwrap();
    let answered = warren_e2e::gateway::wait_for(std::time::Duration::from_secs(20), || b.eval(rows).is_ok_and(|t| t.as_str().is_some_and(|t| t.contains("42 from sandbox"))));
    assert!(answered, "the shell's answer never showed: {:?}", b.eval(rows));
    b.screenshot(&shots, "terminal").unwrap();
    // Another site's page cannot open it with the user's cookie.
    let cookie = b.cookie("warren_console").unwrap();
    let console: std::net::SocketAddr = listen.parse().unwrap();
    let upgrade = |origin: &str| {
        let req = format!(
            "GET /terminal/{id}/ws HTTP/1.1\r\nHost: {listen}\r\nCookie: {cookie}\r\nOrigin: {origin}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        );
        // Only the status line: an accepted upgrade keeps the connection open.
        use std::io::{BufRead, Write};
        let mut s = std::net::TcpStream::connect(console).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(s).read_line(&mut line).unwrap();
        line.split_whitespace().nth(1).and_then(|c| c.parse::<u16>().ok()).unwrap_or(0)
    };
    assert_eq!(upgrade("http://evil.example"), 403);
    assert_eq!(upgrade(&format!("http://{listen}")), 101, "the console's own page may");
    // The shell's exit ends the session, said in the page.
    b.send_keys(&input, "exit\u{E007}").unwrap();
    let closed = "return document.querySelector('#terminal').getAttribute('data-closed')";
    assert!(warren_e2e::gateway::wait_for(std::time::Duration::from_secs(20), || b.eval(closed).is_ok_and(|v| v.as_str() == Some("exit 0"))), "{:?}", b.eval(closed));
    // The Sandboxes page lists the live sandbox with its status (its shell
    // gone: ready); the Activity page has the session, by the signed-in user.
    let text = "return document.body.textContent";
    let shows = |path: &str, want: &[&str]| {
        warren_e2e::gateway::wait_for(std::time::Duration::from_secs(20), || {
            b.goto(&format!("http://{listen}{path}")).is_ok() && b.eval(text).is_ok_and(|t| t.as_str().is_some_and(|t| want.iter().all(|w| t.contains(w))))
        })
    };
    assert!(shows("/sandboxes", &["Live sandboxes", &id, "ready"]), "{:?}", b.eval(text));
    assert!(shows("/activity", &["sandbox.create", "sandbox.terminal", &format!("main/{id}: console terminal")]), "{:?}", b.eval(text));
}
