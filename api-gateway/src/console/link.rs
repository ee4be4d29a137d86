//! Single-machine sign-in: a one-time link for the local admin, written to
//! a file only the gateway's user can read (never logged). Each link works
//! once; using it writes the next one, so `cat` of the file always gives a
//! link that signs in. A link not used stays valid until the gateway stops.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use subtle::ConstantTimeEq as _;

use super::oidc::Identity;

/// The path a link points at, before its token.
pub const PATH: &str = "/signin/link/";

/// Who a link signs in.
pub fn local_admin() -> Identity {
    Identity { subject: "local-admin".into(), user: "local-admin".into(), groups: vec!["warren:local-admins".into()] }
}

/// The current link's token and where it is written.
pub struct LocalLink {
    file: PathBuf,
    base: String,
    token: Mutex<String>,
}

impl LocalLink {
    /// Writes the first link (`base` + [`PATH`] + token) to `file`.
    pub fn new(file: &Path, base: &str) -> std::io::Result<LocalLink> {
        let link = LocalLink { file: file.to_path_buf(), base: base.trim_end_matches('/').to_string(), token: Mutex::new(String::new()) };
        link.mint()?;
        Ok(link)
    }

    /// A fresh token, written out before it is accepted.
    fn mint(&self) -> std::io::Result<()> {
        let mut bytes = [0u8; 32];
        rand::fill(&mut bytes);
        let token = B64.encode(bytes);
        write_private(&self.file, format!("{}{PATH}{token}\n", self.base).as_bytes())?;
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = token;
        Ok(())
    }

    /// True (once) for the current token; the next link is then written.
    pub fn redeem(&self, token: &str) -> bool {
        {
            let mut current = self.token.lock().unwrap_or_else(|p| p.into_inner());
            let ok = !current.is_empty() && token.len() == current.len() && bool::from(token.as_bytes().ct_eq(current.as_bytes()));
            if !ok {
                return false;
            }
            current.clear();
        }
        if let Err(e) = self.mint() {
            tracing::warn!(error = %e, file = %self.file.display(), "console: the next sign-in link could not be written");
        }
        true
    }
}

/// Replaces `file` with `data`, readable by this user only (a temporary
/// file renamed over it, so a reader never sees half a link).
fn write_private(file: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = file.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn a_link_works_once_and_the_next_one_is_written_privately() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("console-link");
        let link = LocalLink::new(&file, "http://127.0.0.1:8081/").unwrap();
        let first = std::fs::read_to_string(&file).unwrap();
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        let token = first.trim().strip_prefix("http://127.0.0.1:8081/signin/link/").expect(&first).to_string();
        assert!(!link.redeem("wrong"), "a wrong token");
        assert!(!link.redeem(&format!("{token}x")), "a longer one");
        assert!(link.redeem(&token), "the link");
        assert!(!link.redeem(&token), "used twice");
        let second = std::fs::read_to_string(&file).unwrap();
        assert_ne!(first, second, "the next link is written");
        assert!(link.redeem(second.trim().rsplit('/').next().unwrap()));
        assert!(!link.redeem(""), "an empty token never matches");
    }
}
