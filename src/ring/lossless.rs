//! The producer's bounded wait for lossless readers, with eviction past the
//! lease: one implementation for the frame [`crate::Publisher`] and the
//! [`crate::packet::PacketPublisher`].

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

/// Which lossless reader the producer is waiting for, and since when: the
/// lease is measured across calls, so a reader that keeps the producer
/// waiting through several timed-out loans or writes is still evicted.
#[derive(Debug, Default)]
pub(crate) struct LosslessGate {
    /// (entry, generation, key, since).
    blocked: Option<(usize, u32, u64, Instant)>,
}

impl LosslessGate {
    /// Waits until `holder()` names no lossless reader, at most `timeout`.
    /// A reader that has kept the producer waiting on the same key for
    /// `lease` is evicted, and the wait goes on without it. Calls that had
    /// to wait are counted in the service state's `lossless_waits`.
    ///
    /// # Errors
    /// [`Error::LosslessBlocked`] when `timeout` runs out first.
    pub(crate) fn wait<S: Served>(
        &mut self,
        sh: &S,
        timeout: Duration,
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
            let (k, generation) = (h.blocker.index, h.blocker.generation);
            if !counted {
                // Relaxed: a counter for stats.
                sh.state().lossless_waits.fetch_add(1, Ordering::Relaxed);
                counted = true;
            }
            let since = match self.blocked {
                Some((bk, bg, key, since)) if bk == k && bg == generation && key == h.key => since,
                _ => {
                    let now = Instant::now();
                    self.blocked = Some((k, generation, h.key, now));
                    now
                }
            };
            if since.elapsed() >= lease {
                self.evict(sh, &h);
                continue;
            }
            if start.elapsed() >= timeout {
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

    /// Evicts the holder through the table and has the service send
    /// `Evicted` and close the connection. Nothing happens if the entry
    /// changed hands meanwhile (the service freed or reassigned it).
    fn evict<S: Served>(&mut self, sh: &S, h: &Holder) {
        self.blocked = None;
        let k = h.blocker.index;
        if !sh.table().evict(k, h.blocker.generation, EVICT_LEASE) {
            return;
        }
        let name = sh.table().entry(k).map(|e| e.name()).unwrap_or_default();
        tracing::warn!(index = k, name = %name, "evicting a lossless subscriber that kept the producer waiting past its lease");
        // Relaxed: a counter for stats (the service counts too).
        sh.producer().evictions.fetch_add(1, Ordering::Relaxed);
        sh.state().request_eviction(k, h.blocker.generation, EVICT_LEASE);
    }
}
