//! The audit log's filters, as the console's URL carries them (a GET form,
//! so a filtered view is a link to share): parsed strictly, turned into a
//! record [`Filter`] scoped to the namespaces the user may see. Pure.

use crate::records::{Filter, Status};

/// Rows per page.
pub const PAGE: u32 = 50;
/// Most metadata pairs in one filter.
const MAX_METADATA: usize = 10;

/// The filters as typed (kept to refill the form and build page links).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// One namespace (else all the user may see).
    pub namespace: String,
    /// One ApiKey name.
    pub key: String,
    /// One status.
    pub status: String,
    /// One language.
    pub language: String,
    /// One thread.
    pub thread_id: String,
    /// Created at or after.
    pub since: String,
    /// Created before.
    pub until: String,
    /// `k=v` pairs, space separated; all must match.
    pub metadata: String,
    /// Where the page starts (the last row of the previous one).
    pub cursor: String,
}

/// Why a query gives no page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A malformed field: its name and the rule.
    Invalid(&'static str, &'static str),
    /// A namespace the user may not see (shown as not found: its existence
    /// is not confirmed).
    NotVisible,
}

impl ListQuery {
    /// Reads the query string's pairs; unknown names are refused.
    pub fn parse(pairs: &[(String, String)]) -> Result<ListQuery, Refusal> {
        let mut q = ListQuery::default();
        for (k, v) in pairs {
            let slot = match k.as_str() {
                "namespace" => &mut q.namespace,
                "key" => &mut q.key,
                "status" => &mut q.status,
                "language" => &mut q.language,
                "thread_id" => &mut q.thread_id,
                "since" => &mut q.since,
                "until" => &mut q.until,
                "metadata" => &mut q.metadata,
                "cursor" => &mut q.cursor,
                _ => return Err(Refusal::Invalid("query", "unknown filter")),
            };
            if v.len() > 1024 {
                return Err(Refusal::Invalid("query", "a filter of at most 1024 characters"));
            }
            *slot = v.trim().to_string();
        }
        Ok(q)
    }

    /// The record filter for a user who may see `visible`.
    pub fn filter(&self, visible: &[String]) -> Result<Filter, Refusal> {
        let mut f = Filter { namespaces: visible.to_vec(), limit: PAGE, ..Filter::default() };
        if !self.namespace.is_empty() {
            if !visible.contains(&self.namespace) {
                return Err(Refusal::NotVisible);
            }
            f.namespaces = vec![self.namespace.clone()];
        }
        f.key_name = some(&self.key, is_name, "key", "an ApiKey name")?;
        f.status = some(&self.status, Status::is_known, "status", "running or a final status")?;
        f.language = some(&self.language, |l| matches!(l, "python" | "node" | "bash"), "language", "python, node or bash")?;
        f.thread_id = some(&self.thread_id, warren_core::ids::is_thread_id, "thread_id", warren_core::ids::THREAD_ID_RULE)?;
        f.since_ms = time(&self.since, "since")?;
        f.until_ms = time(&self.until, "until")?;
        for pair in self.metadata.split_whitespace() {
            match pair.split_once('=') {
                Some((k, v)) if crate::exec::request::is_metadata_key(k) && v.len() <= 256 => f.metadata.push((k.to_string(), v.to_string())),
                _ => return Err(Refusal::Invalid("metadata", "name=value pairs separated by spaces")),
            }
        }
        if f.metadata.len() > MAX_METADATA {
            return Err(Refusal::Invalid("metadata", "at most 10 pairs"));
        }
        if !self.cursor.is_empty() {
            f.after = Some(cursor(&self.cursor).ok_or(Refusal::Invalid("cursor", "a page link, unchanged"))?);
        }
        Ok(f)
    }

    /// The query string of this view, starting at `cursor` (none: the first page).
    pub fn link(&self, cursor: Option<&str>) -> String {
        let mut out = url::form_urlencoded::Serializer::new(String::new());
        let fields = [
            ("namespace", &self.namespace),
            ("key", &self.key),
            ("status", &self.status),
            ("language", &self.language),
            ("thread_id", &self.thread_id),
            ("since", &self.since),
            ("until", &self.until),
            ("metadata", &self.metadata),
        ];
        for (k, v) in fields.into_iter().filter(|(_, v)| !v.is_empty()) {
            out.append_pair(k, v);
        }
        if let Some(c) = cursor {
            out.append_pair("cursor", c);
        }
        out.finish()
    }
}

/// The cursor after `created_ms` and `trace_id` (the last row shown).
pub fn cursor_of(created_ms: i64, trace_id: &str) -> String {
    format!("{created_ms}.{trace_id}")
}

fn cursor(v: &str) -> Option<(i64, String)> {
    let (t, id) = v.split_once('.')?;
    warren_core::ids::is_execution_id(id).then_some(())?;
    Some((t.parse().ok()?, id.to_string()))
}

fn is_name(s: &str) -> bool {
    (1..=253).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

fn some(v: &str, ok: impl Fn(&str) -> bool, field: &'static str, rule: &'static str) -> Result<Option<String>, Refusal> {
    match v {
        "" => Ok(None),
        v if ok(v) => Ok(Some(v.to_string())),
        _ => Err(Refusal::Invalid(field, rule)),
    }
}

/// RFC 3339, or what a `datetime-local` input sends (`2026-11-26T10:00`, UTC).
fn time(v: &str, field: &'static str) -> Result<Option<i64>, Refusal> {
    if v.is_empty() {
        return Ok(None);
    }
    let t = v.parse::<jiff::Timestamp>().ok().or_else(|| v.parse::<jiff::civil::DateTime>().ok().and_then(|d| d.to_zoned(jiff::tz::TimeZone::UTC).ok()).map(|z| z.timestamp()));
    t.map(|t| Some(t.as_millisecond())).ok_or(Refusal::Invalid(field, "a time like 2026-11-26T10:00 (UTC) or RFC 3339"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &str) -> Vec<(String, String)> {
        url::form_urlencoded::parse(q.as_bytes()).into_owned().collect()
    }

    fn visible() -> Vec<String> {
        vec!["team-a".into(), "team-b".into()]
    }

    #[test]
    fn filters_become_a_record_filter_within_the_visible_namespaces() {
        let q = ListQuery::parse(&pairs("namespace=team-a&key=agent&status=failed&language=python&thread_id=t-1&since=2026-11-26T10:00&until=2026-11-26T11:00:00Z&metadata=run%3D7+job%3Dx")).unwrap();
        let f = q.filter(&visible()).unwrap();
        assert_eq!(f.namespaces, vec!["team-a".to_string()]);
        assert_eq!((f.key_name.as_deref(), f.status.as_deref(), f.language.as_deref(), f.thread_id.as_deref()), (Some("agent"), Some("failed"), Some("python"), Some("t-1")));
        assert_eq!((f.since_ms, f.until_ms), (Some(1_795_687_200_000), Some(1_795_690_800_000)));
        assert_eq!(f.metadata, vec![("run".into(), "7".into()), ("job".into(), "x".into())]);
        let all = ListQuery::default().filter(&visible()).unwrap();
        assert_eq!((all.namespaces, all.limit), (visible(), PAGE), "no namespace: every visible one");
    }

    #[test]
    fn another_namespace_is_not_found_and_junk_is_refused() {
        let other = ListQuery::parse(&pairs("namespace=team-c")).unwrap();
        assert_eq!(other.filter(&visible()), Err(Refusal::NotVisible));
        assert_eq!(ListQuery::default().filter(&[]).unwrap().namespaces, Vec::<String>::new(), "nothing visible: nothing matches");
        for (q, field) in [("status=pwned", "status"), ("language=ruby", "language"), ("key=A'B", "key"), ("thread_id=..%2F", "thread_id"), ("since=yesterday", "since"), ("metadata=novalue", "metadata"), ("cursor=1.x'", "cursor")] {
            let e = ListQuery::parse(&pairs(q)).unwrap().filter(&visible());
            assert!(matches!(e, Err(Refusal::Invalid(f, _)) if f == field), "{q}: {e:?}");
        }
        assert!(matches!(ListQuery::parse(&pairs("sql=1")), Err(Refusal::Invalid("query", _))));
    }

    #[test]
    fn page_links_keep_the_filters() {
        let q = ListQuery::parse(&pairs("namespace=team-a&metadata=run%3D7&status=")).unwrap();
        let next = q.link(Some(&cursor_of(5, "trc_x")));
        assert_eq!(next, "namespace=team-a&metadata=run%3D7&cursor=5.trc_x");
        let again = ListQuery::parse(&pairs(&next)).unwrap().filter(&visible()).unwrap();
        assert_eq!(again.after, Some((5, "trc_x".into())));
    }
}
