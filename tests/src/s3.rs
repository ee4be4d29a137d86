//! A real S3 server for the thread-store tests: `s3s-fs` (built from
//! crates.io by scripts/test.sh) on a loopback port, with one bucket.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Bucket every test uses.
pub const BUCKET: &str = "warren-threads";
const ACCESS_KEY: &str = "warrentestaccess";
const SECRET_KEY: &str = "warrentestsecretkey";

/// A running s3s-fs; killed on drop, its data removed with its tempdir.
pub struct S3Server {
    child: Child,
    /// Where it serves.
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
}

fn binary() -> anyhow::Result<PathBuf> {
    let on_path = std::env::var_os("PATH").into_iter().flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).map(|d| d.join("s3s-fs"));
    let cargo_home = std::env::var_os("CARGO_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    on_path
        .chain(cargo_home.map(|c| c.join("bin/s3s-fs")))
        .find(|p| p.is_file())
        .context("s3s-fs is not installed: scripts/test.sh installs it (cargo install s3s-fs@0.14.1 --features binary)")
}

impl S3Server {
    /// Starts the server and waits until it accepts connections.
    pub fn start() -> anyhow::Result<S3Server> {
        let dir = tempfile::Builder::new().prefix("warren-s3-").tempdir()?;
        std::fs::create_dir(dir.path().join(BUCKET))?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(binary()?)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting s3s-fs")?;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let server = S3Server { child, addr, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(addr).is_err() {
            if Instant::now() > deadline {
                bail!("s3s-fs did not start listening on {addr}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// The agent's `--thread-store` value.
    pub fn store_url(&self) -> String {
        format!("s3://{BUCKET}")
    }

    /// Environment that points `object_store` at this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT", format!("http://{}", self.addr)),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
        ]
    }

    /// Endpoint URL.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The credentials a StorageConnection's Secret would hold.
    pub fn credentials(&self) -> Vec<(String, String)> {
        vec![("accessKeyId".into(), ACCESS_KEY.into()), ("secretAccessKey".into(), SECRET_KEY.into())]
    }

    /// The secret key (tests assert it never reaches a sandbox).
    pub fn secret_key(&self) -> &'static str {
        SECRET_KEY
    }

    /// Stores `body` under `key` (written where the server keeps objects).
    pub fn put(&self, key: &str, body: &[u8]) {
        let path = self.dir.path().join(BUCKET).join(key);
        std::fs::create_dir_all(path.parent().expect("a key has a parent")).unwrap();
        std::fs::write(path, body).unwrap();
    }

    /// The object under `key`, if any.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        std::fs::read(self.dir.path().join(BUCKET).join(key)).ok()
    }

    /// Files the server stores for `prefix` (its on-disk layout mirrors keys).
    pub fn objects(&self, prefix: &str) -> Vec<String> {
        let root = self.dir.path().join(BUCKET);
        let mut out = Vec::new();
        let mut stack = vec![root.join(prefix)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if let Ok(rel) = p.strip_prefix(&root) {
                    out.push(rel.to_string_lossy().into_owned());
                }
            }
        }
        out.sort();
        out
    }
}

impl S3Server {
    /// Stops serving (the stored objects stay readable with [`S3Server::get`]).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback TCP proxy in front of a server that forwards every connection
/// except those whose request starts with `hang_on` (e.g. `PUT `): those it
/// holds open and never answers, as a store that hangs on uploads. One
/// request per connection is assumed (clients with idle pooling off).
pub struct HangingProxy {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl HangingProxy {
    /// Starts forwarding to `upstream`.
    pub fn start(upstream: SocketAddr, hang_on: &'static [u8]) -> anyhow::Result<HangingProxy> {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(mut client) = conn else { continue };
                let stopped = stopped.clone();
                std::thread::spawn(move || {
                    let _ = client.set_read_timeout(Some(Duration::from_millis(200)));
                    let mut head = vec![0u8; hang_on.len()];
                    let mut got = 0;
                    while got < head.len() && !stopped.load(Ordering::Relaxed) {
                        match client.read(&mut head[got..]) {
                            Ok(0) => return,
                            Ok(n) => got += n,
                            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                            Err(_) => return,
                        }
                    }
                    if head == hang_on {
                        // Swallow the request, answer nothing, until stopped.
                        let mut sink = [0u8; 64 << 10];
                        while !stopped.load(Ordering::Relaxed) {
                            match client.read(&mut sink) {
                                Ok(0) => return,
                                Ok(_) => {}
                                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                                Err(_) => return,
                            }
                        }
                        return;
                    }
                    let Ok(mut server) = TcpStream::connect(upstream) else { return };
                    let _ = client.set_read_timeout(None);
                    if server.write_all(&head).is_err() {
                        return;
                    }
                    let (Ok(mut c2), Ok(mut s2)) = (client.try_clone(), server.try_clone()) else { return };
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut c2, &mut s2);
                        let _ = s2.shutdown(std::net::Shutdown::Write);
                    });
                    let _ = std::io::copy(&mut server, &mut client);
                    let _ = client.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        Ok(HangingProxy { addr, stop })
    }

    /// Its endpoint URL.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for HangingProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}
