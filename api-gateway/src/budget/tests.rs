use super::*;

/// The attack: a program printing its output cap of bytes that encode
/// worst (control characters: 6 bytes of JSON each; invalid UTF-8: 3
/// bytes of text each) made a body of ~14× the cap against a
/// reservation of 4×. What a result holds now stays within its share.
#[test]
fn what_a_result_holds_stays_within_its_reservation_whatever_was_printed() {
    let cap = 64 * 1024u64;
    let share = cap * HELD_PER_OUTPUT_BYTE;
    let control = "\u{1}".repeat(cap as usize);
    let invalid = String::from_utf8_lossy(&vec![0xffu8; cap as usize]).into_owned();
    for printed in [control, invalid] {
        let mut text = printed.clone();
        assert!(fit_encoded(&mut text, share), "worst-case output is cut");
        let held = text.len() + serde_json::to_string(&text).unwrap().len();
        assert!(held as u64 <= share, "{held} > {share}");
    }
    // Ordinary output, a JSON document with its quotes, is never cut.
    let doc = r#"{"id": 1, "name": "ada", "tags": ["a", "b"], "path": "C:\\tmp"}"#.repeat((cap / 32) as usize);
    let mut text = doc[..cap as usize].to_string();
    assert!(!fit_encoded(&mut text, share));
    assert_eq!(text.len() as u64, cap);
    assert_eq!(worst_case(cap), 2 * share);
    assert_eq!(stream_share(cap, cap), share, "a stream's share never passes its cap's");
}

/// Reserved as output arrives: a stream's share follows what it kept, and
/// ordinary text (a newline, quotes) fits its share however short.
#[test]
fn a_streams_share_follows_its_output_and_holds_short_text() {
    for text in ["\n", "\"", "a", "{\"k\": \"v\"}\n"] {
        let mut t = text.to_string();
        assert!(!fit_encoded(&mut t, stream_share(text.len() as u64, 1 << 20)), "{text:?} was cut");
    }
    assert_eq!(stream_share(0, 1 << 20), 2);
    assert_eq!(stream_share(u64::MAX, 1 << 20), 3 << 20);
}

const MIB: u64 = 1 << 20;
const NOW: Duration = Duration::ZERO;

#[tokio::test]
async fn reservations_are_bounded_globally_and_per_key_and_returned() {
    let b = OutputBudget::new(100 * MIB);
    let a1 = b.reserve("a", 30 * MIB, NOW).await.unwrap();
    assert_eq!(b.reserved_bytes(), 30 * MIB);
    let e = b.reserve("a", 30 * MIB, NOW).await.unwrap_err();
    assert!(matches!(&e, ExecError::Busy(m) if m.contains("its share")), "{e:?}");
    let b1 = b.reserve("b", 50 * MIB, NOW).await.unwrap();
    let e = b.reserve("c", 40 * MIB, NOW).await.unwrap_err();
    assert!(e.to_string().contains("in use by other executions"), "{e:?}");
    assert_eq!(b.reserved_bytes(), 80 * MIB, "a refused reservation holds nothing");
    assert!(b.reserve("c", 51 * MIB, NOW).await.unwrap_err().to_string().contains("lower maxOutputBytes"));
    drop(a1);
    drop(b1);
    assert_eq!(b.reserved_bytes(), 0);
    let _c = b.reserve("c", 40 * MIB, NOW).await.unwrap();
    let _a = b.reserve("a", 50 * MIB, NOW).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_reservation_waits_for_budget_to_come_back() {
    let b = OutputBudget::new(100 * MIB);
    let first = b.reserve("a", 50 * MIB, NOW).await.unwrap();
    let _second = b.reserve("b", 40 * MIB, NOW).await.unwrap();
    let b2 = b.clone();
    let waiting = tokio::spawn(async move { b2.reserve("c", 20 * MIB, Duration::from_secs(5)).await.map(drop) });
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(first);
    assert!(waiting.await.unwrap().is_ok());
}

/// Spawns a reservation of `mib` for `key` waiting up to a minute, and
/// lets it reach its queue.
async fn waiting(b: &Arc<OutputBudget>, key: &'static str, mib: u64) -> tokio::task::JoinHandle<Result<Reservation, ExecError>> {
    let b2 = b.clone();
    let t = tokio::spawn(async move { b2.reserve(key, mib * MIB, Duration::from_secs(60)).await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    t
}

#[tokio::test(start_paused = true)]
async fn reservations_waiting_for_budget_are_served_in_order() {
    let b = OutputBudget::new(100 * MIB);
    let first = b.reserve("a", 50 * MIB, NOW).await.unwrap();
    let _second = b.reserve("b", 40 * MIB, NOW).await.unwrap();
    let big = waiting(&b, "c", 20).await;
    // 10 MiB are free, enough for the newcomer, but the earlier one is served first.
    let small = waiting(&b, "d", 5).await;
    assert!(!big.is_finished() && !small.is_finished(), "the newcomer does not pass the earlier waiter");
    drop(first);
    let (big, small) = (big.await.unwrap().unwrap(), small.await.unwrap().unwrap());
    assert_eq!((big.bytes(), small.bytes()), (20 * MIB, 5 * MIB));
}

#[tokio::test(start_paused = true)]
async fn a_key_at_its_share_waits_without_holding_up_other_keys() {
    let b = OutputBudget::new(100 * MIB);
    let full = b.reserve("a", 50 * MIB, NOW).await.unwrap();
    let mine = waiting(&b, "a", 10).await;
    let _other = b.reserve("b", 10 * MIB, NOW).await.expect("another key is not held up");
    assert!(!mine.is_finished());
    drop(full);
    assert_eq!(mine.await.unwrap().unwrap().bytes(), 10 * MIB);
}

#[tokio::test(start_paused = true)]
async fn a_growth_that_cannot_be_had_fails_at_its_deadline_and_keeps_what_was_held() {
    let b = OutputBudget::new(100 * MIB);
    let _other = b.reserve("b", 50 * MIB, NOW).await.unwrap();
    let _third = b.reserve("c", 5 * MIB, NOW).await.unwrap();
    let mut r = b.reserve("a", STEP, NOW).await.unwrap();
    r.grow_until(40 * MIB, Instant::now()).await.unwrap();
    let t = Instant::now();
    assert_eq!(r.grow_until(60 * MIB, t + Duration::from_secs(2)).await, Err(Short::KeyShare), "past the key's share");
    assert_eq!(r.grow_until(50 * MIB, t + Duration::from_secs(2)).await, Err(Short::Global), "the budget is taken");
    assert_eq!(t.elapsed(), Duration::from_secs(2), "it waited until its deadline");
    assert_eq!((r.bytes(), b.reserved_bytes()), (40 * MIB, 95 * MIB), "what it held stays, nothing more");
    // The key's share it took for the failed growth went back: its other executions get it.
    drop(b.reserve("a", 5 * MIB, NOW).await.expect("the key's share came back"));
    drop(r);
    assert_eq!(b.reserved_bytes(), 55 * MIB);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_loses_no_budget() {
    let b = OutputBudget::new(100 * MIB);
    let held = b.reserve("a", 50 * MIB, NOW).await.unwrap();
    let _other = b.reserve("b", 50 * MIB, NOW).await.unwrap();
    let gone = waiting(&b, "a", 20).await;
    let gone2 = waiting(&b, "c", 20).await;
    gone.abort();
    gone2.abort();
    let _ = (gone.await, gone2.await);
    drop(held);
    assert_eq!(b.reserved_bytes(), 50 * MIB);
    let _a = b.reserve("a", 50 * MIB, NOW).await.expect("the whole share is free again");
    assert!(b.lock().len() <= 2, "no share is kept for keys without reservations");
}
