//! Who is signed in to the console, and the sign-ins under way: random
//! ids kept only as hashes, single-use sign-in state (a replayed `state`
//! finds nothing) bound to the browser that started it, a CSRF token per
//! session, expiry, and bounds on how many of each are held, per client
//! for sign-ins. Pure apart from the clock and randomness passed in.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::client::Client;
use super::oidc::{Identity, Pkce};

/// The session cookie's name.
pub const COOKIE: &str = "warren_console";
/// The cookie binding a sign-in to the browser that started it.
pub const BINDING_COOKIE: &str = "warren_console_signin";
/// How long a session lasts at most (with a provider, the re-check
/// interval ends it sooner).
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// How long a sign-in may take at the identity provider.
pub const SIGN_IN_TTL: Duration = Duration::from_secs(600);
/// Most sessions held (the oldest goes first).
pub const MAX_SESSIONS: usize = 4096;
/// Most sign-ins under way (an unauthenticated client can start them).
pub const MAX_SIGN_INS: usize = 1024;
/// Most sign-ins one client may have under way: its own oldest makes room
/// for its next, so a flood from one client evicts only its own.
pub const MAX_SIGN_INS_PER_CLIENT: usize = 32;

/// 32 random bytes, base64url: an id, a state, a nonce, a CSRF token.
pub fn token(random: [u8; 32]) -> String {
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
    client: Client,
    /// The hash of the browser's binding cookie.
    binding: [u8; 32],
}

/// The browser starting a sign-in: the client it counts against, and
/// the value of its binding cookie (the callback must carry it again).
#[derive(Debug, Clone, Copy)]
pub struct Browser<'a> {
    /// Where it connects from.
    pub client: Client,
    /// Its [`BINDING_COOKIE`]'s value.
    pub binding: &'a str,
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

/// Room for one more sign-in of `client`: expired ones go; then, while
/// `client` holds its share, its own oldest; while the table is full, the
/// oldest of the client holding most. A flood from one client only ever
/// evicts its own sign-ins.
fn make_room_for(map: &mut HashMap<[u8; 32], SignIn>, client: Client, now: Instant) {
    map.retain(|_, s| s.expires > now);
    loop {
        let mine = map.values().filter(|s| s.client == client).count();
        let victim = if mine >= MAX_SIGN_INS_PER_CLIENT {
            client
        } else if map.len() >= MAX_SIGN_INS {
            heaviest(map)
        } else {
            return;
        };
        let Some(oldest) = map.iter().filter(|(_, s)| s.client == victim).min_by_key(|(_, s)| s.expires).map(|(k, _)| *k) else { return };
        map.remove(&oldest);
    }
}

/// The client with the most sign-ins under way.
fn heaviest(map: &HashMap<[u8; 32], SignIn>) -> Client {
    let mut counts: HashMap<Client, usize> = HashMap::new();
    for s in map.values() {
        *counts.entry(s.client).or_default() += 1;
    }
    counts.into_iter().max_by_key(|(_, n)| *n).map_or(Client::UNKNOWN, |(c, _)| c)
}

impl Sessions {
    /// Starts a sign-in for `browser`, returning to `return_to`; `random`
    /// gives three independent 32-byte values (state, nonce, PKCE verifier).
    pub fn begin(&self, browser: &Browser<'_>, return_to: &str, random: [[u8; 32]; 3], now: Instant) -> Started {
        let (state, nonce, pkce) = (token(random[0]), token(random[1]), Pkce::from_random(random[2]));
        let mut map = self.sign_ins.lock().unwrap_or_else(|p| p.into_inner());
        make_room_for(&mut map, browser.client, now);
        let return_to = if is_console_path(return_to) { return_to.to_string() } else { "/".to_string() };
        let sign_in = SignIn { nonce: nonce.clone(), verifier: pkce.verifier, return_to, expires: now + SIGN_IN_TTL, client: browser.client, binding: hashed(browser.binding) };
        map.insert(hashed(&state), sign_in);
        Started { state, nonce, challenge: pkce.challenge }
    }

    /// The sign-in `state` names, once, when `binding` is the value of the
    /// binding cookie of the browser that started it: a replayed or
    /// unknown state, one past its time, or a callback opened in another
    /// browser (login CSRF: an attacker's own callback link) finds nothing.
    pub fn finish(&self, state: &str, binding: Option<&str>, now: Instant) -> Option<SignIn> {
        let mut map = self.sign_ins.lock().unwrap_or_else(|p| p.into_inner());
        let found = map.remove(&hashed(state)).filter(|s| s.expires > now)?;
        let same_browser = binding.is_some_and(|b| bool::from(hashed(b).ct_eq(&found.binding)));
        same_browser.then_some(found)
    }

    /// Signs `identity` in for `ttl` (at most [`SESSION_TTL`]): the cookie
    /// value and its session.
    pub fn create(&self, identity: Identity, random: [[u8; 32]; 2], now: Instant, ttl: Duration) -> (String, Session) {
        let id = token(random[0]);
        let session = Session { identity, csrf: token(random[1]), expires: now + ttl.min(SESSION_TTL) };
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
    named(header, COOKIE)
}

/// The `Set-Cookie` value binding sign-ins to this browser: script cannot
/// read it, and it lives only as long as a sign-in may take. `Lax`, so the
/// top-level return from the identity provider carries it.
pub fn binding_cookie(value: &str) -> String {
    format!("{BINDING_COOKIE}={value}; Path=/; HttpOnly; Secure; SameSite=Lax; Max-Age={}", SIGN_IN_TTL.as_secs())
}

/// The binding cookie's value in a `Cookie` header, when it has the form
/// the console gives it (43 characters of base64url).
pub fn binding_value(header: &str) -> Option<&str> {
    named(header, BINDING_COOKIE).filter(|v| v.len() == 43 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
}

fn named<'h>(header: &'h str, name: &str) -> Option<&'h str> {
    header.split(';').map(str::trim).find_map(|c| c.strip_prefix(name)?.strip_prefix('='))
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

    fn numbered(i: u32) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..4].copy_from_slice(&i.to_le_bytes());
        b
    }

    fn from(client: &str, binding: &'static str) -> Browser<'static> {
        Browser { client: Client::of(client.parse().unwrap()), binding }
    }

    const BINDING: &str = "browser-binding-of-ada";

    #[test]
    fn a_sign_in_state_is_used_once_and_only_in_time() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let ada = from("192.0.2.1", BINDING);
        let started = s.begin(&ada, "/executions?ns=team-a", [r(1), r(2), r(3)], t0);
        assert_eq!(started.challenge, Pkce::from_random(r(3)).challenge);
        let signed = s.finish(&started.state, Some(BINDING), t0 + Duration::from_secs(5)).expect("the callback finds its sign-in");
        assert_eq!((signed.nonce.as_str(), signed.return_to.as_str()), (started.nonce.as_str(), "/executions?ns=team-a"));
        assert_eq!(signed.verifier, Pkce::from_random(r(3)).verifier);
        assert_eq!(s.finish(&started.state, Some(BINDING), t0 + Duration::from_secs(6)), None, "a replayed state finds nothing");
        assert_eq!(s.finish("forged", Some(BINDING), t0), None);
        let late = s.begin(&ada, "/", [r(4), r(5), r(6)], t0);
        assert_eq!(s.finish(&late.state, Some(BINDING), t0 + SIGN_IN_TTL), None, "too late");
    }

    #[test]
    fn an_attackers_callback_opened_in_another_browser_finds_no_sign_in() {
        let s = Sessions::default();
        let t0 = Instant::now();
        // The attacker starts a sign-in in their own browser and sends its callback link to a victim.
        let started = s.begin(&from("198.51.100.9", "attackers-binding"), "/", [r(1), r(2), r(3)], t0);
        assert_eq!(s.finish(&started.state, Some("victims-binding"), t0), None, "the victim's browser carries another binding");
        let again = s.begin(&from("198.51.100.9", "attackers-binding"), "/", [r(4), r(5), r(6)], t0);
        assert_eq!(s.finish(&again.state, None, t0), None, "a browser without the cookie");
        assert_eq!(s.finish(&again.state, Some("attackers-binding"), t0), None, "a refused callback used the state up");
    }

    #[test]
    fn sign_ins_return_only_inside_the_console() {
        let s = Sessions::default();
        let t0 = Instant::now();
        for evil in ["https://evil.example", "//evil.example/x", "/\\evil.example", "javascript:alert(1)", "/x\r\nSet-Cookie: a=b"] {
            let st = s.begin(&from("192.0.2.1", BINDING), evil, [r(7), r(8), r(9)], t0);
            assert_eq!(s.finish(&st.state, Some(BINDING), t0).unwrap().return_to, "/", "{evil:?}");
        }
    }

    #[test]
    fn sessions_expire_end_and_carry_their_own_csrf_token() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let (id, session) = s.create(ada(), [r(1), r(2)], t0, SESSION_TTL);
        let got = s.get(&id, t0 + Duration::from_secs(60)).unwrap();
        assert_eq!(got.identity, ada());
        assert!(got.csrf_ok(&session.csrf) && !got.csrf_ok("") && !got.csrf_ok(&token(r(3))));
        assert_eq!(s.get(&token(r(2)), t0), None, "the CSRF token is not a session id");
        assert_eq!(s.get(&id, t0 + SESSION_TTL), None, "expired");
        let (id2, _) = s.create(ada(), [r(4), r(5)], t0, SESSION_TTL);
        s.end(&id2);
        assert_eq!(s.get(&id2, t0), None, "signed out");
        let (short, _) = s.create(ada(), [r(6), r(7)], t0, Duration::from_secs(900));
        assert!(s.get(&short, t0 + Duration::from_secs(899)).is_some());
        assert_eq!(s.get(&short, t0 + Duration::from_secs(900)), None, "a session lasts its re-check interval");
    }

    #[test]
    fn what_an_anonymous_client_can_start_is_bounded() {
        let s = Sessions::default();
        let t0 = Instant::now();
        // Many clients, a few sign-ins each: the table stays bounded, the oldest of the busiest goes.
        for i in 0..(MAX_SIGN_INS as u32 * 2) {
            let client = format!("10.0.{}.{}", i / 4 / 256, (i / 4) % 256);
            s.begin(&from(&client, BINDING), "/", [numbered(i), numbered(i), numbered(i)], t0 + Duration::from_millis(u64::from(i)));
        }
        assert!(s.sign_ins.lock().unwrap().len() <= MAX_SIGN_INS);
    }

    #[test]
    fn a_flood_of_sign_ins_from_one_client_evicts_only_its_own() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let victim = s.begin(&from("192.0.2.1", BINDING), "/", [r(0), r(0), r(0)], t0);
        let flooder = from("203.0.113.66", "flood");
        let mut last = None;
        for i in 1..=(MAX_SIGN_INS as u32 * 4) {
            last = Some(s.begin(&flooder, "/", [numbered(i), numbered(i), numbered(i)], t0 + Duration::from_millis(u64::from(i))));
        }
        assert_eq!(s.sign_ins.lock().unwrap().len(), MAX_SIGN_INS_PER_CLIENT + 1, "the flood holds its share only");
        assert!(s.finish(&victim.state, Some(BINDING), t0).is_some(), "another client's sign-in survives the flood");
        assert!(s.finish(&last.unwrap().state, Some("flood"), t0).is_some(), "the flood's newest is still there");
        // Many flooding clients filling the table evict the busiest first, not a client with one.
        let victim = s.begin(&from("192.0.2.1", BINDING), "/", [r(1), r(1), r(1)], t0);
        for i in 0..(MAX_SIGN_INS as u32 * 2) {
            let client = format!("203.0.{}.{}", i % 64, i % 64);
            let n = numbered((i + 1) << 16);
            s.begin(&from(&client, "flood"), "/", [n, n, n], t0 + Duration::from_millis(u64::from(i)));
        }
        assert!(s.finish(&victim.state, Some(BINDING), t0).is_some(), "a client with one sign-in is the last to be evicted");
    }

    #[test]
    fn cookies_are_http_only_secure_and_read_back() {
        let c = set_cookie("abc");
        for attr in ["HttpOnly", "Secure", "SameSite=Lax", "Path=/"] {
            assert!(c.contains(attr), "{c}");
        }
        assert_eq!(cookie_value("theme=dark; warren_console=abc; other=1"), Some("abc"));
        assert_eq!(cookie_value("warren_console_x=abc"), None);
        assert_eq!(cookie_value("warren_console_signin=abc"), None, "the binding cookie is not the session's");
        assert!(clear_cookie().contains("Max-Age=0"));
        let b = binding_cookie(&token(r(1)));
        for attr in ["HttpOnly", "Secure", "SameSite=Lax", "Max-Age=600"] {
            assert!(b.contains(attr), "{b}");
        }
        assert_eq!(binding_value(&format!("warren_console=x; warren_console_signin={}", token(r(1)))), Some(token(r(1)).as_str()));
        assert_eq!(binding_value("warren_console_signin=short"), None, "only values the console gives");
    }
}
