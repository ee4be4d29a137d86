//! `GET /v2/sandboxes` (and the older `GET /sandboxes`): a key's live
//! sandboxes, oldest first, paged by an opaque cursor, filtered by state and
//! metadata.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Deserialize;
use serde_json::Value;

use super::control::{key, listed};
use super::E2bError;
use crate::records::now_ms;
use crate::state::AppState;

/// Rows one listing reads at most.
const LIST_SCAN: u32 = 10_000;
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// `GET /v2/sandboxes` query.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    state: Option<String>,
    metadata: Option<String>,
    limit: Option<u32>,
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
}

/// `GET /v2/sandboxes`: the key's live sandboxes, oldest first, paged
/// (`limit` ≤ 100, `X-Next-Token`), filtered by state and metadata.
pub async fn list(State(st): State<AppState>, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    match page(&st, &headers, q).await {
        Ok((items, next)) => {
            let mut r = axum::Json(items).into_response();
            if let Some(v) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
                r.headers_mut().insert("x-next-token", v);
            }
            r
        }
        Err(e) => e.into_response(),
    }
}

/// `GET /sandboxes` (older SDKs): the first page, without paging.
pub async fn list_v1(State(st): State<AppState>, headers: HeaderMap, Query(q): Query<ListQuery>) -> Response {
    page(&st, &headers, q).await.map_or_else(IntoResponse::into_response, |(items, _)| axum::Json(items).into_response())
}

async fn page(st: &AppState, headers: &HeaderMap, q: ListQuery) -> Result<(Vec<Value>, Option<String>), E2bError> {
    let key = key(st, headers)?;
    let limit = q.limit.unwrap_or(100).clamp(1, 100) as usize;
    let states: Vec<&str> = q.state.as_deref().map(|s| s.split(',').map(str::trim).filter(|s| !s.is_empty()).collect()).unwrap_or_default();
    // The SDKs quote each key and value, then form-encode the pairs.
    let wanted: Vec<(String, String)> = q.metadata.as_deref().map(|m| url::form_urlencoded::parse(m.as_bytes()).map(|(k, v)| (unquote(&k), unquote(&v))).collect()).unwrap_or_default();
    let after = match q.next_token.as_deref() {
        None | Some("") => None,
        Some(t) => Some(cursor(t).ok_or_else(|| E2bError::invalid("nextToken is not one this gateway gave"))?),
    };
    let now = now_ms();
    let rows = st.service.records.store().sandboxes(&key.namespace, &key.name, after, LIST_SCAN).await?;
    let mut out = Vec::new();
    let mut next = None;
    for s in rows {
        if s.end_ms <= now {
            super::lifecycle::expire(st, &key, &s);
            continue;
        }
        if (!states.is_empty() && !states.contains(&s.state.as_str())) || !wanted.iter().all(|(k, v)| s.metadata.get(k) == Some(v)) {
            continue;
        }
        if out.len() == limit {
            break;
        }
        if out.len() + 1 == limit {
            next = Some(B64.encode(format!("{}:{}", s.started_ms, s.id)));
        }
        out.push(listed(&key, &s));
    }
    // A full page says there may be more; the last page of exactly `limit`
    // then gives one empty page, as E2B's own paging does.
    let full = out.len() == limit;
    Ok((out, next.filter(|_| full)))
}

/// Percent-decoding (`urllib.parse.quote`'s inverse); bad escapes stay as they are.
fn unquote(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn cursor(token: &str) -> Option<(i64, String)> {
    let raw = String::from_utf8(B64.decode(token).ok()?).ok()?;
    let (t, id) = raw.split_once(':')?;
    warren_core::ids::is_thread_id(id).then(|| Some((t.parse().ok()?, id.to_string())))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_bad_ones_are_refused() {
        let t = B64.encode("1700000000000:abc");
        assert_eq!(cursor(&t), Some((1_700_000_000_000, "abc".into())));
        assert_eq!(cursor("!!"), None);
        assert_eq!(cursor(&B64.encode("x:abc")), None);
        assert_eq!(cursor(&B64.encode("1:../x")), None);
    }

    #[test]
    fn metadata_filters_are_unquoted() {
        assert_eq!(unquote("a%20b%2Fc"), "a b/c");
        assert_eq!(unquote("100%"), "100%");
        assert_eq!(unquote("%zz"), "%zz");
        assert_eq!(unquote("%C3%A9"), "é");
    }
}
