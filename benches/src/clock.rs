//! Clocks and pacing: `CLOCK_MONOTONIC` (comparable across processes), a
//! thread's and a process's CPU time, and waiting until a monotonic time,
//! asleep or spinning.

/// `CLOCK_MONOTONIC` now, ns (the clock of every latency stamp the benches
/// pass between processes).
pub fn now_ns() -> u64 {
    vramring::monotonic_ns()
}

/// This thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), ns.
pub fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// This process's CPU time, every thread's user and system time
/// (`CLOCK_PROCESS_CPUTIME_ID`), ns.
pub fn process_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// What two back-to-back [`thread_cpu_ns`] reads cost (µs of wall time,
/// median of 10 000): the measurement's own share of a column read
/// between two of them.
pub fn clock_pair_us() -> f64 {
    let mut d: Vec<u64> = (0..10_000)
        .map(|_| {
            let t0 = now_ns();
            let a = thread_cpu_ns();
            let b = thread_cpu_ns();
            std::hint::black_box((a, b));
            now_ns() - t0
        })
        .collect();
    d.sort_unstable();
    crate::stats::pct_us(&d, 0.5)
}

/// Sleeps until `CLOCK_MONOTONIC` reads `t` ns (absolute: a late wake-up
/// does not shift the schedule; a signal's interruption sleeps again).
pub fn sleep_until_ns(t: u64) {
    let ts = rustix::time::Timespec {
        tv_sec: (t / 1_000_000_000) as _,
        tv_nsec: (t % 1_000_000_000) as _,
    };
    while let Err(rustix::io::Errno::INTR) =
        rustix::thread::clock_nanosleep_absolute(rustix::thread::ClockId::Monotonic, &ts)
    {}
}

/// Spins until `CLOCK_MONOTONIC` reads `t` ns, as a thread that is never
/// idle (its core stays awake, its caches warm).
pub fn spin_until_ns(t: u64) {
    while now_ns() < t {
        std::hint::spin_loop();
    }
}

/// Waits until `t` ns: spinning ([`spin_until_ns`]) when `spin`, else
/// asleep ([`sleep_until_ns`]).
pub fn wait_until_ns(t: u64, spin: bool) {
    if spin {
        spin_until_ns(t);
    } else {
        sleep_until_ns(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waits_end_at_their_time_and_not_before() {
        for spin in [false, true] {
            let t = now_ns() + 2_000_000;
            wait_until_ns(t, spin);
            assert!(now_ns() >= t, "spin {spin}");
        }
        // A time already past returns at once.
        sleep_until_ns(0);
        spin_until_ns(0);
    }

    #[test]
    fn cpu_clocks_advance_with_work() {
        let (t0, p0) = (thread_cpu_ns(), process_cpu_ns());
        let mut x = 0u64;
        for k in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(k));
        }
        assert!(thread_cpu_ns() > t0 && process_cpu_ns() > p0);
        assert!(clock_pair_us() >= 0.0);
    }
}
