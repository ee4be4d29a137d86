//! The execute endpoint refuses malformed and hostile requests with the
//! documented status and JSON error, and nothing reaches a node.
//! Real gateway, real node-agent.

use std::net::SocketAddr;

use warren_e2e::gateway::{key, Gateway};
use warren_e2e::http;
use warren_e2e::{skip_unless_root, Agent};

struct Case {
    name: &'static str,
    request: Vec<u8>,
    status: u16,
    code: &'static str,
    field: Option<&'static str>,
}

fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len()).into_bytes();
    for (n, v) in headers {
        r.extend_from_slice(n.as_bytes());
        r.extend_from_slice(b": ");
        r.extend_from_slice(v);
        r.extend_from_slice(b"\r\n");
    }
    r.extend_from_slice(b"\r\n");
    r.extend_from_slice(body);
    r
}

/// The table. `addr` is the gateway; `main` the usual key.
fn cases(addr: SocketAddr) -> Vec<Case> {
    let main = format!("Bearer {}", key("main"));
    let json = |body: &[u8]| request(addr, "POST", "/v1/sandbox/execute", &[("Authorization", main.as_bytes()), ("Content-Type", b"application/json")], body);
    let with = |k: &str, body: &[u8]| {
        let auth = format!("Bearer {}", key(k));
        request(addr, "POST", "/v1/sandbox/execute", &[("Authorization", auth.as_bytes()), ("Content-Type", b"application/json")], body)
    };
    let headers = |h: &[(&str, &[u8])]| request(addr, "POST", "/v1/sandbox/execute", h, br#"{"code":"print(1)"}"#);
    let bad = |name, request, field| Case { name, request, status: 400, code: "invalid_request", field: Some(field) };
    let bad_json = |name, body: &[u8]| Case { name, request: json(body), status: 400, code: "invalid_json", field: None };
    let huge_code = format!(r#"{{"code":"{}"}}"#, "x".repeat((1 << 20) + 1));
    let meta11: String = (0..11).map(|i| format!(r#""k{i}":"v""#)).collect::<Vec<_>>().join(",");
    let env51: String = (0..51).map(|i| format!(r#""V{i}":"v""#)).collect::<Vec<_>>().join(",");
    let deep = format!(r#"{{"code":"x","metadata":{}1{}}}"#, "[".repeat(2000), "]".repeat(2000));
    let long_thread = format!(r#"{{"code":"x","thread_id":"{}"}}"#, "a".repeat(129));
    let long_meta_key = format!(r#"{{"code":"x","metadata":{{"{}":"v"}}}}"#, "k".repeat(41));
    let long_meta_val = format!(r#"{{"code":"x","metadata":{{"k":"{}"}}}}"#, "v".repeat(257));
    let long_env_val = format!(r#"{{"code":"x","env_vars":{{"A":"{}"}}}}"#, "v".repeat(4097));
    let sub11 = format!(r#"{{"code":"x","sub_paths":[{}]}}"#, [r#""/data/m/a""#; 11].join(","));
    vec![
        // Authentication and authorisation.
        Case { name: "no Authorization", request: headers(&[("Content-Type", b"application/json")]), status: 401, code: "missing_api_key", field: None },
        Case { name: "Bearer without key", request: headers(&[("Authorization", b"Bearer"), ("Content-Type", b"application/json")]), status: 401, code: "invalid_api_key", field: None },
        Case { name: "Basic scheme", request: headers(&[("Authorization", format!("Basic {}", key("main")).as_bytes()), ("Content-Type", b"application/json")]), status: 401, code: "invalid_api_key", field: None },
        Case { name: "unknown key", request: headers(&[("Authorization", format!("Bearer {}", key("nobody")).as_bytes()), ("Content-Type", b"application/json")]), status: 401, code: "invalid_api_key", field: None },
        Case { name: "key with non-ASCII bytes", request: headers(&[("Authorization", b"Bearer sk-wrn-\xff\xfeAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"), ("Content-Type", b"application/json")]), status: 401, code: "invalid_api_key", field: None },
        Case { name: "two Authorization headers", request: headers(&[("Authorization", main.as_bytes()), ("Authorization", b"Bearer x"), ("Content-Type", b"application/json")]), status: 401, code: "missing_api_key", field: None },
        Case { name: "disabled key", request: with("off", br#"{"code":"print(1)"}"#), status: 403, code: "api_key_disabled", field: None },
        // Content type and size.
        Case { name: "no Content-Type", request: headers(&[("Authorization", main.as_bytes())]), status: 415, code: "unsupported_media_type", field: None },
        Case { name: "text/plain", request: headers(&[("Authorization", main.as_bytes()), ("Content-Type", b"text/plain")]), status: 415, code: "unsupported_media_type", field: None },
        Case { name: "form encoded", request: headers(&[("Authorization", main.as_bytes()), ("Content-Type", b"application/x-www-form-urlencoded")]), status: 415, code: "unsupported_media_type", field: None },
        Case { name: "JSON in latin1", request: headers(&[("Authorization", main.as_bytes()), ("Content-Type", b"application/json; charset=latin1")]), status: 415, code: "unsupported_media_type", field: None },
        Case {
            name: "declared body over 4 MiB",
            request: {
                let mut r = json(b"{}");
                let at = r.windows(16).position(|w| w == b"Content-Length: ").unwrap();
                r.splice(at..at + 17, b"Content-Length: 5000000".iter().copied());
                r.truncate(r.len() - 2);
                r
            },
            status: 413,
            code: "payload_too_large",
            field: None,
        },
        // Not JSON, or not the right JSON.
        bad_json("empty body", b""),
        bad_json("truncated JSON", br#"{"code": "print(1)""#),
        bad_json("not JSON at all", b"print(1)"),
        bad_json("invalid UTF-8 in a string", b"{\"code\": \"print('\xff\xfe')\"}"),
        bad_json("array body", br#"["code"]"#),
        bad_json("string body", br#""code""#),
        bad_json("trailing data", br#"{"code":"x"} {"code":"y"}"#),
        bad_json("duplicate key", br#"{"code":"print(1)","code":"import os"}"#),
        bad_json("number out of range", br#"{"code":"x","timeout":1e999}"#),
        bad_json("nesting 2000 deep", deep.as_bytes()),
        // Fields.
        bad("unknown field (typo)", json(br#"{"code":"x","timout":5}"#), "timout"),
        bad("unknown field image", json(br#"{"code":"x","image":"evil"}"#), "image"),
        bad("code missing", json(br#"{"language":"python"}"#), "code"),
        bad("code empty", json(br#"{"code":""}"#), "code"),
        bad("code not a string", json(br#"{"code":42}"#), "code"),
        bad("code over 1 MiB", json(huge_code.as_bytes()), "code"),
        bad("code with NUL", json(br#"{"code":"print(1)\u0000"}"#), "code"),
        bad("language unknown", json(br#"{"code":"x","language":"ruby"}"#), "language"),
        bad("language wrong case", json(br#"{"code":"x","language":"Python"}"#), "language"),
        bad("language a number", json(br#"{"code":"x","language":5}"#), "language"),
        bad("language not in the sandbox", with("bashonly", br#"{"code":"x","language":"python"}"#), "language"),
        bad("timeout zero", json(br#"{"code":"x","timeout":0}"#), "timeout"),
        bad("timeout negative", json(br#"{"code":"x","timeout":-1}"#), "timeout"),
        bad("timeout over 3600", json(br#"{"code":"x","timeout":3601}"#), "timeout"),
        bad("timeout over the key's maximum", json(br#"{"code":"x","timeout":61}"#), "timeout"),
        bad("timeout a string", json(br#"{"code":"x","timeout":"60"}"#), "timeout"),
        bad("timeout fractional", json(br#"{"code":"x","timeout":1.5}"#), "timeout"),
        bad("timeout huge integer", json(br#"{"code":"x","timeout":99999999999999999999999}"#), "timeout"),
        bad("timeout 1e300", json(br#"{"code":"x","timeout":1e300}"#), "timeout"),
        bad("thread_id leading dash", json(br#"{"code":"x","thread_id":"-a"}"#), "thread_id"),
        bad("thread_id with slash", json(br#"{"code":"x","thread_id":"a/../b"}"#), "thread_id"),
        bad("thread_id empty", json(br#"{"code":"x","thread_id":""}"#), "thread_id"),
        bad("thread_id 129 chars", json(long_thread.as_bytes()), "thread_id"),
        bad("thread_id header injection", json(br#"{"code":"x","thread_id":"a\r\nSet-Cookie: x=1"}"#), "thread_id"),
        bad("thread_id a number", json(br#"{"code":"x","thread_id":7}"#), "thread_id"),
        bad("metadata 11 keys", json(format!(r#"{{"code":"x","metadata":{{{meta11}}}}}"#).as_bytes()), "metadata"),
        bad("metadata a list", json(br#"{"code":"x","metadata":["a"]}"#), "metadata"),
        bad("metadata non-string value", json(br#"{"code":"x","metadata":{"user":1}}"#), "metadata.user"),
        bad("metadata key 41 chars", json(long_meta_key.as_bytes()), "metadata.kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"),
        bad("metadata value 257 chars", json(long_meta_val.as_bytes()), "metadata.k"),
        bad("metadata log injection", json(br#"{"code":"x","metadata":{"k":"a\n{\"outcome\":\"forged\"}"}}"#), "metadata.k"),
        bad("metadata bad key", json(br#"{"code":"x","metadata":{"a b":"v"}}"#), "metadata.a?b"),
        bad("env_vars lower-case name", json(br#"{"code":"x","env_vars":{"lower":"v"}}"#), "env_vars.lower"),
        bad("env_vars PATH", json(br#"{"code":"x","env_vars":{"PATH":"/tmp"}}"#), "env_vars.PATH"),
        bad("env_vars LD_PRELOAD", json(br#"{"code":"x","env_vars":{"LD_PRELOAD":"/tmp/x.so"}}"#), "env_vars.LD_PRELOAD"),
        bad("env_vars own prefix", json(br#"{"code":"x","env_vars":{"WARREN_NODE":"x"}}"#), "env_vars.WARREN_NODE"),
        bad("env_vars NUL in value", json(br#"{"code":"x","env_vars":{"A":"a\u0000b"}}"#), "env_vars.A"),
        bad("env_vars value not a string", json(br#"{"code":"x","env_vars":{"A":1}}"#), "env_vars.A"),
        bad("env_vars value 4097 bytes", json(long_env_val.as_bytes()), "env_vars.A"),
        bad("env_vars 51 variables", json(format!(r#"{{"code":"x","env_vars":{{{env51}}}}}"#).as_bytes()), "env_vars"),
        bad("sub_paths not a list", json(br#"{"code":"x","sub_paths":"/data/m"}"#), "sub_paths"),
        bad("sub_paths traversal", json(br#"{"code":"x","sub_paths":["/data/m/../../etc"]}"#), "sub_paths[0]"),
        bad("sub_paths encoded traversal", json(br#"{"code":"x","sub_paths":["/data/m/%2e%2e/x"]}"#), "sub_paths[0]"),
        bad("sub_paths outside /data", json(br#"{"code":"x","sub_paths":["/etc/passwd"]}"#), "sub_paths[0]"),
        bad("sub_paths 11 paths", json(sub11.as_bytes()), "sub_paths"),
        bad("sub_paths unknown mount", json(br#"{"code":"x","sub_paths":["/data/m/a"]}"#), "sub_paths[0]"),
        bad("webhook_url without Prefer", json(br#"{"code":"x","webhook_url":"https://example.invalid/h"}"#), "webhook_url"),
        bad("webhook_url over http", json(br#"{"code":"x","webhook_url":"http://example.invalid/h"}"#), "webhook_url"),
        Case {
            name: "webhook_url to the metadata address",
            request: request(addr, "POST", "/v1/sandbox/execute", &[("Authorization", main.as_bytes()), ("Content-Type", b"application/json"), ("Prefer", b"respond-async")], br#"{"code":"x","webhook_url":"https://169.254.169.254/latest"}"#),
            status: 400,
            code: "invalid_request",
            field: Some("webhook_url"),
        },
        // Routing.
        Case { name: "GET on execute", request: request(addr, "GET", "/v1/sandbox/execute", &[("Authorization", main.as_bytes())], b""), status: 405, code: "method_not_allowed", field: None },
        Case { name: "unknown path", request: request(addr, "POST", "/v1/sandbox/../../etc/passwd", &[], b""), status: 404, code: "not_found", field: None },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_hostile_requests_get_their_documented_error() {
    if skip_unless_root("malformed_and_hostile_requests_get_their_documented_error") {
        return;
    }
    let agent = Agent::start(&[]).await.unwrap();
    let gw = Gateway::start(&[agent.address()], &[], true).await.unwrap();
    let table = cases(gw.addr);
    assert!(table.len() >= 40, "the table has {} cases", table.len());
    let mut failures = Vec::new();
    for c in &table {
        let r = http::raw(gw.addr, &c.request).unwrap();
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null);
        let field = body.get("field").and_then(|f| f.as_str());
        let ok = r.status == c.status
            && body["error"] == c.code
            && body["message"].as_str().is_some_and(|m| !m.is_empty())
            && field == c.field
            && r.header("content-type") == Some("application/json")
            && r.header("set-cookie").is_none();
        if !ok {
            failures.push(format!("{}: got {} {}", c.name, r.status, r.text().chars().take(300).collect::<String>()));
        }
        // The key never comes back in an error.
        assert!(!r.text().contains(&key("main")), "{}: response echoes the key", c.name);
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), table.len(), failures.join("\n"));
    // Nothing ran: no audit record, the agent never saw an execution.
    assert!(gw.audit_records().is_empty(), "{:?}", gw.audit_records());
    let mut client = agent.client().await.unwrap();
    let status = client.status(warren_proto::agent::StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(status.running_executions, 0);
    // And the gateway still serves.
    let r = gw.execute(&key("main"), &serde_json::json!({"code": "print('still here')"}));
    assert_eq!((r.status, r.json()["stdout"].as_str()), (200, Some("still here\n")));
}

/// Reads until the peer closes; returns what arrived.
fn read_to_close(s: &mut std::net::TcpStream) -> String {
    use std::io::Read;
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_cut_off_and_connections_are_capped() {
    if skip_unless_root("slow_clients_are_cut_off_and_connections_are_capped") {
        return;
    }
    use std::io::Write;
    let agent = Agent::start(&[]).await.unwrap();
    let args = ["--header-timeout-ms", "1000", "--body-timeout-ms", "1000", "--max-connections", "1"];
    let gw = Gateway::start(&[agent.address()], &args, false).await.unwrap();
    // Only one connection is served at a time: a second client waits until
    // the first one (sending nothing, slow-loris style) is cut off.
    let mut idle = std::net::TcpStream::connect(gw.addr).unwrap();
    let waiting = std::thread::spawn({
        let addr = gw.addr;
        move || {
            let r = http::get(addr, "/healthz");
            (r.status, std::time::Instant::now())
        }
    });
    let idle_said = read_to_close(&mut idle);
    let closed_at = std::time::Instant::now();
    assert!(!idle_said.contains("200 OK"), "the idle connection got nothing but a close: {idle_said:?}");
    let (status, served_at) = waiting.join().unwrap();
    assert_eq!(status, 200);
    assert!(served_at >= closed_at, "the second client was served only once the first was gone");
    // Headers that never finish: the connection is closed.
    let mut slow = std::net::TcpStream::connect(gw.addr).unwrap();
    slow.write_all(b"POST /v1/sandbox/execute HTTP/1.1\r\nHost: x\r\n").unwrap();
    let said = read_to_close(&mut slow);
    assert!(!said.contains("HTTP/1.1 2"), "{said:?}");
    // A body that never finishes: 408 with the documented error, nothing ran.
    let mut trickle = std::net::TcpStream::connect(gw.addr).unwrap();
    let head = format!(
        "POST /v1/sandbox/execute HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"code\":",
        key("main")
    );
    trickle.write_all(head.as_bytes()).unwrap();
    let said = read_to_close(&mut trickle);
    assert!(said.starts_with("HTTP/1.1 408") && said.contains("\"error\":\"request_timeout\""), "{said:?}");
    assert!(gw.audit_records().is_empty());
    // A kept-alive connection left idle is closed too, after its response.
    let mut kept = std::net::TcpStream::connect(gw.addr).unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let said = read_to_close(&mut kept);
    assert!(said.starts_with("HTTP/1.1 200"), "{said:?}");
}

/// Reads one response (head and a `content-length` body) from a kept-alive
/// connection; returns the head (lowercased) and the body.
fn read_response(s: &mut std::net::TcpStream) -> (String, String) {
    use std::io::Read;
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "the connection closed mid-head: {:?}", String::from_utf8_lossy(&got));
        got.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
    let len = head.lines().find_map(|l| l.strip_prefix("content-length: ")).map_or(0, |n| n.trim().parse::<usize>().unwrap());
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).unwrap();
    (head, String::from_utf8_lossy(&body).into_owned())
}

/// A request refused before its body was read (a bad key) says
/// `connection: close`: the gateway cannot reuse that connection, and a
/// client that pools connections must know before it sends the next
/// request on it (without the header it raced the close and got "server
/// disconnected"). A request whose body was read keeps the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_before_the_body_is_read_close_the_connection() {
    use std::io::Write;
    // No node-agent is needed to refuse a key.
    let gw = Gateway::start(&["unix:/nonexistent/warren-agent.sock".to_string()], &[], false).await.unwrap();
    for path in ["/v1/sandbox/execute", "/mcp"] {
        let mut conn = std::net::TcpStream::connect(gw.addr).unwrap();
        // The body is announced but only partly sent: it cannot have been read.
        let head = format!("POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-wrn-nope\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"code\":");
        conn.write_all(head.as_bytes()).unwrap();
        let (head, body) = read_response(&mut conn);
        assert!(head.starts_with("http/1.1 401"), "{path}: {head}");
        assert!(body.contains("\"error\":\"invalid_api_key\""), "{path}: {body}");
        assert!(head.contains("\r\nconnection: close\r\n"), "{path}: the refusal says the connection closes: {head}");
    }
    // A request with a read body (and no refusal before reading it) keeps the
    // connection: two requests on one connection both get answers.
    let mut conn = std::net::TcpStream::connect(gw.addr).unwrap();
    let auth = format!("Bearer {}", key("main"));
    for _ in 0..2 {
        let req = request(gw.addr, "POST", "/v1/sandbox/execute", &[("Authorization", auth.as_bytes()), ("Content-Type", b"application/json")], b"{\"code\":1}");
        let req = String::from_utf8(req).unwrap().replace("Connection: close\r\n", "");
        conn.write_all(req.as_bytes()).unwrap();
        let (head, body) = read_response(&mut conn);
        assert!(head.starts_with("http/1.1 400"), "{head}{body}");
        assert!(!head.contains("connection: close"), "{head}");
    }
}
