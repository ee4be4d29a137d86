use std::collections::BTreeMap;

use super::*;

async fn store() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&format!("sqlite://{}/records.db", dir.path().display())).await.unwrap();
    (store, dir)
}

fn sandbox(id: &str, key: &str, started_ms: i64, metadata: &[(&str, &str)]) -> E2bSandbox {
    E2bSandbox {
        id: id.to_string(),
        namespace: "ns".into(),
        key_name: key.into(),
        template: "base".into(),
        metadata: metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        env: Some(String::new()),
        state: "running".into(),
        started_ms,
        end_ms: started_ms + 60_000,
        auto_pause: false,
        node: None,
        status: String::new(),
        reason: String::new(),
        live_ms: 0,
        public_ports: false,
    }
}

/// The attack: many creates at once for a key allowed 3 sandboxes, each
/// counting before any inserts. The count and the insert are one step under
/// the key's lock: exactly 3 are stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_creates_never_pass_the_keys_sandbox_limit() {
    let (store, _dir) = store().await;
    let now = crate::records::now_ms();
    let creates = (0..24).map(|i| {
        let (store, s) = (store.clone(), sandbox(&format!("race{i:02}"), "k", now, &[]));
        tokio::spawn(async move { store.insert_sandbox_within(&s, 3, 1000).await.unwrap() == Inserted::Yes })
    });
    let stored = futures_util::future::join_all(creates).await.into_iter().filter(|r| *r.as_ref().unwrap()).count();
    assert_eq!(stored, 3);
    let page = SandboxPage { namespace: "ns".into(), key_name: "k".into(), now, limit: 100, ..Default::default() };
    assert_eq!(store.sandbox_page(&page).await.unwrap().len(), 3);
    // Another key has a limit of its own; an ended sandbox does not count.
    assert_eq!(store.insert_sandbox_within(&sandbox("other1", "k2", now, &[]), 1, 1000).await.unwrap(), Inserted::Yes);
    assert_eq!(store.insert_sandbox_within(&sandbox("other2", "k2", now, &[]), 1, 1000).await.unwrap(), Inserted::TooMany);
    assert_eq!(store.insert_sandbox_within(&sandbox("later1", "k2", now + 120_000, &[]), 1, 1000).await.unwrap(), Inserted::Yes, "the first ended by then");
}

/// Running sandboxes have a limit of their own; a paused one does not count.
#[tokio::test]
async fn running_sandboxes_are_counted_apart_from_paused_ones() {
    let (store, _dir) = store().await;
    let now = crate::records::now_ms();
    assert_eq!(store.insert_sandbox_within(&sandbox("run1", "k", now, &[]), 10, 1).await.unwrap(), Inserted::Yes);
    assert_eq!(store.insert_sandbox_within(&sandbox("run2", "k", now, &[]), 10, 1).await.unwrap(), Inserted::TooManyRunning);
    store.update_sandbox("run1", now + 60_000, "paused").await.unwrap();
    assert_eq!(store.running_sandboxes("ns", "k", now).await.unwrap(), 0);
    assert_eq!(store.insert_sandbox_within(&sandbox("run2", "k", now, &[]), 10, 1).await.unwrap(), Inserted::Yes);
    assert_eq!(store.running_sandboxes("ns", "k", now).await.unwrap(), 1);
}

/// A listing's filters, order and cut are the database's: a page holds
/// at most `limit` rows, never the environment, and the cursor goes on
/// where it stopped.
#[tokio::test]
async fn a_listing_reads_one_page_filtered_in_the_database() {
    let (store, _dir) = store().await;
    let now = crate::records::now_ms();
    for i in 0..40 {
        let team = if i % 4 == 0 { "a" } else { "b" };
        let mut s = sandbox(&format!("sbx{i:02}"), "k", now + i, &[("team", team), ("n", &i.to_string())]);
        s.env = Some("wse1.sealed".into());
        assert_eq!(store.insert_sandbox_within(&s, 1000, 1000).await.unwrap(), Inserted::Yes);
    }
    assert_eq!(store.insert_sandbox_within(&sandbox("theirs", "k2", now, &[("team", "a")]), 1000, 1000).await.unwrap(), Inserted::Yes);
    let mut ended = sandbox("ended", "k", now - 120_000, &[("team", "a")]);
    ended.end_ms = now - 1;
    assert_eq!(store.insert_sandbox_within(&ended, 1000, 1000).await.unwrap(), Inserted::Yes);
    store.update_sandbox("sbx08", now + 60_000, "paused").await.unwrap();

    let ask = |after: Option<(i64, String)>| SandboxPage {
        namespace: "ns".into(),
        key_name: "k".into(),
        metadata: vec![("team".into(), "a".into())],
        after,
        now,
        limit: 3,
        ..Default::default()
    };
    let first = store.sandbox_page(&ask(None)).await.unwrap();
    assert_eq!(first.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["sbx00", "sbx04", "sbx08"]);
    assert!(first.iter().all(|s| s.env.is_none()), "a listing never reads the environment");
    let last = first.last().map(|s| (s.started_ms, s.id.clone()));
    let second = store.sandbox_page(&ask(last)).await.unwrap();
    assert_eq!(second.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["sbx12", "sbx16", "sbx20"]);
    let paused = SandboxPage { states: vec!["paused".into()], ..ask(None) };
    assert_eq!(store.sandbox_page(&paused).await.unwrap().iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["sbx08"]);
    let both = SandboxPage { metadata: vec![("team".into(), "a".into()), ("n".into(), "12".into())], ..ask(None) };
    assert_eq!(store.sandbox_page(&both).await.unwrap().iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["sbx12"]);
    // Forgotten with its metadata rows.
    assert!(store.delete_sandbox("sbx00").await.unwrap());
    assert_eq!(store.sandbox_page(&ask(None)).await.unwrap()[0].id, "sbx04");
    assert_eq!(store.sandbox("sbx04").await.unwrap().and_then(|s| s.env).as_deref(), Some("wse1.sealed"), "read by id, it has its environment");
}

/// A row an earlier release stored (plain JSON environment, no metadata
/// rows) is found, sealed once, and listed by its metadata after.
#[tokio::test]
async fn rows_of_an_earlier_release_are_sealed_and_get_their_metadata_rows() {
    let (store, _dir) = store().await;
    let now = crate::records::now_ms();
    sqlx::query("INSERT INTO warren_e2b_sandboxes (id, namespace, key_name, template, metadata, env, state, started_ms, end_ms, auto_pause) VALUES ('old1', 'ns', 'k', 'base', '{\"team\":\"a\"}', '{\"TOKEN\":\"plain\"}', 'running', $1, $2, 0)")
        .bind(now)
        .bind(now + 60_000)
        .execute(&store.pool)
        .await
        .unwrap();
    let old = store.unsealed_sandboxes(10).await.unwrap();
    assert_eq!((old.len(), old[0].env.as_deref()), (1, Some(r#"{"TOKEN":"plain"}"#)));
    assert!(store.seal_sandbox(&old[0], "wse1.sealed").await.unwrap());
    assert!(!store.seal_sandbox(&old[0], "wse1.again").await.unwrap(), "sealed once");
    assert!(store.unsealed_sandboxes(10).await.unwrap().is_empty());
    let page = SandboxPage { namespace: "ns".into(), key_name: "k".into(), metadata: vec![("team".into(), "a".into())], now, limit: 10, ..Default::default() };
    assert_eq!(store.sandbox_page(&page).await.unwrap().len(), 1);
}

/// A sweep's verdict is a compare-and-swap on the record as it read it: a
/// sandbox pausing, paused, or live again elsewhere meanwhile is not marked
/// failed; one that is marks once, frees its running slot, and keeps its home.
#[tokio::test]
async fn a_failure_is_recorded_once_and_never_over_a_pause_or_a_resume() {
    let (store, _dir) = store().await;
    let now = crate::records::now_ms();
    assert_eq!(store.insert_sandbox_within(&sandbox("sb1", "k", now, &[]), 10, 1).await.unwrap(), Inserted::Yes);
    store.set_sandbox_node("sb1", Some("node-a")).await.unwrap();
    let read = store.sandbox("sb1").await.unwrap().unwrap();
    assert!(read.live_ms > 0 && read.node.as_deref() == Some("node-a"));
    // A pause in progress wins over the sweep.
    store.set_sandbox_status("sb1", "pausing").await.unwrap();
    assert!(!store.fail_sandbox(&read, "lost", now + 1000).await.unwrap());
    assert!(!store.begin_pause(&read).await.unwrap(), "already pausing");
    store.set_sandbox_status("sb1", "").await.unwrap();
    // Live again (a resume) since the sweep read it: not the sandbox it judged.
    store.set_sandbox_node("sb1", None).await.unwrap();
    store.set_sandbox_node("sb1", Some("node-b")).await.unwrap();
    assert!(!store.fail_sandbox(&read, "lost", now + 1000).await.unwrap());
    let read = store.sandbox("sb1").await.unwrap().unwrap();
    assert!(store.fail_sandbox(&read, "node node-b lost", now + 1000).await.unwrap());
    assert!(!store.fail_sandbox(&read, "node node-b lost", now + 1000).await.unwrap(), "once");
    let failed = store.sandbox("sb1").await.unwrap().unwrap();
    assert_eq!((failed.state.as_str(), failed.status.as_str(), failed.reason.as_str(), failed.node.as_deref()), ("paused", "failed", "node node-b lost", None));
    assert_eq!(store.running_sandboxes("ns", "k", now).await.unwrap(), 0, "a failed sandbox holds no running slot");
    // Resumed, it is running again and neither failed nor explained.
    store.set_sandbox_node("sb1", Some("node-c")).await.unwrap();
    store.update_sandbox("sb1", now + 60_000, "running").await.unwrap();
    let back = store.sandbox("sb1").await.unwrap().unwrap();
    assert_eq!((back.status.as_str(), back.reason.as_str()), ("", ""));
    // Idle: pausing once, then paused by Warren with the reason.
    assert!(store.begin_pause(&back).await.unwrap());
    assert!(!store.begin_pause(&back).await.unwrap(), "one replica pauses it");
    store.set_sandbox_node("sb1", None).await.unwrap();
    store.paused_by_warren("sb1", now + 1000, "idle").await.unwrap();
    let idle = store.sandbox("sb1").await.unwrap().unwrap();
    assert_eq!((idle.state.as_str(), idle.status.as_str(), idle.reason.as_str()), ("paused", "", "idle"));
    assert_eq!(store.live_on_nodes(10).await.unwrap().len(), 0);
    assert_eq!(store.sandboxes_in(&["ns".into()], now, 10).await.unwrap().len(), 1);
    assert!(store.sandboxes_in(&["other".into()], now, 10).await.unwrap().is_empty());
}
