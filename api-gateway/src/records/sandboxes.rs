//! The E2B API's sandboxes in the record database, so every gateway replica
//! answers for every sandbox: which key's thread an id names, its template,
//! metadata and environment, and when it ends.

use std::collections::BTreeMap;

use sqlx::any::AnyRow;
use sqlx::Row as _;

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
    /// Environment every command gets (under the call's own).
    pub env: BTreeMap<String, String>,
    /// `running` or `paused`.
    pub state: String,
    /// Created, Unix milliseconds.
    pub started_ms: i64,
    /// Ends (and its thread is deleted) at, Unix milliseconds.
    pub end_ms: i64,
    /// At its end a running sandbox is paused (kept) instead of deleted.
    pub auto_pause: bool,
}

const COLUMNS: &str = "id, namespace, key_name, template, metadata, env, state, started_ms, end_ms, auto_pause";

fn decode(r: &AnyRow) -> Result<E2bSandbox, sqlx::Error> {
    let map = |c: &str| -> Result<BTreeMap<String, String>, sqlx::Error> {
        let text: String = r.try_get(c)?;
        Ok(serde_json::from_str(&text).unwrap_or_default())
    };
    Ok(E2bSandbox {
        id: r.try_get("id")?,
        namespace: r.try_get("namespace")?,
        key_name: r.try_get("key_name")?,
        template: r.try_get("template")?,
        metadata: map("metadata")?,
        env: map("env")?,
        state: r.try_get("state")?,
        started_ms: r.try_get("started_ms")?,
        end_ms: r.try_get("end_ms")?,
        auto_pause: r.try_get::<i64, _>("auto_pause")? != 0,
    })
}

fn json(m: &BTreeMap<String, String>) -> String {
    serde_json::to_string(m).unwrap_or_else(|_| "{}".into())
}

impl Store {
    /// Stores a new sandbox.
    pub async fn insert_sandbox(&self, s: &E2bSandbox) -> Result<(), StoreError> {
        sqlx::query("INSERT INTO warren_e2b_sandboxes (id, namespace, key_name, template, metadata, env, state, started_ms, end_ms, auto_pause) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)")
            .bind(s.id.clone())
            .bind(s.namespace.clone())
            .bind(s.key_name.clone())
            .bind(s.template.clone())
            .bind(json(&s.metadata))
            .bind(json(&s.env))
            .bind(s.state.clone())
            .bind(s.started_ms)
            .bind(s.end_ms)
            .bind(i64::from(s.auto_pause))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// One sandbox by id.
    pub async fn sandbox(&self, id: &str) -> Result<Option<E2bSandbox>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM warren_e2b_sandboxes WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(id.to_string()).fetch_optional(&self.pool).await?;
        Ok(row.map(|r| decode(&r)).transpose()?)
    }

    /// A key's sandboxes, oldest first, after the `(started_ms, id)` cursor, at most `limit`.
    pub async fn sandboxes(&self, namespace: &str, key_name: &str, after: Option<(i64, String)>, limit: u32) -> Result<Vec<E2bSandbox>, StoreError> {
        let (t, id) = after.unwrap_or((i64::MIN, String::new()));
        let sql = format!(
            "SELECT {COLUMNS} FROM warren_e2b_sandboxes WHERE namespace = $1 AND key_name = $2 AND (started_ms > $3 OR (started_ms = $3 AND id > $4)) ORDER BY started_ms, id LIMIT $5"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(namespace.to_string())
            .bind(key_name.to_string())
            .bind(t)
            .bind(id)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| decode(r).map_err(StoreError::from)).collect()
    }

    /// How many sandboxes a key has that end after `now`.
    pub async fn live_sandboxes(&self, namespace: &str, key_name: &str, now: i64) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query("SELECT COUNT(*) AS n FROM warren_e2b_sandboxes WHERE namespace = $1 AND key_name = $2 AND end_ms > $3")
            .bind(namespace.to_string())
            .bind(key_name.to_string())
            .bind(now)
            .fetch_one(&self.pool)
            .await?
            .try_get("n")?;
        Ok(n.max(0) as u64)
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

    /// Sandboxes that ended at or before `now`, at most `limit`.
    pub async fn ended_sandboxes(&self, now: i64, limit: u32) -> Result<Vec<E2bSandbox>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM warren_e2b_sandboxes WHERE end_ms <= $1 ORDER BY end_ms LIMIT $2");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now).bind(i64::from(limit)).fetch_all(&self.pool).await?;
        rows.iter().map(|r| decode(r).map_err(StoreError::from)).collect()
    }

    /// Forgets a sandbox; false when there was none.
    pub async fn delete_sandbox(&self, id: &str) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM warren_e2b_sandboxes WHERE id = $1").bind(id.to_string()).execute(&self.pool).await?;
        Ok(done.rows_affected() > 0)
    }
}
