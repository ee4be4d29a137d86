//! The record database: one schema and one set of statements for SQLite
//! (embedded, zero setup) and PostgreSQL (shared by every replica), through
//! sqlx's `Any` driver. Only types both speak: TEXT and BIGINT (booleans
//! are 0/1), times as Unix milliseconds.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{Any, AnyPool, AssertSqlSafe, Row as _};

use super::batch::{insert_action, Write, Q};
use super::model::{Action, Filter, Row, Stats};

/// A failure of the record database (never shown to callers as such).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL names no supported database.
    #[error("the records file cannot be made private to the gateway: {0}")]
    Private(std::io::Error),
    #[error("--records must be a sqlite:// or postgres:// URL")]
    Scheme,
    /// The database refused or failed.
    #[error("record database: {0}")]
    Db(#[from] sqlx::Error),
}

impl StoreError {
    /// A moment's contention rather than a failure: no connection came free
    /// within the pool's wait (requests wait for one in order), or the
    /// database's lock stayed held past its busy timeout. Callers answer
    /// 429 with a retry, not 503.
    pub fn is_busy(&self) -> bool {
        match self {
            StoreError::Db(sqlx::Error::PoolTimedOut) => true,
            // SQLite BUSY and LOCKED (and their extended codes); PostgreSQL
            // too_many_connections and lock_not_available.
            StoreError::Db(sqlx::Error::Database(e)) => matches!(e.code().as_deref(), Some("5" | "6" | "261" | "262" | "517" | "53300" | "55P03")),
            _ => false,
        }
    }
}

/// How long a request waits for a database connection unless told otherwise.
const ACQUIRE_WAIT: Duration = Duration::from_secs(5);

/// Which database the URL named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sqlite,
    Postgres,
}

/// The record database.
#[derive(Debug, Clone)]
pub struct Store {
    pub(super) pool: AnyPool,
    /// Where the record writer commits its batches. SQLite: one connection
    /// of its own, whose page cache stays valid from batch to batch (on the
    /// shared pool each batch landed on another connection, whose cache the
    /// batches before had made stale: pages re-read for every record).
    /// PostgreSQL: the pool.
    writer: AnyPool,
    kind: Kind,
}

/// The schema, in order; a database at version N runs steps N+1…
const MIGRATIONS: &[&[&str]] = &[&[
    "CREATE TABLE IF NOT EXISTS warren_executions (
        trace_id TEXT PRIMARY KEY,
        namespace TEXT NOT NULL,
        key_name TEXT NOT NULL,
        sandbox TEXT NOT NULL,
        language TEXT NOT NULL,
        thread_id TEXT,
        metadata TEXT NOT NULL,
        mode TEXT NOT NULL,
        status TEXT NOT NULL,
        error TEXT,
        exit_code BIGINT,
        duration_ms BIGINT NOT NULL DEFAULT 0,
        cpu_ms BIGINT NOT NULL DEFAULT 0,
        peak_memory_bytes BIGINT NOT NULL DEFAULT 0,
        stdout TEXT,
        stderr TEXT,
        stdout_truncated BIGINT NOT NULL DEFAULT 0,
        stderr_truncated BIGINT NOT NULL DEFAULT 0,
        output_expired BIGINT NOT NULL DEFAULT 0,
        node TEXT NOT NULL,
        owner TEXT NOT NULL,
        timeout_secs BIGINT NOT NULL,
        cancel_requested BIGINT NOT NULL DEFAULT 0,
        webhook_url TEXT,
        webhook_status TEXT,
        webhook_attempts BIGINT NOT NULL DEFAULT 0,
        created_ms BIGINT NOT NULL,
        completed_ms BIGINT
    )",
    "CREATE INDEX IF NOT EXISTS warren_executions_by_key ON warren_executions (namespace, key_name, created_ms)",
    "CREATE INDEX IF NOT EXISTS warren_executions_by_namespace ON warren_executions (namespace, created_ms)",
    "CREATE INDEX IF NOT EXISTS warren_executions_open ON warren_executions (completed_ms, owner)",
    "CREATE TABLE IF NOT EXISTS warren_execution_metadata (
        trace_id TEXT NOT NULL,
        k TEXT NOT NULL,
        v TEXT NOT NULL,
        PRIMARY KEY (trace_id, k)
    )",
    "CREATE INDEX IF NOT EXISTS warren_execution_metadata_kv ON warren_execution_metadata (k, v)",
    "CREATE TABLE IF NOT EXISTS warren_execution_events (
        trace_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        line TEXT NOT NULL,
        PRIMARY KEY (trace_id, seq)
    )",
    "CREATE TABLE IF NOT EXISTS warren_settings (
        k TEXT PRIMARY KEY,
        v TEXT NOT NULL
    )",
    "CREATE TABLE IF NOT EXISTS warren_gateways (
        id TEXT PRIMARY KEY,
        heartbeat_ms BIGINT NOT NULL
    )",
], &[
    // What console users changed (issue #29): who, what, where, when.
    "CREATE TABLE IF NOT EXISTS warren_console_actions (
        at_ms BIGINT NOT NULL,
        user_name TEXT NOT NULL,
        action TEXT NOT NULL,
        namespace TEXT NOT NULL,
        object TEXT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS warren_console_actions_by_namespace ON warren_console_actions (namespace, at_ms)",
], &[
    // The destinations the sandbox's network refused, as the result's JSON
    // array (bounded by the agent's report), for later readers.
    "ALTER TABLE warren_executions ADD COLUMN blocked_egress TEXT",
], &[
    // The E2B API's sandboxes (issue #31): each names a thread of one key.
    "CREATE TABLE IF NOT EXISTS warren_e2b_sandboxes (
        id TEXT PRIMARY KEY,
        namespace TEXT NOT NULL,
        key_name TEXT NOT NULL,
        template TEXT NOT NULL,
        metadata TEXT NOT NULL,
        env TEXT NOT NULL,
        state TEXT NOT NULL,
        started_ms BIGINT NOT NULL,
        end_ms BIGINT NOT NULL,
        auto_pause BIGINT NOT NULL DEFAULT 0
    )",
    "CREATE INDEX IF NOT EXISTS warren_e2b_sandboxes_by_key ON warren_e2b_sandboxes (namespace, key_name, started_ms)",
], &[
    // An E2B sandbox's metadata as rows, so a listing filters and pages in
    // the database (issue #43); rows of sandboxes made before are added by
    // the E2B sweep as it seals their environment.
    "CREATE TABLE IF NOT EXISTS warren_e2b_sandbox_metadata (
        id TEXT NOT NULL,
        k TEXT NOT NULL,
        v TEXT NOT NULL,
        PRIMARY KEY (id, k)
    )",
    "CREATE INDEX IF NOT EXISTS warren_e2b_sandbox_metadata_kv ON warren_e2b_sandbox_metadata (k, v)",
], &[
    // The node holding an E2B sandbox while it is live (issue #46).
    "ALTER TABLE warren_e2b_sandboxes ADD COLUMN node TEXT",
], &[
    // A live sandbox's lifecycle beyond running/paused: `pausing`, `failed`
    // and why, and when it last went live (issue #46).
    "ALTER TABLE warren_e2b_sandboxes ADD COLUMN status TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE warren_e2b_sandboxes ADD COLUMN reason TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE warren_e2b_sandboxes ADD COLUMN live_ms BIGINT NOT NULL DEFAULT 0",
    // Its ports answer without a token (its key allows it, and create asked).
    "ALTER TABLE warren_e2b_sandboxes ADD COLUMN public_ports BIGINT NOT NULL DEFAULT 0",
], &[
    // Idempotency keys: the first call's request hash, id and answer (issue #47).
    "CREATE TABLE IF NOT EXISTS warren_idempotency (
        namespace TEXT NOT NULL,
        key_name TEXT NOT NULL,
        scope TEXT NOT NULL,
        idem_key TEXT NOT NULL,
        request_hash TEXT NOT NULL,
        id TEXT NOT NULL,
        created_ms BIGINT NOT NULL,
        answer TEXT,
        PRIMARY KEY (namespace, key_name, scope, idem_key)
    )",
    "CREATE INDEX IF NOT EXISTS warren_idempotency_by_age ON warren_idempotency (created_ms)",
], &[
    // The W3C trace an execution continued (issue #47).
    "ALTER TABLE warren_executions ADD COLUMN otel_trace_id TEXT",
    // Partial: a call without a trace writes no index entry.
    "CREATE INDEX IF NOT EXISTS warren_executions_by_otel_trace ON warren_executions (otel_trace_id) WHERE otel_trace_id IS NOT NULL",
]];

/// Columns read back into a [`Row`].
const COLUMNS: &str = "trace_id, namespace, key_name, sandbox, language, thread_id, metadata, mode, status, error, exit_code, \
    duration_ms, cpu_ms, peak_memory_bytes, stdout, stderr, stdout_truncated, stderr_truncated, output_expired, node, owner, \
    timeout_secs, cancel_requested, webhook_url, webhook_status, webhook_attempts, created_ms, completed_ms, blocked_egress, otel_trace_id";

/// The same columns without the output (list views).
const SUMMARY_COLUMNS: &str = "trace_id, namespace, key_name, sandbox, language, thread_id, metadata, mode, status, error, exit_code, \
    duration_ms, cpu_ms, peak_memory_bytes, NULL AS stdout, NULL AS stderr, stdout_truncated, stderr_truncated, output_expired, node, owner, \
    timeout_secs, cancel_requested, webhook_url, webhook_status, webhook_attempts, created_ms, completed_ms, NULL AS blocked_egress, otel_trace_id";


/// Makes the SQLite file (every execution's output, the file-URL signing
/// key) readable by the gateway's user only: a directory it creates is
/// 0700, the file 0600 (tightened if it exists; SQLite gives its -wal and
/// -shm files the same mode).
fn private_file(file: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    if file.as_os_str().is_empty() || file.as_os_str() == ":memory:" {
        return Ok(());
    }
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    let f = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(file)?;
    if f.metadata()?.permissions().mode() & 0o077 != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

/// Every SQLite connection's settings. WAL: readers never wait for the
/// writer; several gateways may share the file. cache_size: each
/// connection's page cache held at 512 KiB (SQLite's default is 2 MiB), so
/// the gateway's memory stops growing with the database early: in the soak
/// benchmark the connections' caches filling as records accrued were the
/// gateway's RSS growth (+6 MiB over 10 minutes, in steps; bounded,
/// +0.2 MiB). The kernel's page cache keeps the file.
fn sqlite_settings(opts: AnyPoolOptions) -> AnyPoolOptions {
    opts.after_connect(|conn, _| {
        Box::pin(async move {
            sqlx::raw_sql("PRAGMA journal_mode=WAL; PRAGMA busy_timeout=5000; PRAGMA synchronous=NORMAL; PRAGMA cache_size=-512").execute(conn).await?;
            Ok(())
        })
    })
}

impl Store {
    /// Connects to `url` (`sqlite:///path/records.db` — created when
    /// missing — or `postgres://…`) and brings the schema up to date.
    pub async fn open(url: &str) -> Result<Store, StoreError> {
        Store::open_waiting(url, ACQUIRE_WAIT).await
    }

    /// [`Store::open`] whose calls wait up to `acquire` for a connection,
    /// in order (sqlx's pool is fair), before failing as busy.
    pub async fn open_waiting(url: &str, acquire: Duration) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let (kind, url) = if let Some(path) = url.strip_prefix("sqlite://") {
            let file = path.split('?').next().unwrap_or_default();
            private_file(std::path::Path::new(file)).map_err(StoreError::Private)?;
            let create = if url.contains("mode=") { String::new() } else if url.contains('?') { "&mode=rwc".into() } else { "?mode=rwc".into() };
            (Kind::Sqlite, format!("{url}{create}"))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (Kind::Postgres, url.to_string())
        } else {
            return Err(StoreError::Scheme);
        };
        let pool_options = |connections: u32| {
            let opts = AnyPoolOptions::new().acquire_timeout(acquire.max(Duration::from_millis(100))).max_connections(connections);
            match kind {
                Kind::Sqlite => sqlite_settings(opts),
                Kind::Postgres => opts,
            }
        };
        let pool = pool_options(if kind == Kind::Sqlite { 4 } else { 10 }).connect(&url).await?;
        let writer = match kind {
            Kind::Sqlite => pool_options(1).connect(&url).await?,
            Kind::Postgres => pool.clone(),
        };
        let store = Store { pool, writer, kind };
        store.migrate().await?;
        Ok(store)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        if self.kind == Kind::Postgres {
            // Replicas starting together migrate one at a time.
            sqlx::query("SELECT pg_advisory_xact_lock(7243140471)").execute(&mut *tx).await?;
        }
        sqlx::query("CREATE TABLE IF NOT EXISTS warren_schema (version BIGINT NOT NULL)").execute(&mut *tx).await?;
        let at: Option<i64> = sqlx::query("SELECT MAX(version) AS v FROM warren_schema").fetch_one(&mut *tx).await?.try_get("v")?;
        let at = at.unwrap_or(0) as usize;
        for (i, step) in MIGRATIONS.iter().enumerate().skip(at) {
            for stmt in *step {
                sqlx::query(*stmt).execute(&mut *tx).await?;
            }
            sqlx::query("INSERT INTO warren_schema (version) VALUES ($1)").bind(i as i64 + 1).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// A transaction that holds the lock named `name` until it ends, on every
    /// gateway sharing the database: SQLite takes its one write lock up
    /// front (`BEGIN IMMEDIATE`, waiting out the busy timeout), PostgreSQL a
    /// transaction-scoped advisory lock on the name's hash (names that share
    /// a hash only wait for each other). What a transaction reads under it
    /// stays true until it commits, so a count and an insert are one step.
    pub(super) async fn begin_locked(&self, name: &str) -> Result<sqlx::Transaction<'static, Any>, StoreError> {
        match self.kind {
            Kind::Sqlite => Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?),
            Kind::Postgres => {
                let mut tx = self.pool.begin().await?;
                // 724314: this lock family, apart from the migration's lock.
                sqlx::query("SELECT pg_advisory_xact_lock(724314, hashtext($1))").bind(name.to_string()).execute(&mut *tx).await?;
                Ok(tx)
            }
        }
    }

    /// Writes a batch of operations in one transaction, as few statements
    /// as their kinds allow (see `batch`).
    pub(super) async fn apply(&self, ops: &[Write]) -> Result<(), StoreError> {
        let mut tx = self.writer.begin().await?;
        for q in super::batch::statements(ops) {
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// One record.
    pub async fn get(&self, trace_id: &str) -> Result<Option<Row>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM warren_executions WHERE trace_id = $1");
        let row = sqlx::query(AssertSqlSafe(sql)).bind(trace_id.to_string()).fetch_optional(&self.pool).await?;
        Ok(row.map(|r| decode(&r)).transpose()?)
    }

    /// Stored stream lines after `seq`, in order, at most `limit`.
    pub async fn lines_after(&self, trace_id: &str, seq: u64, limit: u32) -> Result<Vec<(u64, String)>, StoreError> {
        let rows = sqlx::query("SELECT seq, line FROM warren_execution_events WHERE trace_id = $1 AND seq > $2 ORDER BY seq LIMIT $3")
            .bind(trace_id.to_string())
            .bind(seq as i64)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok((r.try_get::<i64, _>("seq")? as u64, r.try_get("line")?))).collect()
    }

    /// Marks a running record as asked to cancel; the record as it is now.
    pub async fn request_cancel(&self, trace_id: &str) -> Result<Option<Row>, StoreError> {
        sqlx::query("UPDATE warren_executions SET cancel_requested = 1 WHERE trace_id = $1 AND completed_ms IS NULL")
            .bind(trace_id.to_string())
            .execute(&self.pool)
            .await?;
        self.get(trace_id).await
    }

    /// Records matching `f`, newest first, without their output.
    pub async fn query(&self, f: &Filter) -> Result<Vec<Row>, StoreError> {
        if f.namespaces.is_empty() {
            return Ok(Vec::new());
        }
        let mut w = Where::namespaces(&f.namespaces);
        if let Some(k) = &f.key_name {
            w.and("key_name = ?", vec![Bind::Text(k.clone())]);
        }
        if let Some(t) = f.since_ms {
            w.and("created_ms >= ?", vec![Bind::Int(t)]);
        }
        if let Some(t) = f.until_ms {
            w.and("created_ms < ?", vec![Bind::Int(t)]);
        }
        if let Some(s) = &f.status {
            w.and("status = ?", vec![Bind::Text(s.clone())]);
        }
        if let Some(l) = &f.language {
            w.and("language = ?", vec![Bind::Text(l.clone())]);
        }
        if let Some(t) = &f.thread_id {
            w.and("thread_id = ?", vec![Bind::Text(t.clone())]);
        }
        if let Some(t) = &f.otel_trace_id {
            w.and("otel_trace_id = ?", vec![Bind::Text(t.clone())]);
        }
        for (k, v) in &f.metadata {
            let exists = "EXISTS (SELECT 1 FROM warren_execution_metadata m WHERE m.trace_id = e.trace_id AND m.k = ? AND m.v = ?)";
            w.and(exists, vec![Bind::Text(k.clone()), Bind::Text(v.clone())]);
        }
        if let Some((t, id)) = &f.after {
            let page = "(created_ms < ? OR (created_ms = ? AND trace_id < ?))";
            w.and(page, vec![Bind::Int(*t), Bind::Int(*t), Bind::Text(id.clone())]);
        }
        let limit = w.bind(Bind::Int(i64::from(f.limit)));
        let sql = format!("SELECT {SUMMARY_COLUMNS} FROM warren_executions e WHERE {} ORDER BY created_ms DESC, trace_id DESC LIMIT {limit}", w.sql);
        let rows = w.query(sql).fetch_all(&self.pool).await?;
        rows.iter().map(|r| Ok(decode(r)?)).collect()
    }

    /// What ended in `namespaces` at or after `since_ms`, summed up: counts
    /// per outcome and, with `per_minute`, per minute (grouped in the
    /// database, so bounded by the window's minutes, not its executions),
    /// and the duration's p50 and p99 (read at their rank, one row each).
    pub async fn stats(&self, namespaces: &[String], since_ms: i64, per_minute: bool) -> Result<Stats, StoreError> {
        let mut stats = Stats::default();
        if namespaces.is_empty() {
            return Ok(stats);
        }
        let window = || {
            let mut w = Where::namespaces(namespaces);
            w.and("created_ms >= ?", vec![Bind::Int(since_ms)]);
            w.and("status <> ?", vec![Bind::Text(super::Status::RUNNING.into())]);
            w
        };
        let w = window();
        let minute = if per_minute { "created_ms / 60000" } else { "0" };
        let sql = format!("SELECT {minute} AS minute, status, COALESCE(error, '') AS error, COUNT(*) AS n FROM warren_executions e WHERE {} GROUP BY minute, status, error", w.sql);
        for r in w.query(sql).fetch_all(&self.pool).await? {
            let (minute, n): (i64, i64) = (r.try_get("minute")?, r.try_get("n")?);
            let (status, error): (String, String) = (r.try_get("status")?, r.try_get("error")?);
            stats.add(per_minute.then_some(minute * 60_000), &status, (!error.is_empty()).then_some(error.as_str()), n as u64);
        }
        let ranks = (stats.rank(50), stats.rank(99));
        for (rank, slot) in [(ranks.0, &mut stats.p50_ms), (ranks.1, &mut stats.p99_ms)] {
            let Some(rank) = rank else { continue };
            let mut w = window();
            let offset = w.bind(Bind::Int(rank as i64));
            let sql = format!("SELECT duration_ms FROM warren_executions e WHERE {} ORDER BY duration_ms LIMIT 1 OFFSET {offset}", w.sql);
            *slot = w.query(sql).fetch_optional(&self.pool).await?.map(|r| r.try_get::<i64, _>("duration_ms")).transpose()?.map(|d| d.max(0) as u64);
        }
        Ok(stats)
    }

    /// Records that `a.user` did `a.action` to `a.object` in `a.namespace`.
    pub async fn record_action(&self, a: &Action) -> Result<(), StoreError> {
        insert_action(a).execute(&self.pool).await?;
        Ok(())
    }

    /// The newest `limit` console actions in `namespaces`.
    pub async fn actions(&self, namespaces: &[String], limit: u32) -> Result<Vec<Action>, StoreError> {
        if namespaces.is_empty() {
            return Ok(Vec::new());
        }
        let mut w = Where::namespaces(namespaces);
        let limit = w.bind(Bind::Int(i64::from(limit)));
        let sql = format!("SELECT at_ms, user_name, action, namespace, object FROM warren_console_actions WHERE {} ORDER BY at_ms DESC LIMIT {limit}", w.sql);
        let rows = w.query(sql).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| Ok(Action { at_ms: r.try_get("at_ms")?, user: r.try_get("user_name")?, action: r.try_get("action")?, namespace: r.try_get("namespace")?, object: r.try_get("object")? }))
            .collect()
    }

    /// Removes the setting `name`, if any.
    pub async fn forget_setting(&self, name: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM warren_settings WHERE k = $1").bind(name.to_string()).execute(&self.pool).await?;
        Ok(())
    }

    /// This gateway is alive at `now`.
    pub async fn heartbeat(&self, owner: &str, now: i64) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO warren_gateways (id, heartbeat_ms) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET heartbeat_ms = excluded.heartbeat_ms")
            .bind(owner.to_string())
            .bind(now)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Ends the records of gateways silent since `stale`: their stream is
    /// gone, so their node killed the sandbox. Returns how many.
    pub async fn end_orphans(&self, now: i64, stale: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "UPDATE warren_executions SET status = CASE WHEN cancel_requested = 1 THEN 'cancelled' ELSE 'failed' END, \
             error = 'gateway_lost', completed_ms = $1 \
             WHERE completed_ms IS NULL AND NOT EXISTS (SELECT 1 FROM warren_gateways g WHERE g.id = warren_executions.owner AND g.heartbeat_ms >= $2)",
        )
        .bind(now)
        .bind(stale)
        .execute(&self.pool)
        .await?;
        sqlx::query("DELETE FROM warren_gateways WHERE heartbeat_ms < $1").bind(stale - 86_400_000).execute(&self.pool).await?;
        Ok(done.rows_affected())
    }

    /// Takes over the pending webhooks of gateways silent since `stale`
    /// (their executions ended, or were just ended as `gateway_lost`, and
    /// nobody is delivering them): `owner` becomes their owner. Each is
    /// claimed by exactly one gateway. (trace id, URL, namespace, key name).
    pub async fn claim_webhooks(&self, owner: &str, stale: i64) -> Result<Vec<(String, String, String, String)>, StoreError> {
        let rows = sqlx::query(
            "UPDATE warren_executions SET owner = $1 \
             WHERE webhook_status = 'pending' AND completed_ms IS NOT NULL AND owner <> $1 \
             AND NOT EXISTS (SELECT 1 FROM warren_gateways g WHERE g.id = warren_executions.owner AND g.heartbeat_ms >= $2) \
             RETURNING trace_id, webhook_url, namespace, key_name",
        )
        .bind(owner.to_string())
        .bind(stale)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get("trace_id")?, r.try_get::<Option<String>, _>("webhook_url")?.unwrap_or_default(), r.try_get("namespace")?, r.try_get("key_name")?))).collect()
    }

    /// Drops the output of records ended before `output_before` and whole
    /// records (and activity) from before `record_before`.
    pub async fn expire(&self, output_before: i64, record_before: i64) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        let old = "SELECT trace_id FROM warren_executions WHERE completed_ms < $1 AND output_expired = 0";
        sqlx::query(AssertSqlSafe(format!("DELETE FROM warren_execution_events WHERE trace_id IN ({old})"))).bind(output_before).execute(&mut *tx).await?;
        sqlx::query("UPDATE warren_executions SET stdout = NULL, stderr = NULL, output_expired = 1 WHERE completed_ms < $1 AND output_expired = 0")
            .bind(output_before)
            .execute(&mut *tx)
            .await?;
        let gone = "SELECT trace_id FROM warren_executions WHERE completed_ms < $1";
        sqlx::query(AssertSqlSafe(format!("DELETE FROM warren_execution_metadata WHERE trace_id IN ({gone})"))).bind(record_before).execute(&mut *tx).await?;
        sqlx::query(AssertSqlSafe(format!("DELETE FROM warren_execution_events WHERE trace_id IN ({gone})"))).bind(record_before).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM warren_executions WHERE completed_ms < $1").bind(record_before).execute(&mut *tx).await?;
        // The activity log (console actions, live sandboxes' processes,
        // terminals and ports) is kept as long as the records.
        sqlx::query("DELETE FROM warren_console_actions WHERE at_ms < $1").bind(record_before).execute(&mut *tx).await?;
        tx.commit().await?;
        self.expire_idempotency(super::now_ms() - super::IDEMPOTENCY_KEPT_MS).await?;
        Ok(())
    }
}

pub(super) enum Bind {
    Text(String),
    Int(i64),
}

/// A WHERE clause built from constant text with `?` for each value; the
/// values are bound as `$n`, never spliced into the statement.
pub(super) struct Where {
    pub(super) sql: String,
    binds: Vec<Bind>,
}

impl Where {
    /// `text`, its values bound.
    pub(super) fn new(text: &str, values: Vec<Bind>) -> Where {
        let mut w = Where { sql: String::new(), binds: Vec::new() };
        w.push(text, values);
        w
    }

    /// `namespace IN (…)`, every name bound.
    pub(super) fn namespaces(namespaces: &[String]) -> Where {
        let mut w = Where { sql: String::new(), binds: Vec::new() };
        let marks = namespaces.iter().map(|_| "?").collect::<Vec<_>>().join(", ");
        w.push(&format!("namespace IN ({marks})"), namespaces.iter().map(|n| Bind::Text(n.clone())).collect());
        w
    }

    /// Adds `AND text`.
    pub(super) fn and(&mut self, text: &str, values: Vec<Bind>) {
        self.sql.push_str(" AND ");
        self.push(text, values);
    }

    fn push(&mut self, text: &str, values: Vec<Bind>) {
        let mut t = text.to_string();
        for v in values {
            let mark = self.bind(v);
            t = t.replacen('?', &mark, 1);
        }
        self.sql.push_str(&t);
    }

    /// Binds `v`; its placeholder.
    pub(super) fn bind(&mut self, v: Bind) -> String {
        self.binds.push(v);
        format!("${}", self.binds.len())
    }

    /// The statement `sql` (constant text and this clause) with the values bound.
    pub(super) fn query(self, sql: String) -> Q<'static> {
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for b in self.binds {
            q = match b {
                Bind::Text(s) => q.bind(s),
                Bind::Int(i) => q.bind(i),
            };
        }
        q
    }
}

fn decode(r: &AnyRow) -> Result<Row, sqlx::Error> {
    let int = |c: &str| r.try_get::<i64, _>(c);
    let metadata: String = r.try_get("metadata")?;
    Ok(Row {
        trace_id: r.try_get("trace_id")?,
        namespace: r.try_get("namespace")?,
        key_name: r.try_get("key_name")?,
        sandbox: r.try_get("sandbox")?,
        language: r.try_get("language")?,
        thread_id: r.try_get("thread_id")?,
        otel_trace_id: r.try_get("otel_trace_id")?,
        metadata: serde_json::from_str::<BTreeMap<String, String>>(&metadata).unwrap_or_default(),
        mode: r.try_get("mode")?,
        status: r.try_get("status")?,
        error: r.try_get("error")?,
        exit_code: r.try_get::<Option<i64>, _>("exit_code")?.map(|c| c as i32),
        duration_ms: int("duration_ms")? as u64,
        cpu_ms: int("cpu_ms")? as u64,
        peak_memory_bytes: u64::try_from(int("peak_memory_bytes")?).ok(),
        stdout: r.try_get("stdout")?,
        stderr: r.try_get("stderr")?,
        stdout_truncated: int("stdout_truncated")? != 0,
        stderr_truncated: int("stderr_truncated")? != 0,
        output_expired: int("output_expired")? != 0,
        node: r.try_get("node")?,
        owner: r.try_get("owner")?,
        timeout_secs: int("timeout_secs")? as u32,
        cancel_requested: int("cancel_requested")? != 0,
        webhook_url: r.try_get("webhook_url")?,
        webhook_status: r.try_get("webhook_status")?,
        webhook_attempts: int("webhook_attempts")? as u32,
        created_ms: int("created_ms")?,
        completed_ms: r.try_get("completed_ms")?,
        blocked_egress: r.try_get("blocked_egress")?,
    })
}

#[cfg(test)]
mod private_tests {
    use std::os::unix::fs::PermissionsExt;

    /// Single-machine mode keeps every output and the signing key here:
    /// nobody but the gateway's user reads it.
    #[tokio::test]
    async fn the_sqlite_file_and_its_new_directory_are_private() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("gateway/records.db");
        super::Store::open(&format!("sqlite://{}", file.display())).await.unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&t.path().join("gateway")), mode(&file)), (0o700, 0o600));
        let old = t.path().join("old.db");
        std::fs::write(&old, "").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        super::Store::open(&format!("sqlite://{}", old.display())).await.unwrap();
        assert_eq!(mode(&old), 0o600, "an existing world-readable file is tightened");
    }
}
