//! `GET /v2/sandboxes` (and the older `GET /sandboxes`): a key's live
//! sandboxes, oldest first, paged by an opaque cursor, filtered by state and
//! metadata — all in the database, so a listing reads one page of rows
//! (never their environment), however many sandboxes the key has.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Deserialize;
use serde_json::Value;

use super::control::{key, listed};
use super::E2bError;
use crate::records::{now_ms, SandboxPage};
use crate::state::AppState;

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

/// States a sandbox may be in; a filter naming only others matches nothing.
const STATES: &[&str] = &["running", "paused"];
/// Most metadata entries one filter names (a sandbox has at most 10).
const MAX_FILTERS: usize = 10;

async fn page(st: &AppState, headers: &HeaderMap, q: ListQuery) -> Result<(Vec<Value>, Option<String>), E2bError> {
    let key = key(st, headers)?;
    let limit = q.limit.unwrap_or(100).clamp(1, 100);
    let asked: Vec<&str> = q.state.as_deref().map(|s| s.split(',').map(str::trim).filter(|s| !s.is_empty()).collect()).unwrap_or_default();
    let states: Vec<String> = STATES.iter().filter(|s| asked.contains(s)).map(|s| s.to_string()).collect();
    if !asked.is_empty() && states.is_empty() {
        return Ok((Vec::new(), None));
    }
    // The SDKs quote each key and value, then form-encode the pairs.
    let metadata: Vec<(String, String)> = q.metadata.as_deref().map(|m| url::form_urlencoded::parse(m.as_bytes()).map(|(k, v)| (unquote(&k), unquote(&v))).collect()).unwrap_or_default();
    if metadata.len() > MAX_FILTERS {
        return Err(E2bError::invalid(format!("metadata: at most {MAX_FILTERS} entries to filter by")));
    }
    let after = match q.next_token.as_deref() {
        None | Some("") => None,
        Some(t) => Some(cursor(t).ok_or_else(|| E2bError::invalid("nextToken is not one this gateway gave"))?),
    };
    let ask = SandboxPage { namespace: key.namespace.clone(), key_name: key.name.clone(), states, metadata, after, now: now_ms(), limit };
    let rows = st.service.records.store().sandbox_page(&ask).await?;
    // A full page says there may be more; the last page of exactly `limit`
    // then gives one empty page, as E2B's own paging does.
    let next = rows.last().filter(|_| rows.len() == limit as usize).map(|s| B64.encode(format!("{}:{}", s.started_ms, s.id)));
    Ok((rows.iter().map(|s| listed(st, &key, s)).collect(), next))
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
