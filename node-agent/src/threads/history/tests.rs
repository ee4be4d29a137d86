use super::*;
use crate::threads::manifest::{new_id, ThreadKey};

fn layer(thread: &str) -> LayerRef {
    LayerRef { key: ThreadKey::new("ns", "k", thread).unwrap().layer_key(&new_id()), size: 10 }
}

fn at(now: u64, layers: Vec<LayerRef>, bytes: u64) -> Manifest {
    Manifest { layers, bytes, updated_at: now, ..Manifest::empty(now) }
}

fn run(trace: &str) -> Option<Produced> {
    Some(Produced { trace_id: trace.into(), kind: Kind::Execution, exit: Some(0) })
}

const KEEP: Keep = Keep { count: 50, max_age: None };

/// The manifest as the agent reads it back: its history's indices checked.
fn check(m: &Manifest) -> Result<(), String> {
    Manifest::parse(&serde_json::to_vec(m).unwrap(), &ThreadKey::new("ns", "k", "t").unwrap()).map(|_| ())
}

#[test]
fn every_save_adds_a_version_naming_the_layers_it_had() {
    let (a, b) = (layer("t"), layer("t"));
    let one = advance(None, at(1, vec![a.clone()], 5), run("trc_1"), KEEP);
    let two = advance(Some(&one), at(2, vec![a.clone(), b.clone()], 7), run("trc_2"), KEEP);
    assert_eq!(two.history.len(), 2);
    assert!(two.pool.is_empty(), "both versions name current layers");
    assert_eq!(layers_of(&two, find(&two, "trc_1").unwrap()), vec![a.clone()]);
    assert_eq!(layers_of(&two, find(&two, "trc_2").unwrap()), vec![a.clone(), b.clone()]);
    assert_eq!(find(&two, "trc_1").unwrap().bytes, 5);
    check(&two).unwrap();
    // A compaction replaces the current layers: the older versions' go to the pool.
    let c = layer("t");
    let three = advance(Some(&two), at(3, vec![c.clone()], 7), run("trc_3"), KEEP);
    assert_eq!(three.pool, vec![a.clone(), b.clone()]);
    assert_eq!(layers_of(&three, find(&three, "trc_2").unwrap()), vec![a, b]);
    assert_eq!(layers_of(&three, find(&three, "trc_3").unwrap()), vec![c]);
    let unchanged = advance(Some(&three), at(4, three.layers.clone(), 7), None, KEEP);
    assert_eq!(unchanged.history, three.history, "a call that changed nothing adds no version");
    assert!(find(&three, "").is_none() && find(&three, "trc_9").is_none());
}

#[test]
fn the_history_keeps_its_count_and_age_and_always_the_current_version() {
    let mut m: Option<Manifest> = None;
    let mut layers = Vec::new();
    for i in 0..10u64 {
        layers.push(layer("t"));
        m = Some(advance(m.as_ref(), at(i * 100, layers.clone(), i), run(&format!("trc_{i}")), Keep { count: 3, max_age: None }));
    }
    let m = m.unwrap();
    let traces: Vec<&str> = m.history.iter().map(|v| v.trace_id.as_str()).collect();
    assert_eq!(traces, ["trc_7", "trc_8", "trc_9"]);
    let old = advance(Some(&m), at(10_000, m.layers.clone(), 9), run("trc_10"), Keep { count: 50, max_age: Some(150) });
    assert_eq!(old.history.len(), 1, "versions past the age go; the current stays");
    let alone = advance(Some(&m), at(10_000, m.layers.clone(), 9), None, Keep { count: 50, max_age: Some(1) });
    assert_eq!(alone.history.len(), 1);
    assert_eq!(alone.history[0].trace_id, "trc_9");
}

#[test]
fn a_pool_keeps_only_what_kept_versions_name() {
    let (a, b, c) = (layer("t"), layer("t"), layer("t"));
    let one = advance(None, at(1, vec![a.clone()], 1), run("trc_1"), KEEP);
    let two = advance(Some(&one), at(2, vec![b.clone()], 1), run("trc_2"), KEEP);
    let three = advance(Some(&two), at(3, vec![c.clone()], 1), run("trc_3"), Keep { count: 2, max_age: None });
    assert_eq!(three.pool, vec![b], "a is named by no kept version");
}

#[test]
fn a_fork_starts_at_the_chosen_version_with_the_history_up_to_it() {
    let (a, b) = (layer("src"), layer("src"));
    let one = advance(None, at(1, vec![a.clone()], 5), run("trc_1"), KEEP);
    let two = advance(Some(&one), at(2, vec![a.clone(), b.clone()], 7), run("trc_2"), KEEP);
    let base = |now| Manifest { retention_secs: Some(60), ..Manifest::empty(now) };
    let head = fork(&two, None, base(9), KEEP);
    assert_eq!((head.layers.clone(), head.bytes, head.retention_secs), (vec![a.clone(), b.clone()], 7, Some(60)));
    assert_eq!(head.history.len(), 2);
    let i = two.history.iter().position(|v| v.trace_id == "trc_1").unwrap();
    let early = fork(&two, Some(i), base(9), KEEP);
    assert_eq!((early.layers.clone(), early.bytes), (vec![a.clone()], 5));
    assert_eq!(early.history.len(), 1);
    assert!(early.pool.is_empty(), "b is named by no version of the fork");
    check(&early).unwrap();
    let legacy = at(1, vec![a.clone()], 3);
    let f = fork(&legacy, None, base(9), KEEP);
    assert_eq!((f.layers, f.bytes, f.history.len()), (vec![a], 3, 1));
}

#[test]
fn indices_outside_the_manifest_are_refused() {
    let mut m = advance(None, at(1, vec![layer("t")], 1), run("trc_1"), KEEP);
    m.history[0].layers.push(7);
    assert!(check(&m).unwrap_err().contains("trc_1"));
    let k = ThreadKey::new("ns", "k", "t").unwrap();
    assert!(Manifest::parse(&serde_json::to_vec(&m).unwrap(), &k).is_err());
}
