//! The data plane's access token (`envdAccessToken`, sent back as
//! `X-Access-Token`): an HMAC-SHA256 under the file-URL signing key over the
//! sandbox id and its key, so it opens that one sandbox only, every replica
//! checks it without a lookup of its own, and rotating the signing key ends
//! every token. The traffic token (`trafficAccessToken`, sent back as
//! `E2B-Traffic-Access-Token`) opens what E2B reaches through its proxy —
//! the code interpreter and the sandbox's ports — and nothing of envd's.
//! Pure; unit-tested.

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// What a token opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// envd: commands, files, filesystem.
    Envd,
    /// The proxy: the code interpreter and ports.
    Traffic,
    /// One port of the sandbox.
    Port(u16),
    /// Its terminal WebSocket (`terminalUrl`).
    Terminal,
}

impl Scope {
    fn label(self) -> (String, &'static str) {
        match self {
            Scope::Envd => ("warren e2b envd v1".into(), "wet1_"),
            Scope::Traffic => ("warren e2b traffic v1".into(), "wtt1_"),
            Scope::Port(p) => (format!("warren e2b port v1 {p}"), "wpt1_"),
            Scope::Terminal => ("warren terminal v1".into(), "wtm1_"),
        }
    }
}

fn mac(signing_key: &[u8], scope: Scope, namespace: &str, key: &str, id: &str) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(signing_key).expect("HMAC takes keys of any length");
    for part in [scope.label().0.as_str(), namespace, key, id] {
        m.update(part.as_bytes());
        m.update(&[0]);
    }
    m
}

/// The path and token of sandbox `id`'s terminal WebSocket (`terminalUrl`,
/// served by the gateway's terminal module).
pub fn terminal_url(signing_key: &[u8], namespace: &str, key: &str, id: &str) -> String {
    let token = sign_for(Scope::Terminal, signing_key, namespace, key, id);
    format!("/sandboxes/{id}/terminal?warren_token={token}")
}

/// The envd token of sandbox `id` of ApiKey `namespace/key`.
pub fn sign(signing_key: &[u8], namespace: &str, key: &str, id: &str) -> String {
    sign_for(Scope::Envd, signing_key, namespace, key, id)
}

/// The token of `scope` of that sandbox.
pub fn sign_for(scope: Scope, signing_key: &[u8], namespace: &str, key: &str, id: &str) -> String {
    format!("{}{}", scope.label().1, B64.encode(mac(signing_key, scope, namespace, key, id).finalize().into_bytes()))
}

/// True when `token` is the envd token of that sandbox (constant time).
#[cfg(test)]
fn verify(signing_key: &[u8], namespace: &str, key: &str, id: &str, token: &str) -> bool {
    verify_for(Scope::Envd, signing_key, namespace, key, id, token)
}

/// True when `token` is the `scope` token of that sandbox (constant time).
pub fn verify_for(scope: Scope, signing_key: &[u8], namespace: &str, key: &str, id: &str, token: &str) -> bool {
    let Some(raw) = token.strip_prefix(scope.label().1).and_then(|t| B64.decode(t).ok()) else { return false };
    mac(signing_key, scope, namespace, key, id).verify_slice(&raw).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_its_own_sandbox_only() {
        let k = b"0123456789abcdef0123456789abcdef";
        let t = sign(k, "ns", "key", "sbx1");
        assert!(verify(k, "ns", "key", "sbx1", &t));
        assert!(!verify(k, "ns", "key", "sbx2", &t));
        assert!(!verify(k, "ns", "other", "sbx1", &t));
        assert!(!verify(k, "ns2", "key", "sbx1", &t));
        assert!(!verify(b"another signing key of 32 bytes!", "ns", "key", "sbx1", &t));
        assert!(!verify(k, "ns", "key", "sbx1", "wet1_"));
        assert!(!verify(k, "ns", "key", "sbx1", &t[..t.len() - 1]));
        // The separator keeps fields apart: ("a", "bc") is not ("ab", "c").
        assert_ne!(sign(k, "a", "bc", "x"), sign(k, "ab", "c", "x"));
    }

    #[test]
    fn a_traffic_token_opens_no_envd_call_and_the_other_way_round() {
        let k = b"0123456789abcdef0123456789abcdef";
        let traffic = sign_for(Scope::Traffic, k, "ns", "key", "sbx1");
        assert!(verify_for(Scope::Traffic, k, "ns", "key", "sbx1", &traffic));
        assert!(!verify(k, "ns", "key", "sbx1", &traffic));
        let envd = sign(k, "ns", "key", "sbx1");
        assert!(!verify_for(Scope::Traffic, k, "ns", "key", "sbx1", &envd));
        let forged = format!("wet1_{}", traffic.trim_start_matches("wtt1_"));
        assert!(!verify(k, "ns", "key", "sbx1", &forged), "the scope is in the MAC, not only the prefix");
        let port = sign_for(Scope::Port(8000), k, "ns", "key", "sbx1");
        assert!(verify_for(Scope::Port(8000), k, "ns", "key", "sbx1", &port));
        assert!(!verify_for(Scope::Port(8001), k, "ns", "key", "sbx1", &port) && !verify_for(Scope::Traffic, k, "ns", "key", "sbx1", &port));
    }
}
