//! A batch of record writes as few statements as its kinds allow: the
//! batch's new records in multi-row INSERTs (their metadata in others),
//! its stream lines likewise, and its records' ends in one UPDATE … FROM a
//! VALUES list. Each statement is a round trip to the database (SQLite's is
//! to its worker thread and back, two thread wakeups; PostgreSQL's a
//! network one), and a call's insert and end were two of them: with the
//! rest of a batch's per-statement work, ~0.3 ms of the gateway's CPU per
//! call at saturation, 40% of all the gateway did for a call.
//!
//! Order: a write needs at most the insert of its record (in this batch or
//! an earlier one), so inserts go first, then metadata, lines, ends,
//! webhook states and activity entries. A record ends once (the UPDATE
//! skips ended records): of two ends of one record in a batch the first
//! counts, as it did when each was its own statement.

use std::collections::HashSet;

use sqlx::AssertSqlSafe;

use super::model::{Action, Finished, NewRecord};

/// A query on the record database, whichever it is.
pub(super) type Q<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

/// `peak_memory_bytes` of an execution whose node keeps no peak (cgroup v2
/// before Linux 5.19): the column stays NOT NULL for databases made before.
pub(super) const PEAK_UNKNOWN: i64 = -1;

/// Most rows of one multi-row statement: its binds stay under 999, the
/// oldest SQLite's bound on a statement's parameters.
const ROWS: usize = 32;

/// The statements that write `ops`, in the order above.
pub(super) fn statements(ops: &[Write]) -> Vec<Q<'static>> {
    let mut out = Vec::new();
    let inserts: Vec<&NewRecord> = ops.iter().filter_map(|w| if let Write::Insert(r) = w { Some(&**r) } else { None }).collect();
    out.extend(inserts.chunks(ROWS).map(insert_records));
    let metadata: Vec<[&str; 3]> = inserts.iter().flat_map(|r| r.metadata.iter().map(|(k, v)| [r.trace_id.as_str(), k, v])).collect();
    let text = |q: Q<'static>, row: &[&str; 3]| q.bind(row[0].to_string()).bind(row[1].to_string()).bind(row[2].to_string());
    out.extend(metadata.chunks(ROWS).map(|rows| insert_rows("warren_execution_metadata (trace_id, k, v)", rows, text)));
    let lines: Vec<(&str, i64, &str)> = ops.iter().filter_map(|w| if let Write::Line(id, seq, line) = w { Some((id.as_str(), *seq as i64, line.as_str())) } else { None }).collect();
    let line = |q: Q<'static>, (id, seq, line): &(&str, i64, &str)| q.bind(id.to_string()).bind(*seq).bind(line.to_string());
    out.extend(lines.chunks(ROWS).map(|rows| insert_rows("warren_execution_events (trace_id, seq, line)", rows, line)));
    let mut ended = HashSet::new();
    let ends: Vec<(&str, &Finished)> = ops.iter().filter_map(|w| if let Write::Finish(id, f) = w { Some((id.as_str(), &**f)) } else { None }).filter(|(id, _)| ended.insert(*id)).collect();
    out.extend(ends.chunks(ROWS).map(finish_records));
    for w in ops {
        match w {
            Write::Webhook(id, status, attempts) => out.push(
                sqlx::query("UPDATE warren_executions SET webhook_status = $2, webhook_attempts = $3 WHERE trace_id = $1")
                    .bind(id.clone())
                    .bind(status.to_string())
                    .bind(i64::from(*attempts)),
            ),
            Write::Action(a) => out.push(insert_action(a)),
            Write::Insert(_) | Write::Finish(..) | Write::Line(..) => {}
        }
    }
    out
}

/// `($1, $2, …), ($k+1, …)`: `rows` groups of `width` placeholders; each
/// group's `fixed` text (a literal column value) is put after its first
/// `at` placeholders.
fn placeholders(rows: usize, width: usize, fixed: Option<(usize, &str)>) -> String {
    let mut text = String::new();
    for row in 0..rows {
        text.push_str(if row == 0 { "(" } else { ", (" });
        for col in 0..width {
            if col > 0 {
                text.push_str(", ");
            }
            if let Some((_, literal)) = fixed.filter(|(at, _)| *at == col) {
                text.push_str(literal);
                text.push_str(", ");
            }
            text.push_str(&format!("${}", row * width + col + 1));
        }
        text.push(')');
    }
    text
}

/// One INSERT of `rows` into `table` (its columns named), three text or
/// integer values per row.
fn insert_rows<R>(table: &str, rows: &[R], bind: impl Fn(Q<'static>, &R) -> Q<'static>) -> Q<'static> {
    let q = sqlx::query(AssertSqlSafe(format!("INSERT INTO {table} VALUES {}", placeholders(rows.len(), 3, None))));
    rows.iter().fold(q, bind)
}

/// The new records' rows (status `running`).
fn insert_records(rows: &[&NewRecord]) -> Q<'static> {
    let sql = format!(
        "INSERT INTO warren_executions (trace_id, namespace, key_name, sandbox, language, thread_id, metadata, mode, status, \
         node, owner, timeout_secs, webhook_url, webhook_status, created_ms, otel_trace_id) VALUES {}",
        placeholders(rows.len(), 15, Some((8, "'running'")))
    );
    let mut q = sqlx::query(AssertSqlSafe(sql));
    for r in rows {
        let metadata = serde_json::to_string(&r.metadata).unwrap_or_else(|_| "{}".into());
        q = q
            .bind(r.trace_id.clone())
            .bind(r.namespace.clone())
            .bind(r.key_name.clone())
            .bind(r.sandbox.clone())
            .bind(r.language.to_string())
            .bind(r.thread_id.clone())
            .bind(metadata)
            .bind(r.mode.as_str().to_string())
            .bind(r.node.clone())
            .bind(r.owner.clone())
            .bind(i64::from(r.timeout_secs))
            .bind(r.webhook_url.clone())
            .bind(r.webhook_url.as_ref().map(|_| "pending".to_string()))
            .bind(r.created_ms)
            .bind(r.otel_trace_id.clone());
    }
    q
}

/// The ends of distinct records: each record not yet ended takes its
/// values; one whose cancel was asked for ends `cancelled` unless it
/// succeeded.
fn finish_records(rows: &[(&str, &Finished)]) -> Q<'static> {
    let sql = format!(
        "WITH v (trace_id, status, error, exit_code, duration_ms, cpu_ms, peak_memory_bytes, stdout, stderr, \
         stdout_truncated, stderr_truncated, completed_ms, blocked_egress) AS (VALUES {}) \
         UPDATE warren_executions SET \
         status = CASE WHEN warren_executions.cancel_requested = 1 AND v.status <> 'success' THEN 'cancelled' ELSE v.status END, \
         error = v.error, exit_code = v.exit_code, duration_ms = v.duration_ms, cpu_ms = v.cpu_ms, \
         peak_memory_bytes = v.peak_memory_bytes, stdout = v.stdout, stderr = v.stderr, stdout_truncated = v.stdout_truncated, \
         stderr_truncated = v.stderr_truncated, completed_ms = v.completed_ms, blocked_egress = v.blocked_egress \
         FROM v WHERE warren_executions.trace_id = v.trace_id AND warren_executions.completed_ms IS NULL",
        placeholders(rows.len(), 13, None)
    );
    let mut q = sqlx::query(AssertSqlSafe(sql));
    for (id, f) in rows {
        q = q
            .bind(id.to_string())
            .bind(f.status.to_string())
            .bind(f.error.clone())
            .bind(f.exit_code.map(i64::from))
            .bind(f.duration_ms as i64)
            .bind(f.cpu_ms as i64)
            .bind(f.peak_memory_bytes.map_or(PEAK_UNKNOWN, |b| b as i64))
            .bind(f.stdout.clone())
            .bind(f.stderr.clone())
            .bind(i64::from(f.stdout_truncated))
            .bind(i64::from(f.stderr_truncated))
            .bind(f.completed_ms)
            .bind(f.blocked_egress.clone());
    }
    q
}

/// One write the recorder batches.
#[derive(Debug)]
pub(super) enum Write {
    Insert(Box<NewRecord>),
    Finish(String, Box<Finished>),
    Line(String, u64, String),
    Webhook(String, &'static str, u32),
    Action(Box<Action>),
}

impl Write {
    /// Roughly what the write holds in memory (its text), for the spill bound.
    pub(super) fn bytes(&self) -> usize {
        let s = |o: &Option<String>| o.as_ref().map_or(0, String::len);
        match self {
            Write::Insert(_) | Write::Webhook(..) => 1024,
            Write::Action(a) => 64 + a.user.len() + a.action.len() + a.namespace.len() + a.object.len(),
            Write::Finish(id, f) => 1024 + id.len() + s(&f.stdout) + s(&f.stderr) + s(&f.error) + s(&f.blocked_egress),
            Write::Line(id, _, line) => 64 + id.len() + line.len(),
        }
    }
}

/// The insert of one activity-log entry.
pub(super) fn insert_action(a: &Action) -> Q<'static> {
    sqlx::query("INSERT INTO warren_console_actions (at_ms, user_name, action, namespace, object) VALUES ($1, $2, $3, $4, $5)")
        .bind(a.at_ms)
        .bind(a.user.clone())
        .bind(a.action.clone())
        .bind(a.namespace.clone())
        .bind(a.object.clone())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::model::{Filter, Finished, Mode, NewRecord};
    use super::Write;
    use crate::records::Store;
    use super::placeholders;

    fn record(id: &str, metadata: &[(&str, &str)]) -> Write {
        Write::Insert(Box::new(NewRecord {
            trace_id: id.into(),
            namespace: "ns".into(),
            key_name: "k".into(),
            sandbox: "s".into(),
            language: "bash",
            metadata: metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
            mode: Mode::Inline,
            node: "n".into(),
            owner: "gw".into(),
            timeout_secs: 5,
            created_ms: 1,
            thread_id: None,
            otel_trace_id: None,
            webhook_url: None,
        }))
    }

    fn end(id: &str, status: &'static str, stdout: &str) -> Write {
        Write::Finish(id.into(), Box::new(Finished { status, exit_code: Some(0), stdout: Some(stdout.into()), completed_ms: 2, ..Default::default() }))
    }

    /// One batch of many records' inserts, metadata, lines and ends, ends
    /// of records inserted in an earlier batch, a second end of one record
    /// and the end of a record whose cancel was asked: each row as the
    /// statements one by one wrote it.
    #[tokio::test]
    async fn a_mixed_batch_writes_what_its_writes_one_by_one_did() {
        let t = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}", t.path().join("r.db").display())).await.unwrap();
        store.apply(&[record("trc_early", &[]), record("trc_cancel", &[])]).await.unwrap();
        store.request_cancel("trc_cancel").await.unwrap();
        let mut ops: Vec<Write> = (0..70).map(|i| record(&format!("trc_{i}"), &[("team", "a"), ("run", &i.to_string())])).collect();
        ops.extend((0..70).map(|i| Write::Line(format!("trc_{i}"), 1, format!("line {i}"))));
        ops.extend((0..70).map(|i| end(&format!("trc_{i}"), "success", &format!("out {i}"))));
        ops.push(end("trc_3", "failed", "a second end"));
        ops.push(end("trc_early", "success", "early"));
        ops.push(end("trc_cancel", "failed", ""));
        store.apply(&ops).await.unwrap();
        for i in [0, 3, 69] {
            let row = store.get(&format!("trc_{i}")).await.unwrap().unwrap();
            assert_eq!((row.status.as_str(), row.stdout.as_deref(), row.metadata["run"].as_str()), ("success", Some(format!("out {i}").as_str()), i.to_string().as_str()), "the first end counts");
            assert_eq!(store.lines_after(&row.trace_id, 0, 10).await.unwrap(), vec![(1, format!("line {i}"))]);
        }
        assert_eq!(store.get("trc_early").await.unwrap().unwrap().status, "success");
        assert_eq!(store.get("trc_cancel").await.unwrap().unwrap().status, "cancelled");
        let tagged = store.query(&Filter { namespaces: vec!["ns".into()], metadata: vec![("team".into(), "a".into()), ("run".into(), "41".into())], limit: 10, ..Default::default() }).await.unwrap();
        assert_eq!(tagged.iter().map(|r| r.trace_id.as_str()).collect::<Vec<_>>(), vec!["trc_41"], "each record's metadata rows, queryable");
    }

    #[test]
    fn placeholders_number_every_row_and_put_the_literal_in_place() {
        assert_eq!(placeholders(2, 3, None), "($1, $2, $3), ($4, $5, $6)");
        assert_eq!(placeholders(2, 2, Some((1, "'running'"))), "($1, 'running', $2), ($3, 'running', $4)");
    }
}
