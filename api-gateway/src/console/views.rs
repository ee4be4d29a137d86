//! The console's views of execution records, pure: a record is hostile
//! data (metadata, thread ids and output are the caller's; node and error
//! names come from other processes), so every value goes through
//! [`Html::text`], and links are made only from ids of the documented form.

use super::html::{table, Html};
use crate::records::{rfc3339, Row};

/// The audit log's table: one row per execution, newest first as given.
pub fn executions(rows: &[Row]) -> Html {
    let body = rows.iter().map(|r| {
        vec![
            execution_link(&r.trace_id),
            Html::text(&format!("{}/{}", r.namespace, r.key_name)),
            Html::text(&r.language),
            status(r),
            Html::text(&r.exit_code.map_or(String::new(), |c| c.to_string())),
            Html::text(&format!("{} ms", r.duration_ms)),
            Html::text(&rfc3339(r.created_ms)),
            Html::text(r.thread_id.as_deref().unwrap_or("")),
            metadata(r),
        ]
    });
    table(&["execution", "key", "language", "status", "exit", "duration", "created (UTC)", "thread", "metadata"], body)
}

/// One execution: what ran, how it ended, and its output.
pub fn execution(r: &Row) -> Html {
    let mut h = Html::default();
    let facts = [
        ("key", format!("{}/{}", r.namespace, r.key_name)),
        ("sandbox", r.sandbox.clone()),
        ("language", r.language.clone()),
        ("delivery", r.mode.clone()),
        ("node", r.node.clone()),
        ("created (UTC)", rfc3339(r.created_ms)),
        ("duration", format!("{} ms (CPU {} ms)", r.duration_ms, r.cpu_ms)),
        ("peak memory", r.peak_memory_bytes.map_or("not measured on this node".into(), |b| format!("{b} bytes"))),
        ("webhook", r.webhook_status.clone().map_or(String::new(), |s| format!("{s} after {} attempt(s)", r.webhook_attempts))),
    ];
    h.push_markup("<dl>");
    for (k, v) in facts {
        h.push_markup("<dt>");
        h.push_markup(k);
        h.push_markup("</dt><dd>");
        h.push_text(&v);
        h.push_markup("</dd>");
    }
    h.push_markup("<dt>status</dt><dd>");
    h.push(&status(r));
    h.push_markup("</dd><dt>metadata</dt><dd>");
    h.push(&metadata(r));
    h.push_markup("</dd></dl>");
    for (name, text, cut) in [("stdout", &r.stdout, r.stdout_truncated), ("stderr", &r.stderr, r.stderr_truncated)] {
        h.push_markup("<h2>");
        h.push_markup(name);
        h.push_markup("</h2>");
        match text {
            Some(t) => {
                h.push_markup("<pre>");
                h.push_text(t);
                h.push_markup("</pre>");
                if cut {
                    h.push_markup("<p>(cut at the key's output limit)</p>");
                }
            }
            None if r.output_expired => h.push_markup("<p>(removed by the output retention)</p>"),
            None => h.push_markup("<p>(none kept)</p>"),
        }
    }
    h
}

fn status(r: &Row) -> Html {
    let mut h = Html::text(&r.status);
    if let Some(e) = &r.error {
        h.push_text(&format!(" ({e})"));
    }
    h
}

fn metadata(r: &Row) -> Html {
    Html::text(&r.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", "))
}

/// A link to the execution's page when `id` has the documented form
/// (letters, digits, `_` and `-`); else the id as text.
fn execution_link(id: &str) -> Html {
    if !warren_core::ids::is_execution_id(id) {
        return Html::text(id);
    }
    let mut h = Html::default();
    h.push_markup("<a href=\"/executions/");
    h.push(&Html::attr(id));
    h.push_markup("\">");
    h.push_text(id);
    h.push_markup("</a>");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hostile() -> Row {
        Row {
            trace_id: "trc_abc".into(),
            namespace: "team-a".into(),
            key_name: "agent".into(),
            language: "python".into(),
            status: "succeeded".into(),
            exit_code: Some(0),
            thread_id: Some("<b>t</b>".into()),
            metadata: [("run".to_string(), "\"><script>alert(1)</script>".to_string())].into(),
            stdout: Some("<img src=x onerror=alert(2)>\n</pre><script>alert(3)</script>".into()),
            stderr: None,
            output_expired: true,
            error: Some("<i>node_lost</i>".into()),
            created_ms: 1_800_000_000_000,
            ..Row::default()
        }
    }

    #[test]
    fn hostile_records_render_inert_in_the_list_and_the_page() {
        for html in [executions(&[hostile()]), execution(&hostile())] {
            let s = html.as_str();
            for bad in ["<script", "<img", "<b>", "<i>", "\"><"] {
                assert!(!s.contains(bad), "{bad} in {s}");
            }
        }
        let page = execution(&hostile());
        assert!(page.as_str().contains("&lt;img src=x onerror=alert(2)&gt;\n&lt;/pre&gt;&lt;script&gt;alert(3)&lt;/script&gt;"));
        assert!(page.as_str().contains("(removed by the output retention)"));
    }

    #[test]
    fn only_well_formed_ids_become_links() {
        let list = executions(&[hostile()]);
        assert!(list.as_str().contains("<a href=\"/executions/trc_abc\">trc_abc</a>"));
        let odd = Row { trace_id: "javascript:alert(1)".into(), ..hostile() };
        let list = executions(&[odd]);
        assert!(!list.as_str().contains("<a ") && list.as_str().contains("javascript:alert(1)"), "shown, never linked");
        assert!(list.as_str().contains("2027-01-15T08:00:00.000Z"), "{}", list.as_str());
    }
}
