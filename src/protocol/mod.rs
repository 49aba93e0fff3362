//! The lock-free ring protocol over the shared layout, backend-agnostic.
//!
//! # Who writes what
//!
//! | field | writer | readers |
//! | --- | --- | --- |
//! | `RingHeader.info.*` | publisher, once, before `layout_version` | everyone (validated once, copied) |
//! | `producer.state` | publisher | subscribers (Acquire) |
//! | `seq.global_seq` | publisher | subscribers (Acquire) |
//! | `doorbell.doorbell` | publisher | subscribers (futex word) |
//! | `SlotDesc.seq` | publisher | subscribers (Acquire, then re-check) |
//! | `SlotDesc.{pts, commit_ns, flags, user*}` | publisher, between invalidate and commit | subscribers, between the two seq loads |
//! | `SubEntry.{state, flags, generation, name}` | publisher | producer path, subscriber |
//! | `SubEntry.{released_seq, reading_seq, parked, counters, heartbeat}` | that subscriber | publisher |
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
//!   (Release) after its copy of `s` completed (or its borrow ended); the
//!   producer Acquire-loads it before reusing the slot that held `s`.
//! * **park**: a subscriber sets `parked = 1`, `SeqCst` fence, loads the
//!   doorbell, re-checks `global_seq`, then futex-waits on the doorbell value
//!   it loaded. The publisher stores `global_seq`, `SeqCst` fence, then reads
//!   every `parked`; if any is set it increments the doorbell (Release) and
//!   wakes. The two fences make it impossible for both sides to miss each
//!   other (Dekker); every wait is also bounded by a timeout slice.
//! * **push-seq / push-hold**: push delivery, see [`push`].
//!
//! Sequence numbers are free-running `u64`; 0 means never written; the slot
//! of seq `s` is `s & (slot_count - 1)`.

pub mod consume;
pub mod publish;
pub mod push;
pub mod wait;

pub use consume::{pick, safe_window, Look, Pick, ReadMode, SlotSnapshot};
pub use publish::{
    commit, commit_slot, invalidate, lossless_holder, publish_global, publish_seq, ring_doorbell, ring_doorbell_word,
    CommitMeta,
};
pub use wait::{wait_for_seq, wait_on, Bell, WaitOutcome};
