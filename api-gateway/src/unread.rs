//! Closing a connection whose request body was not read (the API's and
//! the console's routers both use it).
//!
//! A request refused early (a bad key, a full admission queue) is answered
//! without reading its body. hyper then cannot reuse the connection: the
//! unread bytes would be taken for the next request, so it closes it once
//! the response is out — but, without a `connection: close` in that
//! response, a client that pipelines or pools its connections may already
//! have written its next request, and gets "server disconnected" instead of
//! an answer. Saying `connection: close` on those responses tells the client
//! before it reuses the connection.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{header, HeaderValue, Version};
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};

/// Middleware: `connection: close` on HTTP/1 responses sent before their
/// request's body was read to its end.
pub async fn close_when_unread(req: Request, next: Next) -> Response {
    if req.version() >= Version::HTTP_2 || req.body().is_end_stream() {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let read = Arc::new(AtomicBool::new(false));
    let body = Body::new(Tracked { inner: body, read: read.clone() });
    let mut resp = next.run(Request::from_parts(parts, body)).await;
    if !read.load(Ordering::Acquire) {
        resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// A request body that notes when it has been read to its end.
struct Tracked {
    inner: Body,
    read: Arc<AtomicBool>,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
