//! The console's sign-in against a real OpenID provider: node-oidc-provider
//! (OpenID Certified; installed by scripts/test.sh) on a loopback port, the
//! authorization code flow with PKCE driven over HTTP as a browser would
//! (the provider's interaction step signs in the user the test names), the
//! code exchanged and the ID token checked by `console::provider`; and the
//! attacks on it: a callback link opened in another browser, a flood of
//! sign-ins, claims naming identities the provider does not own, groups
//! removed at the provider during a session.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use warren_api_gateway::console::client::Client;
use warren_api_gateway::console::oidc::ClaimMapping;
use warren_api_gateway::console::provider::{Provider, ProviderConfig, ProviderError};
use warren_api_gateway::console::session::{Browser, Sessions};

use warren_e2e::idp::{Idp, SECRET};

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

fn random<const N: usize>() -> [[u8; 32]; N] {
    std::array::from_fn(|_| rand_bytes())
}

fn rand_bytes() -> [u8; 32] {
    let mut b = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut b).unwrap();
    b
}

/// A browser without JavaScript: follows the provider's redirects by hand,
/// keeping its cookies, until the provider sends it to the redirect URI;
/// the query it carries there.
async fn browse_to_callback(start: &str, user: &str, redirect: &str) -> Vec<(String, String)> {
    browse_to(start, user, redirect).await.query_pairs().map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
}

/// The same, the whole URL the provider sends the browser back to.
async fn browse_to(start: &str, user: &str, redirect: &str) -> url::Url {
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let mut cookies: Vec<String> = Vec::new();
    let mut url = start.to_string();
    for _ in 0..10 {
        let answer = http.get(&url).header("cookie", cookies.join("; ")).send().await.unwrap();
        for c in answer.headers().get_all("set-cookie") {
            let pair = c.to_str().unwrap().split(';').next().unwrap().to_string();
            let name = pair.split('=').next().unwrap().to_string();
            cookies.retain(|k| !k.starts_with(&format!("{name}=")));
            cookies.push(pair);
        }
        let location = answer.headers().get("location").unwrap_or_else(|| panic!("no redirect from {url}: {}", answer.status())).to_str().unwrap().to_string();
        let next = url::Url::parse(&url).unwrap().join(&location).unwrap();
        if next.as_str().starts_with(redirect) {
            return next;
        }
        url = next.to_string();
        if next.path().starts_with("/interaction/") {
            url = format!("{url}?user={user}");
        }
    }
    panic!("the provider never sent the browser back");
}

/// The browser of the direct `Sessions` tests: one client, one binding cookie.
const BINDING: &str = "the-test-browsers-binding";

fn browser() -> Browser<'static> {
    Browser { client: Client::UNKNOWN, binding: BINDING }
}

fn param<'a>(q: &'a [(String, String)], k: &str) -> &'a str {
    q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str()).unwrap_or_else(|| panic!("no {k} in {q:?}"))
}

#[tokio::test]
async fn a_user_signs_in_with_the_code_flow_and_pkce_and_a_code_works_once() {
    let idp = Idp::start();
    let provider = Provider::discover(idp.config()).await.expect("discovery");
    let sessions = Sessions::default();
    for (user, email, group) in [("ada", "ada@example.test", "platform-admins"), ("bob", "bob@example.test", "team-a")] {
        let started = sessions.begin(&browser(), "/executions", random::<3>(), Instant::now());
        let auth = provider.authorization_url(&started);
        assert!(auth.contains("code_challenge_method=S256") && auth.contains(&started.challenge));
        let back = browse_to_callback(&auth, user, &idp.redirect).await;
        assert_eq!(param(&back, "state"), started.state, "the provider returns the state it was given");
        let sign_in = sessions.finish(param(&back, "state"), Some(BINDING), Instant::now()).expect("the sign-in is found once");
        let code = param(&back, "code");
        let id = provider.exchange(code, &sign_in, now()).await.expect("exchange");
        assert_eq!((id.subject.as_str(), id.user.as_str(), id.groups.as_slice()), (user, email, &[group.to_string()][..]));
        // The same code again (a replayed callback): the provider refuses it.
        assert!(matches!(provider.exchange(code, &sign_in, now()).await, Err(ProviderError::Refused(_))), "a code is good once");
    }
}

#[tokio::test]
async fn a_code_without_its_verifier_or_from_another_sign_in_is_refused() {
    let idp = Idp::start();
    let provider = Provider::discover(idp.config()).await.unwrap();
    let sessions = Sessions::default();
    let first = sessions.begin(&browser(), "/", random::<3>(), Instant::now());
    let other = sessions.begin(&browser(), "/", random::<3>(), Instant::now());
    let back = browse_to_callback(&provider.authorization_url(&first), "bob", &idp.redirect).await;
    sessions.finish(param(&back, "state"), Some(BINDING), Instant::now()).expect("the callback finds its sign-in");
    let other = sessions.finish(&other.state, Some(BINDING), Instant::now()).unwrap();
    // An attacker's code injected into another browser's sign-in: the PKCE
    // verifier does not match, and neither would the nonce.
    assert!(matches!(provider.exchange(param(&back, "code"), &other, now()).await, Err(ProviderError::Refused(_))));
    // A code and verifier that belong together, checked against another
    // sign-in's nonce: the provider issues the token, the console refuses it.
    let third = sessions.begin(&browser(), "/", random::<3>(), Instant::now());
    let back = browse_to_callback(&provider.authorization_url(&third), "bob", &idp.redirect).await;
    let mut mixed = sessions.finish(param(&back, "state"), Some(BINDING), Instant::now()).unwrap();
    mixed.nonce = other.nonce.clone();
    let refused = provider.exchange(param(&back, "code"), &mixed, now()).await;
    assert!(matches!(refused, Err(ProviderError::Token(warren_api_gateway::console::oidc::TokenError::Claim("nonce")))), "{refused:?}");
}

#[tokio::test]
async fn a_provider_naming_another_issuer_or_not_answering_is_not_used() {
    let idp = Idp::start();
    let mut wrong = idp.config();
    wrong.issuer = format!("{}/", idp.issuer);
    assert!(matches!(Provider::discover(wrong).await, Err(ProviderError::Refused(m)) if m.contains("issuer")));
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut down = idp.config();
    down.issuer = format!("http://127.0.0.1:{closed}");
    assert!(matches!(Provider::discover(down).await, Err(ProviderError::Unavailable(_))));
    let mut plain = idp.config();
    plain.issuer = "http://idp.example.test".into();
    assert!(matches!(Provider::discover(plain).await, Err(ProviderError::Refused(_))), "plain http off loopback is refused before any request");
}

/// The console on a loopback listener, stopped on drop.
struct ConsoleServer {
    base: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ConsoleServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn console_listener() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    (listener, base)
}

fn serve(listener: tokio::net::TcpListener, base: String, config: ProviderConfig) -> ConsoleServer {
    serve_for(listener, base, config, vec![])
}

fn serve_for(listener: tokio::net::TcpListener, base: String, config: ProviderConfig, allowed_groups: Vec<String>) -> ConsoleServer {
    serve_with(listener, base, config, allowed_groups, Default::default())
}

/// The console as the gateway serves it: each request knows its peer.
fn serve_with(listener: tokio::net::TcpListener, base: String, config: ProviderConfig, allowed_groups: Vec<String>, settings: warren_api_gateway::console::app::Settings) -> ConsoleServer {
    use warren_api_gateway::console::{access::Access, app};
    let app = app::router(app::Console::with(app::SignIn::Oidc { config, allowed_groups }, Access::SignedIn, None, settings));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await;
    });
    ConsoleServer { base, task }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// A client connecting from `addr` (another loopback address: another client to the console).
fn client_from(addr: &str) -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).local_address(addr.parse::<std::net::IpAddr>().unwrap()).build().unwrap()
}

fn location(r: &reqwest::Response) -> String {
    r.headers().get("location").expect("a redirect").to_str().unwrap().to_string()
}

/// The `name=value` of the cookie `name` a response sets.
fn set_cookie(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers().get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()).map(|v| v.split(';').next().unwrap_or_default().to_string()).find(|c| c.starts_with(&format!("{name}=")))
}

/// A sign-in started at the console by a browser: where the provider
/// sends it back, and the binding cookie the console gave it.
struct Started {
    callback: url::Url,
    binding: String,
}

/// Starts a sign-in with `http` and signs `user` in at the provider.
async fn start(http: &reqwest::Client, console: &ConsoleServer, idp: &Idp, user: &str) -> Started {
    let start = http.get(format!("{}/signin?return=%2F", console.base)).send().await.unwrap();
    assert_eq!(start.status(), 303);
    let binding = set_cookie(&start, "warren_console_signin").expect("the sign-in is bound to this browser");
    let set = start.headers().get_all("set-cookie").iter().map(|v| v.to_str().unwrap().to_string()).find(|c| c.starts_with("warren_console_signin=")).unwrap();
    for attr in ["HttpOnly", "Secure", "SameSite=Lax"] {
        assert!(set.contains(attr), "{set}");
    }
    Started { callback: browse_to(&location(&start), user, &idp.redirect).await, binding }
}

/// Signs `user` in through the console: the session cookie (`name=value`),
/// the callback URL the browser was sent to, and its binding cookie.
async fn sign_in(console: &ConsoleServer, idp: &Idp, user: &str) -> (String, String, String) {
    let http = client();
    let started = start(&http, console, idp, user).await;
    let done = http.get(started.callback.as_str()).header("cookie", &started.binding).send().await.unwrap();
    assert_eq!((done.status().as_u16(), location(&done).as_str()), (303, "/"), "signed in and sent back");
    let set = done.headers().get("set-cookie").unwrap().to_str().unwrap().to_string();
    for attr in ["HttpOnly", "Secure", "SameSite=Lax"] {
        assert!(set.contains(attr), "{set}");
    }
    (set.split(';').next().unwrap().to_string(), started.callback.to_string(), started.binding)
}

#[tokio::test]
async fn the_console_signs_in_shows_who_and_signs_out_only_with_its_csrf_token() {
    let (listener, base) = console_listener().await;
    let idp = Idp::start_for(&format!("{base}/callback"));
    let console = serve(listener, base, idp.config());
    let http = client();
    // Without a session: sent to sign in, with the security headers.
    let anonymous = http.get(format!("{}/", console.base)).send().await.unwrap();
    assert_eq!((anonymous.status().as_u16(), location(&anonymous).as_str()), (303, "/signin?return=%2F"));
    let csp = anonymous.headers().get("content-security-policy").unwrap().to_str().unwrap();
    assert!(csp.starts_with("default-src 'none'") && !csp.contains("unsafe-inline"), "{csp}");
    let (cookie, callback, binding) = sign_in(&console, &idp, "ada").await;
    let page = http.get(format!("{}/account", console.base)).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let body = page.text().await.unwrap();
    assert!(body.contains("ada@example.test") && body.contains("platform-admins"), "{body}");
    // The callback once more (a replayed state), from the same browser: refused, no session.
    let replay = http.get(&callback).header("cookie", &binding).send().await.unwrap();
    assert_eq!(replay.status(), 400);
    assert!(replay.headers().get("set-cookie").is_none());
    // Sign-out without the form's token, or with another: refused, still signed in.
    let csrf = body.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
    for form in [String::new(), "csrf=forged".to_string(), format!("csrf={csrf}x")] {
        let r = http.post(format!("{}/signout", console.base)).header("cookie", &cookie).header("content-type", "application/x-www-form-urlencoded").body(form).send().await.unwrap();
        assert_eq!(r.status(), 403);
    }
    assert_eq!(http.get(format!("{}/account", console.base)).header("cookie", &cookie).send().await.unwrap().status(), 200);
    let out = http.post(format!("{}/signout", console.base)).header("cookie", &cookie).header("content-type", "application/x-www-form-urlencoded").body(format!("csrf={csrf}")).send().await.unwrap();
    assert_eq!(out.status(), 303);
    assert!(out.headers().get("set-cookie").unwrap().to_str().unwrap().contains("Max-Age=0"));
    let after = http.get(format!("{}/account", console.base)).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(after.status(), 303, "the old cookie is no session any more");
}

#[tokio::test]
async fn claims_carrying_markup_render_inert() {
    let (listener, base) = console_listener().await;
    let idp = Idp::start_for(&format!("{base}/callback"));
    let console = serve(listener, base, idp.config());
    let (cookie, _, _) = sign_in(&console, &idp, "mallory").await;
    let body = client().get(format!("{}/account", console.base)).header("cookie", &cookie).send().await.unwrap().text().await.unwrap();
    assert!(body.contains("&lt;img src=x onerror=alert(1)&gt;@example.test") && body.contains("&lt;script&gt;alert(2)&lt;/script&gt;"), "{body}");
    assert!(!body.contains("<img") && !body.contains("<script"), "{body}");
}

#[tokio::test]
async fn only_the_allowed_groups_sign_in() {
    let (listener, base) = console_listener().await;
    let idp = Idp::start_for(&format!("{base}/callback"));
    let console = serve_for(listener, base, idp.config(), vec!["platform-admins".into()]);
    let http = client();
    let started = start(&http, &console, &idp, "bob").await;
    let refused = http.get(started.callback.as_str()).header("cookie", &started.binding).send().await.unwrap();
    assert_eq!(refused.status(), 403, "bob is in team-a only");
    assert!(refused.headers().get("set-cookie").is_none(), "no session");
    sign_in(&console, &idp, "ada").await;
}

#[tokio::test]
async fn an_attackers_callback_link_opened_in_another_browser_signs_nobody_in() {
    let (listener, base) = console_listener().await;
    let idp = Idp::start_for(&format!("{base}/callback"));
    let console = serve(listener, base, idp.config());
    // The attacker begins sign-ins in their own browser and signs in at the provider as
    // themselves, then sends the callback links (login CSRF) instead of opening them.
    let attacker = client();
    let traps = [start(&attacker, &console, &idp, "mallory").await, start(&attacker, &console, &idp, "mallory").await];
    // The victim's browser: once with a binding cookie of its own (it began a sign-in), once without any.
    let victim = client();
    let own = start(&victim, &console, &idp, "ada").await;
    for (trap, cookie) in traps.iter().zip([Some(own.binding.as_str()), None]) {
        let mut r = victim.get(trap.callback.as_str());
        if let Some(c) = cookie {
            r = r.header("cookie", c);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 400, "{cookie:?}");
        assert!(set_cookie(&r, "warren_console").is_none(), "no session for the victim");
        assert!(r.text().await.unwrap().contains("started in another browser"));
    }
    // The same kind of link works in the browser that began it, and the victim's own sign-in still does.
    let control = start(&attacker, &console, &idp, "mallory").await;
    let mine = attacker.get(control.callback.as_str()).header("cookie", &control.binding).send().await.unwrap();
    assert_eq!(mine.status(), 303, "the attacker's link signs in only the attacker's browser");
    let theirs = victim.get(own.callback.as_str()).header("cookie", &own.binding).send().await.unwrap();
    assert!(set_cookie(&theirs, "warren_console").is_some(), "{}", theirs.status());
}

#[tokio::test]
async fn a_flood_of_sign_ins_from_one_address_does_not_evict_another_addresss() {
    let (listener, base) = console_listener().await;
    let idp = Idp::start_for(&format!("{base}/callback"));
    let console = serve(listener, base, idp.config());
    // A user begins signing in from one address...
    let user = client_from("127.0.0.2");
    let started = user.get(format!("{}/signin", console.base)).send().await.unwrap();
    let (authorize, binding) = (location(&started), set_cookie(&started, "warren_console_signin").unwrap());
    // ...while another address starts more sign-ins than the console holds in all.
    let flood = client_from("127.0.0.3");
    for _ in 0..warren_api_gateway::console::session::MAX_SIGN_INS + 100 {
        assert_eq!(flood.get(format!("{}/signin", console.base)).send().await.unwrap().status(), 303);
    }
    let callback = browse_to(&authorize, "bob", &idp.redirect).await;
    let done = user.get(callback.as_str()).header("cookie", &binding).send().await.unwrap();
    assert_eq!(done.status(), 303, "the user's sign-in survived the flood");
    assert!(set_cookie(&done, "warren_console").is_some());
}

/// Whether the callback `started` leads to signs its browser in: the status and page.
async fn finish(http: &reqwest::Client, started: &Started) -> (u16, Option<String>, String) {
    let r = http.get(started.callback.as_str()).header("cookie", &started.binding).send().await.unwrap();
    let session = set_cookie(&r, "warren_console");
    (r.status().as_u16(), session, r.text().await.unwrap())
}

#[tokio::test]
async fn an_unverified_email_or_a_system_group_from_the_provider_is_not_a_cluster_identity() {
    let (listener, base) = console_listener().await;
    let idp = Idp::start_for(&format!("{base}/callback"));
    let console = serve(listener, base, idp.config());
    let http = client();
    // eve typed ada's address at the provider, which never verified it.
    let (status, session, page) = finish(&http, &start(&http, &console, &idp, "eve").await).await;
    assert_eq!((status, session), (403, None), "{page}");
    assert!(page.contains("does not say the email address is verified"), "{page}");
    // root's provider groups include system:masters: dropped, the others kept.
    let (cookie, _, _) = sign_in(&console, &idp, "root").await;
    let account = http.get(format!("{}/account", console.base)).header("cookie", &cookie).send().await.unwrap().text().await.unwrap();
    assert!(account.contains("root@example.test") && account.contains("team-a") && !account.contains("system:"), "{account}");
}

#[tokio::test]
async fn usernames_from_other_claims_are_prefixed_and_a_system_username_is_refused() {
    // --console-oidc-username-claim=sub, --console-oidc-groups-prefix=oidc: (the API server's default prefix for sub).
    let (listener, base) = console_listener().await;
    let idp = Idp::start_for(&format!("{base}/callback"));
    let mut config = idp.config();
    config.claims = ClaimMapping { username_claim: "sub".into(), groups_prefix: "oidc:".into(), ..ClaimMapping::default() };
    let console = serve(listener, base, config);
    let (cookie, _, _) = sign_in(&console, &idp, "bob").await;
    let account = client().get(format!("{}/account", console.base)).header("cookie", &cookie).send().await.unwrap().text().await.unwrap();
    assert!(account.contains(&format!("{}#bob", idp.issuer)) && account.contains("oidc:team-a"), "{account}");
    // preferred_username without a prefix: root's "system:admin" would be a Kubernetes system user.
    let (listener, base) = console_listener().await;
    let idp = Idp::start_for(&format!("{base}/callback"));
    let mut config = idp.config();
    config.claims = ClaimMapping { username_claim: "preferred_username".into(), username_prefix: Some("-".into()), ..ClaimMapping::default() };
    let console = serve(listener, base, config);
    let http = client();
    let (status, session, page) = finish(&http, &start(&http, &console, &idp, "root").await).await;
    assert_eq!((status, session), (403, None), "{page}");
    assert!(page.contains("Kubernetes system name"), "{page}");
}

#[tokio::test]
async fn a_group_removed_at_the_provider_stops_counting_within_the_recheck_interval() {
    let recheck = Duration::from_secs(2);
    let (listener, base) = console_listener().await;
    let idp = Idp::start_for(&format!("{base}/callback"));
    let settings = warren_api_gateway::console::app::Settings { recheck, ..Default::default() };
    let console = serve_with(listener, base, idp.config(), vec!["team-a".into(), "team-b".into()], settings);
    let http = client();
    let account = |cookie: String| {
        let (http, url) = (http.clone(), format!("{}/account", console.base));
        async move { http.get(url).header("cookie", cookie).send().await.unwrap() }
    };
    let (cookie, _, _) = sign_in(&console, &idp, "bob").await;
    // An admin moves bob from team-a to team-b at the provider.
    idp.set_groups("bob", &["team-b"]).await;
    tokio::time::sleep(recheck + Duration::from_millis(500)).await;
    let stale = account(cookie).await;
    assert_eq!((stale.status().as_u16(), location(&stale).as_str()), (303, "/signin?return=%2Faccount"), "the session's team-a is no longer used");
    // Signing in again (at once while the provider's own session lasts) reads the groups anew.
    let (cookie, _, _) = sign_in(&console, &idp, "bob").await;
    let page = account(cookie.clone()).await.text().await.unwrap();
    assert!(page.contains("team-b") && !page.contains("team-a"), "{page}");
    // Removed from every allowed group: after the interval the console refuses him.
    idp.set_groups("bob", &[]).await;
    tokio::time::sleep(recheck + Duration::from_millis(500)).await;
    assert_eq!(account(cookie).await.status(), 303, "his session ended");
    let (status, session, _) = finish(&http, &start(&http, &console, &idp, "bob").await).await;
    assert_eq!((status, session), (403, None), "and the provider's answer no longer lets him in");
}

#[tokio::test]
async fn a_provider_that_is_down_gets_a_clear_page() {
    let (listener, base) = console_listener().await;
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = ProviderConfig { issuer: format!("http://127.0.0.1:{closed}"), client_id: "warren-console".into(), client_secret: SECRET.into(), redirect_uri: format!("{base}/callback"), claims: ClaimMapping::default() };
    let console = serve(listener, base, config);
    let r = client().get(format!("{}/signin", console.base)).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.text().await.unwrap().contains("identity provider is not answering"));
}

#[test]
fn the_console_is_off_unless_asked_for_and_then_needs_its_provider() {
    use clap::Parser as _;
    let args = |extra: &[&str]| warren_api_gateway::Args::parse_from([&["warren-gateway"][..], extra].concat());
    assert!(warren_api_gateway::console_config(&args(&[])).unwrap().is_none(), "no console by default");
    let e = warren_api_gateway::console_config(&args(&["--console-listen", "127.0.0.1:8081"])).unwrap_err().to_string();
    assert!(e.contains("--console-oidc-issuer"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "s3cret\n").unwrap();
    let full = args(&["--console-listen", "127.0.0.1:8081", "--console-url", "https://console.example.test/", "--console-oidc-issuer", "https://idp.example.test", "--console-oidc-client-secret-file", secret.to_str().unwrap()]);
    let e = warren_api_gateway::console_config(&full).unwrap_err().to_string();
    assert!(e.contains("--console-allowed-groups"), "off a cluster, who may sign in must be named: {e}");
    let full = args(&["--console-listen", "127.0.0.1:8081", "--console-url", "https://console.example.test/", "--console-oidc-issuer", "https://idp.example.test", "--console-oidc-client-secret-file", secret.to_str().unwrap(), "--console-allowed-groups", "ops, admins"]);
    let (listen, sign_in) = warren_api_gateway::console_config(&full).unwrap().unwrap();
    let warren_api_gateway::console::app::SignIn::Oidc { config, allowed_groups } = sign_in else { panic!("{sign_in:?}") };
    assert_eq!(allowed_groups, ["ops", "admins"]);
    assert_eq!((listen.port(), config.redirect_uri.as_str(), config.client_secret.as_str(), config.client_id.as_str()), (8081, "https://console.example.test/callback", "s3cret", "warren-console"));
    std::fs::write(&secret, "\n").unwrap();
    assert!(warren_api_gateway::console_config(&full).is_err(), "an empty secret");
    // One machine: the local admin's link, written privately; never with a provider or in a cluster.
    let file = dir.path().join("console-link");
    let (_, sign_in) = warren_api_gateway::console_config(&args(&["--console-listen", "127.0.0.1:8081", "--console-link-file", file.to_str().unwrap()])).unwrap().unwrap();
    assert!(matches!(sign_in, warren_api_gateway::console::app::SignIn::Link(_)));
    assert!(std::fs::read_to_string(&file).unwrap().starts_with("http://127.0.0.1:8081/signin/link/"));
    for extra in [&["--console-oidc-issuer", "https://idp.example.test"][..], &["--cluster"][..]] {
        let both = [&["warren-gateway", "--console-listen", "127.0.0.1:8081", "--console-link-file", "/tmp/x"][..], extra].concat();
        assert!(warren_api_gateway::Args::try_parse_from(both).is_err(), "{extra:?}");
    }
}
