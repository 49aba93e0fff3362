//! Clocks shared by processes: `CLOCK_MONOTONIC` is system-wide (outside
//! time namespaces), so a commit time written by the publisher can be
//! compared with a read time in a subscriber.

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// `CLOCK_MONOTONIC_COARSE` now, in nanoseconds: a few ns to read, with
/// the kernel tick's resolution (1–10 ms), for rate limits in hot loops.
pub fn coarse_monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::MonotonicCoarse);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// `CLOCK_REALTIME` now, in nanoseconds.
pub fn realtime_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// `now + timeout`, or a deadline about 136 years out where the sum does
/// not fit an `Instant` (`Duration::MAX`, "wait for ever", would panic).
pub fn deadline_after(now: std::time::Instant, timeout: std::time::Duration) -> std::time::Instant {
    now.checked_add(timeout)
        .unwrap_or_else(|| now + std::time::Duration::from_secs(u64::from(u32::MAX)))
}

/// `d` as a `timespec` for `poll` and `futex`, its seconds capped at
/// `i64::MAX` (`Duration::MAX` would wrap negative, which both refuse).
pub fn timespec(d: std::time::Duration) -> rustix::time::Timespec {
    rustix::time::Timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as _,
        tv_nsec: d.subsec_nanos() as _,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_timespec_of_any_duration_is_never_negative() {
        assert_eq!(timespec(Duration::MAX).tv_sec, i64::MAX);
        let t = timespec(Duration::new(3, 5));
        assert_eq!((t.tv_sec, t.tv_nsec), (3, 5));
    }

    #[test]
    fn a_deadline_after_any_timeout_is_ahead_and_never_panics() {
        let now = Instant::now();
        assert_eq!(
            deadline_after(now, Duration::from_millis(5)),
            now + Duration::from_millis(5)
        );
        for huge in [Duration::MAX, Duration::from_secs(u64::MAX / 2)] {
            let d = deadline_after(now, huge);
            assert!(d >= now + Duration::from_secs(u64::from(u32::MAX)), "{huge:?}");
        }
    }
}
