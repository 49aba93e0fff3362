//! Push delivery: the publisher copies each frame into buffers the
//! subscriber owns, in the publisher's own GPU context, so the subscriber
//! does no GPU work to receive a frame (no GPU context switch between
//! processes per frame and subscriber).
//!
//! Each push subscriber has [`PUSH_BUFFERS`] buffers, one `push_seq` word
//! per buffer in its table entry (publisher-written, read-only to
//! subscribers) and one `push_held` word in its own client region
//! (subscriber-written; the publisher only compares it, so a bad value
//! costs that subscriber its own frames).
//!
//! * The publisher picks a buffer that is neither the newest complete one
//!   nor held: it stores `push_seq[k] = seq | SEQ_WRITING`, issues a `SeqCst`
//!   fence, then loads `push_held`; if the reader holds `k` it restores the
//!   old value and tries the next buffer.
//! * The reader picks the newest complete buffer `k` (Acquire load of
//!   `push_seq[k] = s`), stores `push_held = k + 1`, issues a `SeqCst` fence
//!   and reloads `push_seq[k]`: if it is still `s`, the publisher will not
//!   write `k` until the hold moves; otherwise it tries again.
//!
//! The two fences make it impossible for the publisher to start writing a
//! buffer the reader has just claimed and for the reader to miss that
//! (Dekker). After the copy completed (stream synchronised), the publisher
//! stores `push_seq[k] = seq` with Release, before `global_seq`.
//!
//! A reader may also read a buffer in place *without* holding it (a push
//! subscriber's borrow, which leaves its hold where it is): it picks the
//! newest complete buffer `k` (Acquire load of `push_seq[k] = s`), reads it
//! (copies synchronised), issues an Acquire fence and reloads `push_seq[k]`:
//! the read is whole only if it is still `s`. This is the seqlock of the
//! ring's slots: the publisher marks `k` writing before its SeqCst fence and
//! writes after it, so a read that saw any of those writes also sees the
//! mark (or a later seq) on the reload.

use crate::layout::{ClientLine, SubEntry, PUSH_BUFFERS, SEQ_WRITING};
use crate::sync::atomic::{fence, AtomicU64, Ordering};

/// Publisher: claims a buffer of `entry` to write frame `seq` into, skipping
/// `newest` (the newest complete buffer) and whatever the reader holds.
/// `None` when every candidate is held (the frame is not pushed to this
/// reader; it sees a gap).
pub fn claim_buffer(entry: &SubEntry, client: &ClientLine, newest: Option<usize>, seq: u64) -> Option<usize> {
    claim_buffer_avoiding(entry, client, newest.map_or(0, |k| 1 << k), seq)
}

/// [`claim_buffer`], skipping every buffer `k` whose bit is set in `skip`
/// (the newest complete one, and with stream-order commits those whose
/// copy and commit are still in flight on the GPU).
pub fn claim_buffer_avoiding(entry: &SubEntry, client: &ClientLine, skip: u32, seq: u64) -> Option<usize> {
    for k in 0..PUSH_BUFFERS {
        if skip & (1 << k) != 0 {
            continue;
        }
        // Relaxed: publisher-owned word; ordered by the fence below.
        let old = entry.push_seq[k].load(Ordering::Relaxed);
        entry.push_seq[k].store(seq | SEQ_WRITING, Ordering::Relaxed);
        // SYNC: push-hold — SeqCst fence between our mark and the load of
        // the reader's hold (mirror of the reader's fence).
        // SYNC: push-peek — and between our mark and our writes into `k`,
        // for a reader that reads `k` in place without a hold.
        fence(Ordering::SeqCst);
        let held = client.push_held.load(Ordering::Relaxed) as usize;
        // SYNC: push-hold — Acquire fence pairs with the reader's Release
        // store of a hold elsewhere: its reads of buffer `k` under its
        // earlier hold happen before our writes into `k`.
        fence(Ordering::Acquire);
        if held == k + 1 {
            // The reader holds it: put the old seq back (its bytes are
            // untouched) and try another buffer.
            entry.push_seq[k].store(old, Ordering::Relaxed);
            continue;
        }
        return Some(k);
    }
    None
}

/// Publisher: frame `seq` is complete in buffer `k`.
pub fn complete_buffer(entry: &SubEntry, k: usize, seq: u64) {
    // SYNC: push-seq — Release after the copy into buffer `k` completed
    // (the writing stream was synchronised), paired with the reader's
    // Acquire in `take_newest`.
    entry.push_seq[k % PUSH_BUFFERS].store(seq, Ordering::Release);
}

/// Publisher, before a new subscriber's first frame: clears its buffers'
/// seqs. With stream-order commits it runs only after every commit enqueued
/// before has landed, so a store the GPU made for the entry's previous
/// occupant cannot survive into the newcomer's view.
pub fn reset_buffers(entry: &SubEntry) {
    for w in &entry.push_seq {
        // Relaxed: published by the Release store of `push_count` after it.
        w.store(0, Ordering::Relaxed);
    }
}

/// Reader: holds and returns the newest complete buffer whose frame is newer
/// than `after` and committed, as `(k, seq)`; `None` when there is none.
///
/// `upto` is `global_seq` as the reader loaded it (Acquire) **before** this
/// call. A frame past it is in flight: its push word may be visible before
/// its slot's seq (the commit kernel stores both behind one fence), so it
/// is neither taken nor, by the caller, counted lost. A frame at or below
/// it has its slot's seq visible (stored before `global_seq`). Counting a
/// gap up to a `global_seq` loaded *after* the take would count a frame
/// whose commit landed between the two loads (PROTOCOL.md §16.7).
pub fn take_newest(entry: &SubEntry, client: &ClientLine, after: u64, upto: u64) -> Option<(usize, u64)> {
    for _ in 0..64 {
        let (k, s) = newest_between(entry, after, upto)?;
        // SYNC: push-hold — Release: our reads of the buffer we held before
        // happen before the publisher's next write into it (its Acquire
        // fence); then a SeqCst fence before re-checking `push_seq[k]`.
        client.push_held.store(k as u32 + 1, Ordering::Release);
        fence(Ordering::SeqCst);
        if entry.push_seq[k].load(Ordering::Relaxed) == s {
            return Some((k, s));
        }
        crate::sync::spin_hint();
    }
    None
}

/// What a push reader found once its wait returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushRead<T> {
    /// It holds buffer `k` with frame `seq`, whose meta `look` read.
    Took(usize, u64, T),
    /// Nothing to deliver: the frames after `last` up to this seq were
    /// committed without reaching this reader (a counted gap when it is
    /// past `last`; at most `last` means nothing was lost).
    NotPushed(u64),
}

/// How a push reader takes the frame it found: holding its buffer (a
/// frame from `next`, which the publisher then spares until the hold
/// moves), or reading it in place without a hold (a borrow, whose read
/// [`still_complete`] validates afterwards).
#[derive(Clone, Copy)]
pub enum Take<'a> {
    /// Hold the buffer through the reader's `push_held` word.
    Hold(&'a ClientLine),
    /// Leave the hold where it is.
    Peek,
}

/// Reader, after its wait returned `g` (`global_seq`, or a push word that
/// passed `after`): loads `global_seq` (Acquire), then takes (`how`) the
/// newest committed pushed frame and reads its meta with `look(k, seq)`
/// (the slot's seqlock; `None` when the slot was reused). PROTOCOL.md
/// §16.7 steps 1a–3 and 6. Both the holding and the in-place read go
/// through here, so the order of the two loads lives in one place
/// (ADR 0015).
pub fn read_pushed<T>(
    entry: &SubEntry,
    how: Take<'_>,
    global_seq: &AtomicU64,
    after: u64,
    g: u64,
    look: impl FnOnce(usize, u64) -> Option<T>,
) -> PushRead<T> {
    // SYNC: global-seq — Acquire pairs with the commit's store of
    // `global_seq`, which follows its stores of `push_seq` and `slot.seq`:
    // every frame up to `landed` has both visible. Loaded before the push
    // words: loaded after, it could include a frame whose push word the
    // take saw before `look` saw its slot's seq, and count it lost.
    let landed = global_seq.load(Ordering::Acquire);
    let found = match how {
        Take::Hold(client) => take_newest(entry, client, after, landed),
        Take::Peek => peek_newest(entry, after, landed),
    };
    if let Some((k, seq)) = found {
        if let Some(t) = look(k, seq) {
            return PushRead::Took(k, seq, t);
        }
    }
    PushRead::NotPushed(g.min(landed))
}

/// The complete buffer with the largest frame in `after < s <= upto` (the
/// lowest `k` on a tie), as `(k, s)`.
fn newest_between(entry: &SubEntry, after: u64, upto: u64) -> Option<(usize, u64)> {
    let mut best: Option<(usize, u64)> = None;
    for k in 0..PUSH_BUFFERS {
        // SYNC: push-seq — Acquire pairs with the publisher's Release.
        let s = entry.push_seq[k].load(Ordering::Acquire);
        if s & SEQ_WRITING == 0 && s > after && s <= upto && best.is_none_or(|(_, b)| s > b) {
            best = Some((k, s));
        }
    }
    best
}

/// Reader, reading in place without a hold: the newest complete buffer
/// whose frame is newer than `after` and at most `upto` (`global_seq`
/// loaded before, as in [`take_newest`]), as `(k, seq)`; `None` when there
/// is none. The publisher may begin rewriting it at any time (it spares
/// only the newest and the held buffer); [`still_complete`] after the read
/// says whether it did.
pub fn peek_newest(entry: &SubEntry, after: u64, upto: u64) -> Option<(usize, u64)> {
    newest_between(entry, after, upto)
}

/// Reader, after reading buffer `k` that [`peek_newest`] returned with
/// `seq` (the read complete: copies synchronised): whether the publisher
/// left the buffer alone meanwhile, so the read is whole.
pub fn still_complete(entry: &SubEntry, k: usize, seq: u64) -> bool {
    // SYNC: push-peek — Acquire fence: our reads of buffer `k` come before
    // the reload; pairs with the publisher's SeqCst fence in `claim_buffer`
    // (its WRITING mark before it, its writes after it).
    fence(Ordering::Acquire);
    // Relaxed: ordered by the fence above.
    entry.push_seq[k % PUSH_BUFFERS].load(Ordering::Relaxed) == seq
}

/// Reader: lets go of whatever buffer it holds.
pub fn release_hold(client: &ClientLine) {
    // SYNC: push-hold — Release, as in `take_newest`.
    client.push_held.store(0, Ordering::Release);
}
