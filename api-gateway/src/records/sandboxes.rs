//! The E2B API's sandboxes in the record database, so every gateway replica
//! answers for every sandbox: which key's thread an id names, its template,
//! metadata (also one row per entry, so listings filter and page in the
//! database), its environment — sealed by the E2B layer, never plaintext —
//! and when it ends.

use std::collections::BTreeMap;

use sqlx::any::AnyRow;
use sqlx::{AssertSqlSafe, Row as _};

use super::store::{Bind, Where};
use super::{Store, StoreError};

/// One E2B sandbox: a thread of one key, with what `create` declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bSandbox {
    /// The sandbox id, which is also its thread id.
    pub id: String,
    /// The owning ApiKey's namespace.
    pub namespace: String,
    /// The owning ApiKey's name.
    pub key_name: String,
    /// The template the caller named (the key's Sandbox).
    pub template: String,
    /// Caller metadata.
    pub metadata: BTreeMap<String, String>,
    /// The environment every command gets, as stored (sealed by the E2B
    /// layer; empty when there is none). Read only where a sandbox is read
    /// by id: listings and the sweep leave it out (`None`).
    pub env: Option<String>,
    /// `running` or `paused`.
    pub state: String,
    /// Created, Unix milliseconds.
    pub started_ms: i64,
    /// Ends (and its thread is deleted) at, Unix milliseconds.
    pub end_ms: i64,
    /// At its end a running sandbox is paused (kept) instead of deleted.
    pub auto_pause: bool,
    /// The node its live sandbox runs on, while it runs.
    pub node: Option<String>,
    /// Beyond `state`: `pausing` while a pause ends its live sandbox,
    /// `failed` when its live sandbox was lost; empty otherwise.
    pub status: String,
    /// Why it failed or was paused by Warren (idle), for its caller.
    pub reason: String,
    /// When it last went live, Unix milliseconds (0: never).
    pub live_ms: i64,
    /// Its ports answer without a token (while its key allows it).
    pub public_ports: bool,
}

/// What [`Store::insert_sandbox_within`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// Stored.
    Yes,
    /// The key has its most sandboxes.
    TooMany,
    /// The key has its most running.
    TooManyRunning,
}

/// One page of a key's live sandboxes, oldest first, as a listing asks.
#[derive(Debug, Clone, Default)]
pub struct SandboxPage {
    /// The ApiKey's namespace.
    pub namespace: String,
    /// The ApiKey's name.
    pub key_name: String,
    /// Only these states (none: any).
    pub states: Vec<String>,
    /// Only sandboxes with every one of these metadata entries.
    pub metadata: Vec<(String, String)>,
    /// After this `(started_ms, id)`.
    pub after: Option<(i64, String)>,
    /// Live means ending after this, Unix milliseconds.
    pub now: i64,
    /// At most this many.
    pub limit: u32,
}

/// Every column but the environment.
const COLUMNS: &str = "id, namespace, key_name, template, metadata, state, started_ms, end_ms, auto_pause, node, status, reason, live_ms, public_ports";

fn decode(r: &AnyRow, with_env: bool) -> Result<E2bSandbox, sqlx::Error> {
    let metadata: String = r.try_get("metadata")?;
    Ok(E2bSandbox {
        id: r.try_get("id")?,
        namespace: r.try_get("namespace")?,
        key_name: r.try_get("key_name")?,
        template: r.try_get("template")?,
        metadata: serde_json::from_str(&metadata).unwrap_or_default(),
        env: if with_env { Some(r.try_get("env")?) } else { None },
        state: r.try_get("state")?,
        started_ms: r.try_get("started_ms")?,
        end_ms: r.try_get("end_ms")?,
        auto_pause: r.try_get::<i64, _>("auto_pause")? != 0,
        node: r.try_get::<Option<String>, _>("node")?.filter(|n| !n.is_empty()),
        status: r.try_get("status")?,
        reason: r.try_get("reason")?,
        live_ms: r.try_get("live_ms")?,
        public_ports: r.try_get::<i64, _>("public_ports")? != 0,
    })
}

/// A key's sandboxes ending after `now` (only the running ones with `running`).
async fn count<'e>(db: impl sqlx::Executor<'e, Database = sqlx::Any>, namespace: &str, key_name: &str, now: i64, running: bool) -> Result<u64, StoreError> {
    let sql = match running {
        true => "SELECT COUNT(*) AS n FROM warren_e2b_sandboxes WHERE namespace = $1 AND key_name = $2 AND end_ms > $3 AND state = 'running'",
        false => "SELECT COUNT(*) AS n FROM warren_e2b_sandboxes WHERE namespace = $1 AND key_name = $2 AND end_ms > $3",
    };
    let n: i64 = sqlx::query(sql).bind(namespace.to_string()).bind(key_name.to_string()).bind(now).fetch_one(db).await?.try_get("n")?;
    Ok(n.max(0) as u64)
}

fn json(m: &BTreeMap<String, String>) -> String {
    serde_json::to_string(m).unwrap_or_else(|_| "{}".into())
}

impl Store {
    /// Stores a new sandbox unless its key already has `most` sandboxes
    /// (ending after it starts) or `running` of them running. The counts and
    /// the insert are one step under the key's lock, so concurrent creates —
    /// through any replica sharing the database — never pass either.
    pub async fn insert_sandbox_within(&self, s: &E2bSandbox, most: u64, running: u64) -> Result<Inserted, StoreError> {
        let mut tx = self.begin_locked(&format!("e2b-sandboxes/{}/{}", s.namespace, s.key_name)).await?;
        if count(&mut *tx, &s.namespace, &s.key_name, s.started_ms, false).await? >= most {
            tx.rollback().await?;
            return Ok(Inserted::TooMany);
        }
        if count(&mut *tx, &s.namespace, &s.key_name, s.started_ms, true).await? >= running {
            tx.rollback().await?;
            return Ok(Inserted::TooManyRunning);
        }
        sqlx::query("INSERT INTO warren_e2b_sandboxes (id, namespace, key_name, template, metadata, env, state, started_ms, end_ms, auto_pause, node, public_ports) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)")
            .bind(s.id.clone())
            .bind(s.namespace.clone())
            .bind(s.key_name.clone())
            .bind(s.template.clone())
            .bind(json(&s.metadata))
            .bind(s.env.clone().unwrap_or_default())
            .bind(s.state.clone())
            .bind(s.started_ms)
            .bind(s.end_ms)
            .bind(i64::from(s.auto_pause))
            .bind(s.node.clone().unwrap_or_default())
            .bind(i64::from(s.public_ports))
            .execute(&mut *tx)
            .await?;
        insert_metadata(&mut tx, s).await?;
        tx.commit().await?;
        Ok(Inserted::Yes)
    }

    /// One sandbox by id, with its environment.
    pub async fn sandbox(&self, id: &str) -> Result<Option<E2bSandbox>, StoreError> {
        let sql = format!("SELECT {COLUMNS}, env FROM warren_e2b_sandboxes WHERE id = $1");
        let row = sqlx::query(AssertSqlSafe(sql)).bind(id.to_string()).fetch_optional(&self.pool).await?;
        Ok(row.map(|r| decode(&r, true)).transpose()?)
    }

    /// One page of a key's live sandboxes: filtered, ordered and cut in the
    /// database, so a listing reads at most `limit` rows, never the environment.
    pub async fn sandbox_page(&self, q: &SandboxPage) -> Result<Vec<E2bSandbox>, StoreError> {
        let mut w = Where::new("namespace = ? AND key_name = ? AND end_ms > ?", vec![Bind::Text(q.namespace.clone()), Bind::Text(q.key_name.clone()), Bind::Int(q.now)]);
        if !q.states.is_empty() {
            let marks = vec!["?"; q.states.len()].join(", ");
            w.and(&format!("state IN ({marks})"), q.states.iter().map(|s| Bind::Text(s.clone())).collect());
        }
        for (k, v) in &q.metadata {
            let exists = "EXISTS (SELECT 1 FROM warren_e2b_sandbox_metadata m WHERE m.id = s.id AND m.k = ? AND m.v = ?)";
            w.and(exists, vec![Bind::Text(k.clone()), Bind::Text(v.clone())]);
        }
        if let Some((t, id)) = &q.after {
            w.and("(started_ms > ? OR (started_ms = ? AND id > ?))", vec![Bind::Int(*t), Bind::Int(*t), Bind::Text(id.clone())]);
        }
        let limit = w.bind(Bind::Int(i64::from(q.limit)));
        let sql = format!("SELECT {COLUMNS} FROM warren_e2b_sandboxes s WHERE {} ORDER BY started_ms, id LIMIT {limit}", w.sql);
        let rows = w.query(sql).fetch_all(&self.pool).await?;
        rows.iter().map(|r| decode(r, false).map_err(StoreError::from)).collect()
    }

    /// Sets a sandbox's end and state.
    pub async fn update_sandbox(&self, id: &str, end_ms: i64, state: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE warren_e2b_sandboxes SET end_ms = $1, state = $2 WHERE id = $3")
            .bind(end_ms)
            .bind(state.to_string())
            .bind(id.to_string())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// How many of a key's sandboxes run (not paused) at `now`.
    pub async fn running_sandboxes(&self, namespace: &str, key_name: &str, now: i64) -> Result<u64, StoreError> {
        count(&self.pool, namespace, key_name, now, true).await
    }

    /// Sets the node a sandbox's live sandbox runs on (`None`: none runs),
    /// and when it went live; either way it is no longer pausing or failed.
    pub async fn set_sandbox_node(&self, id: &str, node: Option<&str>) -> Result<(), StoreError> {
        let q = match node {
            Some(n) => sqlx::query("UPDATE warren_e2b_sandboxes SET node = $1, live_ms = $2, status = '', reason = '' WHERE id = $3").bind(n.to_string()).bind(super::now_ms()),
            None => sqlx::query("UPDATE warren_e2b_sandboxes SET node = '', live_ms = 0, status = CASE WHEN status = 'pausing' THEN '' ELSE status END WHERE id = $1"),
        };
        q.bind(id.to_string()).execute(&self.pool).await?;
        Ok(())
    }

    /// Sets a sandbox's `status` (`pausing`, or empty).
    pub async fn set_sandbox_status(&self, id: &str, status: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE warren_e2b_sandboxes SET status = $1 WHERE id = $2").bind(status.to_string()).bind(id.to_string()).execute(&self.pool).await?;
        Ok(())
    }

    /// Marks `s` (as read, live on its node) `pausing`; false when it
    /// changed meanwhile (paused, resumed elsewhere, or already pausing).
    pub async fn begin_pause(&self, s: &E2bSandbox) -> Result<bool, StoreError> {
        self.update_as_read(s, "status = 'pausing'", None).await
    }

    /// Sets `set` (with `$4`, `$5` bound to `values`) on `s` only while it is
    /// as read: running on its node since the same moment, and not pausing.
    async fn update_as_read(&self, s: &E2bSandbox, set: &str, values: Option<(&str, i64)>) -> Result<bool, StoreError> {
        let sql = format!("UPDATE warren_e2b_sandboxes SET {set} WHERE id = $1 AND state = 'running' AND node = $2 AND live_ms = $3 AND status <> 'pausing'");
        let mut q = sqlx::query(AssertSqlSafe(sql)).bind(s.id.clone()).bind(s.node.clone().unwrap_or_default()).bind(s.live_ms);
        if let Some((text, n)) = values {
            q = q.bind(text.to_string()).bind(n);
        }
        Ok(q.execute(&self.pool).await?.rows_affected() > 0)
    }

    /// A sandbox Warren paused (not its caller): paused until `end_ms`, and why.
    pub async fn paused_by_warren(&self, id: &str, end_ms: i64, reason: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE warren_e2b_sandboxes SET state = 'paused', node = '', status = '', reason = $1, end_ms = $2 WHERE id = $3")
            .bind(reason.to_string())
            .bind(end_ms)
            .bind(id.to_string())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// `s` (as read, live on its node) lost its live sandbox: failed, kept
    /// like a paused one until `end_ms` (its home at its last save); false
    /// when it changed meanwhile (a pause, a resume, a kill).
    pub async fn fail_sandbox(&self, s: &E2bSandbox, reason: &str, end_ms: i64) -> Result<bool, StoreError> {
        self.update_as_read(s, "state = 'paused', node = '', status = 'failed', reason = $4, end_ms = $5", Some((reason, end_ms))).await
    }

    /// Running sandboxes live on a node, oldest live first, at most `limit`
    /// (without their environment): what the gateways watch.
    pub async fn live_on_nodes(&self, limit: u32) -> Result<Vec<E2bSandbox>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM warren_e2b_sandboxes WHERE state = 'running' AND node <> '' ORDER BY live_ms LIMIT $1");
        let rows = sqlx::query(AssertSqlSafe(sql)).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        rows.iter().map(|r| decode(r, false).map_err(StoreError::from)).collect()
    }

    /// The newest `limit` sandboxes (running or paused) of keys in `namespaces`
    /// ending after `now`, without their environment (the console's list).
    pub async fn sandboxes_in(&self, namespaces: &[String], now: i64, limit: u32) -> Result<Vec<E2bSandbox>, StoreError> {
        if namespaces.is_empty() {
            return Ok(Vec::new());
        }
        let mut w = Where::namespaces(namespaces);
        w.and("end_ms > ?", vec![Bind::Int(now)]);
        let limit = w.bind(Bind::Int(i64::from(limit)));
        let sql = format!("SELECT {COLUMNS} FROM warren_e2b_sandboxes WHERE {} ORDER BY started_ms DESC LIMIT {limit}", w.sql);
        let rows = w.query(sql).fetch_all(&self.pool).await?;
        rows.iter().map(|r| decode(r, false).map_err(StoreError::from)).collect()
    }

    /// Pauses a sandbox that reached its end while running, until `end_ms`;
    /// false when another replica (or a call) changed it first.
    pub async fn auto_pause(&self, s: &E2bSandbox, end_ms: i64) -> Result<bool, StoreError> {
        let done = sqlx::query("UPDATE warren_e2b_sandboxes SET end_ms = $1, state = 'paused' WHERE id = $2 AND end_ms = $3 AND state = 'running'")
            .bind(end_ms)
            .bind(s.id.clone())
            .bind(s.end_ms)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Sandboxes that ended at or before `now`, at most `limit` (without their environment).
    pub async fn ended_sandboxes(&self, now: i64, limit: u32) -> Result<Vec<E2bSandbox>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM warren_e2b_sandboxes WHERE end_ms <= $1 ORDER BY end_ms LIMIT $2");
        let rows = sqlx::query(AssertSqlSafe(sql)).bind(now).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        rows.iter().map(|r| decode(r, false).map_err(StoreError::from)).collect()
    }

    /// Forgets a sandbox; false when there was none.
    pub async fn delete_sandbox(&self, id: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM warren_e2b_sandbox_metadata WHERE id = $1").bind(id.to_string()).execute(&mut *tx).await?;
        let done = sqlx::query("DELETE FROM warren_e2b_sandboxes WHERE id = $1").bind(id.to_string()).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(done.rows_affected() > 0)
    }

    /// Sandboxes stored by an earlier release, whose environment is plain
    /// JSON and whose metadata has no rows, at most `limit`, with the environment.
    pub async fn unsealed_sandboxes(&self, limit: u32) -> Result<Vec<E2bSandbox>, StoreError> {
        let sql = format!("SELECT {COLUMNS}, env FROM warren_e2b_sandboxes WHERE env LIKE '{{%' LIMIT $1");
        let rows = sqlx::query(AssertSqlSafe(sql)).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        rows.iter().map(|r| decode(r, true).map_err(StoreError::from)).collect()
    }

    /// Replaces the plain environment of `s` (as [`Store::unsealed_sandboxes`]
    /// read it) with `sealed`, and gives its metadata rows; false when the
    /// sandbox changed or went meanwhile.
    pub async fn seal_sandbox(&self, s: &E2bSandbox, sealed: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query("UPDATE warren_e2b_sandboxes SET env = $1 WHERE id = $2 AND env = $3")
            .bind(sealed.to_string())
            .bind(s.id.clone())
            .bind(s.env.clone().unwrap_or_default())
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            tx.rollback().await?;
            return Ok(false);
        }
        insert_metadata(&mut tx, s).await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// The rows of `s.metadata` (one already there is left as it is).
async fn insert_metadata(tx: &mut sqlx::Transaction<'static, sqlx::Any>, s: &E2bSandbox) -> Result<(), StoreError> {
    for (k, v) in &s.metadata {
        sqlx::query("INSERT INTO warren_e2b_sandbox_metadata (id, k, v) VALUES ($1, $2, $3) ON CONFLICT (id, k) DO NOTHING")
            .bind(s.id.clone())
            .bind(k.clone())
            .bind(v.clone())
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
