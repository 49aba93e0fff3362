//! The lock-free ring protocol over the shared layout, backend-agnostic.
//!
//! # Who writes what
//!
//! | field | writer | readers |
//! | --- | --- | --- |
//! | `RingHeader.info.*` | publisher, once, before `layout_version` | everyone (validated once, copied) |
//! | `producer.state` | publisher | subscribers (Acquire) |
//! | `seq.global_seq` | publisher | subscribers (Acquire) |
//! | `SlotDesc.seq` | publisher | subscribers (Acquire, then re-check) |
//! | `SlotDesc.{pts, commit_ns, flags, user*}` | publisher, between invalidate and commit | subscribers, between the two seq loads |
//! | `SubEntry.*` (the subscriber table) | publisher (`ring::table`) | subscribers, read-only |
//! | `ClientLine.doorbell` | publisher | that subscriber (futex word) |
//! | `ClientLine.{released_seq, reading_seq, parked, push_held, counters}` | that subscriber, in its own region | publisher, as hostile input |
//!
//! # Orderings (each pair is labelled `SYNC: <name>` at both ends)
//!
//! * **slot-seq**: the publisher commits with `slot.seq.store(s, Release)`
//!   after the frame's bytes are complete and its meta is stored; a reader's
//!   `slot.seq.load(Acquire) == s` makes the meta and (for host memory) the
//!   bytes visible. For GPU memory the bytes are complete before the commit
//!   because the publisher synchronised the writing stream first.
//! * **invalidate**: before any write to a slot is made or enqueued, the
//!   publisher stores `seq | SEQ_WRITING` and issues a `SeqCst` fence (a
//!   release fence for the writes that follow). A reader copies the slot, then
//!   issues an Acquire fence and reloads `slot.seq`: if any byte it copied
//!   came from a write after the invalidation, the fence pair makes the
//!   invalidation visible to that reload, so the copy is discarded
//!   ("validate after the copy"). Validating *before* an asynchronous copy
//!   proves nothing: the producer may overwrite the slot while the copy runs.
//! * **global-seq**: `global_seq.store(s, Release)` after the slot's seq;
//!   a reader Acquire-loads it to learn what exists.
//! * **release-cursor**: a lossless subscriber stores `released_seq = s`
//!   (Release) in its client region after its copy of `s` completed (or its
//!   borrow ended); the producer Acquire-loads it (clamped to what was
//!   published, never moving back) before reusing the slot that held `s`.
//! * **park** / **doorbell**: see [`crate::ring::wait`]; each subscriber
//!   parks on the doorbell of its own client region.
//! * **push-seq / push-hold**: push delivery, see [`push`].
//! * **frame-hold**: within one subscriber process, a `FrameHold`'s drop
//!   (Release decrement of its buffer's count) and the subscriber's Acquire
//!   load of the counts before it moves `push_held` off that buffer
//!   (`frame/subscriber/hold.rs`).
//!
//! Sequence numbers are free-running `u64`; 0 means never written; the slot
//! of seq `s` is `s & (slot_count - 1)`.

pub mod consume;
pub mod publish;
pub mod push;

pub use crate::ring::wait::{publish_seq, ring_doorbell, wait_on, wake_if_parked, Bell, WaitOutcome};
pub use consume::{pick, safe_window, Look, Mode, Pick, SlotSnapshot};
pub use publish::{
    announce_pending, commit, commit_slot, invalidate, publish_global, stage_meta, wait_for_seq, withdraw_pending,
    CommitMeta,
};
