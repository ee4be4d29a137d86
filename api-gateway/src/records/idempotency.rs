//! Idempotency keys (`Idempotency-Key`) in the record database, so a retry
//! reaches the first call's answer through any gateway replica and after a
//! restart: one row per (ApiKey, scope, key) holding a hash of the request,
//! the trace id (or sandbox id) it was given and, once known, the answer.
//! A key is kept [`KEPT_MS`]; after that it may be used afresh.

use sqlx::Row as _;

use super::batch::Q;
use super::{Store, StoreError};

/// How long a key holds its answer, milliseconds (24 h).
pub const KEPT_MS: i64 = 24 * 3600 * 1000;

/// One idempotency key of one ApiKey, for one kind of call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdemKey<'a> {
    /// The ApiKey's namespace.
    pub namespace: &'a str,
    /// The ApiKey's name.
    pub key_name: &'a str,
    /// `execute` or `e2b-create`.
    pub scope: &'a str,
    /// The caller's key.
    pub key: &'a str,
}

/// What claiming a key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// Unused (or expired): the call runs, as the id it claimed with.
    New,
    /// Used by the same request: its id and, once stored, its answer.
    Same {
        /// The first call's trace id (or sandbox id).
        id: String,
        /// Its answer, once stored.
        answer: Option<String>,
    },
    /// Used by another request.
    Different,
}

/// `q` with `k` bound as `$1`…`$4` (namespace, key name, scope, key).
fn keyed<'q>(q: Q<'q>, k: &IdemKey<'_>) -> Q<'q> {
    q.bind(k.namespace.to_string()).bind(k.key_name.to_string()).bind(k.scope.to_string()).bind(k.key.to_string())
}

/// Names one row by its key.
const WHERE_KEY: &str = "namespace = $1 AND key_name = $2 AND scope = $3 AND idem_key = $4";

impl Store {
    /// Claims `k` for a request hashing to `hash`, as `id`: one step, so of
    /// calls racing with one key (through any replicas) exactly one is new.
    pub async fn claim_idempotency(&self, k: &IdemKey<'_>, hash: &str, id: &str, now: i64) -> Result<Claimed, StoreError> {
        for _ in 0..2 {
            let insert = sqlx::query(
                "INSERT INTO warren_idempotency (namespace, key_name, scope, idem_key, request_hash, id, created_ms) VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (namespace, key_name, scope, idem_key) DO NOTHING",
            );
            let inserted = keyed(insert, k).bind(hash.to_string()).bind(id.to_string()).bind(now).execute(&self.pool).await?;
            if inserted.rows_affected() == 1 {
                return Ok(Claimed::New);
            }
            let select = format!("SELECT request_hash, id, answer, created_ms FROM warren_idempotency WHERE {WHERE_KEY}");
            let row = keyed(sqlx::query(sqlx::AssertSqlSafe(select)), k).fetch_optional(&self.pool).await?;
            let Some(row) = row else { continue };
            if row.try_get::<i64, _>("created_ms")? <= now - KEPT_MS {
                // Expired: gone, then claimed afresh (a racing claim may win).
                self.release_idempotency(k).await?;
                continue;
            }
            if row.try_get::<String, _>("request_hash")? != hash {
                return Ok(Claimed::Different);
            }
            return Ok(Claimed::Same { id: row.try_get("id")?, answer: row.try_get::<Option<String>, _>("answer")? });
        }
        // Claimed and released by others twice over: as if it ran.
        Ok(Claimed::Same { id: id.to_string(), answer: None })
    }

    /// Stores the answer of the call that claimed `k`.
    pub async fn answer_idempotency(&self, k: &IdemKey<'_>, answer: &str) -> Result<(), StoreError> {
        let update = format!("UPDATE warren_idempotency SET answer = $5 WHERE {WHERE_KEY}");
        keyed(sqlx::query(sqlx::AssertSqlSafe(update)), k).bind(answer.to_string()).execute(&self.pool).await?;
        Ok(())
    }

    /// Forgets `k` (its call ran nothing: a retry may run it).
    pub async fn release_idempotency(&self, k: &IdemKey<'_>) -> Result<(), StoreError> {
        let delete = format!("DELETE FROM warren_idempotency WHERE {WHERE_KEY}");
        keyed(sqlx::query(sqlx::AssertSqlSafe(delete)), k).execute(&self.pool).await?;
        Ok(())
    }

    /// Forgets keys claimed before `before`.
    pub async fn expire_idempotency(&self, before: i64) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM warren_idempotency WHERE created_ms < $1").bind(before).execute(&self.pool).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn store() -> (Store, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&format!("sqlite://{}/records.db", dir.path().display())).await.unwrap();
        (store, dir)
    }

    const K: IdemKey<'static> = IdemKey { namespace: "ns", key_name: "k", scope: "execute", key: "retry-1" };

    /// The attack: many calls with one key at once, through any replica:
    /// exactly one runs; the others see it, with its id.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn of_racing_claims_exactly_one_is_new() {
        let (store, _dir) = store().await;
        let now = crate::records::now_ms();
        let claims = (0..16).map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.claim_idempotency(&K, "h", &format!("trc_{i}"), now).await.unwrap() })
        });
        let all: Vec<Claimed> = futures_util::future::join_all(claims).await.into_iter().map(Result::unwrap).collect();
        assert_eq!(all.iter().filter(|c| **c == Claimed::New).count(), 1, "{all:?}");
        let ids: std::collections::HashSet<_> = all.iter().filter_map(|c| if let Claimed::Same { id, .. } = c { Some(id.clone()) } else { None }).collect();
        assert_eq!(ids.len(), 1, "every other claim sees the one that ran: {ids:?}");
    }

    #[tokio::test]
    async fn a_key_answers_its_request_refuses_another_and_is_scoped_and_expires() {
        let (store, _dir) = store().await;
        let now = crate::records::now_ms();
        assert_eq!(store.claim_idempotency(&K, "h", "trc_a", now).await.unwrap(), Claimed::New);
        assert_eq!(store.claim_idempotency(&K, "h", "trc_b", now).await.unwrap(), Claimed::Same { id: "trc_a".into(), answer: None });
        store.answer_idempotency(&K, "{\"ok\":1}").await.unwrap();
        assert_eq!(store.claim_idempotency(&K, "h", "trc_b", now).await.unwrap(), Claimed::Same { id: "trc_a".into(), answer: Some("{\"ok\":1}".into()) });
        assert_eq!(store.claim_idempotency(&K, "other body", "trc_b", now).await.unwrap(), Claimed::Different);
        // Another ApiKey, another scope: their own.
        let other = IdemKey { key_name: "k2", ..K };
        assert_eq!(store.claim_idempotency(&other, "h", "trc_c", now).await.unwrap(), Claimed::New);
        let create = IdemKey { scope: "e2b-create", ..K };
        assert_eq!(store.claim_idempotency(&create, "h", "sbx", now).await.unwrap(), Claimed::New);
        // A day later the key is new again; released, at once.
        assert_eq!(store.claim_idempotency(&K, "h", "trc_d", now + KEPT_MS + 1).await.unwrap(), Claimed::New);
        store.release_idempotency(&K).await.unwrap();
        assert_eq!(store.claim_idempotency(&K, "h2", "trc_e", now).await.unwrap(), Claimed::New);
        store.expire_idempotency(now + 1).await.unwrap();
        assert_eq!(store.claim_idempotency(&K, "h3", "trc_f", now).await.unwrap(), Claimed::New, "expired rows are deleted");
    }
}
