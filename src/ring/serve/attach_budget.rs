//! The attach rate in the service loop: the token bucket and the queue of push
//! Attaches waiting for a token, first come first served.

use std::time::{Duration, Instant};

use crate::ring::AttachRate;
use crate::socket::msg::Attach;
use crate::socket::PeerFd;

/// A checked Attach waiting for the attach rate, with its descriptors.
pub(super) struct Waiting {
    /// Its place in the order of arrival.
    pub(super) arrival: u64,
    pub(super) attach: Attach,
    pub(super) fds: Vec<PeerFd>,
}

/// The attach rate's state in the service loop: the bucket, and which
/// waiting Attach goes next (first come, first served).
pub(super) struct Attaches {
    pub(super) budget: AttachBudget,
    /// Arrivals so far (the next waiting Attach's `arrival`).
    pub(super) arrivals: u64,
    /// The oldest waiting Attach's `arrival` at the start of this turn:
    /// only it may take a token this turn, and a new Attach queues behind
    /// it.
    pub(super) first: Option<u64>,
}

/// The attach rate's token bucket ([`AttachRate`]); `None` inside: no bound.
pub(super) struct AttachBudget {
    rate: Option<AttachRate>,
    tokens: u32,
    /// When the last token was added (or the bucket was last full).
    refilled: Instant,
}

impl AttachBudget {
    pub(super) fn new(rate: Option<AttachRate>, now: Instant) -> AttachBudget {
        AttachBudget {
            rate,
            tokens: rate.map_or(0, |r| r.burst),
            refilled: now,
        }
    }

    fn interval(r: AttachRate) -> Duration {
        // Rounded up, so that no rate makes it zero.
        Duration::from_nanos(1_000_000_000u64.div_ceil(u64::from(r.per_second.max(1))))
    }

    fn refill(&mut self, now: Instant) {
        let Some(r) = self.rate else { return };
        if self.tokens >= r.burst {
            self.refilled = now;
            return;
        }
        let every = Self::interval(r);
        let due = now.saturating_duration_since(self.refilled).as_nanos() / every.as_nanos().max(1);
        let add = u32::try_from(due).unwrap_or(u32::MAX);
        if add > 0 {
            self.tokens = self.tokens.saturating_add(add).min(r.burst);
            self.refilled = if self.tokens >= r.burst {
                now
            } else {
                self.refilled + every * add
            };
        }
    }

    /// Takes a token if there is one at `now`.
    pub(super) fn take(&mut self, now: Instant) -> bool {
        if self.rate.is_none() {
            return true;
        }
        self.refill(now);
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }

    /// How long from `now` until the next token (zero when one is there).
    pub(super) fn next_in(&self, now: Instant) -> Duration {
        match self.rate {
            Some(r) if self.tokens == 0 => (self.refilled + Self::interval(r)).saturating_duration_since(now),
            _ => Duration::ZERO,
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::ring::ServeConfig;

    #[test]
    fn the_attach_budget_serves_a_burst_then_one_per_interval_and_never_stores_more_than_the_burst() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut b = AttachBudget::new(
            Some(AttachRate {
                per_second: 10,
                burst: 3,
            }),
            t0,
        );
        // The burst, at once; then nothing until a token has come.
        assert!((0..3).all(|_| b.take(t0)));
        assert!(!b.take(t0));
        assert_eq!(b.next_in(t0), ms(100));
        assert_eq!(b.next_in(t0 + ms(40)), ms(60));
        assert!(!b.take(t0 + ms(99)));
        assert!(b.take(t0 + ms(100)));
        assert!(!b.take(t0 + ms(150)));
        // Two intervals later, two tokens; the third waits for its own.
        assert!(b.take(t0 + ms(300)));
        assert!(b.take(t0 + ms(300)));
        assert!(!b.take(t0 + ms(300)));
        assert_eq!(b.next_in(t0 + ms(300)), ms(100));
        // A long quiet spell fills the bucket to the burst, no further.
        let later = t0 + Duration::from_secs(60);
        assert!((0..3).all(|_| b.take(later)));
        assert!(!b.take(later));
    }

    #[test]
    fn a_zero_attach_rate_or_burst_is_refused_with_a_sentence() {
        for (per_second, burst) in [(0, 4), (4, 0)] {
            let c = ServeConfig {
                attach_rate: Some(AttachRate { per_second, burst }),
                ..ServeConfig::default()
            };
            let e = c.validate().unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{e:?}");
            assert!(e.to_string().contains("attach rate"), "{e}");
        }
        let unbounded = ServeConfig {
            attach_rate: None,
            ..ServeConfig::default()
        };
        unbounded.validate().unwrap();
        ServeConfig::default().validate().unwrap();
    }

    #[test]
    fn a_rate_above_a_billion_a_second_still_has_a_nonzero_interval() {
        let r = AttachRate {
            per_second: u32::MAX,
            burst: 1,
        };
        assert_eq!(AttachBudget::interval(r), Duration::from_nanos(1));
        let t0 = Instant::now();
        let mut b = AttachBudget::new(Some(r), t0);
        assert!(b.take(t0));
        assert!(!b.take(t0));
        assert_eq!(b.next_in(t0), Duration::from_nanos(1));
        assert!(b.take(t0 + Duration::from_nanos(1)));
    }

    #[test]
    fn no_rate_means_every_attach_is_served_at_once() {
        let t0 = Instant::now();
        let mut b = AttachBudget::new(None, t0);
        assert!((0..10_000).all(|_| b.take(t0)));
        assert_eq!(b.next_in(t0), Duration::ZERO);
    }
}
