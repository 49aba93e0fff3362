//! Wakeups, the same for both ring kinds: the publisher stores the ring's
//! newest seq and rings the doorbell of each parked subscriber; a
//! subscriber spins briefly, then parks on the doorbell of its own client
//! region, in bounded slices so a dead publisher is noticed.
//!
//! * **park**: a subscriber sets `parked = 1`, `SeqCst` fence, loads its
//!   doorbell, re-checks the seq, then futex-waits on the doorbell value it
//!   loaded. The publisher stores the seq, `SeqCst` fence
//!   ([`publish_seq`]), then reads every `parked` ([`wake_if_parked`]); if
//!   one is set it increments that subscriber's doorbell (Release) and
//!   wakes it. The two fences make it impossible for both sides to miss
//!   each other (Dekker); every wait is also bounded by a timeout slice.
//! * Each doorbell lives in a region only its subscriber and the publisher
//!   map, so no subscriber can wake (or keep awake) another.

use std::time::{Duration, Instant};

use crate::layout::{ClientLine, ProducerLine, PRODUCER_CLOSED};
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

/// The words a waiter watches: the ring's newest seq (`global_seq` of a
/// frame ring, `write_seq` of a packet ring) and the producer state, both
/// in the ring's read-only control region.
#[derive(Clone, Copy)]
pub struct Bell<'a> {
    /// Newest committed seq.
    pub seq: &'a AtomicU64,
    /// The producer line (its `state`).
    pub producer: &'a ProducerLine,
}

/// Waits until the bell's seq passes `after`, or `deadline`.
///
/// Spins for up to `spin`, then parks on `client`'s doorbell futex in
/// slices of at most `slice`; between slices it calls `alive()`, which
/// returns `false` to stop waiting (the publisher's socket closed, or this
/// subscriber was evicted). `client` is this subscriber's own region, whose
/// `parked` flag tells the publisher to ring its doorbell.
pub fn wait_on(
    bell: Bell<'_>,
    client: &ClientLine,
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
        client.parked.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        // SYNC: doorbell — Acquire pairs with the publisher's Release increment.
        let word = client.doorbell.load(Ordering::Acquire);
        let g = load();
        if g > after {
            client.parked.store(0, Ordering::Relaxed);
            return WaitOutcome::Advanced(g);
        }
        park(client, word, (deadline - now).min(slice));
        // Relaxed: only a hint for the publisher; a stale 1 costs one wake.
        client.parked.store(0, Ordering::Relaxed);
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
fn park(line: &ClientLine, bell: u32, timeout: Duration) {
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
    // Shared futex (no PRIVATE flag): see `ring_doorbell`. EAGAIN
    // (the doorbell already moved), ETIMEDOUT and EINTR all just return.
    let _ = rustix::thread::futex::wait(&line.doorbell, rustix::thread::futex::Flags::empty(), bell, Some(&ts));
}

/// The model of `FUTEX_WAIT` with no timeout: block until the doorbell moves
/// from `bell`. A lost wakeup is then a waiter that never returns, which loom
/// reports, instead of a slice that silently hides it.
#[cfg(loom)]
fn park(line: &ClientLine, bell: u32, _timeout: Duration) {
    // Relaxed: the kernel's compare of the futex word orders nothing; the
    // caller re-loads `global_seq` (Acquire) and re-parks if it has not moved.
    while line.doorbell.load(Ordering::Relaxed) == bell {
        loom::thread::yield_now();
    }
}

/// Publisher: stores the newest seq of a ring (`global_seq`, or a packet
/// ring's `write_seq`), then the fence after which parked flags are read
/// ([`wake_if_parked`], or [`crate::ring::table`]'s `wake_parked`).
pub fn publish_seq(word: &AtomicU64, seq: u64) {
    // SYNC: global-seq / packet-write-seq — Release, after the slot seq or
    // packet record commit, so a reader that sees `>= seq` finds it
    // committed (or overwritten later).
    word.store(seq, Ordering::Release);
    // SYNC: park — SeqCst fence between the seq store and the loads of
    // `parked`; the subscriber has the mirror fence (see the module docs).
    fence(Ordering::SeqCst);
}

/// Publisher, after [`publish_seq`]: rings `client`'s doorbell if it is
/// parked. Returns whether it rang. A hostile subscriber that keeps
/// `parked` set costs one wake of its own futex per publish, nothing more.
pub fn wake_if_parked(client: &ClientLine) -> bool {
    // Relaxed: ordered by the fence in `publish_seq`.
    if client.parked.load(Ordering::Relaxed) == 0 {
        return false;
    }
    ring_doorbell(client);
    true
}

/// Wakes the subscriber parked on `client`'s doorbell.
pub fn ring_doorbell(client: &ClientLine) {
    // SYNC: doorbell — Release increment; a waiter that loads the new value
    // also sees the seq stored before it.
    client.doorbell.fetch_add(1, Ordering::Release);
    #[cfg(not(loom))]
    {
        // Shared (not PRIVATE) futex: the word lives in a MAP_SHARED memfd
        // mapping, so the kernel keys it by inode and offset and it wakes
        // the waiter in another process and namespace.
        let _ = rustix::thread::futex::wake(&client.doorbell, rustix::thread::futex::Flags::empty(), i32::MAX as u32);
    }
}
