//! The wait strategies and the glue that runs one wait by them: the cadence
//! estimator as the hook of the doorbell wait.

use std::time::{Duration, Instant};

use super::estimator::Cadence;
use crate::layout::ClientLine;
use crate::ring::wait::{wait_with, Bell, NoPlan, SpinWindow, WaitOutcome, WaitPlan};
use crate::ring::ClientConfig;

/// How a subscriber waits for the next frame or packet.
///
/// Every strategy is bounded by the call's timeout and notices a closed
/// publisher; the parking ones also check the publisher's socket between
/// park slices (`park_slice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaitStrategy {
    /// The default. Learns the publisher's cadence from commit timestamps;
    /// once it is steady, parks on the futex until just before the next
    /// frame is due (an early frame still wakes it), spins through the
    /// window in which the frame is expected, and falls back to
    /// [`WaitStrategy::Park`] when the frame does not come or the source
    /// is irregular. At camera rates it receives frames far sooner than a
    /// plain park, for a small share of the CPU a spin costs
    /// (`docs/PERF.md`, "Wake-ups at camera rates").
    #[default]
    Cadence,
    /// Spin for `spin` (default 50 µs), then park on the futex until a
    /// frame comes. Cheapest in CPU; every frame that comes while parked
    /// pays the kernel's wakeup, slow on an idle vCPU.
    Park,
    /// Busy-poll for the whole timeout: lowest latency, one core at 100 %.
    /// A publisher that closes is noticed at the timeout, not before.
    Spin,
}

/// One wait of a subscriber (either ring kind) by its settings' strategy:
/// the cadence plan ([`WaitStrategy::Cadence`], learning into `cadence`), a
/// spin of `cfg.spin` then park ([`WaitStrategy::Park`]), or a spin up to
/// the deadline ([`WaitStrategy::Spin`]); otherwise as
/// [`crate::ring::wait::wait_with`], parking at most `cfg.park_slice` at a
/// time.
pub(crate) fn wait_by(
    cfg: &ClientConfig,
    cadence: &mut Cadence,
    bell: Bell<'_>,
    client: &ClientLine,
    after: u64,
    deadline: Instant,
    alive: impl FnMut() -> bool,
) -> WaitOutcome {
    let (spin, slice) = (cfg.spin, cfg.park_slice);
    match cfg.wait {
        WaitStrategy::Cadence => {
            let (mut plan, spin) = CadencePlan::new(cadence, spin);
            let o = wait_with(bell, client, after, deadline, spin, slice, &mut plan, alive);
            plan.finish(matches!(o, WaitOutcome::Advanced(_)));
            o
        }
        WaitStrategy::Park => wait_with(bell, client, after, deadline, spin, slice, &mut NoPlan, alive),
        WaitStrategy::Spin => {
            let spin = deadline.saturating_duration_since(Instant::now());
            wait_with(bell, client, after, deadline, spin, slice, &mut NoPlan, alive)
        }
    }
}

/// [`Cadence`] as the hook of one [`crate::ring::wait::wait_with`] call.
pub struct CadencePlan<'a> {
    cadence: &'a mut Cadence,
    /// The window's spin began.
    spun: bool,
    /// The wait parked on a timer set to the window's start.
    parked: bool,
    /// The window, converted to `Instant`s at plan time.
    window: Option<SpinWindow>,
}

impl<'a> CadencePlan<'a> {
    /// Plans a wait now. Returns the plan and the spin before parking to
    /// pass to the wait: `spin`, always (a window comes on top of it, so a
    /// caller that asked for a long spin still busy-polls).
    pub fn new(cadence: &'a mut Cadence, spin: Duration) -> (Self, Duration) {
        let (now, now_ns) = (Instant::now(), crate::time::monotonic_ns());
        let window = cadence.plan(now_ns).map(|w| SpinWindow {
            from: now + Duration::from_nanos(w.from_ns.saturating_sub(now_ns)),
            until: now + Duration::from_nanos(w.until_ns.saturating_sub(now_ns)),
        });
        (
            CadencePlan {
                cadence,
                spun: false,
                parked: false,
                window,
            },
            spin,
        )
    }

    /// Reports how the wait ended (`advanced`: the seq moved).
    pub fn finish(self, advanced: bool) {
        self.cadence
            .waited(advanced, self.spun, self.parked, crate::time::monotonic_ns());
    }
}

impl WaitPlan for CadencePlan<'_> {
    fn window(&mut self) -> Option<SpinWindow> {
        self.window
    }
    fn timer_woke(&mut self, late: Duration) {
        self.cadence
            .timer_woke(u64::try_from(late.as_nanos()).unwrap_or(u64::MAX));
    }
    fn window_opened(&mut self) {
        self.spun = true;
    }
    fn parked_for_window(&mut self) {
        self.parked = true;
    }
}
