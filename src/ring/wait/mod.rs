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
//! * **plan** ([`wait_with`]): a [`WaitPlan`] may add one spin window to
//!   a wait: the park's timeout then also ends at the window's start, the
//!   waiter spins through it and parks again as usual if nothing came
//!   (`ring::cadence` plans it from the publisher's cadence).
//! * Each doorbell lives in a region only its subscriber and the publisher
//!   map, so no subscriber can wake (or keep awake) another.
//! * **in flight** (frame rings on CUDA, stream-order commits): the GPU
//!   stores `global_seq` behind the frame's writes, and the publisher does
//!   not wait for it. It stores `pending_seq` (the seq it enqueued),
//!   `SeqCst` fence, then rings every subscriber it sees parked, at once,
//!   so that no subscriber can make it wait for the GPU (ADR 0017): the
//!   commit may not have landed yet. A subscriber that has set `parked` and
//!   fenced reads `pending_seq` too: if a commit newer than what it waits
//!   for is in flight it spins until it lands (then naps briefly) instead of
//!   parking. Dekker again: either the publisher saw the flag and rang, so
//!   the subscriber wakes, parks again and sees the commit in flight, or
//!   the subscriber saw the commit in flight. Nobody rings when the commit
//!   lands.

mod bell;
mod precise_timer;
mod schedule;

pub use bell::{publish_seq, ring_doorbell, wake_if_parked, Bell};
pub use schedule::{wait_on, wait_with, Doze, NoPlan, SpinWindow, WaitOutcome, WaitPlan};
