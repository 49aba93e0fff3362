//! Per-uid back-off after a lossless lease eviction (ADR 0024): a uid whose
//! lossless reader kept the producer waiting past the lease is refused
//! lossless for a while, longer each time, so that a peer that reconnects
//! after every eviction costs the producer one lease per back-off, not one
//! per connection.
//!
//! Pure bookkeeping: every call is given the time, so the schedule is
//! tested with an injected clock.

use std::time::{Duration, Instant};

use crate::ring::LosslessBackoff;

/// Most uids remembered at once. Only the kernel hands out uids (they come
/// from `SO_PEERCRED`), so a peer cannot make up new ones; the cap keeps
/// the map small however many uids a host has. When it is full, the uid
/// whose back-off ends first makes room.
pub(crate) const MAX_BACKOFF_UIDS: usize = 64;

/// One uid's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Record {
    uid: u32,
    /// Lease evictions counted against it (its strikes), at least 1.
    strikes: u32,
    /// Refused lossless until then.
    until: Instant,
}

/// A uid refused lossless: for how long yet, and after how many strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused {
    /// Time left of the back-off.
    pub(crate) left: Duration,
    /// Lease evictions counted against the uid.
    pub(crate) strikes: u32,
}

/// The strikes of every uid whose lossless reader was evicted for the
/// lease, bounded by [`MAX_BACKOFF_UIDS`].
#[derive(Debug)]
pub(crate) struct Strikes {
    cfg: Option<LosslessBackoff>,
    records: Vec<Record>,
}

impl Strikes {
    /// No strikes yet; `cfg` `None` never refuses.
    pub(crate) fn new(cfg: Option<LosslessBackoff>) -> Strikes {
        Strikes {
            cfg,
            records: Vec::new(),
        }
    }

    /// The back-off after `strikes` strikes: `base`, doubled per strike
    /// after the first, at most `cap`.
    fn backoff(cfg: &LosslessBackoff, strikes: u32) -> Duration {
        let doublings = strikes.saturating_sub(1).min(31);
        cfg.base.saturating_mul(1 << doublings).min(cfg.cap)
    }

    /// Whether `r`'s strikes are forgotten at `now`: its back-off ended
    /// `quiet` ago or more.
    fn forgotten(cfg: &LosslessBackoff, r: &Record, now: Instant) -> bool {
        now.saturating_duration_since(r.until) >= cfg.quiet
    }

    /// Counts a lease eviction against `uid` at `now` (once per eviction
    /// round, however many of its readers went): returns its strikes and
    /// back-off, or `None` when back-off is off.
    pub(crate) fn strike(&mut self, uid: u32, now: Instant) -> Option<(u32, Duration)> {
        let cfg = self.cfg?;
        let strikes = match self.records.iter().position(|r| r.uid == uid) {
            Some(k) => {
                let r = self.records[k];
                if Self::forgotten(&cfg, &r, now) {
                    self.records.swap_remove(k);
                    1
                } else {
                    self.records.swap_remove(k);
                    r.strikes.saturating_add(1)
                }
            }
            None => 1,
        };
        if self.records.len() >= MAX_BACKOFF_UIDS {
            // Make room: the forgotten first, else the back-off that ends
            // first.
            self.records.retain(|r| !Self::forgotten(&cfg, r, now));
            if self.records.len() >= MAX_BACKOFF_UIDS {
                if let Some(k) = (0..self.records.len()).min_by_key(|&k| self.records[k].until) {
                    self.records.swap_remove(k);
                }
            }
        }
        let backoff = Self::backoff(&cfg, strikes);
        self.records.push(Record {
            uid,
            strikes,
            until: now + backoff,
        });
        Some((strikes, backoff))
    }

    /// Whether `uid` is refused lossless at `now`, and for how long yet.
    pub(crate) fn refused(&self, uid: u32, now: Instant) -> Option<Refused> {
        self.cfg?;
        let r = self.records.iter().find(|r| r.uid == uid)?;
        (now < r.until).then(|| Refused {
            left: r.until - now,
            strikes: r.strikes,
        })
    }

    /// uids remembered now (forgotten ones included until they make room).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.records.len()
    }
}

/// The Reject reason for a uid refused lossless (at most 120 bytes, the
/// notice's reason field).
pub(crate) fn reason(uid: u32, r: Refused) -> String {
    // Clipped so the longest uid still fits (a back-off of 99999 s, more
    // than a day, reads as at least that).
    let secs = (r.left.as_secs_f64().ceil() as u64).min(99_999);
    let strikes = r.strikes.min(999);
    format!("lossless refused to uid {uid} for {secs} s: it stalled the producer past the lease ({strikes}x); retry later or lossy")
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: LosslessBackoff = LosslessBackoff {
        base: Duration::from_secs(10),
        cap: Duration::from_secs(60),
        quiet: Duration::from_secs(300),
    };

    /// The schedule: refused for `base` after the first strike, doubled per
    /// strike up to the cap; free again once it ends; strikes forgotten
    /// after a quiet spell.
    #[test]
    fn backoff_doubles_per_strike_up_to_the_cap_and_is_forgotten_after_quiet() {
        let t0 = Instant::now();
        let s = |n: u64| Duration::from_secs(n);
        let mut b = Strikes::new(Some(CFG));
        assert_eq!(b.refused(1000, t0), None, "no strike, no refusal");
        assert_eq!(b.strike(1000, t0), Some((1, s(10))));
        assert_eq!(b.refused(1000, t0 + s(4)), Some(Refused { left: s(6), strikes: 1 }));
        assert_eq!(b.refused(1001, t0 + s(4)), None, "another uid is not refused");
        assert_eq!(b.refused(1000, t0 + s(10)), None, "free once the back-off ends");
        // Strikes while the uid keeps coming back: 20, 40, then the cap.
        let mut now = t0 + s(10);
        for (n, want) in [(2, 20), (3, 40), (4, 60), (5, 60)] {
            assert_eq!(b.strike(1000, now), Some((n, s(want))), "strike {n}");
            assert!(b.refused(1000, now + s(want) - Duration::from_millis(1)).is_some());
            assert_eq!(b.refused(1000, now + s(want)), None);
            now += s(want);
        }
        // Quiet for less than `quiet` after the back-off ended: remembered.
        assert_eq!(b.strike(1000, now + s(299)), Some((6, s(60))));
        now += s(299) + s(60);
        // Quiet for `quiet`: forgotten, back to the base.
        assert_eq!(b.strike(1000, now + s(300)), Some((1, s(10))));
    }

    /// Off: never refuses, remembers nothing.
    #[test]
    fn backoff_off_refuses_nobody() {
        let t0 = Instant::now();
        let mut b = Strikes::new(None);
        assert_eq!(b.strike(7, t0), None);
        assert_eq!(b.refused(7, t0), None);
        assert_eq!(b.len(), 0);
    }

    /// The map never holds more than its cap; the uid whose back-off ends
    /// first makes room, a newly struck uid is always remembered.
    #[test]
    fn backoff_map_is_bounded() {
        let t0 = Instant::now();
        let mut b = Strikes::new(Some(CFG));
        for uid in 0..(MAX_BACKOFF_UIDS as u32 * 4) {
            b.strike(uid, t0 + Duration::from_millis(u64::from(uid)));
            assert!(b.len() <= MAX_BACKOFF_UIDS);
            assert!(b.refused(uid, t0 + Duration::from_millis(u64::from(uid))).is_some());
        }
        assert_eq!(b.len(), MAX_BACKOFF_UIDS);
        assert_eq!(b.refused(0, t0 + Duration::from_secs(1)), None, "the oldest made room");
    }

    /// The reason fits the notice's 120 bytes in the worst case and says
    /// who, how long, why and what to do.
    #[test]
    fn backoff_reason_fits_a_notice() {
        let worst = reason(
            u32::MAX,
            Refused {
                left: Duration::from_secs(99_999_999),
                strikes: u32::MAX,
            },
        );
        assert!(worst.len() <= 120, "{} bytes: {worst}", worst.len());
        let r = reason(
            1000,
            Refused {
                left: Duration::from_millis(19_200),
                strikes: 2,
            },
        );
        assert_eq!(
            r,
            "lossless refused to uid 1000 for 20 s: it stalled the producer past the lease (2x); retry later or lossy"
        );
    }
}
