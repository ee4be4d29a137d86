//! A deliberately raw HTTP/1.1 client: tests need to send bytes no polite
//! client would (invalid UTF-8, truncated JSON, odd headers) and see exactly
//! what comes back.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A parsed response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// Body (de-chunked).
    pub body: Vec<u8>,
}

impl Response {
    /// First value of a header.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Body as JSON (panics with the body when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// Body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends raw bytes (a whole request) and reads the response to EOF.
pub fn raw(addr: SocketAddr, request: &[u8]) -> std::io::Result<Response> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    s.write_all(request)?;
    read_response(s)
}

/// Reads a response from `s` to EOF (or its last chunk).
pub fn read_response(s: TcpStream) -> std::io::Result<Response> {
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((n, v)) = l.split_once(':') {
            headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let chunked = headers.iter().any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(n) = headers.iter().find(|(n, _)| n == "content-length").and_then(|(_, v)| v.parse::<usize>().ok()) {
        // Exactly the body: a server that refused a request it had not read
        // may reset the connection right after it.
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(Response { status, headers, body })
}

/// A `method` request with the given headers and body (Content-Length set, connection closed).
pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len()).into_bytes();
    for (n, v) in headers {
        req.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body);
    raw(addr, &req).expect("HTTP request")
}

/// A POST with the given headers and body (Content-Length set, connection closed).
pub fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
    request(addr, "POST", path, headers, body)
}

/// A GET.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    raw(addr, format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).expect("HTTP request")
}

/// Sends `request` and reads until `marker` appears in what arrived; returns
/// the open connection (drop it to disconnect) and the text so far.
pub fn open_until(addr: SocketAddr, request: &[u8], marker: &str) -> std::io::Result<(TcpStream, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    s.write_all(request)?;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(marker) {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, String::from_utf8_lossy(&seen).into_owned()));
        }
        seen.extend_from_slice(&buf[..n]);
    }
    Ok((s, String::from_utf8_lossy(&seen).into_owned()))
}

/// The `x-trace-id` header in the text of a response's head.
pub fn trace_id(head: &str) -> String {
    head.lines().find_map(|l| l.strip_prefix("x-trace-id: ")).expect("x-trace-id header").trim().to_string()
}

/// An execute request as raw bytes (`Accept: application/x-ndjson` when `stream`).
pub fn execute_request(addr: SocketAddr, key: &str, body: &serde_json::Value, stream: bool) -> Vec<u8> {
    let body = body.to_string();
    let accept = if stream { "Accept: application/x-ndjson\r\n" } else { "" };
    format!(
        "POST /v1/sandbox/execute HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n{accept}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// NDJSON body lines, parsed.
pub fn ndjson(r: &Response) -> Vec<serde_json::Value> {
    r.text().lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect("NDJSON line")).collect()
}
