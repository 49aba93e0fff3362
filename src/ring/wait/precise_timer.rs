//! A guard that holds the calling thread's timer slack at 1 ns while a planned
//! wait parks, so the park ends when asked.

/// The calling thread's timer slack held at 1 ns for as long as this
/// lives, then put back.
///
/// Linux lets a futex timeout fire up to the thread's timer slack late (50
/// µs by default, `prctl(PR_SET_TIMERSLACK)`), so that timers can be
/// batched. A park meant to end just before the frame is due would then
/// wake up to 50 µs later than asked, on every frame. The window's margin
/// absorbs that, but as spin: CPU spent on every frame, and budget not left
/// for the tail the margin exists to cover. The slack is per thread; it is
/// lowered from the first park of a wait that has a window until that wait
/// returns, then restored, so the caller's thread keeps its own setting.
/// Where `prctl` fails (a seccomp profile that refuses it) nothing changes
/// and the margin still absorbs the slack.
pub(super) struct PreciseTimer {
    /// The slack to put back, when it was changed (loom models no timers).
    #[cfg(not(loom))]
    restore: Option<std::num::NonZeroU64>,
}

impl PreciseTimer {
    pub(super) fn hold() -> Self {
        #[cfg(not(loom))]
        {
            let restore = rustix::thread::current_timer_slack()
                .ok()
                .and_then(std::num::NonZeroU64::new)
                .filter(|&old| old.get() > 1)
                .filter(|_| rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1)).is_ok());
            PreciseTimer { restore }
        }
        #[cfg(loom)]
        PreciseTimer {}
    }
}

impl Drop for PreciseTimer {
    fn drop(&mut self) {
        #[cfg(not(loom))]
        if let Some(old) = self.restore {
            let _ = rustix::thread::set_current_timer_slack(Some(old));
        }
    }
}
