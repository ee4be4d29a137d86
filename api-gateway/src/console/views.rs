//! The console's views of execution records, pure: a record is hostile
//! data (metadata, thread ids and output are the caller's; node and error
//! names come from other processes), so every value goes through
//! [`Html::text`], and links are made only from ids of the documented form.

use super::html::{table, Html};
use super::query::{cursor_of, ListQuery, PAGE};
use crate::records::{rfc3339, Row, Stats, Status};
use crate::result::BlockedEgress;
use warren_config::EffectiveKey;

/// What the overview shows of one node-agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// Its name (its address until it answered once).
    pub name: String,
    /// Answering its health checks.
    pub ready: bool,
    /// The agent's version.
    pub version: String,
    /// Executions running, of how many it takes.
    pub running: u32,
    /// Concurrent executions it takes.
    pub capacity: u32,
    /// cgroup version.
    pub cgroup: u32,
    /// OCI images warm on it.
    pub images: Vec<String>,
    /// Sandboxes in its warm pool.
    pub warm: u32,
    /// Memory they hold, bytes.
    pub warm_memory: u64,
}

/// What this gateway replica holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GatewayLoad {
    /// Requests waiting, in order, for a node slot (the queue depth).
    pub queued: usize,
    /// Executions it admitted and runs.
    pub in_flight: i64,
}

/// The overview: the nodes' capacity, this gateway's queue, and the last
/// hour and day from the records.
pub fn overview(nodes: &[NodeFacts], load: GatewayLoad, hour: &Stats, day: &Stats, now_ms: i64) -> Html {
    let mut h = Html::default();
    h.push_markup("<div class=\"cards\">");
    let ready = nodes.iter().filter(|n| n.ready).count();
    card(&mut h, "nodes ready", &format!("{ready} of {}", nodes.len()));
    // Slots of the ready nodes only: a silent node's last figures are stale.
    let (running, capacity) = nodes.iter().filter(|n| n.ready).fold((0u64, 0u64), |(r, c), n| (r + u64::from(n.running), c + u64::from(n.capacity)));
    card(&mut h, "node slots in use", &format!("{running} of {capacity}"));
    card(&mut h, "waiting for a node slot (this gateway)", &load.queued.to_string());
    card(&mut h, "executions in flight (this gateway)", &load.in_flight.to_string());
    for (label, s) in [("last hour", hour), ("last day", day)] {
        card(&mut h, &format!("executions, {label}"), &s.total.to_string());
        card(&mut h, &format!("p50 / p99, {label}"), &format!("{} / {}", ms(s.p50_ms), ms(s.p99_ms)));
    }
    h.push_markup("</div><h2>Executions per minute, last hour</h2>");
    h.push(&per_minute_chart(hour, now_ms));
    h.push_markup("<h2>Outcomes, last day</h2>");
    h.push(&table(&["outcome", "executions"], day.outcomes().into_iter().map(|(o, n)| vec![Html::text(o), Html::text(&n.to_string())])));
    h.push_markup("<h2>Nodes</h2>");
    let rows = nodes.iter().map(|n| {
        vec![
            Html::text(&n.name),
            Html::text(if n.ready { "ready" } else { "not answering" }),
            Html::text(&n.version),
            Html::text(&format!("{} of {}", n.running, n.capacity)),
            Html::text(&format!("{} ({} MiB)", n.warm, n.warm_memory >> 20)),
            Html::text(&if n.cgroup == 0 { String::new() } else { format!("v{}", n.cgroup) }),
            Html::text(&n.images.join(", ")),
        ]
    });
    h.push(&table(&["node", "state", "agent version", "running of max", "warm sandboxes", "cgroup", "images warm"], rows));
    h
}

fn card(h: &mut Html, label: &str, value: &str) {
    h.push_markup("<div class=\"card\"><strong>");
    h.push_text(value);
    h.push_markup("</strong>");
    h.push_text(label);
    h.push_markup("</div>");
}

fn ms(v: Option<u64>) -> String {
    v.map_or("–".into(), |v| format!("{v} ms"))
}

/// The last hour's executions per minute as an SVG bar chart, drawn here
/// (no script, no library): 60 bars, scaled to the busiest minute.
pub fn per_minute_chart(s: &Stats, now_ms: i64) -> Html {
    let last = now_ms.div_euclid(60_000) * 60_000;
    let counts: Vec<u64> = (0..60).map(|i| s.per_minute.get(&(last - (59 - i) * 60_000)).copied().unwrap_or(0)).collect();
    let max = counts.iter().copied().max().unwrap_or(0).max(1);
    let mut h = Html::default();
    h.push_markup("<svg class=\"chart\" viewBox=\"0 0 600 100\" preserveAspectRatio=\"none\" role=\"img\" aria-label=\"executions per minute\">");
    for (i, n) in counts.iter().enumerate().filter(|(_, n)| **n > 0) {
        let height = (*n as f64 / max as f64 * 100.0).max(1.0);
        h.push_markup("<rect x=\"");
        h.push_text(&(i * 10 + 1).to_string());
        h.push_markup("\" y=\"");
        h.push_text(&format!("{:.1}", 100.0 - height));
        h.push_markup("\" width=\"8\" height=\"");
        h.push_text(&format!("{height:.1}"));
        h.push_markup("\"><title>");
        h.push_text(&format!("{n} at minute {}", i as i64 - 59));
        h.push_markup("</title></rect>");
    }
    h.push_markup("</svg>");
    h
}

/// The audit log's filter form (GET: a filtered view is a link), filled
/// with `q`, offering the `namespaces` the user may see.
pub fn filter_form(q: &ListQuery, namespaces: &[String]) -> Html {
    let mut h = Html::default();
    h.push_markup("<form class=\"filters\" method=\"get\" action=\"/executions\"><label>namespace<select name=\"namespace\"><option value=\"\">all</option>");
    for ns in namespaces {
        option(&mut h, ns, ns, q.namespace == *ns);
    }
    h.push_markup("</select></label><label>status<select name=\"status\"><option value=\"\">any</option>");
    for st in std::iter::once(Status::RUNNING).chain(Status::TERMINAL) {
        option(&mut h, st, st, q.status == st);
    }
    h.push_markup("</select></label><label>language<select name=\"language\"><option value=\"\">any</option>");
    for l in ["python", "node", "bash"] {
        option(&mut h, l, l, q.language == l);
    }
    h.push_markup("</select></label>");
    for (name, label, value, kind) in [
        ("key", "key", &q.key, "text"),
        ("thread_id", "thread", &q.thread_id, "text"),
        ("metadata", "metadata (k=v …)", &q.metadata, "text"),
        ("since", "since (UTC)", &q.since, "datetime-local"),
        ("until", "until (UTC)", &q.until, "datetime-local"),
    ] {
        h.push_markup("<label>");
        h.push_text(label);
        h.push_markup("<input name=\"");
        h.push_text(name);
        h.push_markup("\" type=\"");
        h.push_text(kind);
        h.push_markup("\" value=\"");
        h.push(&Html::attr(value));
        h.push_markup("\"></label>");
    }
    h.push_markup("<button type=\"submit\">Filter</button></form>");
    h
}

fn option(h: &mut Html, value: &str, label: &str, selected: bool) {
    h.push_markup("<option value=\"");
    h.push(&Html::attr(value));
    h.push_markup(if selected { "\" selected>" } else { "\">" });
    h.push_text(label);
    h.push_markup("</option>");
}

/// The link to the next page, when `rows` filled this one.
pub fn pager(q: &ListQuery, rows: &[Row]) -> Html {
    let mut h = Html::default();
    if let (true, Some(last)) = (rows.len() == PAGE as usize, rows.last()) {
        h.push_markup("<p class=\"pager\"><a rel=\"next\" href=\"/executions?");
        h.push(&Html::attr(&q.link(Some(&cursor_of(last.created_ms, &last.trace_id)))));
        h.push_markup("\">Older executions →</a></p>");
    }
    h
}

/// The API keys: each one's effective configuration, never its secret
/// (a key shows as its prefix); with `true`, a form to disable or enable
/// it (carrying the session's `csrf` token).
pub fn keys(keys: &[(&EffectiveKey, bool)], csrf: &str) -> Html {
    let rows = keys.iter().map(|(k, writable)| {
        vec![
            Html::text(&k.namespace),
            Html::text(&k.name),
            Html::text(&k.display_prefix),
            Html::text(if k.disabled { "disabled" } else { "enabled" }),
            Html::text(&k.sandbox),
            Html::text(&format!("{} at once, {} s max", k.max_concurrency, k.max_timeout_seconds)),
            Html::text(if k.audit_namespace { "namespace" } else { "own" }),
            if *writable { key_switch(k, csrf) } else { Html::default() },
        ]
    });
    table(&["namespace", "name", "key", "state", "sandbox", "limits", "audit scope", ""], rows)
}

/// The form that flips a key: names come from the cluster (DNS labels),
/// still escaped as attribute text.
fn key_switch(k: &EffectiveKey, csrf: &str) -> Html {
    let mut h = Html::default();
    h.push_markup("<form method=\"post\" action=\"/keys/");
    h.push(&Html::attr(&k.namespace));
    h.push_markup("/");
    h.push(&Html::attr(&k.name));
    h.push_markup(if k.disabled { "/enable\">" } else { "/disable\">" });
    h.push_markup("<input type=\"hidden\" name=\"csrf\" value=\"");
    h.push(&Html::attr(csrf));
    h.push_markup(if k.disabled { "\"><button type=\"submit\">Enable</button></form>" } else { "\"><button type=\"submit\">Disable</button></form>" });
    h
}

/// A key's mounts; a managed volume links to its files.
fn storage(k: &EffectiveKey) -> Html {
    let mut h = Html::default();
    for (i, m) in k.storage.iter().enumerate() {
        if i > 0 {
            h.push_markup(", ");
        }
        let text = format!("/data/{}{}", m.name, if m.read_only { " (ro)" } else { "" });
        match m.prefix.split('/').nth(2).filter(|_| m.provider == warren_core::kinds::Provider::Volume) {
            Some(volume) => {
                h.push_markup("<a href=\"");
                h.push(&Html::attr(&format!("/files/{}/{}/volume/{volume}", k.namespace, k.name)));
                h.push_markup("\">");
                h.push_text(&text);
                h.push_markup("</a>");
            }
            None => h.push_text(&text),
        }
    }
    h
}

/// The console's audit of its own writes, newest first.
pub fn actions(actions: &[crate::records::Action]) -> Html {
    let rows = actions.iter().map(|a| vec![Html::text(&rfc3339(a.at_ms)), Html::text(&a.user), Html::text(&a.action), Html::text(&format!("{}/{}", a.namespace, a.object))]);
    table(&["at (UTC)", "user", "action", "object"], rows)
}

/// The Sandboxes as the keys narrow them: one row per key, since a key may
/// narrow its Sandbox (network, limits, env).
pub fn sandboxes(keys: &[&EffectiveKey]) -> Html {
    let rows = keys.iter().map(|k| {
        let l = &k.limits;
        vec![
            Html::text(&format!("{}/{}", k.namespace, k.sandbox)),
            Html::text(&k.name),
            Html::text(&k.image_digest.as_ref().map_or(k.image.clone(), |d| format!("{} ({d})", k.image))),
            Html::text(&k.languages.iter().map(|l| l.as_str()).collect::<Vec<_>>().join(", ")),
            Html::text(&format!("{} mCPU, {} MiB, {} pids", l.cpu_millis, l.memory_bytes >> 20, l.pids)),
            Html::text(&format!("{:?}", k.network).to_lowercase()),
            storage(k),
            Html::text(&k.connectors.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")),
            Html::text(&k.env.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")),
        ]
    });
    table(&["sandbox", "via key", "image", "languages", "limits", "network", "storage", "connectors", "env (names)"], rows)
}

/// The live sandboxes (E2B's, Sandbase's, the console's terminals), newest
/// first, with their lifecycle status (Banata's names) and why Warren
/// paused one or it failed.
pub fn live_sandboxes(rows: &[(&crate::records::E2bSandbox, &str)]) -> Html {
    let mut h = Html::default();
    h.push_markup("<h2>Live sandboxes</h2>");
    let body = rows.iter().map(|(s, status)| {
        vec![
            Html::text(&s.id),
            Html::text(&format!("{}/{}", s.namespace, s.key_name)),
            Html::text(status),
            Html::text(&s.reason),
            Html::text(s.node.as_deref().unwrap_or("")),
            Html::text(&rfc3339(s.started_ms)),
            Html::text(&rfc3339(s.end_ms)),
        ]
    });
    h.push(&table(&["sandbox", "key", "status", "why", "node", "created (UTC)", "ends (UTC)"], body));
    h
}

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
        ("duration", if r.is_terminal() { format!("{} ms (CPU {} ms)", r.duration_ms, r.cpu_ms) } else { "(running)".into() }),
        ("peak memory", if r.is_terminal() { r.peak_memory_bytes.map_or("not measured on this node".into(), |b| format!("{b} bytes")) } else { "(running)".into() }),
        ("webhook", r.webhook_status.clone().map_or(String::new(), |s| format!("{s} after {} attempt(s)", r.webhook_attempts))),
        ("trace (W3C)", r.otel_trace_id.clone().unwrap_or_default()),
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
    h.push(&blocked_egress(r));
    // A running execution's output is shown from its stream (see [`live_output`]).
    let ended = if r.is_terminal() { [("stdout", &r.stdout, r.stdout_truncated), ("stderr", &r.stderr, r.stderr_truncated)].to_vec() } else { Vec::new() };
    for (name, text, cut) in ended {
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

/// What the Sandbox's network refused this execution, when it refused
/// anything: the addresses and names are the program's choice, so text.
fn blocked_egress(r: &Row) -> Html {
    let blocked = BlockedEgress::from_record(r.blocked_egress.as_deref());
    if blocked.is_empty() {
        return Html::default();
    }
    let rows = blocked.iter().map(|b| {
        vec![
            Html::text(b.host.as_deref().unwrap_or("")),
            Html::text(b.ip.as_deref().unwrap_or("")),
            Html::text(&b.port.to_string()),
            Html::text(&b.protocol),
            Html::text(&b.count.to_string()),
        ]
    });
    let mut h = Html::default();
    h.push_markup("<h2>Refused network destinations</h2>");
    h.push(&table(&["host", "address", "port", "protocol", "refused"], rows));
    h
}

/// The link to a thread's files (its id checked by the caller).
pub fn thread_link(namespace: &str, key: &str, thread: &str) -> Html {
    let mut h = Html::default();
    h.push_markup("<p><a href=\"");
    h.push(&Html::attr(&format!("/files/{namespace}/{key}/thread/{thread}")));
    h.push_markup("\">Browse the thread's files</a></p>");
    h
}

/// The output a running execution has printed so far, from its recorded
/// stream lines (each the NDJSON event the API would send); the console's
/// script follows `id`'s events after the last of them.
pub fn live_output(id: &str, lines: &[(u64, String)]) -> Html {
    let (mut out, mut err) = (String::new(), String::new());
    for (_, line) in lines {
        let Ok(ev) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if ev["type"] != "output" {
            continue;
        }
        let data = ev["data"].as_str().unwrap_or_default();
        if ev["stream"] == "stderr" {
            err.push_str(data)
        } else {
            out.push_str(data)
        }
    }
    let after = lines.last().map_or(0, |(seq, _)| *seq);
    let mut h = Html::default();
    h.push_markup("<h2>Output so far</h2><pre class=\"live\" data-events=\"");
    h.push(&Html::attr(&format!("/executions/{id}/events?after={after}")));
    h.push_markup("\">");
    h.push_text(&out);
    h.push_markup("</pre><pre class=\"live-err error\">");
    h.push_text(&err);
    h.push_markup("</pre>");
    h
}

/// The button that cancels a running execution (the id is checked
/// before this page is drawn; still escaped).
pub fn cancel_form(id: &str, csrf: &str) -> Html {
    let mut h = Html::default();
    h.push_markup("<form method=\"post\" action=\"/executions/");
    h.push(&Html::attr(id));
    h.push_markup("/cancel\"><input type=\"hidden\" name=\"csrf\" value=\"");
    h.push(&Html::attr(csrf));
    h.push_markup("\"><button type=\"submit\">Cancel this execution</button></form>");
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
            status: "success".into(),
            exit_code: Some(0),
            thread_id: Some("<b>t</b>".into()),
            metadata: [("run".to_string(), "\"><script>alert(1)</script>".to_string())].into(),
            stdout: Some("<img src=x onerror=alert(2)>\n</pre><script>alert(3)</script>".into()),
            stderr: None,
            output_expired: true,
            error: Some("<i>node_lost</i>".into()),
            created_ms: 1_800_000_000_000,
            blocked_egress: Some(r#"[{"host":"<svg onload=alert(4)>.test","ip":"10.200.0.10","port":80,"protocol":"tcp","count":2}]"#.into()),
            ..Row::default()
        }
    }

    #[test]
    fn hostile_records_render_inert_in_the_list_and_the_page() {
        for html in [executions(&[hostile()]), execution(&hostile())] {
            let s = html.as_str();
            for bad in ["<script", "<img", "<b>", "<i>", "\"><", "<svg"] {
                assert!(!s.contains(bad), "{bad} in {s}");
            }
        }
        let page = execution(&hostile());
        assert!(page.as_str().contains("&lt;img src=x onerror=alert(2)&gt;\n&lt;/pre&gt;&lt;script&gt;alert(3)&lt;/script&gt;"));
        assert!(page.as_str().contains("(removed by the output retention)"));
        assert!(page.as_str().contains("<h2>Refused network destinations</h2>") && page.as_str().contains("&lt;svg onload=alert(4)&gt;.test"), "{}", page.as_str());
        let open = Row { blocked_egress: None, ..hostile() };
        assert!(!execution(&open).as_str().contains("Refused"), "no table when nothing was refused");
    }

    #[test]
    fn the_overview_shows_each_nodes_slots_and_the_queue() {
        let node = |name: &str, ready: bool, running: u32, capacity: u32| NodeFacts { name: name.into(), ready, running, capacity, ..NodeFacts::default() };
        let nodes = [node("node-a", true, 3, 32), node("node-b", true, 1, 8), node("<b>gone</b>", false, 7, 16)];
        let html = overview(&nodes, GatewayLoad { queued: 5, in_flight: 4 }, &Stats::default(), &Stats::default(), 1_800_000_000_000);
        let s = html.as_str();
        for want in ["<td>3 of 32</td>", "<td>1 of 8</td>", "<td>7 of 16</td>", "<strong>4 of 40</strong>node slots in use", "<strong>5</strong>waiting for a node slot", "<strong>4</strong>executions in flight", "running of max"] {
            assert!(s.contains(want), "{want} not in {s}");
        }
        assert!(!s.contains("<b>gone") && s.contains("&lt;b&gt;gone&lt;/b&gt;"), "a node's name is text: {s}");
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
