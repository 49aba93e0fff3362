//! The producer's bounded wait for lossless readers, with eviction past the
//! lease: one implementation for the frame [`super::Publisher`] and the
//! [`crate::packet::PacketPublisher`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::layout::SUB_EVICTED;
use crate::socket::service::Served;

/// Which lossless reader the producer is waiting for, and since when: the
/// lease is measured across calls, so a reader that keeps the producer
/// waiting through several timed-out loans or writes is still evicted.
#[derive(Debug, Default)]
pub(crate) struct LosslessGate {
    /// (entry, seq it holds or needs, since).
    blocked: Option<(usize, u64, Instant)>,
}

impl LosslessGate {
    /// Waits until `holder()` names no lossless reader, at most `timeout`;
    /// `holder` returns the first blocking reader's entry and the seq it
    /// holds (frames) or needs next (packets). A reader that has kept the
    /// producer waiting on the same seq for `lease` is evicted. `waits`
    /// counts calls that had to wait.
    ///
    /// # Errors
    /// [`Error::LosslessBlocked`] when `timeout` runs out first.
    pub(crate) fn wait<S: Served>(
        &mut self,
        sh: &S,
        waits: &AtomicU64,
        lease: Duration,
        timeout: Duration,
        mut holder: impl FnMut() -> Option<(usize, u64)>,
    ) -> Result<()> {
        let start = Instant::now();
        let mut counted = false;
        loop {
            let Some((k, seq)) = holder() else {
                self.blocked = None;
                return Ok(());
            };
            if !counted {
                // Relaxed: a counter for stats.
                waits.fetch_add(1, Ordering::Relaxed);
                counted = true;
            }
            let since = match self.blocked {
                Some((bk, bs, since)) if bk == k && bs == seq => since,
                _ => {
                    let now = Instant::now();
                    self.blocked = Some((k, seq, now));
                    now
                }
            };
            if since.elapsed() >= lease {
                self.evict(sh, k);
                continue;
            }
            if start.elapsed() >= timeout {
                return Err(Error::LosslessBlocked {
                    index: k as u32,
                    name: sh.entries()[k].name(),
                    held_seq: seq,
                    waited: start.elapsed(),
                });
            }
            // The lossless reader is a whole ring behind; it reads at stream
            // rate, so a short sleep costs nothing and spares a core.
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Evicts entry `k`: marks it, counts it, and has the service send
    /// `Evicted` and close the connection.
    fn evict<S: Served>(&mut self, sh: &S, k: usize) {
        let e = &sh.entries()[k];
        tracing::warn!(index = k, name = %e.name(), "evicting a lossless subscriber that kept the producer waiting past its lease");
        // SYNC: sub-state — Release; the subscriber sees EVICTED with Acquire.
        e.state.store(SUB_EVICTED, Ordering::Release);
        // Relaxed: own counter, single writer (the producer thread).
        sh.producer().evictions.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut q) = sh.evict_requests().lock() {
            q.push(k as u32);
        }
        sh.waker().wake();
        self.blocked = None;
    }
}
