//! A real Azure Blob endpoint for the storage tests: Azurite (Microsoft's
//! official emulator, npm `azurite`, installed by scripts/test.sh) on a
//! loopback port, in memory, with one container.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::Engine;
use sha2::Digest;

/// Azurite's well-known development account and key.
pub const ACCOUNT: &str = "devstoreaccount1";
const KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// The container every test uses.
pub const CONTAINER: &str = "warren-data";

/// A running Azurite; killed on drop.
pub struct Azurite {
    child: Child,
    /// Where it serves.
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

/// Where scripts/test.sh installs Azurite (or `WARREN_AZURITE`).
fn binary() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("WARREN_AZURITE") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is unset")?).join(".cache/warren-tools/azurite/node_modules/.bin/azurite-blob"),
    };
    if !path.is_file() {
        bail!("azurite is not installed at {}: scripts/test.sh installs it (npm install azurite)", path.display());
    }
    Ok(path)
}

impl Azurite {
    /// Starts the emulator and creates [`CONTAINER`].
    pub fn start() -> anyhow::Result<Azurite> {
        let dir = tempfile::Builder::new().prefix("warren-azurite-").tempdir()?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(binary()?)
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string(), "--inMemoryPersistence", "--skipApiVersionCheck", "--silent"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting azurite")?;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let server = Azurite { child, addr, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(addr).is_err() {
            if Instant::now() > deadline {
                bail!("azurite did not start listening on {addr}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Listening comes a moment before serving: retry (bounded) until
        // the container is made.
        loop {
            match server.create_container(CONTAINER) {
                Ok(()) => return Ok(server),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The account's endpoint (path style, as the emulator serves it).
    pub fn endpoint(&self) -> String {
        format!("http://{}/{ACCOUNT}", self.addr)
    }

    /// The entries a StorageConnection's Secret would hold.
    pub fn credentials(&self) -> Vec<(String, String)> {
        vec![("accountName".into(), ACCOUNT.into()), ("accountKey".into(), KEY.into())]
    }

    /// The account key (tests assert it never reaches a sandbox).
    pub fn secret_key(&self) -> &'static str {
        KEY
    }

    /// A client of the container, for seeding and checking objects.
    pub fn store(&self) -> Arc<dyn object_store::ObjectStore> {
        let az = object_store::azure::MicrosoftAzureBuilder::new()
            .with_account(ACCOUNT)
            .with_access_key(KEY)
            .with_container_name(CONTAINER)
            .with_endpoint(self.endpoint())
            .with_allow_http(true)
            .build()
            .expect("an Azure client for azurite");
        Arc::new(az)
    }

    /// Creates a container: the one call object_store does not make, signed
    /// here with the account key (Shared Key).
    fn create_container(&self, name: &str) -> anyhow::Result<()> {
        let date = httpdate(std::time::SystemTime::now());
        let version = "2021-08-06";
        let path = format!("/{ACCOUNT}/{name}");
        // Verb, eleven standard headers (all empty here), x-ms-* headers, resource.
        let to_sign = format!("PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n/{ACCOUNT}{path}\nrestype:container");
        let key = base64::engine::general_purpose::STANDARD.decode(KEY)?;
        let sig = base64::engine::general_purpose::STANDARD.encode(hmac_sha256(&key, to_sign.as_bytes()));
        let req = format!(
            "PUT {path}?restype=container HTTP/1.1\r\nHost: {}\r\nx-ms-date: {date}\r\nx-ms-version: {version}\r\nAuthorization: SharedKey {ACCOUNT}:{sig}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.addr
        );
        let mut s = TcpStream::connect(self.addr)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(req.as_bytes())?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        if !answer.starts_with("HTTP/1.1 201") {
            bail!("azurite refused to create the container: {}", answer.lines().next().unwrap_or(""));
        }
        Ok(())
    }
}

fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&sha2::Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |b: u8| k.map(|x| x ^ b);
    let inner = sha2::Sha256::new().chain_update(pad(0x36)).chain_update(msg).finalize();
    sha2::Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize().into()
}

/// RFC 1123 date, as `x-ms-date` wants it.
fn httpdate(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days % 7) as usize];
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let name = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"][(month - 1) as usize];
    format!("{weekday}, {day:02} {name} {year} {:02}:{:02}:{:02} GMT", rem / 3600, rem % 3600 / 60, rem % 60)
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates_and_macs_match_known_values() {
        assert_eq!(super::httpdate(std::time::UNIX_EPOCH + std::time::Duration::from_secs(784_111_777)), "Sun, 06 Nov 1994 08:49:37 GMT");
        // RFC 4231 test case 2.
        let mac = super::hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(mac[..4], [0x5b, 0xdc, 0xc1, 0x46]);
    }
}
