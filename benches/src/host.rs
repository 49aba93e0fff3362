//! What the whole machine did while a bench measured: how busy its CPUs
//! were, how much of their time the hypervisor took (steal), and how many
//! threads were runnable at once.
//!
//! The lent GPU machine is a VM whose vCPUs share their host. A run whose
//! tail is bad because the host took the vCPUs away looks, from inside the
//! bench, exactly like one whose tail is bad because of the code under
//! test. The kernel's own counters (`/proc/stat`) tell the two apart: a
//! guest with steal-time accounting reports the time its vCPUs were
//! runnable but not running; `procs_running` says whether runnable threads
//! outnumbered the vCPUs. `scale` samples them over its measured window,
//! `wake` and `latency` over each row's runs, and each prints them beside
//! its figures.

use std::time::{Duration, Instant};

/// The machine in one line: its CPUs, their model, the kernel.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("")
        .trim()
        .to_owned();
    format!("{cores} CPUs ({cpu}), Linux {}", kernel.trim())
}

/// The machine-wide CPU counters of `/proc/stat`'s `cpu` line, in clock
/// ticks (`USER_HZ`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTicks {
    /// Every field of the line but `guest` and `guest_nice` (already
    /// counted in `user` and `nice`).
    pub total: u64,
    /// `idle` plus `iowait`.
    pub idle: u64,
    /// `steal`: runnable, but the hypervisor ran something else.
    pub steal: u64,
}

impl CpuTicks {
    /// Parses the `cpu ` line of `/proc/stat` text; `None` if absent or
    /// malformed (an old kernel without a steal field reads as steal 0).
    pub fn parse(stat: &str) -> Option<CpuTicks> {
        let line = stat.lines().find(|l| l.starts_with("cpu "))?;
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|v| v.parse().ok())
            .collect::<Option<_>>()?;
        if f.len() < 4 {
            return None;
        }
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        // user nice system idle iowait irq softirq steal [guest guest_nice]
        Some(CpuTicks {
            total: (0..8).map(at).sum(),
            idle: at(3) + at(4),
            steal: at(7),
        })
    }

    /// The counters now; `None` where `/proc/stat` cannot be read.
    pub fn now() -> Option<CpuTicks> {
        CpuTicks::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Adds to these sums how far the counters moved since `before` (read
    /// now) and returns that window; `None` where either reading failed.
    pub fn add_since(&mut self, before: Option<CpuTicks>) -> Option<HostWindow> {
        let (a, b) = (before?, CpuTicks::now()?);
        self.total += b.total.saturating_sub(a.total);
        self.idle += b.idle.saturating_sub(a.idle);
        self.steal += b.steal.saturating_sub(a.steal);
        Some(HostWindow::between(a, b, &[], 0))
    }

    /// Busy and stolen shares (percent) over these sums; `None` when
    /// nothing was added.
    pub fn shares(&self) -> Option<(f64, f64)> {
        (self.total > 0).then(|| {
            let w = HostWindow::between(CpuTicks::default(), *self, &[], 0);
            (w.busy_pct, w.steal_pct)
        })
    }

    /// [`CpuTicks::shares`] as a table cell "busy / stolen", or "–".
    pub fn cell(&self) -> String {
        self.shares()
            .map_or_else(|| "–".to_string(), |(busy, steal)| format!("{busy:.1} / {steal:.2}"))
    }
}

/// `procs_running` of `/proc/stat` text: threads runnable right now.
pub fn procs_running(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("procs_running "))
        .and_then(|v| v.trim().parse().ok())
}

/// The machine over one window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostWindow {
    /// Online CPUs.
    pub cpus: usize,
    /// Share of all CPU time that was not idle (stolen time included),
    /// percent.
    pub busy_pct: f64,
    /// Share of all CPU time stolen by the hypervisor, percent.
    pub steal_pct: f64,
    /// Mean and largest `procs_running` over the samples (the sampling
    /// thread itself included: it is running when it reads).
    pub running_mean: f64,
    pub running_max: u64,
    pub samples: usize,
}

impl HostWindow {
    /// The window between two counter readings, with `running` the
    /// `procs_running` samples taken between them.
    pub fn between(a: CpuTicks, b: CpuTicks, running: &[u64], cpus: usize) -> HostWindow {
        let total = b.total.saturating_sub(a.total).max(1) as f64;
        let idle = b.idle.saturating_sub(a.idle) as f64;
        let steal = b.steal.saturating_sub(a.steal) as f64;
        HostWindow {
            cpus,
            busy_pct: 100.0 * (total - idle).max(0.0) / total,
            steal_pct: 100.0 * steal / total,
            running_mean: running.iter().sum::<u64>() as f64 / running.len().max(1) as f64,
            running_max: running.iter().copied().max().unwrap_or(0),
            samples: running.len(),
        }
    }

    /// Samples the machine from now until `until`, every `every`. `None`
    /// where `/proc/stat` cannot be read (not Linux).
    pub fn sample_until(until: Instant, every: Duration) -> Option<HostWindow> {
        let a = CpuTicks::now()?;
        let mut running = Vec::new();
        loop {
            if let Some(r) = std::fs::read_to_string("/proc/stat")
                .ok()
                .as_deref()
                .and_then(procs_running)
            {
                running.push(r);
            }
            let now = Instant::now();
            if now >= until {
                break;
            }
            std::thread::sleep(every.min(until - now));
        }
        let b = CpuTicks::now()?;
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        Some(HostWindow::between(a, b, &running, cpus))
    }

    /// One sentence for a report.
    pub fn sentence(&self) -> String {
        format!(
            "Host over the measured window: CPUs busy {:.1} % of {} vCPUs, stolen by the hypervisor {:.2} % (`/proc/stat` steal; 0 also where the guest is not told), runnable threads mean {:.1}, max {} ({} samples, the sampler's own thread included).",
            self.busy_pct, self.cpus, self.steal_pct, self.running_mean, self.running_max, self.samples
        )
    }

    /// `key=value` fields for a result line.
    pub fn fields(&self) -> String {
        format!(
            "host_busy_pct={:.2} host_steal_pct={:.3} host_running_mean={:.2} host_running_max={} host_cpus={} host_samples={}",
            self.busy_pct, self.steal_pct, self.running_mean, self.running_max, self.cpus, self.samples
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn this_machines_counters_give_a_window_within_bounds() {
        let w = HostWindow::sample_until(Instant::now() + Duration::from_millis(60), Duration::from_millis(10))
            .expect("/proc/stat is readable on Linux");
        assert!(w.cpus >= 1, "{w:?}");
        assert!((0.0..=100.0).contains(&w.busy_pct), "{w:?}");
        assert!((0.0..=100.0).contains(&w.steal_pct), "{w:?}");
        // This test's own thread is runnable when it reads the counter.
        assert!(w.samples >= 1 && w.running_max >= 1, "{w:?}");
    }

    const STAT: &str =
        "cpu  100 5 50 1000 10 1 2 30 7 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1 2\nprocs_running 3\nprocs_blocked 0\n";

    #[test]
    fn the_cpu_line_is_parsed_without_guest_time() {
        let t = CpuTicks::parse(STAT).expect("parsed");
        assert_eq!(t.total, 100 + 5 + 50 + 1000 + 10 + 1 + 2 + 30);
        assert_eq!(t.idle, 1010);
        assert_eq!(t.steal, 30);
        assert_eq!(procs_running(STAT), Some(3));
        // A kernel without the steal field (before 2.6.11) reads as steal 0;
        // fewer than the four oldest fields is not a cpu line.
        let old = CpuTicks::parse("cpu  10 0 5 100 2\n").expect("five fields");
        assert_eq!((old.total, old.idle, old.steal), (117, 102, 0));
        assert_eq!(CpuTicks::parse("cpu  1 2 3\n"), None);
        assert_eq!(CpuTicks::parse("cpu0 1 2 3 4\n"), None);
        assert_eq!(CpuTicks::parse("cpu  1 x 3 4\n"), None);
    }

    #[test]
    fn a_window_reports_busy_and_stolen_shares() {
        let a = CpuTicks {
            total: 1000,
            idle: 800,
            steal: 0,
        };
        let b = CpuTicks {
            total: 2000,
            idle: 1300,
            steal: 100,
        };
        let w = HostWindow::between(a, b, &[2, 4, 6], 16);
        assert!((w.busy_pct - 50.0).abs() < 1e-9, "{w:?}");
        assert!((w.steal_pct - 10.0).abs() < 1e-9, "{w:?}");
        assert!((w.running_mean - 4.0).abs() < 1e-9 && w.running_max == 6, "{w:?}");
    }

    #[test]
    fn summed_windows_give_the_shares_and_a_cell() {
        let mut sum = CpuTicks::default();
        assert_eq!(sum.shares(), None);
        assert_eq!(sum.cell(), "–");
        sum.total = 400;
        sum.idle = 300;
        sum.steal = 8;
        assert_eq!(sum.shares(), Some((25.0, 2.0)));
        assert_eq!(sum.cell(), "25.0 / 2.00");
        // A window read now adds what the counters moved by, never less.
        let w = sum.add_since(CpuTicks::now()).expect("/proc/stat is readable on Linux");
        assert!(sum.total >= 400 && (0.0..=100.0).contains(&w.busy_pct), "{sum:?} {w:?}");
        assert_eq!(sum.add_since(None), None);
    }
}
