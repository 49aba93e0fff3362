//! The benches' machine sampler (`benches/common/host.rs`: busy, stolen and
//! runnable CPU over a measured window), tested here because the benches
//! run without a test harness.

#[path = "../benches/common/host.rs"]
#[allow(dead_code)]
mod host;

use std::time::{Duration, Instant};

#[test]
fn this_machines_counters_give_a_window_within_bounds() {
    let w = host::HostWindow::sample_until(Instant::now() + Duration::from_millis(60), Duration::from_millis(10))
        .expect("/proc/stat is readable on Linux");
    assert!(w.cpus >= 1, "{w:?}");
    assert!((0.0..=100.0).contains(&w.busy_pct), "{w:?}");
    assert!((0.0..=100.0).contains(&w.steal_pct), "{w:?}");
    // This test's own thread is runnable when it reads the counter.
    assert!(w.samples >= 2 && w.running_max >= 1, "{w:?}");
}

const STAT: &str =
    "cpu  100 5 50 1000 10 1 2 30 7 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1 2\nprocs_running 3\nprocs_blocked 0\n";

#[test]
fn the_cpu_line_is_parsed_without_guest_time() {
    let t = host::CpuTicks::parse(STAT).expect("parsed");
    assert_eq!(t.total, 100 + 5 + 50 + 1000 + 10 + 1 + 2 + 30);
    assert_eq!(t.idle, 1010);
    assert_eq!(t.steal, 30);
    assert_eq!(host::procs_running(STAT), Some(3));
    // A kernel without the steal field (before 2.6.11) reads as steal 0;
    // fewer than the four oldest fields is not a cpu line.
    let old = host::CpuTicks::parse("cpu  10 0 5 100 2\n").expect("five fields");
    assert_eq!((old.total, old.idle, old.steal), (117, 102, 0));
    assert_eq!(host::CpuTicks::parse("cpu  1 2 3\n"), None);
    assert_eq!(host::CpuTicks::parse("cpu0 1 2 3 4\n"), None);
    assert_eq!(host::CpuTicks::parse("cpu  1 x 3 4\n"), None);
}

#[test]
fn a_window_reports_busy_and_stolen_shares() {
    let a = host::CpuTicks {
        total: 1000,
        idle: 800,
        steal: 0,
    };
    let b = host::CpuTicks {
        total: 2000,
        idle: 1300,
        steal: 100,
    };
    let w = host::HostWindow::between(a, b, &[2, 4, 6], 16);
    assert!((w.busy_pct - 50.0).abs() < 1e-9, "{w:?}");
    assert!((w.steal_pct - 10.0).abs() < 1e-9, "{w:?}");
    assert!((w.running_mean - 4.0).abs() < 1e-9 && w.running_max == 6, "{w:?}");
}

#[test]
fn summed_windows_give_the_shares_and_a_cell() {
    let mut sum = host::CpuTicks::default();
    assert_eq!(sum.shares(), None);
    assert_eq!(sum.cell(), "–");
    sum.total = 400;
    sum.idle = 300;
    sum.steal = 8;
    assert_eq!(sum.shares(), Some((25.0, 2.0)));
    assert_eq!(sum.cell(), "25.0 / 2.00");
    // A window read now adds what the counters moved by, never less.
    let w = sum
        .add_since(host::CpuTicks::now())
        .expect("/proc/stat is readable on Linux");
    assert!(sum.total >= 400 && (0.0..=100.0).contains(&w.busy_pct), "{sum:?} {w:?}");
    assert_eq!(sum.add_since(None), None);
}
