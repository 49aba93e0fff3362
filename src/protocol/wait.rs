//! Waiting for `global_seq` to pass a seq: spin briefly, then park on the
//! shared doorbell futex, in bounded slices so a dead publisher is noticed.

use std::time::{Duration, Instant};

use crate::layout::{DoorbellLine, ProducerLine, RingHeader, SubEntry, PRODUCER_CLOSED};
use crate::sync::atomic::{fence, AtomicU64, Ordering};

/// Why [`wait_for_seq`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// `global_seq` passed the seq; here it is.
    Advanced(u64),
    /// The publisher closed in order.
    ProducerClosed,
    /// The deadline passed.
    TimedOut,
    /// The liveness check asked to stop.
    Stopped,
}

/// Waits until `global_seq > after`, or `deadline`.
///
/// Spins for up to `spin`, then parks on the doorbell futex in slices of at
/// most `slice`; between slices it calls `alive()`, which returns `false` to
/// stop waiting (the publisher's socket closed, or this subscriber was
/// evicted). `entry` is this subscriber's table entry, whose `parked` flag
/// tells the publisher to ring the doorbell.
pub fn wait_for_seq(
    header: &RingHeader,
    entry: &SubEntry,
    after: u64,
    deadline: Instant,
    spin: Duration,
    slice: Duration,
    alive: impl FnMut() -> bool,
) -> WaitOutcome {
    let bell = Bell {
        seq: &header.seq.global_seq,
        producer: &header.producer,
        doorbell: &header.doorbell,
    };
    wait_on(bell, entry, after, deadline, spin, slice, alive)
}

/// The three words a waiter watches: the ring's newest seq (`global_seq`
/// of a frame ring, `write_seq` of a packet ring), the producer state, and
/// the doorbell futex.
#[derive(Clone, Copy)]
pub struct Bell<'a> {
    /// Newest committed seq.
    pub seq: &'a AtomicU64,
    /// The producer line (its `state`).
    pub producer: &'a ProducerLine,
    /// The futex word.
    pub doorbell: &'a DoorbellLine,
}

/// [`wait_for_seq`] over any ring's [`Bell`].
pub fn wait_on(
    bell: Bell<'_>,
    entry: &SubEntry,
    after: u64,
    deadline: Instant,
    spin: Duration,
    slice: Duration,
    mut alive: impl FnMut() -> bool,
) -> WaitOutcome {
    let load = || {
        // SYNC: global-seq / packet-write-seq — Acquire pairs with the
        // publisher's Release store.
        bell.seq.load(Ordering::Acquire)
    };
    let closed = || {
        // SYNC: producer-state — Acquire pairs with the publisher's Release on close.
        bell.producer.state.load(Ordering::Acquire) == PRODUCER_CLOSED
    };
    let g = load();
    if g > after {
        return WaitOutcome::Advanced(g);
    }
    let spin_until = Instant::now() + spin;
    while Instant::now() < spin_until.min(deadline) {
        let g = load();
        if g > after {
            return WaitOutcome::Advanced(g);
        }
        crate::sync::spin_hint();
    }
    loop {
        if closed() {
            // A frame may have been committed just before the close.
            let g = load();
            return if g > after {
                WaitOutcome::Advanced(g)
            } else {
                WaitOutcome::ProducerClosed
            };
        }
        let now = Instant::now();
        if now >= deadline {
            return WaitOutcome::TimedOut;
        }
        // Relaxed store + SeqCst fence: SYNC: park — the fence orders the
        // flag before the doorbell and global_seq loads (mirror of the
        // publisher's fence between its global_seq store and its flag loads).
        entry.parked.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        // SYNC: doorbell — Acquire pairs with the publisher's Release increment.
        let word = bell.doorbell.doorbell.load(Ordering::Acquire);
        let g = load();
        if g > after {
            entry.parked.store(0, Ordering::Relaxed);
            return WaitOutcome::Advanced(g);
        }
        park(bell.doorbell, word, (deadline - now).min(slice));
        // Relaxed: only a hint for the publisher; a stale 1 costs one wake.
        entry.parked.store(0, Ordering::Relaxed);
        let g = load();
        if g > after {
            return WaitOutcome::Advanced(g);
        }
        if !alive() {
            return WaitOutcome::Stopped;
        }
    }
}

#[cfg(not(loom))]
fn park(line: &DoorbellLine, bell: u32, timeout: Duration) {
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // Shared futex (no PRIVATE flag): see `publish::ring_doorbell`. EAGAIN
    // (the doorbell already moved), ETIMEDOUT and EINTR all just return.
    let _ = rustix::thread::futex::wait(&line.doorbell, rustix::thread::futex::Flags::empty(), bell, Some(&ts));
}

/// The model of `FUTEX_WAIT` with no timeout: block until the doorbell moves
/// from `bell`. A lost wakeup is then a waiter that never returns, which loom
/// reports, instead of a slice that silently hides it.
#[cfg(loom)]
fn park(line: &DoorbellLine, bell: u32, _timeout: Duration) {
    // Relaxed: the kernel's compare of the futex word orders nothing; the
    // caller re-loads `global_seq` (Acquire) and re-parks if it has not moved.
    while line.doorbell.load(Ordering::Relaxed) == bell {
        loom::thread::yield_now();
    }
}
