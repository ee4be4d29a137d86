//! The console's sign-in against a real OpenID provider: node-oidc-provider
//! (OpenID Certified; installed by scripts/test.sh) on a loopback port, the
//! authorization code flow with PKCE driven over HTTP as a browser would
//! (the provider's interaction step signs in the user the test names), the
//! code exchanged and the ID token checked by `console::provider`.

use std::net::TcpListener;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use warren_api_gateway::console::provider::{Provider, ProviderConfig, ProviderError};
use warren_api_gateway::console::session::Sessions;

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

fn param<'a>(q: &'a [(String, String)], k: &str) -> &'a str {
    q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str()).unwrap_or_else(|| panic!("no {k} in {q:?}"))
}

#[tokio::test]
async fn a_user_signs_in_with_the_code_flow_and_pkce_and_a_code_works_once() {
    let idp = Idp::start();
    let provider = Provider::discover(idp.config()).await.expect("discovery");
    let sessions = Sessions::default();
    for (user, email, group) in [("ada", "ada@example.test", "platform-admins"), ("bob", "bob@example.test", "team-a")] {
        let started = sessions.begin("/executions", random::<3>(), Instant::now());
        let auth = provider.authorization_url(&started);
        assert!(auth.contains("code_challenge_method=S256") && auth.contains(&started.challenge));
        let back = browse_to_callback(&auth, user, &idp.redirect).await;
        assert_eq!(param(&back, "state"), started.state, "the provider returns the state it was given");
        let sign_in = sessions.finish(param(&back, "state"), Instant::now()).expect("the sign-in is found once");
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
    let first = sessions.begin("/", random::<3>(), Instant::now());
    let other = sessions.begin("/", random::<3>(), Instant::now());
    let back = browse_to_callback(&provider.authorization_url(&first), "bob", &idp.redirect).await;
    sessions.finish(param(&back, "state"), Instant::now()).expect("the callback finds its sign-in");
    let other = sessions.finish(&other.state, Instant::now()).unwrap();
    // An attacker's code injected into another browser's sign-in: the PKCE
    // verifier does not match, and neither would the nonce.
    assert!(matches!(provider.exchange(param(&back, "code"), &other, now()).await, Err(ProviderError::Refused(_))));
    // A code and verifier that belong together, checked against another
    // sign-in's nonce: the provider issues the token, the console refuses it.
    let third = sessions.begin("/", random::<3>(), Instant::now());
    let back = browse_to_callback(&provider.authorization_url(&third), "bob", &idp.redirect).await;
    let mut mixed = sessions.finish(param(&back, "state"), Instant::now()).unwrap();
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
    use warren_api_gateway::console::{access::Access, app};
    let app = app::router(app::Console::new(app::SignIn::Oidc { config, allowed_groups }, Access::SignedIn, None));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    ConsoleServer { base, task }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

fn location(r: &reqwest::Response) -> String {
    r.headers().get("location").expect("a redirect").to_str().unwrap().to_string()
}

/// Signs `user` in through the console: the session cookie (`name=value`)
/// and the callback URL the browser was sent to.
async fn sign_in(console: &ConsoleServer, idp: &Idp, user: &str) -> (String, String) {
    let http = client();
    let start = http.get(format!("{}/signin?return=%2F", console.base)).send().await.unwrap();
    assert_eq!(start.status(), 303);
    let callback = browse_to(&location(&start), user, &idp.redirect).await;
    let done = http.get(callback.as_str()).send().await.unwrap();
    assert_eq!((done.status().as_u16(), location(&done).as_str()), (303, "/"), "signed in and sent back");
    let set = done.headers().get("set-cookie").unwrap().to_str().unwrap().to_string();
    for attr in ["HttpOnly", "Secure", "SameSite=Lax"] {
        assert!(set.contains(attr), "{set}");
    }
    (set.split(';').next().unwrap().to_string(), callback.to_string())
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
    let (cookie, callback) = sign_in(&console, &idp, "ada").await;
    let page = http.get(format!("{}/account", console.base)).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let body = page.text().await.unwrap();
    assert!(body.contains("ada@example.test") && body.contains("platform-admins"), "{body}");
    // The callback once more (a replayed state): refused, no session.
    let replay = http.get(&callback).send().await.unwrap();
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
    let (cookie, _) = sign_in(&console, &idp, "mallory").await;
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
    let start = http.get(format!("{}/signin", console.base)).send().await.unwrap();
    let callback = browse_to(&location(&start), "bob", &idp.redirect).await;
    let refused = http.get(callback.as_str()).send().await.unwrap();
    assert_eq!(refused.status(), 403, "bob is in team-a only");
    assert!(refused.headers().get("set-cookie").is_none(), "no session");
    sign_in(&console, &idp, "ada").await;
}

#[tokio::test]
async fn a_provider_that_is_down_gets_a_clear_page() {
    let (listener, base) = console_listener().await;
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = ProviderConfig { issuer: format!("http://127.0.0.1:{closed}"), client_id: "warren-console".into(), client_secret: SECRET.into(), redirect_uri: format!("{base}/callback") };
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
