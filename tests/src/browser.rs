//! A real browser for the console's tests: Debian's `chromium`, driven by
//! `chromedriver` over W3C WebDriver (plain JSON over HTTP, sent with the
//! small client below). Headless, 1280×800, a profile of its
//! own; the driver and the browser are stopped on drop.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::Engine as _;
use serde_json::{json, Value};


/// Where the driver is (Debian's `chromium-driver`).
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A headless Chromium session.
pub struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a browser session (1280×800).
    pub fn start() -> anyhow::Result<Browser> {
        anyhow::ensure!(Path::new(CHROMEDRIVER).exists(), "{CHROMEDRIVER} is missing: apt-get install chromium chromium-driver (scripts/deps.sh does)");
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        // Its own process group: dropping the browser ends chromium's helpers too.
        let driver = Command::new(CHROMEDRIVER).arg(format!("--port={port}")).process_group(0).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().context("starting chromedriver")?;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let profile = tempfile::tempdir()?;
        let mut b = Browser { driver, addr, session: String::new(), _profile: profile };
        let start = Instant::now();
        while request(addr, "GET", "/status", "").map(|r| r.0).ok() != Some(200) {
            if start.elapsed() > Duration::from_secs(20) {
                bail!("chromedriver did not start");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--window-size=1280,800", "--hide-scrollbars", "--force-device-scale-factor=1"];
        let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        args.push(format!("--user-data-dir={}", b._profile.path().display()));
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args}}}});
        let v = b.call("POST", "/session", Some(caps))?;
        b.session = v["sessionId"].as_str().context("no session id")?.to_string();
        // The window holds more than the page: grow it until the viewport is 1280×800.
        let inner = b.eval("return [window.innerWidth, window.innerHeight]")?;
        let (w, h) = (inner[0].as_i64().unwrap_or(1280), inner[1].as_i64().unwrap_or(800));
        b.session_call("POST", "/window/rect", Some(json!({"width": 1280 + (1280 - w), "height": 800 + (800 - h)})))?;
        Ok(b)
    }

    /// One WebDriver command; its `value`.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let (status, text) = request(self.addr, method, path, &body)?;
        let v: Value = serde_json::from_str(&text).with_context(|| format!("{method} {path}: {text}"))?;
        if status != 200 {
            bail!("{method} {path}: {status} {}", v["value"]["error"].as_str().unwrap_or_default());
        }
        Ok(v["value"].clone())
    }

    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    /// Loads `url` and waits for it.
    pub fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.session_call("POST", "/url", Some(json!({"url": url}))).map(drop)
    }

    /// Where the browser is now.
    pub fn url(&self) -> anyhow::Result<String> {
        Ok(self.session_call("GET", "/url", None)?.as_str().unwrap_or_default().to_string())
    }

    /// The page's markup as the browser holds it.
    pub fn source(&self) -> anyhow::Result<String> {
        Ok(self.session_call("GET", "/source", None)?.as_str().unwrap_or_default().to_string())
    }

    /// The visible text of the page.
    pub fn text(&self) -> anyhow::Result<String> {
        let body = self.find("body")?;
        Ok(self.session_call("GET", &format!("/element/{body}/text"), None)?.as_str().unwrap_or_default().to_string())
    }

    /// The first element matching CSS `selector`.
    pub fn find(&self, selector: &str) -> anyhow::Result<String> {
        let v = self.session_call("POST", "/element", Some(json!({"using": "css selector", "value": selector})))?;
        v.as_object().and_then(|o| o.values().next()).and_then(Value::as_str).map(str::to_string).with_context(|| format!("no element {selector}"))
    }

    /// Clicks the element.
    pub fn click(&self, element: &str) -> anyhow::Result<()> {
        self.session_call("POST", &format!("/element/{element}/click"), Some(json!({}))).map(drop)
    }

    /// Clicks the element and waits (up to 20 s) until the browser is at a
    /// URL for which `arrived` holds: a click returns once the navigation
    /// starts, not once the redirects that follow are done.
    pub fn click_to(&self, element: &str, arrived: impl Fn(&str) -> bool) -> anyhow::Result<()> {
        self.click(element)?;
        let start = Instant::now();
        loop {
            let url = self.url()?;
            if arrived(&url) && self.eval("return document.readyState")? == "complete" {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(20) {
                bail!("the click did not lead where expected: at {url}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Clicks the element and waits (up to 20 s) until another document
    /// has loaded: for a form that posts and is sent back to the same URL.
    pub fn click_to_next_page(&self, element: &str) -> anyhow::Result<()> {
        self.eval("window.__warren_old_page = true; return 1")?;
        self.click(element)?;
        let start = Instant::now();
        loop {
            // Mid-navigation the driver may refuse a script: not there yet.
            if self.eval("return window.__warren_old_page === undefined && document.readyState === 'complete'").is_ok_and(|v| v == true) {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(20) {
                bail!("the click loaded no new page: at {}", self.url()?);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Clears the input and types `text` into it.
    pub fn type_into(&self, element: &str, text: &str) -> anyhow::Result<()> {
        self.session_call("POST", &format!("/element/{element}/clear"), Some(json!({})))?;
        self.session_call("POST", &format!("/element/{element}/value"), Some(json!({"text": text}))).map(drop)
    }

    /// Types `text` into the element as it is (WebDriver keys: `\u{E007}` is Enter).
    pub fn send_keys(&self, element: &str, text: &str) -> anyhow::Result<()> {
        self.session_call("POST", &format!("/element/{element}/value"), Some(json!({"text": text}))).map(drop)
    }

    /// Runs `script` in the page (the driver's channel, not the page's
    /// policy) and returns its value.
    pub fn eval(&self, script: &str) -> anyhow::Result<Value> {
        self.session_call("POST", "/execute/sync", Some(json!({"script": script, "args": []})))
    }

    /// True when a JavaScript dialog (`alert`) is open.
    pub fn alert_open(&self) -> bool {
        self.session_call("GET", "/alert/text", None).is_ok()
    }

    /// The session cookie's `name=value`, as the browser would send it.
    pub fn cookie(&self, name: &str) -> anyhow::Result<String> {
        let v = self.session_call("GET", &format!("/cookie/{name}"), None)?;
        Ok(format!("{name}={}", v["value"].as_str().unwrap_or_default()))
    }

    /// Writes a PNG of the viewport to `dir/name.png`.
    pub fn screenshot(&self, dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
        let b64 = self.session_call("GET", "/screenshot", None)?;
        let png = base64::engine::general_purpose::STANDARD.decode(b64.as_str().unwrap_or_default())?;
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png)?;
        Ok(path)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.call("DELETE", &format!("/session/{}", self.session), None);
        }
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// One request to the driver: its status and body. The driver keeps
/// connections open, so the body is read by its `Content-Length`.
fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> anyhow::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}", body.len())?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("no status line")?;
    let mut len = 0usize;
    loop {
        line.clear();
        r.read_line(&mut line)?;
        if line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse()?;
            }
        }
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    Ok((status, String::from_utf8_lossy(&buf).into_owned()))
}

/// Where the console's screenshots go: `$WARREN_SCREENSHOT_DIR`, else
/// `target/console-screenshots` of the workspace.
pub fn screenshot_dir() -> PathBuf {
    std::env::var_os("WARREN_SCREENSHOT_DIR").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/console-screenshots"))
}
