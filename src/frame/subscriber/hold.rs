//! Pushed frames kept past the next read ([`Frame::hold`]): a queued push
//! reader leaves its `push_held` word on the oldest frame it keeps, which
//! the publisher's queued rule spares together with every newer frame
//! (PROTOCOL.md §16.8), so a frame handed on without a copy (a GStreamer
//! buffer, a tensor) stays whole until its [`FrameHold`] drops.

use std::sync::{Arc, Mutex, PoisonError};

use super::*;
use crate::layout::PUSH_MAX_BUFFERS;
use crate::ring::lease::ClientRef;
use crate::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64};

/// How long a lossless reader that keeps frames waits at most before it
/// looks at its holds again: the bound on a release whose wake-up it missed
/// (it parked between the flag and the ring, see `FrameHold::drop`).
const KEPT_LOOK: Duration = Duration::from_millis(10);

/// What a subscriber and its [`FrameHold`]s share: which push buffers are
/// kept, and the subscriber's pool once it closed with some still kept.
pub(super) struct Holds {
    /// Per push buffer: the live holds of its frame.
    count: [AtomicU32; PUSH_MAX_BUFFERS],
    /// Per push buffer: the seq of the frame kept (meaningful while its
    /// count is above 0; a kept buffer is never rewritten).
    seq: [AtomicU64; PUSH_MAX_BUFFERS],
    /// The subscriber's pool (its push buffers' mapping), parked here by a
    /// close that found holds alive; released when the last one drops.
    parked: Mutex<Option<Box<dyn ImportedPool>>>,
    /// A lossless reader's client region: a buffer let go rings its
    /// doorbell, since the publisher may be waiting on the cursor that
    /// buffer held back.
    wake: Option<ClientRef>,
    /// A buffer was let go since the subscriber last looked.
    released: AtomicBool,
}

impl Holds {
    /// Holds of a subscriber; `wake`: its client region, for a lossless
    /// queued push reader (see [`Holds::released`]).
    pub(super) fn new(wake: Option<ClientRef>) -> Arc<Holds> {
        Arc::new(Holds {
            count: std::array::from_fn(|_| AtomicU32::new(0)),
            seq: std::array::from_fn(|_| AtomicU64::new(0)),
            parked: Mutex::new(None),
            wake,
            released: AtomicBool::new(false),
        })
    }

    /// Whether a kept buffer was let go since the subscriber last refreshed
    /// its hold: its wait then ends (a lossless reader's).
    pub(super) fn released(&self) -> bool {
        // Relaxed: a hint; the counts themselves are read with Acquire.
        self.released.load(Ordering::Relaxed)
    }

    /// Takes the flag down before the counts are read again.
    fn take_released(&self) {
        // SYNC: frame-hold — Acquire swap: if it reads a drop's flag, that
        // drop's decrement is seen by the count loads after it (and a drop
        // after it sets the flag again).
        self.released.swap(false, Ordering::Acquire);
    }

    /// The oldest kept frame, as `(k, seq)`.
    pub(super) fn oldest(&self) -> Option<(usize, u64)> {
        let mut best: Option<(usize, u64)> = None;
        for k in 0..PUSH_MAX_BUFFERS {
            // SYNC: frame-hold — Acquire pairs with the Release of a hold's
            // drop: whatever its owner read of the buffer happens before we
            // let the publisher rewrite it.
            if self.count[k].load(Ordering::Acquire) == 0 {
                continue;
            }
            // Relaxed: written by this subscriber's thread before the count.
            let s = self.seq[k].load(Ordering::Relaxed);
            if best.is_none_or(|(_, b)| s < b) {
                best = Some((k, s));
            }
        }
        best
    }

    /// Counts a hold on push buffer `k`, which has frame `seq`; the
    /// `FrameHold` made with the returned handle takes it back on drop.
    pub(super) fn keep(self: &Arc<Self>, k: usize, seq: u64) -> Arc<Holds> {
        let k = k % PUSH_MAX_BUFFERS;
        // Relaxed: published by the count's increment below, which the
        // subscriber's own thread (the only writer of `seq`) makes.
        self.seq[k].store(seq, Ordering::Relaxed);
        self.count[k].fetch_add(1, Ordering::Release);
        Arc::clone(self)
    }

    /// Parks `pool` until the last hold drops.
    pub(super) fn park(&self, pool: Box<dyn ImportedPool>) {
        *self.parked.lock().unwrap_or_else(PoisonError::into_inner) = Some(pool);
    }
}

impl Drop for Holds {
    fn drop(&mut self) {
        let parked = self.parked.get_mut().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(mut pool) = parked {
            if let Err(e) = pool.close() {
                tracing::warn!(error = %e, "releasing a closed subscriber's push buffers after its last held frame");
            }
        }
    }
}

/// A pushed frame kept past the subscriber's next read, from
/// [`Frame::hold`]: its bytes stay in the subscriber's push buffer, which
/// the publisher does not rewrite until every hold of it has dropped (and
/// which outlives the subscriber's close until then). `Send`, so it can go
/// where the frame goes: a GStreamer buffer, another thread.
///
/// While a hold is alive the publisher spares its buffer and every buffer
/// with a newer frame, so a reader keeps taking frames, in place, until
/// its queue is full of frames it has read; then frames are not pushed to
/// it (a counted gap, or for a lossless reader the publisher waits, as for
/// any slow lossless reader). Drop holds as soon as the frame is used.
pub struct FrameHold {
    /// Made by [`Holds::keep`], which counted this hold on buffer `k`.
    pub(super) holds: Arc<Holds>,
    pub(super) k: usize,
    pub(super) seq: u64,
    pub(super) pts: i64,
    pub(super) addr: u64,
    pub(super) len: u64,
    pub(super) backend: BackendKind,
}

impl std::fmt::Debug for FrameHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameHold")
            .field("seq", &self.seq)
            .field("buffer", &self.k)
            .finish()
    }
}

impl FrameHold {
    /// The frame's seq.
    pub fn seq(&self) -> u64 {
        self.seq
    }
    /// The frame's presentation timestamp.
    pub fn pts(&self) -> i64 {
        self.pts
    }
    /// Bytes of the frame (planes at the offsets of the ring's geometry).
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the frame is empty (never: frames have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The frame as device memory in the subscriber's context, on a CUDA
    /// ring (`None` on a host ring: see [`FrameHold::host_bytes`]).
    pub fn device(&self) -> Option<DeviceView<'_>> {
        (self.backend == BackendKind::Cuda).then(|| DeviceView::new(self.addr, self.len))
    }
    /// The frame's bytes, on a host ring.
    pub fn host_bytes(&self) -> Option<&[u8]> {
        if self.backend != BackendKind::Host || self.addr == 0 {
            return None;
        }
        // SAFETY: `addr` is push buffer `k` of the subscriber's own host
        // mapping, at least `len` bytes (`Frame::host_bytes` checked it);
        // the mapping lives while `holds` does (in the subscriber, or
        // parked here by its close), and the publisher writes this buffer
        // only after our count dropped to 0, so the bytes do not change.
        Some(unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len as usize) })
    }
}

impl Drop for FrameHold {
    fn drop(&mut self) {
        // SYNC: frame-hold — Release: our reads of the buffer happen before
        // the subscriber moves its hold off it (its Acquire in `oldest`).
        let was = self.holds.count[self.k].fetch_sub(1, Ordering::Release);
        if let (1, Some(client)) = (was, &self.holds.wake) {
            // The flag, then the SeqCst fence `wake_if_parked` wants before
            // it loads `parked`: a subscriber that parks after this load
            // finds the flag when its park ends (at most `KEPT_LOOK`: its
            // hold is behind, see `kept_wait_end`).
            // SYNC: frame-hold — Release, paired with `take_released`.
            self.holds.released.store(true, Ordering::Release);
            fence(Ordering::SeqCst);
            crate::ring::wait::wake_if_parked(client.get());
        }
    }
}

impl Subscriber {
    /// Whether this push subscriber reads a queue (sequential or lossless),
    /// whose buffers the publisher claims by the queued rule: the only
    /// kind whose frames [`Frame::hold`] can keep.
    pub(super) fn push_queued(&self) -> bool {
        self.push.is_some() && (self.opts.mode == Mode::Sequential || self.opts.client.lossless)
    }

    /// The cursor a lossless reader releases after reading up to `seq`.
    /// While a queued push reader's hold is left behind (on a kept frame,
    /// or not yet caught up after it was let go), no further than the frame
    /// the hold names: the publisher's window counts from the cursor, and
    /// the hold spares every buffer with a newer frame, read or not.
    /// Otherwise no buffer past the hold holds a frame already read, and
    /// the cursor may pass it (past frames that were never pushed).
    pub(super) fn release_cursor(&self, seq: u64) -> u64 {
        if self.push_queued() && (self.hold_behind || self.holds.oldest().is_some()) {
            seq.min(self.hold_seq)
        } else {
            seq
        }
    }

    /// A queued push reader, before each read: the hold goes where it
    /// belongs now (see `refresh_hold`), and a lossless reader's cursor
    /// follows it (the publisher's lossless window counts from it, and may
    /// be waiting on it).
    pub(super) fn release_kept(&mut self) {
        if !self.push_queued() {
            return;
        }
        self.refresh_hold();
        self.release_to_hold();
    }

    /// Before a push read that holds: with frames kept, the hold on the
    /// oldest of them and a read in place under it (`Some(Peek)`); else
    /// `None` (the read holds what it takes).
    pub(super) fn read_under_kept(&mut self) -> Option<protocol::push::Take<'static>> {
        let kept = self.refresh_hold();
        self.release_to_hold();
        kept.then_some(protocol::push::Take::Peek)
    }

    /// The end of one wait of `next` or `borrow` that must end at
    /// `deadline`: a lossless queued push reader that keeps frames looks at
    /// its holds again after at most [`KEPT_LOOK`].
    pub(super) fn kept_wait_end(&self, deadline: Instant) -> Instant {
        if self.holds.wake.is_some() && (self.hold_behind || self.holds.oldest().is_some()) {
            deadline.min(Instant::now() + KEPT_LOOK)
        } else {
            deadline
        }
    }

    /// A lossless reader whose stream has started releases its cursor up
    /// to what its hold allows.
    fn release_to_hold(&self) {
        if self.opts.client.lossless && self.push_started {
            // SYNC: release-cursor — Release, as in `deliver`.
            self.client()
                .released_seq
                .store(self.release_cursor(self.last), Ordering::Release);
        }
    }

    /// Puts the hold on the oldest kept frame (`true`), or, once none is
    /// kept, moves a hold left behind on one to the newest frame read
    /// (which it spared, being newer), so the buffers of the frames between
    /// are free again. Without the catch-up the publisher would find every
    /// buffer newer than a stale hold and push nothing more.
    fn refresh_hold(&mut self) -> bool {
        self.holds.take_released();
        if let Some((k, seq)) = self.holds.oldest() {
            if !protocol::push::keep_hold(self.entry(), self.client(), k, seq) {
                // Cannot happen under the queued rule; the frame stays
                // kept and its owner reads what it holds.
                tracing::warn!(seq, buffer = k, "a kept push buffer no longer reads as its frame");
            }
            self.hold_seq = seq;
            self.hold_behind = true;
            return true;
        }
        if std::mem::take(&mut self.hold_behind) {
            let count = self.push.map_or(0, |b| b.count);
            // Never back: a buffer older than the held frame is the
            // publisher's to claim.
            let found = protocol::push::newest_read(self.entry(), count, self.last);
            let caught = found.filter(|&(_, s)| s >= self.hold_seq).is_some_and(|(k, seq)| {
                let kept = protocol::push::keep_hold(self.entry(), self.client(), k, seq);
                if kept {
                    self.hold_seq = seq;
                }
                kept
            });
            // Not caught up (nothing found, or a claim's mark in the way):
            // the cursor stays at the hold, and the next look tries again.
            // Caught up on the newest frame a buffer still has, frames read
            // after it (never pushed) take no buffer.
            self.hold_behind = !caught;
        }
        false
    }

    /// Closes with frames still kept: says goodbye but leaves the hold
    /// where it is and parks the pool (the push buffers' mapping) with the
    /// holds, which release it when the last one drops. `false` when
    /// nothing is kept.
    pub(super) fn park_if_kept(&mut self) -> bool {
        if self.holds.oldest().is_none() {
            return false;
        }
        self.lease.bye();
        let pool = std::mem::replace(&mut self.pool, Box::new(crate::memory::host::HostImport::push_only()));
        self.holds.park(pool);
        self.holds = Holds::new(None);
        self.parked = true;
        true
    }
}
