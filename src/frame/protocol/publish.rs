//! The producer's half: invalidate, commit, publish (the lossless check is
//! the table's, `ring::table`; the wakeup is [`crate::ring::wait`]'s).

use std::time::{Duration, Instant};

use crate::layout::{ClientLine, RingHeader, SlotDesc, SEQ_WRITING, USER_META_WORDS};
use crate::ring::wait::{publish_seq, wait_on, Bell, WaitOutcome};
use crate::sync::atomic::{fence, Ordering};

/// What a commit stores in the slot descriptor besides the seq.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitMeta {
    /// Presentation timestamp.
    pub pts: i64,
    /// `FRAME_*` flags.
    pub flags: u32,
    /// `CLOCK_MONOTONIC` ns of the commit.
    pub commit_ns: u64,
    /// Bytes of `user` in use.
    pub user_len: u32,
    /// User metadata words.
    pub user: [u64; USER_META_WORDS],
}

/// Step 2 of a publish: mark `slot` as being written for `seq`, before any
/// write to its bytes is made or enqueued.
pub fn invalidate(slot: &SlotDesc, seq: u64) {
    // Relaxed store + SeqCst fence: the fence orders this store before every
    // later write to the slot's bytes and meta (seqlock writer rule).
    // SYNC: invalidate — pairs with the reader's Acquire fence + reload in
    // `consume::SlotSnapshot::still_valid`.
    slot.seq.store(seq | SEQ_WRITING, Ordering::Relaxed);
    fence(Ordering::SeqCst);
}

/// Step 4 of a publish: store the meta, then the slot seq, then `global_seq`
/// and the park fence; the caller then wakes parked subscribers
/// ([`crate::ring::wake_if_parked`] for each).
///
/// The caller has already made the frame's bytes complete (CPU stores, or
/// `cuStreamSynchronize` on the stream that wrote them).
pub fn commit(header: &RingHeader, slot: &SlotDesc, seq: u64, meta: &CommitMeta) {
    commit_slot(slot, seq, meta);
    publish_global(header, seq);
}

/// The first half of [`commit`]: the slot's meta, then its seq (Release).
pub fn commit_slot(slot: &SlotDesc, seq: u64, meta: &CommitMeta) {
    stage_meta(slot, meta);
    // SYNC: slot-seq — Release: bytes and meta above happen-before a reader's
    // Acquire load that sees `seq`.
    slot.seq.store(seq, Ordering::Release);
}

/// The slot's meta, stored while the slot is still invalid (its seq carries
/// `SEQ_WRITING`). [`commit_slot`] then stores the seq on the CPU; a
/// stream-order commit has the GPU store it after a system-scope fence, and
/// the `SeqCst` fence of [`announce_pending`] orders these stores before
/// the commit is enqueued.
pub fn stage_meta(slot: &SlotDesc, meta: &CommitMeta) {
    // Relaxed: these are published by the Release store of `slot.seq` (CPU
    // or GPU) and read by subscribers only between their two loads of
    // `slot.seq`.
    slot.pts.store(meta.pts as u64, Ordering::Relaxed);
    slot.commit_ns.store(meta.commit_ns, Ordering::Relaxed);
    slot.flags.store(meta.flags, Ordering::Relaxed);
    slot.user_len.store(meta.user_len, Ordering::Relaxed);
    for (w, v) in slot.user.iter().zip(meta.user.iter()) {
        w.store(*v, Ordering::Relaxed);
    }
}

/// The second half of [`commit`]: `pending_seq`, `global_seq` (Release),
/// then the park fence ([`publish_seq`]).
pub fn publish_global(header: &RingHeader, seq: u64) {
    // Relaxed: own counter, single writer (the publisher).
    header.producer.published.store(seq, Ordering::Relaxed);
    // SYNC: pending — before the park fence, which orders it before the
    // `parked` loads: a queued reader waits for `pending_seq` itself
    // (PROTOCOL.md §10 step 7; loom model (f)). A CPU commit is never in
    // flight: a reader that sees it ahead of `global_seq` spins until the
    // next store arrives.
    header.seq.pending_seq.store(seq, Ordering::Relaxed);
    publish_seq(&header.seq.global_seq, seq);
}

/// Stream-order commit, on the CPU before the GPU commit is enqueued: the
/// commit of `seq` is in flight from now on. Stores `pending_seq`, then the
/// `SeqCst` fence after which the caller reads the `parked` flags and rings
/// the parked subscribers at once, so that no subscriber makes the publisher
/// wait for the GPU; a woken subscriber spins for the commit in flight
/// (ADR 0017).
pub fn announce_pending(header: &RingHeader, seq: u64) {
    // Relaxed: own counter, single writer (the publisher).
    header.producer.published.store(seq, Ordering::Relaxed);
    // SYNC: pending — Relaxed store, then the SeqCst fence that orders it
    // before the `parked` loads (mirror of the subscriber's park fence).
    header.seq.pending_seq.store(seq, Ordering::Relaxed);
    fence(Ordering::SeqCst);
}

/// Stream-order commit whose enqueue failed: takes the announcement of
/// `seq` back. `pending_seq` returns to `seq - 1`, the previous frame,
/// whose commit may still be in flight. Not to `global_seq`: a subscriber
/// rung at that frame's announcement would then see nothing in flight,
/// park again, and sleep through its landing, since nobody rings when a
/// commit lands (ADR 0017).
pub fn withdraw_pending(header: &RingHeader, seq: u64) {
    // SYNC: pending — Relaxed, like the announcement; a subscriber that
    // still reads `seq` spins for a commit that never lands, 2 ms at most.
    header.seq.pending_seq.store(seq - 1, Ordering::Relaxed);
}

/// Waits until `global_seq > after`, or `deadline`, parked on `client`'s
/// doorbell: [`wait_on`] over the frame ring's words.
pub fn wait_for_seq(
    header: &RingHeader,
    client: &ClientLine,
    after: u64,
    deadline: Instant,
    spin: Duration,
    slice: Duration,
    alive: impl FnMut() -> bool,
) -> WaitOutcome {
    let bell = Bell {
        seq: &header.seq.global_seq,
        producer: &header.producer,
        pending: Some(&header.seq.pending_seq),
        push: None,
        loaned: None,
    };
    wait_on(bell, client, after, deadline, spin, slice, alive)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A failed enqueue of frame 6 while frame 5's commit is still in
    /// flight leaves frame 5 announced: a subscriber rung at its
    /// announcement that parks again must still see it in flight, not sleep
    /// through it (ADR 0017).
    #[test]
    fn a_withdrawn_announcement_leaves_the_previous_commit_in_flight() {
        // SAFETY: the header is `repr(C)` shared words, all atomics, for
        // which all-zero bits are a valid value (a fresh memfd's contents).
        let h: Box<RingHeader> = unsafe { Box::new(std::mem::MaybeUninit::zeroed().assume_init()) };
        h.seq.global_seq.store(4, Ordering::Relaxed);
        announce_pending(&h, 5);
        announce_pending(&h, 6);
        withdraw_pending(&h, 6);
        assert_eq!(
            h.seq.pending_seq.load(Ordering::Relaxed),
            5,
            "frame 5 is still in flight"
        );
        assert!(h.seq.pending_seq.load(Ordering::Relaxed) > h.seq.global_seq.load(Ordering::Relaxed));
    }
}
