//! How Warren's watches of the API server wait after an error: the
//! operator's controllers and the gateway's published-key and agent watches.

use std::time::Duration;

/// The pause after a watch error: 250 ms, doubling to at most 2 s, back to
/// 250 ms after a success.
///
/// kube-runtime's default (up to 30 s per error) made Warren slow to come
/// back after an API server outage: a controller shares one backoff between
/// all its watches, so the ApiKey controller, with six, took minutes, one
/// expired watch after another; and a gateway's watch of published keys
/// could sit out 30 s after the server was back (both found by an outage
/// test, kube-envtest's API server stopped for a minute). Short pauses
/// bring every watch back within seconds and still bound the load on a
/// server that is down: each watch retries at most every 2 s.
#[derive(Debug, Default)]
pub struct ShortBackoff {
    next: Duration,
}

impl ShortBackoff {
    const FIRST: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(2);
}

impl Iterator for ShortBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let pause = self.next.max(Self::FIRST);
        self.next = (pause * 2).min(Self::MAX);
        Some(pause)
    }
}

impl kube::runtime::utils::Backoff for ShortBackoff {
    fn reset(&mut self) {
        self.next = Duration::ZERO;
    }
}

#[cfg(test)]
mod tests {
    use super::ShortBackoff;
    use kube::runtime::utils::Backoff as _;
    use std::time::Duration;

    #[test]
    fn pauses_stay_short_and_restart_after_a_success() {
        let mut b = ShortBackoff::default();
        let ms = |b: &mut ShortBackoff| b.next().unwrap().as_millis();
        assert_eq!([ms(&mut b), ms(&mut b), ms(&mut b), ms(&mut b), ms(&mut b)], [250, 500, 1000, 2000, 2000]);
        b.reset();
        assert_eq!(b.next(), Some(Duration::from_millis(250)));
    }
}
