//! The producer's bounded wait for lossless readers, with eviction past the
//! lease: one implementation for the frame [`crate::Publisher`] and the
//! [`crate::packet::PacketPublisher`].
//!
//! One deadline per frame (or packet) for all lossless readers together
//! (ADR 0024): readers that stall at once cost the producer one lease, not
//! one each, and every uid evicted for it is refused lossless for a while
//! (`serve::backoff`), so one that reconnects after each eviction cannot
//! hold the producer one lease in every few. At that deadline the peer's
//! other lossless readers that stalled through the whole lease go too,
//! holding the frame or not: a peer costs one lease, not one per frame
//! its connections joined at.

use std::time::{Duration, Instant};

use super::serve::Served;
use super::table::Blocker;
use crate::error::{Error, Result};
use crate::layout::EVICT_LEASE;
use crate::sync::atomic::Ordering;

/// A lossless reader the producer must wait for, as `holder` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holder {
    /// The reader, as the table found it.
    pub(crate) blocker: Blocker,
    /// What the lease is measured on: a seq of the producer's own (the
    /// frame held, the packet about to be written), never a value the
    /// reader controls, so a reader cannot restart its lease by moving its
    /// cursor back and forth.
    pub(crate) key: u64,
    /// The seq reported in [`Error::LosslessBlocked`].
    pub(crate) held_seq: u64,
}

/// The frame or packet the producer is waiting to overwrite, and since
/// when: the lease is measured across calls, so readers that keep the
/// producer waiting through several timed-out loans or writes are still
/// evicted.
#[derive(Debug, Default)]
pub(crate) struct LosslessGate {
    blocked: Option<Stall>,
}

/// A wait on one key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stall {
    key: u64,
    since: Instant,
    /// Every lossless reader's (index, generation, cursor) when the wait
    /// began: at the deadline, a struck peer's readers whose cursor has
    /// not moved since, and is behind, stalled through the whole lease.
    cursors: Vec<(usize, u32, u64)>,
}

impl LosslessGate {
    /// Waits until `holder()` names no lossless reader, at most `timeout`.
    ///
    /// The lease runs per frame (per key), for all lossless readers
    /// together: it starts when the producer first waits on the key, and at
    /// its end every lossless reader still holding the key is evicted at
    /// once (one deadline, however many readers), then the wait goes on
    /// without them. `holder` must name the first reader that holds the
    /// key and, once that one is evicted, the next (it reads the table
    /// again, which no longer has the evicted ones as `ACTIVE`). Calls
    /// that had to wait are counted in the service state's
    /// `lossless_waits`; deadlines that evicted in its `lease_deadlines`;
    /// each uid evicted at a deadline gets one strike of back-off.
    ///
    /// # Errors
    /// [`Error::LosslessBlocked`] when `timeout` runs out first.
    ///
    /// `newest` is the newest frame or packet published: a reader whose
    /// cursor is there is caught up, not stalled.
    pub(crate) fn wait<S: Served>(
        &mut self,
        sh: &S,
        timeout: Duration,
        newest: u64,
        mut holder: impl FnMut() -> Option<Holder>,
    ) -> Result<()> {
        let lease = sh.serve_config().lossless_lease;
        let start = Instant::now();
        let mut counted = false;
        loop {
            let Some(h) = holder() else {
                self.blocked = None;
                return Ok(());
            };
            if !counted {
                // Relaxed: a counter for stats.
                sh.state().lossless_waits.fetch_add(1, Ordering::Relaxed);
                counted = true;
            }
            // The lease of a key the producer is still waiting on goes on
            // (a timed-out loan retries the same key); a new key starts
            // its lease when this call began to wait on it.
            let since = match &self.blocked {
                Some(b) if b.key == h.key => b.since,
                _ => {
                    let cursors = sh
                        .table()
                        .lossless_readers(newest)
                        .iter()
                        .map(|r| (r.index, r.generation, r.released))
                        .collect();
                    self.blocked = Some(Stall {
                        key: h.key,
                        since: start,
                        cursors,
                    });
                    start
                }
            };
            if since.elapsed() >= lease {
                self.evict_holders(sh, h, newest, &mut holder);
                continue;
            }
            if start.elapsed() >= timeout {
                let k = h.blocker.index;
                return Err(Error::LosslessBlocked {
                    index: k as u32,
                    name: sh.table().entry(k).map(|e| e.name()).unwrap_or_default(),
                    held_seq: h.held_seq,
                    waited: start.elapsed(),
                });
            }
            // The lossless reader is a whole ring behind; it reads at stream
            // rate, so a short sleep costs nothing and spares a core.
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// The deadline of `first.key`: evicts `first` and every other reader
    /// `holder` names that still holds the same key, in one round (at most
    /// one pass over the table), then the other lossless readers of the
    /// same uids that stalled through the whole lease (cursor unmoved since
    /// the wait began, and behind `newest`); counts the deadline and gives
    /// each uid evicted one strike.
    fn evict_holders<S: Served>(
        &mut self,
        sh: &S,
        first: Holder,
        newest: u64,
        holder: &mut impl FnMut() -> Option<Holder>,
    ) {
        let stall = self.blocked.take();
        let key = first.key;
        let mut uids: Vec<u32> = Vec::new();
        let mut next = Some(first);
        // An entry freed or reassigned meanwhile is skipped (`evict` finds
        // it changed); the bound keeps such races from looping.
        for _ in 0..sh.table().entries().len() {
            let Some(h) = next.filter(|h| h.key == key) else {
                break;
            };
            if self.evict(sh, &h) && !uids.contains(&h.blocker.uid) {
                uids.push(h.blocker.uid);
            }
            next = holder();
        }
        if uids.is_empty() {
            return;
        }
        // The same peers' readers that joined at later frames and never
        // moved: they would each hold the producer for a lease of their own.
        let before = stall.map(|s| s.cursors).unwrap_or_default();
        for r in sh.table().lossless_readers(newest) {
            let unmoved = before.contains(&(r.index, r.generation, r.released));
            if unmoved && r.released < newest && uids.contains(&r.uid) {
                let h = Holder {
                    blocker: r,
                    key,
                    held_seq: r.released.saturating_add(1),
                };
                self.evict(sh, &h);
            }
        }
        // Relaxed: a counter for stats.
        sh.state().lease_deadlines.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut strikes = match sh.state().strikes.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        for uid in uids {
            if let Some((n, backoff)) = strikes.strike(uid, now) {
                tracing::warn!(
                    uid,
                    strikes = n,
                    ?backoff,
                    "refusing lossless to a uid whose reader kept the producer waiting past the lease"
                );
            }
        }
    }

    /// Evicts the holder through the table and has the service send
    /// `Evicted` and close the connection; returns whether it was evicted.
    /// Nothing happens if the entry changed hands meanwhile (the service
    /// freed or reassigned it).
    fn evict<S: Served>(&mut self, sh: &S, h: &Holder) -> bool {
        let k = h.blocker.index;
        if !sh.table().evict(k, h.blocker.generation, EVICT_LEASE) {
            return false;
        }
        let name = sh.table().entry(k).map(|e| e.name()).unwrap_or_default();
        tracing::warn!(index = k, name = %name, "evicting a lossless subscriber that kept the producer waiting past the lease");
        // Relaxed: a counter for stats (the service counts too).
        sh.producer().evictions.fetch_add(1, Ordering::Relaxed);
        sh.state().request_eviction(k, h.blocker.generation, EVICT_LEASE);
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::os::fd::BorrowedFd;

    use super::*;
    use crate::layout::{ProducerLine, SUBF_LOSSLESS, SUB_ACTIVE, SUB_EVICTED};
    use crate::ring::serve::ServiceState;
    use crate::ring::table::{Assigned, Table};
    use crate::ring::ServeConfig;
    use crate::socket::msg::{Hello, Welcome};

    /// The gate's view of a publisher: a table, counters, no service.
    struct Fake {
        producer: ProducerLine,
        table: Table,
        cfg: ServeConfig,
        state: ServiceState,
    }

    impl Served for Fake {
        fn producer(&self) -> &ProducerLine {
            &self.producer
        }
        fn table(&self) -> &Table {
            &self.table
        }
        fn serve_config(&self) -> &ServeConfig {
            &self.cfg
        }
        fn state(&self) -> &ServiceState {
            &self.state
        }
        fn refuse(&self, _: &Hello, _: u32) -> Option<(u32, String)> {
            None
        }
        fn entry_flags(&self, _: &Hello) -> u32 {
            SUBF_LOSSLESS
        }
        fn lossless_start(&self) -> u64 {
            0
        }
        fn welcome(&self, _: &Assigned, _: &Hello) -> (Welcome, BorrowedFd<'_>, Option<BorrowedFd<'_>>) {
            unreachable!("the gate sends no Welcome")
        }
    }

    fn fake(lease: Duration) -> Fake {
        let cfg = ServeConfig {
            lossless_lease: lease,
            ..ServeConfig::default()
        };
        Fake {
            // SAFETY: `ProducerLine` is `repr(C)` of atomic integers only,
            // for which all-zero bytes are a valid value.
            producer: unsafe { std::mem::zeroed() },
            table: Table::create("vramring-test-gate", 8, 1).expect("table"),
            state: ServiceState::new(&cfg).expect("service state"),
            cfg,
        }
    }

    /// Readers (uid, cursor) joined to `f`'s table.
    fn join(f: &Fake, readers: &[(u32, u64)]) -> Vec<Assigned> {
        readers
            .iter()
            .map(|&(uid, at)| {
                f.table
                    .assign(SUBF_LOSSLESS, "r", &|| at, uid)
                    .expect("client region")
                    .expect("free entry")
            })
            .collect()
    }

    fn state(f: &Fake, a: &Assigned) -> u32 {
        // Relaxed: the test's own thread wrote it.
        f.table
            .entry(a.index as usize)
            .expect("entry")
            .state
            .load(Ordering::Relaxed)
    }

    /// Several readers holding the frame the producer waits for are all
    /// evicted at its one deadline; a reader past it is not. The deadline
    /// counts once and each uid gets one strike, however many of its readers
    /// went.
    #[test]
    fn every_holder_of_the_key_is_evicted_at_one_deadline() {
        let lease = Duration::from_secs(3600);
        let f = fake(lease);
        let readers = join(&f, &[(7, 3), (7, 4), (8, 2), (9, 6)]);
        let (newest, held) = (10, 5);
        // The producer has waited on `held` for a whole lease already
        // (earlier timed-out loans): this wait finds the deadline passed.
        let Some(began) = Instant::now().checked_sub(lease) else {
            return; // a clock younger than an hour: nothing to inject
        };
        let mut gate = LosslessGate {
            blocked: Some(Stall {
                key: held,
                since: began,
                cursors: f
                    .table
                    .lossless_readers(newest)
                    .iter()
                    .map(|r| (r.index, r.generation, r.released))
                    .collect(),
            }),
        };
        // No time to wait: every holder must go at the one deadline, or
        // the wait times out on the next.
        gate.wait(&f, Duration::ZERO, newest, || {
            f.table.holder(newest, |r| r < held).map(|blocker| Holder {
                blocker,
                key: held,
                held_seq: held,
            })
        })
        .expect("the wait ends once the holders are evicted");
        let states: Vec<u32> = readers.iter().map(|a| state(&f, a)).collect();
        assert_eq!(states, [SUB_EVICTED, SUB_EVICTED, SUB_EVICTED, SUB_ACTIVE]);
        // Relaxed: counters, this thread's.
        assert_eq!(f.producer.evictions.load(Ordering::Relaxed), 3);
        assert_eq!(f.state.lease_deadlines.load(Ordering::Relaxed), 1);
        let strikes = f.state.strikes.lock().expect("strikes");
        let now = Instant::now();
        assert_eq!(
            strikes.refused(7, now).map(|r| r.strikes),
            Some(1),
            "one strike for two readers"
        );
        assert_eq!(strikes.refused(8, now).map(|r| r.strikes), Some(1));
        assert_eq!(
            strikes.refused(9, now),
            None,
            "a reader that held nothing is not struck"
        );
        drop(strikes);
        let requests = f.state.evict_requests.lock().expect("requests");
        assert_eq!(requests.len(), 3, "the service is asked to tell each one");
    }

    /// At a deadline the struck peer's other lossless readers that never
    /// moved through the lease go too, though they hold a later frame (they
    /// would each cost the producer a lease of their own); one of its
    /// readers that is caught up stays, and so does another peer's stalled
    /// reader that held nothing yet.
    #[test]
    fn a_struck_peers_readers_stalled_at_later_frames_go_at_the_same_deadline() {
        let lease = Duration::from_secs(3600);
        let f = fake(lease);
        let readers = join(&f, &[(7, 3), (7, 7), (7, 10), (8, 7)]);
        let (newest, held) = (10, 5);
        let Some(began) = Instant::now().checked_sub(lease) else {
            return; // a clock younger than an hour: nothing to inject
        };
        let cursors = f
            .table
            .lossless_readers(newest)
            .iter()
            .map(|r| (r.index, r.generation, r.released))
            .collect();
        let mut gate = LosslessGate {
            blocked: Some(Stall {
                key: held,
                since: began,
                cursors,
            }),
        };
        gate.wait(&f, Duration::ZERO, newest, || {
            f.table.holder(newest, |r| r < held).map(|blocker| Holder {
                blocker,
                key: held,
                held_seq: held,
            })
        })
        .expect("the holder is evicted, so the wait ends");
        let states: Vec<u32> = readers.iter().map(|a| state(&f, a)).collect();
        assert_eq!(states, [SUB_EVICTED, SUB_EVICTED, SUB_ACTIVE, SUB_ACTIVE]);
        // Relaxed: this thread's counters.
        assert_eq!(f.producer.evictions.load(Ordering::Relaxed), 2);
        assert_eq!(f.state.lease_deadlines.load(Ordering::Relaxed), 1);
        let strikes = f.state.strikes.lock().expect("strikes");
        assert_eq!(strikes.refused(7, Instant::now()).map(|r| r.strikes), Some(1));
        assert_eq!(strikes.refused(8, Instant::now()), None);
    }

    /// A wait that times out before the lease evicts nobody and keeps the
    /// key's lease running: the next call on the same key does not start
    /// it again.
    #[test]
    fn a_timed_out_wait_keeps_the_lease_of_its_key() {
        let f = fake(Duration::from_secs(3600));
        let readers = join(&f, &[(7, 1), (8, 1)]);
        let mut gate = LosslessGate::default();
        let holder = || {
            f.table.holder(10, |r| r < 5).map(|blocker| Holder {
                blocker,
                key: 5,
                held_seq: 5,
            })
        };
        for _ in 0..2 {
            let e = gate.wait(&f, Duration::ZERO, 10, holder).expect_err("blocked");
            assert!(matches!(e, Error::LosslessBlocked { held_seq: 5, .. }), "{e}");
        }
        let since = gate.blocked.clone().expect("still waiting on the key");
        assert_eq!(since.key, 5);
        let again = gate.wait(&f, Duration::ZERO, 10, holder);
        assert!(again.is_err());
        assert_eq!(gate.blocked, Some(since), "the lease started at the first wait");
        assert!(readers.iter().all(|a| state(&f, a) == SUB_ACTIVE));
        // Relaxed: this thread's counter.
        assert_eq!(f.producer.evictions.load(Ordering::Relaxed), 0);
    }
}
