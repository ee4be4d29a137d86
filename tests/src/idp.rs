//! A real OpenID provider for the console's tests: node-oidc-provider
//! (OpenID Certified; installed by scripts/test.sh) on a loopback port,
//! from `tests/fixtures/oidc/idp.mjs`: one confidential client, users ada
//! (group platform-admins), bob (team-a), mallory (claims carrying
//! markup), eve (ada's address, not verified) and root (`system:` names).
//! Its interaction step signs in `?user=NAME`, or shows a form to pick one
//! (for a real browser); [`Idp::set_groups`] changes a user's groups.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use warren_api_gateway::console::oidc::ClaimMapping;
use warren_api_gateway::console::provider::ProviderConfig;

/// The console's client secret at the test provider.
pub const SECRET: &str = "console-test-secret";

/// The provider process; killed on drop, whatever the test's outcome.
pub struct Idp {
    child: Child,
    /// Its issuer URL.
    pub issuer: String,
    /// Where it sends browsers back.
    pub redirect: String,
    _dir: tempfile::TempDir,
}

impl Drop for Idp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn install_dir() -> PathBuf {
    let home = PathBuf::from(std::env::var_os("HOME").expect("HOME"));
    home.join(".cache/warren-tools/oidc-provider/node_modules")
}

impl Idp {
    /// A provider for a console that is never reached.
    pub fn start() -> Idp {
        Idp::start_for("http://127.0.0.1:1/callback")
    }

    /// A provider sending browsers back to `redirect`.
    pub fn start_for(redirect: &str) -> Idp {
        let modules = install_dir();
        assert!(modules.join("oidc-provider/package.json").is_file(), "oidc-provider is not installed in {}: scripts/test.sh installs it", modules.display());
        // ES modules resolve packages from the script's own directory up.
        let dir = tempfile::Builder::new().prefix("warren-idp-").tempdir().unwrap();
        std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/oidc/idp.mjs"), dir.path().join("idp.mjs")).unwrap();
        std::os::unix::fs::symlink(&modules, dir.path().join("node_modules")).unwrap();
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let redirect = redirect.to_string();
        let child = Command::new("node")
            .args(["idp.mjs", &port.to_string(), &redirect, SECRET])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting node");
        let idp = Idp { child, issuer: format!("http://127.0.0.1:{port}"), redirect, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the identity provider did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        idp
    }

    /// The console's registration at it (the default claim mapping).
    pub fn config(&self) -> ProviderConfig {
        ProviderConfig { issuer: self.issuer.clone(), client_id: "warren-console".into(), client_secret: SECRET.into(), redirect_uri: self.redirect.clone(), claims: ClaimMapping::default() }
    }

    /// Makes `groups` the groups of `user` (tokens issued from now on carry them).
    pub async fn set_groups(&self, user: &str, groups: &[&str]) {
        let r = reqwest::Client::new().put(format!("{}/test/groups/{user}", self.issuer)).body(serde_json::to_string(groups).unwrap()).send().await.unwrap();
        assert!(r.status().is_success(), "the provider did not take the groups: {}", r.status());
    }
}

