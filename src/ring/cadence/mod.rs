//! Cadence-aware waiting: a subscriber learns the publisher's frame
//! interval from the commit timestamps it reads, parks on its doorbell
//! until just before the next frame is due, and spins only then.
//!
//! Why: a parked waiter on a sleeping vCPU is slow to wake (the idle
//! state's exit, not the ring; `docs/PERF.md`, "Wake-ups at camera
//! rates"). A camera publishes at a steady cadence, so the wake can be
//! moved ahead of the frame: the subscriber sets a timer (the park's own
//! timeout) for `expected − margin` and is already awake and spinning when
//! the frame lands.
//!
//! * [`Cadence`] is the estimator and the timing policy, pure arithmetic
//!   over nanosecond timestamps (unit-tested with synthetic ones). It is
//!   fed the `(seq, commit_ns)` of every delivered frame or packet
//!   (`commit_ns` is the publisher's `CLOCK_MONOTONIC`, the same clock as
//!   ours on one kernel), the timer overshoot of each early wake, and when
//!   each frame was seen.
//! * It locks when the last intervals agree (their spread is a small part
//!   of their median) and plans a spin window `[expected − margin,
//!   expected + tolerance]`. The frame is expected either one interval
//!   after the last commit or on the publisher's grid (the earliest of the
//!   recent commits carried forward), whichever has needed the narrower
//!   window lately: a source paced by a clock does not carry one late
//!   frame's lateness over to the next, a source that sleeps after each
//!   frame does.
//! * The margin covers the measured timer overshoot and how early frames
//!   come; the tolerance how late they come and how long after its commit a
//!   frame shows up. Each is the largest of its last 128 samples, bounded;
//!   the tolerance takes twice what its samples ask for, since only a frame
//!   that comes late spins through it. Each is capped at a CPU budget (a
//!   share of the interval). The frames a window misses teach it too: a frame delivered
//!   after its window, and a doorbell wake after the window should have
//!   opened (the timer had not fired), enter the samples, so the window
//!   widens to what it missed and not only to what it caught. A frame that
//!   comes before its window was due to open, sooner after its commit than
//!   the samples say frames show up, says the window was placed late: the
//!   samples above it are forgotten.
//! * The park up to the window runs with the thread's timer slack at 1 ns
//!   (restored after the wait), so its timer fires when asked and not as
//!   late as the kernel's default slack allows.
//! * Anything irregular unlocks it: a seq that goes backwards or jumps, a
//!   timestamp in the future, zero, backwards or out of range (a hostile or
//!   restarted publisher), intervals that disagree, or frames that miss
//!   their window a few times in a row. Unlocked, or when the next frame is
//!   already overdue (a paused stream), the wait is the plain spin-then-park
//!   of [`WaitStrategy::Park`]: no CPU is spent on a stream that does not
//!   come.
//!
//! [`CadencePlan`] adapts it to [`super::wait::WaitPlan`], the hook of
//! [`super::wait::wait_with`]; the window never outlives the caller's
//! deadline, and parking in it is the ordinary doorbell park, so an early
//! frame, a closed or dead publisher and an eviction are noticed as in any
//! other park.

mod estimator;
mod plan;
mod samples;

pub use estimator::{Cadence, CadenceState, Window};
pub(crate) use plan::wait_by;
pub use plan::{CadencePlan, WaitStrategy};
