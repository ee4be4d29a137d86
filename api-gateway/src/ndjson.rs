//! `application/x-ndjson` responses: a small channel a task fills and the
//! HTTP body drains, so a client that stops reading is noticed (its send
//! times out) instead of holding whatever feeds it.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::records::Recorder;
use crate::result::StreamEvent;

/// The media type.
pub const NDJSON: &str = "application/x-ndjson";

/// Lines buffered between the producing task and the HTTP body.
const LINES: usize = 16;

/// The producing side of a response.
pub type Tx = tokio::sync::mpsc::Sender<bytes::Bytes>;

/// A streaming 200 response and the sender that feeds it.
pub fn response() -> (Tx, Response) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(LINES);
    let body = async_stream::stream! {
        while let Some(line) = rx.recv().await {
            yield Ok::<_, std::convert::Infallible>(line);
        }
    };
    let resp = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, NDJSON)
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| ApiError::unavailable("could not start the stream").into_response());
    (tx, resp)
}

/// One event as a line.
pub fn line(ev: &StreamEvent) -> bytes::Bytes {
    let mut v = serde_json::to_vec(ev).unwrap_or_default();
    v.push(b'\n');
    v.into()
}

/// Hands one line to the body; false when the client left or took nothing
/// for `stall`.
pub async fn deliver(tx: &Tx, ev: &StreamEvent, stall: Duration) -> bool {
    deliver_line(tx, line(ev), stall).await
}

/// [`deliver`] for a line already serialized.
pub async fn deliver_line(tx: &Tx, line: bytes::Bytes, stall: Duration) -> bool {
    matches!(tokio::time::timeout(stall, tx.send(line)).await, Ok(Ok(())))
}

/// Records every line but keepalives (which carry nothing to resume).
pub fn record(rec: &Recorder, trace_id: &str, events: &[StreamEvent]) {
    for ev in events {
        if !matches!(ev, StreamEvent::Keepalive { .. }) {
            rec.line(trace_id, ev.seq(), serde_json::to_string(ev).unwrap_or_default());
        }
    }
}
