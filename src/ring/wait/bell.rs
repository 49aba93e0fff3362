//! The doorbell: the words a waiter watches, the publisher's seq store and
//! ring, and the futex park it wakes.

use std::time::Duration;

use crate::layout::{ClientLine, ProducerLine};
use crate::sync::atomic::{fence, AtomicU64, Ordering};

/// The words a waiter watches: the ring's newest seq (`global_seq` of a
/// frame ring, `write_seq` of a packet ring) and the producer state, both
/// in the ring's read-only control region.
///
/// `pending`, `push` and `loaned` serve the frame ring only (a packet ring
/// sets them to `None`); they are fields here rather than frame-side code
/// because the frame subscriber builds its bell as a struct literal.
#[derive(Clone, Copy)]
pub struct Bell<'a> {
    /// Newest committed seq.
    pub seq: &'a AtomicU64,
    /// The producer line (its `state`).
    pub producer: &'a ProducerLine,
    /// The newest seq whose commit is enqueued (`pending_seq` of a frame
    /// ring); `None` when commits are never in flight (packet rings).
    pub pending: Option<&'a AtomicU64>,
    /// A push subscriber's `push_seq` words (its table entry): a frame
    /// pushed to it ends the wait as soon as its word says so, before the
    /// commit stores `global_seq` (behind one more system fence on the
    /// GPU). The seq returned is then the pushed frame's, which may be
    /// ahead of `global_seq`. `None`: `seq` alone.
    pub push: Option<&'a [AtomicU64]>,
    /// A queued-pull subscriber's next frame: its slot's seq word and its
    /// seq `s`. The wait also ends, returning `s`, as soon as the publisher
    /// has loaned the slot for `s` (the word reads `s | SEQ_WRITING`),
    /// before the commit is announced: the subscriber then queues its copy
    /// behind the commit on the GPU, so its driver calls overlap the frame's
    /// writes instead of adding to its latency (ADR 0014). `None`: not
    /// watched.
    pub loaned: Option<(&'a AtomicU64, u64)>,
}

#[cfg(not(loom))]
pub(super) fn park(line: &ClientLine, bell: u32, timeout: Duration) {
    let ts = crate::time::timespec(timeout);
    // Shared futex (no PRIVATE flag): see `ring_doorbell`. EAGAIN
    // (the doorbell already moved), ETIMEDOUT and EINTR all just return.
    let _ = rustix::thread::futex::wait(&line.doorbell, rustix::thread::futex::Flags::empty(), bell, Some(&ts));
}

/// The model of `FUTEX_WAIT` with no timeout: block until the doorbell moves
/// from `bell`. A lost wakeup is then a waiter that never returns, which loom
/// reports, instead of a slice that silently hides it.
#[cfg(loom)]
pub(super) fn park(line: &ClientLine, bell: u32, _timeout: Duration) {
    // Relaxed: the kernel's compare of the futex word orders nothing; the
    // caller re-loads `global_seq` (Acquire) and re-parks if it has not moved.
    while line.doorbell.load(Ordering::Relaxed) == bell {
        loom::thread::yield_now();
    }
}

/// Publisher: stores the newest seq of a ring (`global_seq`, or a packet
/// ring's `write_seq`), then the fence after which parked flags are read
/// ([`wake_if_parked`], or `ring::table`'s `wake_parked`).
pub fn publish_seq(word: &AtomicU64, seq: u64) {
    // SYNC: global-seq / packet-write-seq — Release, after the slot seq or
    // packet record commit, so a reader that sees `>= seq` finds it
    // committed (or overwritten later).
    word.store(seq, Ordering::Release);
    // SYNC: park — SeqCst fence between the seq store and the loads of
    // `parked`; the subscriber has the mirror fence (see the module docs).
    fence(Ordering::SeqCst);
}

/// Publisher, after [`publish_seq`] (or, for a stream-order commit, after
/// announcing it): rings `client`'s doorbell if it is parked. Returns
/// whether it rang. A hostile subscriber that keeps `parked` set costs one
/// wake of its own futex per publish, and nothing more: the publisher never
/// waits for a commit on a subscriber's behalf (ADR 0017, PROTOCOL.md
/// §18.3).
pub fn wake_if_parked(client: &ClientLine) -> bool {
    // SYNC: park / pending — Relaxed, ordered after the seq store by the
    // caller's SeqCst fence: `publish_seq`'s (a CPU commit) or
    // `announce_pending`'s (a stream-order commit, ADR 0017).
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
