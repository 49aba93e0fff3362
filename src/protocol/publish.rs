//! The producer's half: claim (lossless check), invalidate, commit, wake.

use crate::layout::{
    DoorbellLine, RingHeader, SlotDesc, SubEntry, SEQ_WRITING, SUBF_LOSSLESS, SUB_ACTIVE, USER_META_WORDS,
};
use crate::sync::atomic::{fence, AtomicU64, Ordering};

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

/// Under the lossless policy: the first active lossless subscriber that has
/// not yet released `held_seq` (the seq the slot about to be reused still
/// holds), as `(index, its released cursor)`. `None` when the slot is free.
///
/// `entries` is the publisher's own view of the table; a subscriber can only
/// lie about its own cursor, which can only lose it frames.
pub fn lossless_holder(entries: &[SubEntry], held_seq: u64) -> Option<(usize, u64)> {
    if held_seq == 0 {
        return None;
    }
    entries.iter().enumerate().find_map(|(k, e)| {
        // SYNC: sub-state — Acquire pairs with the publisher service's Release
        // when it activates or frees the entry.
        if e.state.load(Ordering::Acquire) != SUB_ACTIVE || e.flags.load(Ordering::Relaxed) & SUBF_LOSSLESS == 0 {
            return None;
        }
        // SYNC: release-cursor — Acquire pairs with the subscriber's Release
        // store after its copy of the frame completed.
        let released = e.released_seq.load(Ordering::Acquire);
        (released < held_seq).then_some((k, released))
    })
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

/// Step 4 of a publish: store the meta, then the slot seq, then `global_seq`;
/// returns whether any subscriber is parked (the caller then rings the
/// doorbell with [`ring_doorbell`]).
///
/// The caller has already made the frame's bytes complete (CPU stores, or
/// `cuStreamSynchronize` on the stream that wrote them).
pub fn commit(header: &RingHeader, slot: &SlotDesc, seq: u64, meta: &CommitMeta, entries: &[SubEntry]) -> bool {
    commit_slot(slot, seq, meta);
    publish_global(header, seq, entries)
}

/// The first half of [`commit`]: the slot's meta, then its seq (Release).
pub fn commit_slot(slot: &SlotDesc, seq: u64, meta: &CommitMeta) {
    // Relaxed: these are published by the Release store of `slot.seq` below
    // and read by subscribers only between their two loads of `slot.seq`.
    slot.pts.store(meta.pts as u64, Ordering::Relaxed);
    slot.commit_ns.store(meta.commit_ns, Ordering::Relaxed);
    slot.flags.store(meta.flags, Ordering::Relaxed);
    slot.user_len.store(meta.user_len, Ordering::Relaxed);
    for (w, v) in slot.user.iter().zip(meta.user.iter()) {
        w.store(*v, Ordering::Relaxed);
    }
    // SYNC: slot-seq — Release: bytes and meta above happen-before a reader's
    // Acquire load that sees `seq`.
    slot.seq.store(seq, Ordering::Release);
}

/// The second half of [`commit`]: `global_seq` (Release), then the park
/// check; returns whether to ring the doorbell.
pub fn publish_global(header: &RingHeader, seq: u64, entries: &[SubEntry]) -> bool {
    // Relaxed: own counter, single writer (the publisher).
    header.producer.published.store(seq, Ordering::Relaxed);
    publish_seq(&header.seq.global_seq, seq, entries)
}

/// Stores the newest seq of a ring (`global_seq`, or a packet ring's
/// `write_seq`) and says whether any subscriber is parked and needs the
/// doorbell.
pub fn publish_seq(word: &AtomicU64, seq: u64, entries: &[SubEntry]) -> bool {
    // SYNC: global-seq / packet-write-seq — Release, after the slot seq or
    // packet record commit, so a reader that sees `>= seq` finds it
    // committed (or overwritten later).
    word.store(seq, Ordering::Release);
    // SYNC: park — SeqCst fence between the seq store and the loads of
    // `parked`; the subscriber has the mirror fence (see protocol docs).
    fence(Ordering::SeqCst);
    // Relaxed: ordered by the fence above.
    entries.iter().any(|e| e.parked.load(Ordering::Relaxed) != 0)
}

/// Wakes every subscriber parked on the doorbell.
pub fn ring_doorbell(header: &RingHeader) {
    ring_doorbell_word(&header.doorbell);
}

/// Wakes every subscriber parked on a doorbell line (the frame ring's or
/// the packet ring's).
pub fn ring_doorbell_word(line: &DoorbellLine) {
    // SYNC: doorbell — Release increment; a waiter that loads the new value
    // also sees the seq stored before it.
    line.doorbell.fetch_add(1, Ordering::Release);
    #[cfg(not(loom))]
    {
        // Shared (not PRIVATE) futex: the word lives in a MAP_SHARED memfd
        // mapping, so the kernel keys it by inode and offset and it wakes
        // waiters in other processes and namespaces.
        let _ = rustix::thread::futex::wake(&line.doorbell, rustix::thread::futex::Flags::empty(), i32::MAX as u32);
    }
}
