use std::time::Duration;

use super::*;

#[test]
fn a_key_gets_its_limit_and_each_slot_returns_on_drop() {
    let slots = Arc::new(KeySlots::default());
    let a = slots.hold("team/k", 2).unwrap();
    let b = slots.hold("team/k", 2).unwrap();
    assert_eq!((a.held(), b.held()), (1, 2));
    assert_eq!(slots.hold("team/k", 2).unwrap_err(), KeySlotError::AtLimit(2));
    assert!(slots.hold("team/other", 1).is_ok(), "keys are counted apart");
    drop(a);
    let c = slots.hold("team/k", 2).unwrap();
    drop((b, c));
    assert_eq!((slots.held("team/k"), slots.total()), (0, 0), "nothing is left behind");
}

#[test]
fn a_lowered_limit_refuses_new_slots_until_enough_returned() {
    let slots = Arc::new(KeySlots::default());
    let held: Vec<_> = (0..3).map(|_| slots.hold("team/k", 3).unwrap()).collect();
    assert_eq!(slots.hold("team/k", 1).unwrap_err(), KeySlotError::AtLimit(1));
    drop(held);
    assert!(slots.hold("team/k", 1).is_ok());
}

#[test]
fn malformed_requests_hold_nothing() {
    let slots = Arc::new(KeySlots::default());
    for key in ["", "k", "/k", "team/", "Team/k", "team/k/x", "team/k\n", &format!("team/{}", "a".repeat(400))] {
        assert_eq!(slots.hold(key, 1).unwrap_err(), KeySlotError::Key, "{key:?}");
    }
    assert_eq!(slots.hold("team/k", 0).unwrap_err(), KeySlotError::Limit);
    assert_eq!(slots.hold("team/k", MAX_LIMIT + 1).unwrap_err(), KeySlotError::Limit);
    assert_eq!(slots.total(), 0);
}

/// Spawns a request for a slot of `team/k` under `limit` that waits up to
/// a minute, and lets it reach the queue.
async fn waiter(slots: &Arc<KeySlots>, limit: u32) -> tokio::task::JoinHandle<Result<KeySlot, KeySlotError>> {
    let s = slots.clone();
    let before = slots.waiting();
    let task = tokio::spawn(async move { s.hold_within("team/k", limit, Duration::from_secs(60)).await });
    while slots.waiting() == before {
        tokio::task::yield_now().await;
    }
    task
}

#[tokio::test(start_paused = true)]
async fn a_key_at_its_limit_waits_in_order_for_a_returned_slot() {
    let slots = Arc::new(KeySlots::default());
    let first = slots.hold_within("team/k", 1, Duration::from_secs(60)).await.unwrap();
    let (w1, w2) = (waiter(&slots, 1).await, waiter(&slots, 1).await);
    assert_eq!(slots.waiting(), 2);
    drop(first);
    let one = w1.await.unwrap().unwrap();
    assert_eq!((one.held(), slots.held("team/k"), slots.waiting()), (1, 1, 1), "the oldest waiter got the returned slot; the other still waits");
    assert!(!w2.is_finished());
    drop(one);
    let two = w2.await.unwrap().unwrap();
    drop(two);
    assert_eq!((slots.total(), slots.waiting()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_newcomer_never_takes_a_slot_before_an_earlier_waiter() {
    let slots = Arc::new(KeySlots::default());
    let held = slots.hold("team/k", 2).unwrap();
    let held2 = slots.hold("team/k", 2).unwrap();
    // A waiter under a lower limit (the key's limit was lowered) keeps its
    // place: a slot freed under the old limit does not go to a newcomer.
    let low = waiter(&slots, 1).await;
    drop(held2);
    assert_eq!(slots.hold("team/k", 2).unwrap_err(), KeySlotError::AtLimit(2), "a newcomer queues behind the waiter");
    drop(held);
    assert_eq!(low.await.unwrap().unwrap().held(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gives_up_at_its_wait_and_holds_nothing() {
    let slots = Arc::new(KeySlots::default());
    let _held = slots.hold("team/k", 1).unwrap();
    let t = tokio::time::Instant::now();
    let refused = slots.hold_within("team/k", 1, Duration::from_secs(3)).await;
    assert_eq!(refused.unwrap_err(), KeySlotError::AtLimit(1));
    assert_eq!(t.elapsed(), Duration::from_secs(3), "it waited its whole wait");
    assert_eq!((slots.held("team/k"), slots.waiting()), (1, 0));
    // An absurd wait is bounded.
    let refused = slots.hold_within("team/k", 1, Duration::from_secs(86_400)).await;
    assert!(refused.is_err());
    assert!(t.elapsed() <= Duration::from_secs(3) + MAX_WAIT);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_leaves_the_queue_and_no_slot_is_lost() {
    let slots = Arc::new(KeySlots::default());
    let held = slots.hold("team/k", 1).unwrap();
    let gone = waiter(&slots, 1).await;
    let next = waiter(&slots, 1).await;
    gone.abort();
    let _ = gone.await;
    assert_eq!(slots.waiting(), 1, "the cancelled call left the queue");
    drop(held);
    let slot = next.await.unwrap().unwrap();
    assert_eq!(slots.held("team/k"), 1);
    drop(slot);
    assert_eq!((slots.total(), slots.waiting()), (0, 0), "nothing is left behind");
}

#[tokio::test(start_paused = true)]
async fn without_a_wait_a_key_at_its_limit_is_refused_at_once() {
    let slots = Arc::new(KeySlots::default());
    let _held = slots.hold("team/k", 1).unwrap();
    let t = tokio::time::Instant::now();
    assert_eq!(slots.hold_within("team/k", 1, Duration::ZERO).await.unwrap_err(), KeySlotError::AtLimit(1));
    assert_eq!((t.elapsed(), slots.waiting()), (Duration::ZERO, 0));
}
