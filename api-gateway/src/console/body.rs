//! Request bodies on the console, which shares its process with the
//! execute API: nobody's body is read before their session is known, and
//! a signed-in user's is read bounded (per route) and within a deadline.
//!
//! - [`gate`] (middleware, every route): a request carrying a body without
//!   a live session is sent to sign in at once, its body never read, and
//!   told `connection: close` (the unread bytes cannot then hold the
//!   connection, or memory, while they trickle in);
//! - [`Form`] (extractor): the body of a signed-in user's form, at most
//!   `MAX` bytes (a larger declared length is refused before reading),
//!   within the console's body deadline; [`read`] the same for a bound
//!   known only in the handler (an upload).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody as _};
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use super::frame::{page, see_other, Console};
use super::html::Html;
use super::session;

/// Largest form of one token and a few short fields (sign-out, a
/// disable, a cancel, a file's path).
pub const SMALL_FORM: usize = 16 << 10;

/// Middleware: a body without a live session is refused unread.
pub(super) async fn gate(State(c): State<Arc<Console>>, req: Request, next: Next) -> Response {
    if req.body().is_end_stream() || c.session(req.headers()).is_some() {
        return next.run(req).await;
    }
    sign_in_first()
}

/// The answer to a body sent without a session: sign in (no return path:
/// a form's target is no page to come back to; a cookie naming no session
/// is cleared), connection closed.
fn sign_in_first() -> Response {
    closing(see_other("/signin", Some(session::clear_cookie())))
}

fn closing(mut r: Response) -> Response {
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// A signed-in user's form body, at most `MAX` bytes.
pub(super) struct Form<const MAX: usize>(pub Bytes);

impl<const MAX: usize> FromRequest<Arc<Console>> for Form<MAX> {
    type Rejection = Response;

    async fn from_request(req: Request, c: &Arc<Console>) -> Result<Self, Response> {
        // The gate already refused it; checked again so this stands alone.
        if c.session(req.headers()).is_none() {
            return Err(sign_in_first());
        }
        let (parts, body) = req.into_parts();
        read(&parts.headers, body, MAX, c.settings.body_timeout).await.map(Form)
    }
}

/// `body`, at most `max` bytes, within `deadline`; else the page saying why.
pub(super) async fn read(headers: &HeaderMap, body: Body, max: usize, deadline: Duration) -> Result<Bytes, Response> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large(max));
    }
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, max)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) if std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>()) => Err(too_large(max)),
        Ok(Err(_)) => Err(refused(StatusCode::BAD_REQUEST, "The form could not be read.")),
        Err(_) => Err(refused(StatusCode::REQUEST_TIMEOUT, &format!("The form did not arrive within {} seconds. Send it again.", deadline.as_secs()))),
    }
}

fn too_large(max: usize) -> Response {
    let limit = if max >= 1 << 20 { format!("{} MiB", max >> 20) } else { format!("{} KiB", max >> 10) };
    refused(StatusCode::PAYLOAD_TOO_LARGE, &format!("This form is larger than this page takes ({limit})."))
}

fn refused(status: StatusCode, why: &str) -> Response {
    closing(page(status, "Refused", None, &Html::text(why)))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::Poll;
    use std::time::Instant;

    use axum::http::Request as HttpRequest;
    use tower::ServiceExt as _;

    use super::super::access::Access;
    use super::super::app::{router, SignIn};
    use super::super::frame::csrf_ok;
    use super::super::link::{local_admin, LocalLink};
    use super::super::session::{Sessions, SESSION_TTL};
    use super::*;

    fn console(dir: &std::path::Path) -> Arc<Console> {
        let link = LocalLink::new(&dir.join("link"), "http://127.0.0.1:1").unwrap();
        Console::new(SignIn::Link(link), Access::SignedIn, None)
    }

    /// A body that never ends and notes whether anyone asked for its bytes.
    fn watched() -> (Body, Arc<AtomicBool>) {
        let polled = Arc::new(AtomicBool::new(false));
        let seen = polled.clone();
        let stream = futures_util::stream::poll_fn(move |_| -> Poll<Option<Result<Bytes, std::io::Error>>> {
            seen.store(true, Ordering::SeqCst);
            Poll::Pending
        });
        (Body::from_stream(stream), polled)
    }

    fn post(path: &str, cookie: Option<&str>, body: Body) -> HttpRequest<Body> {
        let mut r = HttpRequest::post(path).header(header::CONTENT_TYPE, "application/x-www-form-urlencoded").header(header::CONTENT_LENGTH, "2000000");
        if let Some(c) = cookie {
            r = r.header(header::COOKIE, c);
        }
        r.body(body).unwrap()
    }

    #[tokio::test]
    async fn a_cookieless_post_is_sent_to_sign_in_without_its_body_being_read() {
        let dir = tempfile::tempdir().unwrap();
        let app = router(console(dir.path()));
        let routes = ["/signout", "/playground", "/keys/team-a/k/disable", "/executions/trc_x/cancel", "/files/team-a/k/thread/t/upload", "/files/team-a/k/thread/t/remove", "/no-such-page"];
        for path in routes {
            for cookie in [None, Some("warren_console=forged")] {
                let (body, polled) = watched();
                let answer = tokio::time::timeout(Duration::from_secs(10), app.clone().oneshot(post(path, cookie, body))).await.expect("answered without waiting for the body").unwrap();
                assert_eq!(answer.status(), StatusCode::SEE_OTHER, "{path}");
                assert_eq!(answer.headers()[header::LOCATION], "/signin");
                assert_eq!(answer.headers()[header::CONNECTION], "close", "{path}: the unread body's connection is closed");
                assert!(!polled.load(Ordering::SeqCst), "{path} {cookie:?}: no byte of the body was read");
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_signed_in_users_slow_body_meets_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let c = console(dir.path());
        let (id, _) = c.sessions.create(local_admin(), [[1; 32], [2; 32]], Instant::now(), SESSION_TTL);
        let app = router(c.clone());
        let (body, polled) = watched();
        let mut request = post("/signout", Some(&format!("warren_console={id}")), body);
        request.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(100));
        // Paused time: the deadline passes as soon as nothing else can run.
        let answer = app.oneshot(request).await.unwrap();
        assert_eq!(answer.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(answer.headers()[header::CONNECTION], "close");
        assert!(polled.load(Ordering::SeqCst), "a signed-in user's body is read");
        assert!(c.sessions.get(&id, Instant::now()).is_some(), "the refused sign-out changed nothing");
    }

    #[tokio::test]
    async fn a_form_larger_than_its_route_takes_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let c = console(dir.path());
        let (id, _) = c.sessions.create(local_admin(), [[1; 32], [2; 32]], Instant::now(), SESSION_TTL);
        let (body, polled) = watched();
        let mut request = post("/signout", Some(&format!("warren_console={id}")), body);
        request.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(SMALL_FORM + 1));
        let answer = router(c).oneshot(request).await.unwrap();
        assert_eq!(answer.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert!(!polled.load(Ordering::SeqCst));
    }

    #[test]
    fn a_large_form_is_not_taken_for_a_forged_one() {
        let (_, s) = Sessions::default().create(local_admin(), [[1; 32], [2; 32]], Instant::now(), SESSION_TTL);
        let code = "x".repeat(500 << 10);
        let form = url::form_urlencoded::Serializer::new(String::new()).append_pair("csrf", &s.csrf).append_pair("code", &code).finish();
        assert!(csrf_ok(&s, &Bytes::from(form)), "a 500 KiB program's form carries its token");
        assert!(!csrf_ok(&s, &Bytes::from(format!("code={code}&csrf=forged"))));
    }
}
