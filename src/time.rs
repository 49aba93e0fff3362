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
