//! Push delivery: the publisher copies each frame into buffers the
//! subscriber owns, in the publisher's own GPU context, so the subscriber
//! does no GPU work to receive a frame (no GPU context switch between
//! processes per frame and subscriber).
//!
//! Each push subscriber has its buffers ([`PUSH_BUFFERS`] for a latest
//! reader, up to [`PUSH_MAX_BUFFERS`] for a queued one: sequential or
//! lossless), one `push_seq` word per buffer in its table entry
//! (publisher-written, read-only to subscribers) and one `push_held` word
//! in its own client region (subscriber-written; the publisher only
//! compares it, so a bad value costs that subscriber its own frames).
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
//! * A queued reader takes its frames oldest first, so the publisher may
//!   rewrite only a buffer whose frame the reader is done with: empty, a
//!   failed copy, or older than the frame in the held buffer
//!   ([`claim_queued`]). None such: the frame is not pushed to this reader
//!   (a counted gap for a sequential reader; a lossless one is waited for
//!   before the slot is loaned, so it always has one).
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

use crate::layout::{ClientLine, SubEntry, PUSH_BUFFERS, PUSH_MAX_BUFFERS, SEQ_WRITING};
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
    // Acquire in `between`.
    entry.push_seq[k % PUSH_MAX_BUFFERS].store(seq, Ordering::Release);
}

/// Publisher: claims a buffer of a queued reader (sequential or lossless,
/// `count` buffers) to write frame `seq` into: one the reader is done with
/// (empty, a failed copy, or holding a frame older than the one in the
/// held buffer), never the held one nor one in `skip` (stream-order
/// commits: a copy still in flight). Candidates are tried oldest first.
/// `None` when every buffer holds a frame the reader has not read yet.
pub fn claim_queued(entry: &SubEntry, client: &ClientLine, count: usize, skip: u32, seq: u64) -> Option<usize> {
    let count = count.min(PUSH_MAX_BUFFERS);
    let mut order = [(0u64, 0usize); PUSH_MAX_BUFFERS];
    let mut n = 0;
    for k in (0..count).filter(|k| skip & (1 << k) == 0) {
        // Relaxed: publisher-owned words.
        let old = entry.push_seq[k].load(Ordering::Relaxed);
        order[n] = (if old & SEQ_WRITING != 0 { 0 } else { old }, k);
        n += 1;
    }
    order[..n].sort_unstable();
    for &(_, k) in &order[..n] {
        // Relaxed: publisher-owned word; ordered by the fence below.
        let old = entry.push_seq[k].load(Ordering::Relaxed);
        entry.push_seq[k].store(seq | SEQ_WRITING, Ordering::Relaxed);
        // SYNC: push-hold — SeqCst fence between our mark and the load of
        // the reader's hold, as in `claim_buffer_avoiding`.
        fence(Ordering::SeqCst);
        let held = client.push_held.load(Ordering::Relaxed) as usize;
        // SYNC: push-hold — Acquire fence pairs with the reader's Release
        // store of its hold: its reads of the buffers it is done with
        // happen before our writes into them.
        fence(Ordering::Acquire);
        if held != k + 1 && (old == 0 || old & SEQ_WRITING != 0 || read_before(entry, count, held, old)) {
            return Some(k);
        }
        entry.push_seq[k].store(old, Ordering::Relaxed);
    }
    None
}

/// Whether a queued reader whose hold is `held` (`k + 1`, hostile: any
/// value) is done with frame `old`: it holds a complete frame newer than
/// `old` (it takes frames in order). A reader that holds nothing, or
/// whose hold makes no sense, has read nothing the publisher may reuse.
fn read_before(entry: &SubEntry, count: usize, held: usize, old: u64) -> bool {
    if held == 0 || held > count {
        return false;
    }
    // Relaxed: a publisher-written word (or the commit kernel's, for a
    // frame in flight, which still reads as `SEQ_WRITING` and is refused).
    let hs = entry.push_seq[held - 1].load(Ordering::Relaxed);
    hs & SEQ_WRITING == 0 && old < hs
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
    take(entry, client, Order::Newest, PUSH_BUFFERS, after, upto)
}

/// Which pushed frame a reader takes: the newest (a latest reader) or the
/// oldest (a queued reader, which reads every frame pushed to it in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The newest complete frame past `after`.
    Newest,
    /// The oldest complete frame past `after`.
    Oldest,
}

/// Reader: holds and returns, among its first `count` buffers, the newest
/// or oldest (`order`) complete frame in `after < s <= upto`, as `(k, s)`;
/// `None` when there is none. [`take_newest`] explains `upto`.
pub fn take(
    entry: &SubEntry,
    client: &ClientLine,
    order: Order,
    count: usize,
    after: u64,
    upto: u64,
) -> Option<(usize, u64)> {
    for _ in 0..64 {
        let (k, s) = between(entry, order, count, after, upto)?;
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
    /// A queued reader's oldest pushed frame, this seq, lost its meta (its
    /// slot was reused: the reader fell a ring behind): it and the frames
    /// before it are a counted gap; newer pushed frames may still be read.
    Lost(u64),
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

/// A push reader's buffers, as its read looks at them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffers {
    /// Buffers attached (`push_count`).
    pub count: usize,
    /// Which frame a read takes.
    pub order: Order,
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
    bufs: Buffers,
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
        Take::Hold(client) => take(entry, client, bufs.order, bufs.count, after, landed),
        Take::Peek => between(entry, bufs.order, bufs.count, after, landed),
    };
    if let Some((k, seq)) = found {
        if let Some(t) = look(k, seq) {
            return PushRead::Took(k, seq, t);
        }
        if bufs.order == Order::Oldest {
            return PushRead::Lost(seq);
        }
    }
    PushRead::NotPushed(g.min(landed))
}

/// Among the first `count` buffers, the complete one with the largest
/// (`Newest`) or smallest (`Oldest`) frame in `after < s <= upto` (the
/// lowest `k` on a tie), as `(k, s)`.
fn between(entry: &SubEntry, order: Order, count: usize, after: u64, upto: u64) -> Option<(usize, u64)> {
    let mut best: Option<(usize, u64)> = None;
    for k in 0..count.min(PUSH_MAX_BUFFERS) {
        // SYNC: push-seq — Acquire pairs with the publisher's Release.
        let s = entry.push_seq[k].load(Ordering::Acquire);
        let better = match order {
            Order::Newest => best.is_none_or(|(_, b)| s > b),
            Order::Oldest => best.is_none_or(|(_, b)| s < b),
        };
        if s & SEQ_WRITING == 0 && s > after && s <= upto && better {
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
    between(entry, Order::Newest, PUSH_BUFFERS, after, upto)
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
    entry.push_seq[k % PUSH_MAX_BUFFERS].load(Ordering::Relaxed) == seq
}

/// Queued reader that keeps frames past its read (`Frame::hold`): puts its
/// hold on buffer `k`, whose frame `seq` it keeps, and says whether the
/// buffer still has it. The hold stays on the oldest kept frame; the
/// queued rule ([`claim_queued`]) then spares that buffer and every buffer
/// with a newer frame, so the reader reads newer frames in place
/// ([`Take::Peek`]) without moving it. Moving it forward, from one kept
/// frame to a newer one, spares the newer frame throughout: it is newer
/// than the frame held before and is the frame held after.
pub fn keep_hold(entry: &SubEntry, client: &ClientLine, k: usize, seq: u64) -> bool {
    let k = k % PUSH_MAX_BUFFERS;
    // Relaxed: our own word.
    if client.push_held.load(Ordering::Relaxed) as usize != k + 1 {
        // SYNC: push-hold — Release then SeqCst fence, as in `take`: the
        // publisher's claim loads this hold after its own fence.
        client.push_held.store(k as u32 + 1, Ordering::Release);
        fence(Ordering::SeqCst);
    }
    for i in 0..KEEP_HOLD_TRIES {
        // Relaxed: ordered by the fence above (or by the one of the `take`
        // that first held `k`).
        let now = entry.push_seq[k].load(Ordering::Relaxed);
        if now & SEQ_WRITING == 0 {
            return now == seq;
        }
        // A claim's mark, which it takes back once it sees the buffer
        // spared: wait for that, yielding to a publisher preempted in
        // between.
        crate::sync::spin_hint();
        #[cfg(not(loom))]
        if i >= 64 {
            std::thread::yield_now();
        }
        #[cfg(loom)]
        let _ = i;
    }
    false
}

/// How many looks [`keep_hold`] gives a claim's transient mark to be taken
/// back (the first 64 spinning, then yielding the CPU): a mark left by a
/// publisher killed mid-claim must not cost every read long.
const KEEP_HOLD_TRIES: u32 = 64 + 1024;

/// Queued reader: among its first `count` buffers, the complete one with
/// the newest frame it has read (`s <= last`), as `(k, s)`.
pub fn newest_read(entry: &SubEntry, count: usize, last: u64) -> Option<(usize, u64)> {
    between(entry, Order::Newest, count, 0, last)
}

/// Reader: lets go of whatever buffer it holds.
pub fn release_hold(client: &ClientLine) {
    // SYNC: push-hold — Release, as in `take_newest`.
    client.push_held.store(0, Ordering::Release);
}
