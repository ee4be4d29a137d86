//! Who is signed in to the console, and the sign-ins under way: random
//! ids kept only as hashes, single-use sign-in state (a replayed `state`
//! finds nothing), a CSRF token per session, expiry, and bounds on how many
//! of each are held. Pure apart from the clock and randomness passed in.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::oidc::{Identity, Pkce};

/// The session cookie's name.
pub const COOKIE: &str = "warren_console";
/// How long a session lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// How long a sign-in may take at the identity provider.
pub const SIGN_IN_TTL: Duration = Duration::from_secs(600);
/// Most sessions held (the oldest goes first).
pub const MAX_SESSIONS: usize = 4096;
/// Most sign-ins under way (an unauthenticated client can start them).
pub const MAX_SIGN_INS: usize = 1024;

/// 32 random bytes, base64url: an id, a state, a nonce, a CSRF token.
fn token(random: [u8; 32]) -> String {
    B64.encode(random)
}

/// What the map is keyed by: a hash, so a lookup's timing says nothing
/// about stored ids.
fn hashed(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

/// A signed-in user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// Who.
    pub identity: Identity,
    /// The token every form of this session carries.
    pub csrf: String,
    expires: Instant,
}

impl Session {
    /// True when `token` is this session's CSRF token (constant time).
    pub fn csrf_ok(&self, token: &str) -> bool {
        token.len() == self.csrf.len() && bool::from(token.as_bytes().ct_eq(self.csrf.as_bytes()))
    }
}

/// A sign-in sent to the identity provider, waiting for its callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignIn {
    /// The ID token must carry it.
    pub nonce: String,
    /// Sent with the code to the token endpoint.
    pub verifier: String,
    /// Where to go afterwards (a console path).
    pub return_to: String,
    expires: Instant,
}

/// Sessions and sign-ins in memory (one gateway replica's console).
#[derive(Debug, Default)]
pub struct Sessions {
    sessions: Mutex<HashMap<[u8; 32], Session>>,
    sign_ins: Mutex<HashMap<[u8; 32], SignIn>>,
}

/// The start of a sign-in: what goes into the authorization request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    /// `state`.
    pub state: String,
    /// `nonce`.
    pub nonce: String,
    /// `code_challenge` (S256).
    pub challenge: String,
}

/// Keeps `map` under `max` entries: expired ones go, then the one expiring first.
fn make_room<V>(map: &mut HashMap<[u8; 32], V>, max: usize, now: Instant, expires: impl Fn(&V) -> Instant) {
    map.retain(|_, v| expires(v) > now);
    while map.len() >= max {
        let Some(oldest) = map.iter().min_by_key(|(_, v)| expires(v)).map(|(k, _)| *k) else { break };
        map.remove(&oldest);
    }
}

impl Sessions {
    /// Starts a sign-in returning to `return_to`; `random` gives three
    /// independent 32-byte values (state, nonce, PKCE verifier).
    pub fn begin(&self, return_to: &str, random: [[u8; 32]; 3], now: Instant) -> Started {
        let (state, nonce, pkce) = (token(random[0]), token(random[1]), Pkce::from_random(random[2]));
        let mut map = self.sign_ins.lock().unwrap_or_else(|p| p.into_inner());
        make_room(&mut map, MAX_SIGN_INS, now, |s| s.expires);
        let return_to = if is_console_path(return_to) { return_to.to_string() } else { "/".to_string() };
        map.insert(hashed(&state), SignIn { nonce: nonce.clone(), verifier: pkce.verifier, return_to, expires: now + SIGN_IN_TTL });
        Started { state, nonce, challenge: pkce.challenge }
    }

    /// The sign-in `state` names, once: a replayed or unknown state, or one
    /// past its time, finds nothing.
    pub fn finish(&self, state: &str, now: Instant) -> Option<SignIn> {
        let mut map = self.sign_ins.lock().unwrap_or_else(|p| p.into_inner());
        map.remove(&hashed(state)).filter(|s| s.expires > now)
    }

    /// Signs `identity` in: the cookie value and its session.
    pub fn create(&self, identity: Identity, random: [[u8; 32]; 2], now: Instant) -> (String, Session) {
        let id = token(random[0]);
        let session = Session { identity, csrf: token(random[1]), expires: now + SESSION_TTL };
        let mut map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        make_room(&mut map, MAX_SESSIONS, now, |s| s.expires);
        map.insert(hashed(&id), session.clone());
        (id, session)
    }

    /// The session of cookie value `id`, unless it expired or ended.
    pub fn get(&self, id: &str, now: Instant) -> Option<Session> {
        let mut map = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        let key = hashed(id);
        match map.get(&key) {
            Some(s) if s.expires > now => Some(s.clone()),
            Some(_) => {
                map.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Signs the session of cookie value `id` out.
    pub fn end(&self, id: &str) {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner()).remove(&hashed(id));
    }
}

/// A path inside the console to return to after sign-in: absolute, not
/// protocol-relative, no scheme or backslash (no open redirect).
pub fn is_console_path(p: &str) -> bool {
    p.starts_with('/') && !p.starts_with("//") && !p.contains('\\') && !p.contains("://") && p.len() <= 1024 && !p.chars().any(char::is_control)
}

/// The `Set-Cookie` value for session `id`: script cannot read it, it is
/// sent over HTTPS only, and not on cross-site subrequests or posts (`Lax`,
/// so the top-level return from the identity provider still carries it).
pub fn set_cookie(id: &str) -> String {
    format!("{COOKIE}={id}; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age={}", SESSION_TTL.as_secs())
}

/// The `Set-Cookie` value that removes the session cookie.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age=0")
}

/// The session cookie's value in a `Cookie` header.
pub fn cookie_value(header: &str) -> Option<&str> {
    header.split(';').map(str::trim).find_map(|c| c.strip_prefix(COOKIE)?.strip_prefix('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ada() -> Identity {
        Identity { subject: "u-1".into(), user: "ada@example.test".into(), groups: vec!["platform".into()] }
    }

    fn r(b: u8) -> [u8; 32] {
        [b; 32]
    }

    #[test]
    fn a_sign_in_state_is_used_once_and_only_in_time() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let started = s.begin("/executions?ns=team-a", [r(1), r(2), r(3)], t0);
        assert_eq!(started.challenge, Pkce::from_random(r(3)).challenge);
        let signed = s.finish(&started.state, t0 + Duration::from_secs(5)).expect("the callback finds its sign-in");
        assert_eq!((signed.nonce.as_str(), signed.return_to.as_str()), (started.nonce.as_str(), "/executions?ns=team-a"));
        assert_eq!(signed.verifier, Pkce::from_random(r(3)).verifier);
        assert_eq!(s.finish(&started.state, t0 + Duration::from_secs(6)), None, "a replayed state finds nothing");
        assert_eq!(s.finish("forged", t0), None);
        let late = s.begin("/", [r(4), r(5), r(6)], t0);
        assert_eq!(s.finish(&late.state, t0 + SIGN_IN_TTL), None, "too late");
    }

    #[test]
    fn sign_ins_return_only_inside_the_console() {
        let s = Sessions::default();
        let t0 = Instant::now();
        for evil in ["https://evil.example", "//evil.example/x", "/\\evil.example", "javascript:alert(1)", "/x\r\nSet-Cookie: a=b"] {
            let st = s.begin(evil, [r(7), r(8), r(9)], t0);
            assert_eq!(s.finish(&st.state, t0).unwrap().return_to, "/", "{evil:?}");
        }
    }

    #[test]
    fn sessions_expire_end_and_carry_their_own_csrf_token() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let (id, session) = s.create(ada(), [r(1), r(2)], t0);
        let got = s.get(&id, t0 + Duration::from_secs(60)).unwrap();
        assert_eq!(got.identity, ada());
        assert!(got.csrf_ok(&session.csrf) && !got.csrf_ok("") && !got.csrf_ok(&token(r(3))));
        assert_eq!(s.get(&token(r(2)), t0), None, "the CSRF token is not a session id");
        assert_eq!(s.get(&id, t0 + SESSION_TTL), None, "expired");
        let (id2, _) = s.create(ada(), [r(4), r(5)], t0);
        s.end(&id2);
        assert_eq!(s.get(&id2, t0), None, "signed out");
    }

    #[test]
    fn what_an_anonymous_client_can_start_is_bounded() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let first = s.begin("/", [r(0), r(0), r(0)], t0);
        for i in 1..=MAX_SIGN_INS as u32 {
            let mut b = [0u8; 32];
            b[..4].copy_from_slice(&i.to_le_bytes());
            s.begin("/", [b, b, b], t0 + Duration::from_millis(u64::from(i)));
        }
        assert!(s.sign_ins.lock().unwrap().len() <= MAX_SIGN_INS);
        assert_eq!(s.finish(&first.state, t0), None, "the oldest made room");
    }

    #[test]
    fn cookies_are_http_only_secure_and_read_back() {
        let c = set_cookie("abc");
        for attr in ["HttpOnly", "Secure", "SameSite=Lax", "Path=/"] {
            assert!(c.contains(attr), "{c}");
        }
        assert_eq!(cookie_value("theme=dark; warren_console=abc; other=1"), Some("abc"));
        assert_eq!(cookie_value("warren_console_x=abc"), None);
        assert!(clear_cookie().contains("Max-Age=0"));
    }
}
