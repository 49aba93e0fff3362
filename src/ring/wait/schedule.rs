//! The subscriber's wait: spin, then park on its doorbell in bounded slices,
//! with an optional spin window and the in-flight commit rule.

use std::time::{Duration, Instant};

use super::bell::{park, Bell};
use super::precise_timer::PreciseTimer;
use crate::layout::{ClientLine, PRODUCER_CLOSED, SEQ_WRITING};
use crate::sync::atomic::{fence, Ordering};

/// Why [`wait_on`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// `global_seq` passed the seq; here it is.
    Advanced(u64),
    /// The publisher closed in order.
    ProducerClosed,
    /// The deadline passed.
    TimedOut,
    /// The liveness check asked to stop.
    Stopped,
}

/// How long a subscriber spins on a commit it saw in flight before it naps
/// instead: a commit normally lands within microseconds, and since nobody
/// rings when it lands (ADR 0017), the naps, from [`IN_FLIGHT_NAP_MIN`] up
/// to [`IN_FLIGHT_NAP_MAX`], bound how late a slower one is found.
const IN_FLIGHT_SPIN: Duration = Duration::from_millis(2);
/// The first and longest nap between looks at a commit still in flight
/// after [`IN_FLIGHT_SPIN`] (doubling in between).
const IN_FLIGHT_NAP_MIN: Duration = Duration::from_micros(200);
const IN_FLIGHT_NAP_MAX: Duration = Duration::from_millis(20);

/// Waits until the bell's seq passes `after`, or `deadline`.
///
/// Spins for up to `spin`, then parks on `client`'s doorbell futex in
/// slices of at most `slice`; between slices it calls `alive()`, which
/// returns `false` to stop waiting (the publisher's socket closed, or this
/// subscriber was evicted). `client` is this subscriber's own region, whose
/// `parked` flag tells the publisher to ring its doorbell.
pub fn wait_on(
    bell: Bell<'_>,
    client: &ClientLine,
    after: u64,
    deadline: Instant,
    spin: Duration,
    slice: Duration,
    alive: impl FnMut() -> bool,
) -> WaitOutcome {
    wait_with(bell, client, after, deadline, spin, slice, &mut NoPlan, alive)
}

/// A spin window inside a park: park (on the doorbell, as usual) until
/// `from`, then spin until the seq moves or `until`, then park as usual.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpinWindow {
    /// Stop parking and start spinning here.
    pub from: Instant,
    /// Stop spinning here.
    pub until: Instant,
}

/// A timing hint for one wait ([`wait_with`]); `ring::cadence` implements
/// it from the publisher's cadence.
pub trait WaitPlan {
    /// The window to spin in, asked once per wait; `None`: none.
    fn window(&mut self) -> Option<SpinWindow>;
    /// The park whose timeout ended at the window's `from` returned `late`
    /// after it with nothing to read (the timer's overshoot).
    fn timer_woke(&mut self, late: Duration) {
        let _ = late;
    }
    /// The window's spin begins.
    fn window_opened(&mut self) {}
    /// The wait parks with its timer set to the window's start.
    fn parked_for_window(&mut self) {}
}

/// No plan: [`wait_with`] is then exactly [`wait_on`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPlan;

impl WaitPlan for NoPlan {
    fn window(&mut self) -> Option<SpinWindow> {
        None
    }
}

/// A park on a timer held without the thread's timer slack, for a wait
/// whose deadline is this instant: a window of no length there, which the
/// deadline ends before it opens.
#[derive(Debug, Clone, Copy)]
pub struct Doze(pub Instant);

impl WaitPlan for Doze {
    fn window(&mut self) -> Option<SpinWindow> {
        Some(SpinWindow {
            from: self.0,
            until: self.0,
        })
    }
}

/// [`wait_on`] with a [`WaitPlan`]: while parked, the park's timeout also
/// ends at the plan's window, which is then spun through. Parking, the
/// deadline, `slice` and `alive()` work as in [`wait_on`] throughout.
#[allow(clippy::too_many_arguments)]
pub fn wait_with(
    bell: Bell<'_>,
    client: &ClientLine,
    after: u64,
    deadline: Instant,
    spin: Duration,
    slice: Duration,
    plan: &mut impl WaitPlan,
    mut alive: impl FnMut() -> bool,
) -> WaitOutcome {
    // What was committed (or pushed): the loan does not count here.
    let committed = || {
        // SYNC: global-seq / packet-write-seq — Acquire pairs with the
        // publisher's Release store.
        let g = bell.seq.load(Ordering::Acquire);
        bell.push.map_or(g, |words| {
            words
                .iter()
                // SYNC: push-seq — Acquire pairs with the publisher's (or
                // the commit kernel's) store after the copy.
                .map(|w| w.load(Ordering::Acquire))
                .filter(|s| s & SEQ_WRITING == 0)
                .fold(g, u64::max)
        })
    };
    let closed = || {
        // SYNC: producer-state — Acquire pairs with the publisher's Release on close.
        bell.producer.state.load(Ordering::Acquire) == PRODUCER_CLOSED
    };
    let load = || {
        let g = committed();
        bell.loaned.map_or(g, |(word, s)| {
            // SYNC: invalidate — Relaxed: only says that slot `s` is being
            // written; the copy this starts waits on the GPU for the
            // commit and is validated after it (PROTOCOL.md §11). A loan
            // left unpublished by a publisher that closed will never be.
            if word.load(Ordering::Relaxed) == s | SEQ_WRITING && !closed() {
                g.max(s)
            } else {
                g
            }
        })
    };
    let g = load();
    if g > after {
        return WaitOutcome::Advanced(g);
    }
    let spin_until = crate::time::deadline_after(Instant::now(), spin).min(deadline);
    // The in-flight commit already waited for on the CPU: one that has not
    // landed within `IN_FLIGHT_SPIN` is waited for parked (a stuck GPU must
    // not keep the subscriber spinning).
    let mut in_flight = InFlight::default();
    while Instant::now() < spin_until {
        let g = load();
        if g > after {
            return WaitOutcome::Advanced(g);
        }
        crate::sync::spin_hint();
    }
    let mut window = plan.window();
    // Restores the thread's timer slack when the wait returns.
    let mut precise: Option<PreciseTimer> = None;
    loop {
        if closed() {
            // A frame may have been committed just before the close; a
            // loan left unpublished at the close is not one.
            let g = committed();
            return if g > after {
                WaitOutcome::Advanced(g)
            } else {
                WaitOutcome::ProducerClosed
            };
        }
        let now = Instant::now();
        if now >= deadline {
            return WaitOutcome::TimedOut;
        }
        if let Some(w) = window.filter(|w| now >= w.from) {
            window = None;
            plan.window_opened();
            while Instant::now() < w.until.min(deadline) {
                let g = load();
                if g > after {
                    return WaitOutcome::Advanced(g);
                }
                // Yield, not only a pause: on a busy machine the publisher
                // may be waiting for this very CPU to make the frame.
                #[cfg(not(loom))]
                std::thread::yield_now();
                crate::sync::spin_hint();
            }
            continue;
        }
        // Relaxed store + SeqCst fence: SYNC: park — the fence orders the
        // flag before the doorbell and global_seq loads (mirror of the
        // publisher's fence between its global_seq store and its flag loads).
        client.parked.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        // SYNC: doorbell — Acquire pairs with the publisher's Release increment.
        let word = client.doorbell.load(Ordering::Acquire);
        let g = load();
        if g > after {
            client.parked.store(0, Ordering::Relaxed);
            return WaitOutcome::Advanced(g);
        }
        // A planned window ends the park early (`from > now` here), on a
        // timer held without the thread's timer slack (`PreciseTimer`), so
        // it fires when asked.
        let timer = window.map(|w| w.from);
        if timer.is_some() && precise.is_none() {
            precise = Some(PreciseTimer::hold());
        }
        let mut limit = (deadline - now).min(timer.map_or(slice, |from| slice.min(from - now)));
        if let Some(pending) = bell.pending {
            // SYNC: pending — Relaxed, ordered by the SeqCst fence above
            // (mirror of the publisher's fence between its `pending_seq`
            // store and its `parked` loads).
            let p = pending.load(Ordering::Relaxed);
            let step = in_flight.step(p, after);
            if step == InFlightStep::Spin {
                // A commit is in flight, and nobody rings when it lands (the
                // publisher rang, if at all, when it announced it, ADR
                // 0017): wait for it on the CPU (microseconds on the GPU).
                client.parked.store(0, Ordering::Relaxed);
                let mut until = (Instant::now() + IN_FLIGHT_SPIN).min(deadline);
                let mut opened = false;
                loop {
                    let g = load();
                    if g > after {
                        return WaitOutcome::Advanced(g);
                    }
                    let now = Instant::now();
                    if let Some(w) = window.filter(|w| now >= w.from) {
                        // The planned window opens while this spin runs
                        // (the publisher rang at the announcement, before
                        // the commit landed, ADR 0017): the spin is the
                        // window's, so a frame found from here is the
                        // window's hit or miss, not an early frame whose
                        // lateness would read as the timer's overshoot.
                        window = None;
                        plan.window_opened();
                        until = until.max(w.until.min(deadline));
                        opened = true;
                    }
                    if now >= until {
                        break;
                    }
                    if opened {
                        // As in the window's own spin: yield too.
                        #[cfg(not(loom))]
                        std::thread::yield_now();
                    }
                    crate::sync::spin_hint();
                }
                continue;
            }
            if let InFlightStep::Nap(n) = step {
                limit = limit.min(n);
            }
        }
        if timer.is_some() {
            plan.parked_for_window();
        }
        park(client, word, limit);
        // Relaxed: only a hint for the publisher; a stale 1 costs one wake.
        client.parked.store(0, Ordering::Relaxed);
        let g = load();
        if g > after {
            return WaitOutcome::Advanced(g);
        }
        if let Some(late) = timer.and_then(|from| Instant::now().checked_duration_since(from)) {
            plan.timer_woke(late);
        }
        if !alive() {
            return WaitOutcome::Stopped;
        }
    }
}

/// What a parked waiter does about the commit announced in flight
/// (`pending_seq`) when it looks: [`InFlight::step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InFlightStep {
    /// Nothing newer than what it waits for is in flight: park as usual.
    Park,
    /// A commit it has not spun for yet is in flight: spin for it.
    Spin,
    /// The commit it spun for is still in flight: look again after this
    /// nap instead of a whole park slice.
    Nap(Duration),
}

/// The in-flight bookkeeping of one wait: which announced seq it has spun
/// for, and how long its last nap for it was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct InFlight {
    /// The announced seq spun for (0: none).
    spun_for: u64,
    /// The last nap taken for it (`None`: none yet).
    nap: Option<Duration>,
}

impl InFlight {
    /// The waiter, waiting for a seq after `after`, reads `pending` as the
    /// announced seq: spin for a commit once, then nap, growing from
    /// [`IN_FLIGHT_NAP_MIN`] to [`IN_FLIGHT_NAP_MAX`].
    fn step(&mut self, pending: u64, after: u64) -> InFlightStep {
        if pending < self.spun_for {
            // The announcement was withdrawn (a failed enqueue,
            // PROTOCOL.md step 9′): the same seq announced again is a new
            // commit, spun for afresh rather than found by a nap.
            *self = InFlight::default();
        }
        if pending <= after {
            return InFlightStep::Park;
        }
        if pending != self.spun_for {
            self.spun_for = pending;
            return InFlightStep::Spin;
        }
        let n = self.nap.map_or(IN_FLIGHT_NAP_MIN, |n| (n * 2).min(IN_FLIGHT_NAP_MAX));
        self.nap = Some(n);
        InFlightStep::Nap(n)
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
