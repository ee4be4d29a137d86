use std::time::Duration;

use warren_proto::agent as pb;

use super::*;

fn sandbox(state: &str, status: &str, node: Option<&str>) -> E2bSandbox {
    E2bSandbox {
        id: "sb1".into(),
        namespace: "ns".into(),
        key_name: "k".into(),
        template: "base".into(),
        metadata: Default::default(),
        env: None,
        state: state.into(),
        started_ms: 0,
        end_ms: i64::MAX,
        auto_pause: false,
        node: node.map(str::to_string),
        status: status.into(),
        reason: String::new(),
        live_ms: 1,
        public_ports: false,
    }
}

fn live_ref(id: &str) -> Option<pb::LiveRef> {
    Some(pb::LiveRef { r#ref: Some(pb::ThreadRef { namespace: "ns".into(), key_name: "k".into(), thread_id: id.into() }) })
}

fn report(live: &[(&str, u64, u32)], ended: &[(&str, &str)]) -> Option<Heard> {
    Some(Heard::Status(Box::new(pb::StatusResponse {
        live: live.iter().map(|(id, idle_ms, busy)| pb::LiveSummary { live: live_ref(id), idle_ms: *idle_ms, busy: *busy }).collect(),
        live_ended: ended.iter().map(|(id, why)| pb::LiveEnded { live: live_ref(id), reason: (*why).into() }).collect(),
        reports_live: true,
        ..Default::default()
    })))
}

#[test]
fn statuses_follow_banata_s_names() {
    assert_eq!(status_of(&sandbox("running", "", None), None), Status::Queued);
    assert_eq!(status_of(&sandbox("running", "", Some("n")), None), Status::Ready);
    assert_eq!(status_of(&sandbox("running", "", Some("n")), Some(0)), Status::Ready);
    assert_eq!(status_of(&sandbox("running", "", Some("n")), Some(2)), Status::Active);
    assert_eq!(status_of(&sandbox("running", "pausing", Some("n")), Some(2)), Status::Pausing);
    assert_eq!(status_of(&sandbox("paused", "", None), None), Status::Paused);
    assert_eq!(status_of(&sandbox("paused", "failed", None), None), Status::Failed);
}

#[test]
fn a_sandbox_its_node_still_runs_is_kept_until_idle_past_its_key_s_limit() {
    let s = sandbox("running", "", Some("n"));
    assert_eq!(verdict(&s, "n", report(&[("sb1", 29_999, 0)], &[]), 30), Verdict::Keep);
    assert_eq!(verdict(&s, "n", report(&[("sb1", 30_000, 0)], &[]), 30), Verdict::Idle(30));
    assert_eq!(verdict(&s, "n", report(&[("sb1", 10_000_000, 0)], &[]), 0), Verdict::Keep, "no limit, never idle-paused");
    // Another key's sandbox of the same id is not this one.
    let other = Some(Heard::Status(Box::new(pb::StatusResponse {
        live: vec![pb::LiveSummary { live: Some(pb::LiveRef { r#ref: Some(pb::ThreadRef { namespace: "ns".into(), key_name: "other".into(), thread_id: "sb1".into() }) }), idle_ms: 0, busy: 0 }],
        reports_live: true,
        ..Default::default()
    })));
    assert!(matches!(verdict(&s, "n", other, 30), Verdict::Failed(_)));
}

#[test]
fn an_agent_older_than_its_live_report_is_no_evidence_of_loss() {
    let s = sandbox("running", "", Some("n"));
    let old = Some(Heard::Status(Box::new(pb::StatusResponse::default())));
    assert_eq!(verdict(&s, "n", old, 30), Verdict::Keep, "an empty report from an old agent fails nothing (a rolling upgrade)");
}

#[test]
fn a_sandbox_its_node_lost_has_failed_with_the_node_s_reason() {
    let s = sandbox("running", "", Some("n"));
    let Verdict::Failed(why) = verdict(&s, "n", report(&[], &[("sb1", "died")]), 0) else { panic!() };
    assert!(why.contains("died on node n"), "{why}");
    let Verdict::Failed(why) = verdict(&s, "n", report(&[], &[]), 0) else { panic!() };
    assert!(why.contains("no longer runs it"), "{why}");
    let Verdict::Failed(why) = verdict(&s, "n", None, 0) else { panic!() };
    assert!(why.contains("gone from the cluster"), "{why}");
}

#[test]
fn a_silent_node_is_waited_for_until_it_is_lost() {
    let s = sandbox("running", "", Some("n"));
    assert_eq!(verdict(&s, "n", Some(Heard::NotYet), 0), Verdict::Keep, "no report since it went live: nothing is known");
    assert_eq!(verdict(&s, "n", Some(Heard::Silent(LOST_AFTER - Duration::from_millis(1))), 0), Verdict::Keep, "a late status check is not a dead node");
    let Verdict::Failed(why) = verdict(&s, "n", Some(Heard::Silent(LOST_AFTER)), 0) else { panic!() };
    assert!(why.contains("stopped answering"), "{why}");
}
