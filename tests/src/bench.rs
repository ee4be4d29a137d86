//! Helpers shared by the benchmarks: percentiles, bare interpreter runs, and
//! a keep-alive HTTP/1.1 client (one connection per simulated caller).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;

/// The `p` quantile of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

/// Milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs `interpreter script` with a minimal environment, output piped;
/// returns the wall time. The script must print `1`.
pub fn bare(interpreter: &str, script: &std::path::Path) -> Duration {
    let (d, out) = bare_output(interpreter, script);
    assert_eq!(out, b"1\n");
    d
}

/// [`bare`], returning what the script printed.
pub fn bare_output(interpreter: &str, script: &std::path::Path) -> (Duration, Vec<u8>) {
    let t = Instant::now();
    let out = Command::new(interpreter)
        .arg(script)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", "/tmp")
        .env("LANG", "C.UTF-8")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("bare run");
    (t.elapsed(), out.stdout)
}

/// The agent's pool as its status reports it: idle sandboxes, the memory
/// they hold, and the calls warm interpreters ran.
pub async fn pool_status(agent: &crate::Agent) -> (u32, u64, u64) {
    let s = agent.client().await.unwrap().status(warren_proto::agent::StatusRequest {}).await.unwrap().into_inner();
    (s.warm_sandboxes, s.warm_memory_bytes, s.warm_starts)
}

/// The pool's size once it stops changing for 300 ms (new shapes fill by
/// demand), and its memory.
pub async fn pool_settled(agent: &crate::Agent) -> (u32, u64) {
    let (mut last, mut since) = (pool_status(agent).await, Instant::now());
    while since.elapsed() < Duration::from_millis(300) {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = pool_status(agent).await;
        if now.0 != last.0 {
            since = Instant::now();
        }
        last = now;
    }
    (last.0, last.1)
}

/// Waits (bounded) until the pool holds `n` sandboxes again, as between an
/// agent's tool calls; false when it did not (an idle shape cooled meanwhile).
pub async fn pool_refilled(agent: &crate::Agent, n: u32) -> bool {
    for _ in 0..1000 {
        if pool_status(agent).await.0 >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    false
}

/// `v`, sorted.
pub fn sorted(v: &[Duration]) -> Vec<Duration> {
    let mut v = v.to_vec();
    v.sort();
    v
}

/// Prints each row's p50 and p99, and its p50 over the first row's (the
/// bare process of the same run), names padded to `width`.
pub fn print_rows<S: AsRef<str>>(rows: &[(S, Vec<Duration>)], width: usize) {
    let Some((_, first)) = rows.first() else { return };
    let bare_p50 = ms(percentile(&sorted(first), 0.5));
    for (name, v) in rows {
        let v = sorted(v);
        println!("{:<width$} p50 {:>7.2} ms  p99 {:>7.2} ms  ({:.2}× bare p50)", name.as_ref(), ms(percentile(&v, 0.5)), ms(percentile(&v, 0.99)), ms(percentile(&v, 0.5)) / bare_p50);
    }
}

/// One keep-alive HTTP/1.1 connection to the gateway.
pub struct Conn {
    sender: http1::SendRequest<Full<bytes::Bytes>>,
    host: String,
}

impl Conn {
    /// Connects to `addr`.
    pub async fn open(addr: std::net::SocketAddr) -> anyhow::Result<Conn> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let (sender, conn) = http1::handshake(TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        Ok(Conn { sender, host: addr.to_string() })
    }

    /// `POST /v1/sandbox/execute`; returns status and body.
    pub async fn execute(&mut self, key: &str, body: &[u8]) -> anyhow::Result<(u16, bytes::Bytes)> {
        self.execute_with(key, body, &[]).await
    }

    /// [`Conn::execute`] with extra headers (`Prefer: respond-async`).
    pub async fn execute_with(&mut self, key: &str, body: &[u8], headers: &[(&str, &str)]) -> anyhow::Result<(u16, bytes::Bytes)> {
        self.post(key, "/v1/sandbox/execute", body, headers).await
    }

    /// One execute's round trip with extra headers, its status checked (200).
    pub async fn timed(&mut self, key: &str, body: &str, headers: &[(&str, &str)]) -> Duration {
        let t = std::time::Instant::now();
        let (status, resp) = self.execute_with(key, body.as_bytes(), headers).await.unwrap();
        let d = t.elapsed();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&resp));
        d
    }

    /// `POST path` with a JSON `body` and extra headers; status and body.
    pub async fn post(&mut self, key: &str, path: &str, body: &[u8], headers: &[(&str, &str)]) -> anyhow::Result<(u16, bytes::Bytes)> {
        let mut req = hyper::Request::post(path)
            .header("host", &self.host)
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(bytes::Bytes::copy_from_slice(body)))?;
        self.sender.ready().await?;
        let resp = self.sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

/// What [`saturate`] measured.
#[derive(Debug)]
pub struct Saturation {
    /// Calls answered 200 with stdout `1\n`.
    pub ok: u64,
    /// Every other answer (or a broken connection).
    pub errors: u64,
    /// Seconds the phase took.
    pub seconds: f64,
    /// The first wrong answer, cut to 300 characters.
    pub first_error: Option<String>,
}

/// `clients` keep-alive clients call bash `echo 1` on the gateway at `addr`
/// with `key` until `duration` has passed or `max_calls` were made (bounded
/// both ways); a client whose call fails reconnects.
pub async fn saturate(addr: std::net::SocketAddr, key: &str, clients: usize, duration: Duration, max_calls: u64) -> Saturation {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let (ok, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let body = serde_json::json!({"code": "echo 1", "language": "bash"}).to_string();
    let (started, deadline) = (Instant::now(), Instant::now() + duration);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (ok, errors, body, k) = (ok.clone(), errors.clone(), body.clone(), key.to_string());
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await.expect("connect");
            let mut first_error = None;
            while Instant::now() < deadline && ok.load(Ordering::Relaxed) + errors.load(Ordering::Relaxed) < max_calls {
                match conn.execute(&k, body.as_bytes()).await {
                    Ok((200, b)) if serde_json::from_slice::<serde_json::Value>(&b).is_ok_and(|v| v["stdout"] == "1\n") => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    other => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        first_error.get_or_insert_with(|| format!("{other:?}").chars().take(300).collect::<String>());
                        if let Ok(c) = Conn::open(addr).await {
                            conn = c;
                        }
                    }
                }
            }
            first_error
        }));
    }
    let mut first_error = None;
    for t in tasks {
        if let Ok(Some(e)) = t.await {
            first_error.get_or_insert(e);
        }
    }
    Saturation { ok: ok.load(Ordering::Relaxed), errors: errors.load(Ordering::Relaxed), seconds: started.elapsed().as_secs_f64(), first_error }
}
