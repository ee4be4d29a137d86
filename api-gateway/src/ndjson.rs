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

/// Records an execution's lines (not keepalives) for `…/output` to
/// resume, within the recorder's output size: output beyond it is not
/// recorded, and the result's copy of the output is cut to it.
#[derive(Debug)]
pub struct Tape {
    rec: Recorder,
    trace_id: String,
    kept: usize,
}

impl Tape {
    /// An empty tape for `trace_id`.
    pub fn new(rec: Recorder, trace_id: &str) -> Tape {
        Tape { rec, trace_id: trace_id.to_string(), kept: 0 }
    }

    /// Records `events`.
    pub fn record(&mut self, events: &[StreamEvent]) {
        let max = self.rec.output_max;
        for ev in events {
            let line = match ev {
                StreamEvent::Keepalive { .. } => continue,
                StreamEvent::Output { data, .. } => {
                    // stdout and stderr share twice the per-stream size.
                    if self.kept + data.len() > 2 * max {
                        continue;
                    }
                    self.kept += data.len();
                    serde_json::to_string(ev)
                }
                StreamEvent::Result { trace_id, status, result, output_truncated, seq } if result.stdout.len() > max || result.stderr.len() > max => {
                    let mut result = result.clone();
                    let (out, out_cut) = crate::records::cut(&result.stdout, max);
                    let (err, err_cut) = crate::records::cut(&result.stderr, max);
                    (result.stdout, result.stderr) = (out, err);
                    result.stdout_truncated |= out_cut;
                    result.stderr_truncated |= err_cut;
                    let cut = StreamEvent::Result { trace_id: trace_id.clone(), status: status.clone(), result, output_truncated: *output_truncated || out_cut || err_cut, seq: *seq };
                    serde_json::to_string(&cut)
                }
                _ => serde_json::to_string(ev),
            };
            self.rec.line(&self.trace_id, ev.seq(), line.unwrap_or_default());
        }
    }

    /// Resolves once everything recorded so far is committed.
    pub async fn flush(&self) {
        self.rec.flush().await;
    }
}
