//! The Connect protocol as envd speaks it, JSON codec only: unary calls are
//! a JSON body in and out; server streams take one enveloped message and
//! answer enveloped messages ending with an end-of-stream envelope that
//! carries the error, if any. An envelope is a flags byte, a big-endian u32
//! length and the JSON. Pure; unit-tested.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, Bytes, BytesMut};

use super::E2bError;

/// Flag of the end-of-stream envelope.
const END_STREAM: u8 = 0x02;
/// Flag of a compressed envelope (never sent; refused when received).
const COMPRESSED: u8 = 0x01;
/// The streaming content type.
pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";

/// One envelope.
pub fn envelope(flags: u8, json: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + json.len());
    b.put_u8(flags);
    b.put_u32(json.len() as u32);
    b.put_slice(json);
    b.freeze()
}

/// A stream message.
pub fn message(value: &serde_json::Value) -> Bytes {
    envelope(0, &serde_json::to_vec(value).unwrap_or_default())
}

/// The end of a stream: `{}` or `{"error": {code, message}}`.
pub fn end(error: Option<&E2bError>) -> Bytes {
    let body = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({"error": {"code": code_of(e), "message": e.message}}),
    };
    envelope(END_STREAM, &serde_json::to_vec(&body).unwrap_or_default())
}

/// The one message of a streaming request's body.
pub fn single_message(body: &[u8]) -> Result<&[u8], E2bError> {
    let bad = |why: &str| E2bError::invalid(format!("not a Connect stream request: {why}"));
    let (&flags, rest) = body.split_first().ok_or_else(|| bad("empty body"))?;
    if flags & COMPRESSED != 0 {
        return Err(bad("compressed messages are not accepted"));
    }
    let len = rest.get(..4).map(|l| u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize).ok_or_else(|| bad("short envelope"))?;
    let msg = rest.get(4..4 + len).ok_or_else(|| bad("short message"))?;
    if rest.len() != 4 + len {
        return Err(bad("one message expected"));
    }
    Ok(msg)
}

/// The Connect code of an error.
pub fn code_of(e: &E2bError) -> &'static str {
    e.connect_code.unwrap_or_else(|| code(e.status))
}

/// The Connect code of an HTTP status.
pub fn code(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 422 => "invalid_argument",
        401 => "unauthenticated",
        403 => "permission_denied",
        404 => "not_found",
        409 => "failed_precondition",
        413 | 429 => "resource_exhausted",
        501 => "unimplemented",
        502 | 503 => "unavailable",
        504 => "deadline_exceeded",
        _ => "unknown",
    }
}

/// The HTTP status a unary error answers with (Connect's table).
fn unary_status(code: &str) -> StatusCode {
    match code {
        "invalid_argument" | "failed_precondition" => StatusCode::BAD_REQUEST,
        "unauthenticated" => StatusCode::UNAUTHORIZED,
        "permission_denied" => StatusCode::FORBIDDEN,
        "not_found" => StatusCode::NOT_FOUND,
        "already_exists" => StatusCode::CONFLICT,
        "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
        "unimplemented" => StatusCode::NOT_IMPLEMENTED,
        "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
        "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::BAD_GATEWAY,
    }
}

/// A unary error with an explicit Connect code.
pub fn unary_error_code(code: &str, message: &str) -> Response {
    let body = serde_json::json!({"code": code, "message": message});
    (unary_status(code), [(header::CONTENT_TYPE, "application/json")], serde_json::to_vec(&body).unwrap_or_default()).into_response()
}

/// A unary error (an explicit Connect code keeps the error's own status).
pub fn unary_error(e: &E2bError) -> Response {
    match e.connect_code {
        Some(code) => {
            let body = serde_json::json!({"code": code, "message": e.message});
            (e.status, [(header::CONTENT_TYPE, "application/json")], serde_json::to_vec(&body).unwrap_or_default()).into_response()
        }
        None => unary_error_code(code(e.status), &e.message),
    }
}

/// A unary answer.
pub fn unary_ok(value: &serde_json::Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], serde_json::to_vec(value).unwrap_or_default()).into_response()
}

/// A whole stream that is only an error.
pub fn stream_error(e: &E2bError) -> Response {
    ([(header::CONTENT_TYPE, STREAM_CONTENT_TYPE)], end(Some(e))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_round_trip_and_bad_bodies_are_refused() {
        let m = message(&serde_json::json!({"a": 1}));
        assert_eq!(&m[..5], &[0, 0, 0, 0, 7]);
        assert_eq!(single_message(&m).unwrap(), br#"{"a":1}"#);
        assert!(single_message(&[]).is_err());
        assert!(single_message(&[0, 0, 0]).is_err());
        assert!(single_message(&[0, 0, 0, 0, 9, b'{']).is_err());
        assert!(single_message(&[COMPRESSED, 0, 0, 0, 0]).is_err());
        let two = [m.to_vec(), m.to_vec()].concat();
        assert!(single_message(&two).is_err());
    }

    #[test]
    fn stream_ends_carry_the_error() {
        let ok = end(None);
        assert_eq!(ok[0], END_STREAM);
        assert_eq!(&ok[5..], b"{}");
        let e = end(Some(&E2bError::not_found("no such file")));
        let v: serde_json::Value = serde_json::from_slice(&e[5..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(v["error"]["message"], "no such file");
    }

    #[test]
    fn codes_follow_connect() {
        assert_eq!(code(StatusCode::BAD_GATEWAY), "unavailable");
        assert_eq!(code(StatusCode::NOT_IMPLEMENTED), "unimplemented");
        assert_eq!(unary_status("not_found"), StatusCode::NOT_FOUND);
        assert_eq!(unary_status("unavailable"), StatusCode::SERVICE_UNAVAILABLE);
    }
}
