//! Free device memory, and an optional watchdog that acts when it runs low.
//!
//! Free device memory is `cuMemGetInfo`'s free count, except on an
//! integrated GPU (Jetson, GB10), where device and host share one pool and
//! the host's `MemAvailable` counts too: the larger of the two
//! ([`effective_free_bytes`]). The rule is a pure function; the CUDA backend
//! supplies the driver readings and the integrated attribute, and builds the
//! probe a [`MemoryWatchdog`] polls from them:
//!
//! ```ignore
//! let probe = Box::new(move || {
//!     let cu_free = cuda_mem_get_info_free()?; // cuMemGetInfo, context current
//!     Some(effective_free_bytes(cu_free, mem_available_bytes(), integrated))
//! });
//! ```
//!
//! The watchdog is injected with its probe, so everything here runs without
//! a GPU.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::lifecycle::exit::{panic_message, ExitPhase, ExitWorker, JoinOutcome, StopSignal};

/// Free memory to report for a device: on an integrated GPU the larger of
/// the driver's free count `cu_free` and the host's `MemAvailable`
/// (`mem_available`, when known), else `cu_free`. On a discrete GPU host RAM
/// is a separate pool and never counts.
pub fn effective_free_bytes(cu_free: u64, mem_available: Option<u64>, integrated: bool) -> u64 {
    match mem_available {
        Some(available) if integrated => cu_free.max(available),
        _ => cu_free,
    }
}

/// The `MemAvailable` line of `/proc/meminfo` text, in bytes. `None` when the
/// line is missing, malformed, not in kB, or overflows.
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let rest = meminfo.lines().find_map(|line| line.strip_prefix("MemAvailable:"))?;
    let mut fields = rest.split_whitespace();
    let kib: u64 = fields.next()?.parse().ok()?;
    match (fields.next(), fields.next()) {
        (Some("kB"), None) => kib.checked_mul(1024),
        _ => None,
    }
}

/// The host's `MemAvailable` in bytes, from `/proc/meminfo`; `None` where it
/// cannot be read.
pub fn mem_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

/// Reads free device memory in bytes; `None` when the reading failed.
pub type FreeMemoryProbe = Box<dyn FnMut() -> Option<u64> + Send>;

/// What the watchdog saw when its action fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LowMemory {
    /// The reading that made the action fire, in bytes.
    pub free_bytes: u64,
    /// The configured threshold, in bytes.
    pub threshold_bytes: u64,
    /// How many consecutive readings were below the threshold.
    pub consecutive_lows: u32,
}

/// What the watchdog does when free memory stayed low for the configured
/// number of readings. It fires once per low episode: again only after a
/// reading at or above the threshold and another run of low readings.
pub enum WatchdogAction {
    /// Log an error (every low reading is logged as a warning either way).
    Report,
    /// Log, then call this on the watchdog's thread, for example to stop
    /// publishing cleanly. A panic in it is caught and logged. If it calls
    /// `std::process::exit`, the process-exit hook stops the other workers
    /// and does not wait for this one.
    Callback(Box<dyn FnMut(&LowMemory) + Send>),
}

impl WatchdogAction {
    /// [`WatchdogAction::Callback`] from a closure.
    pub fn callback(f: impl FnMut(&LowMemory) + Send + 'static) -> Self {
        WatchdogAction::Callback(Box::new(f))
    }
}

impl fmt::Debug for WatchdogAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchdogAction::Report => f.write_str("Report"),
            WatchdogAction::Callback(_) => f.write_str("Callback(..)"),
        }
    }
}

/// Readings below the threshold, in a row, before the action fires, unless
/// configured otherwise.
pub const DEFAULT_CONSECUTIVE_LOWS: u32 = 3;

/// Watchdog settings.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WatchdogConfig {
    /// A reading below this many bytes is low.
    pub threshold_bytes: u64,
    /// Time between readings (nonzero).
    pub interval: Duration,
    /// Low readings in a row before the action fires (at least 1).
    pub consecutive_lows: u32,
    /// Longest wait for the thread when stopping it.
    pub join_timeout: Duration,
}

impl WatchdogConfig {
    /// `threshold_bytes` and `interval`, firing after
    /// [`DEFAULT_CONSECUTIVE_LOWS`] low readings.
    pub fn new(threshold_bytes: u64, interval: Duration) -> Self {
        WatchdogConfig {
            threshold_bytes,
            interval,
            consecutive_lows: DEFAULT_CONSECUTIVE_LOWS,
            join_timeout: crate::lifecycle::exit::DEFAULT_JOIN_TIMEOUT,
        }
    }

    /// Fires after `n` low readings in a row.
    pub fn consecutive_lows(mut self, n: u32) -> Self {
        self.consecutive_lows = n;
        self
    }

    fn validate(&self) -> Result<()> {
        if self.interval.is_zero() {
            return Err(Error::Config("the memory watchdog's interval must be nonzero".into()));
        }
        if self.consecutive_lows == 0 {
            return Err(Error::Config(
                "the memory watchdog's consecutive_lows must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Counts low readings in a row. A reading at or above the threshold resets
/// the count; a failed reading leaves it unchanged.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct LowCounter {
    consecutive: u32,
}

impl LowCounter {
    /// Records `reading`; true when it makes the action fire, which is when
    /// the count reaches `needed` (once per low episode).
    fn observe(&mut self, reading: Option<u64>, threshold: u64, needed: u32) -> bool {
        match reading {
            None => false,
            Some(free) if free >= threshold => {
                self.consecutive = 0;
                false
            }
            Some(_) => {
                self.consecutive = self.consecutive.saturating_add(1);
                self.consecutive == needed
            }
        }
    }
}

/// Whether a watchdog thread exists in this process.
static WATCHDOG_CLAIMED: AtomicBool = AtomicBool::new(false);

/// The process's one watchdog slot, held by the watchdog's thread for as
/// long as that thread runs, released when it ends (or unwinds).
struct Claim(());

impl Claim {
    fn take() -> Option<Claim> {
        // SYNC: watchdog-claim. Acquire pairs with the Release in `drop`:
        // a new watchdog starts after everything the last one did. Failure
        // is Relaxed: we read nothing else and return an error.
        WATCHDOG_CLAIMED
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Claim(()))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // SYNC: watchdog-claim.
        WATCHDOG_CLAIMED.store(false, Ordering::Release);
    }
}

/// `last_free` before the first successful reading.
const NO_READING: u64 = u64::MAX;

/// Counters written by the watchdog thread only (single writer).
#[derive(Debug)]
struct WatchdogState {
    readings: AtomicU64,
    fired: AtomicU64,
    consecutive_low: AtomicU32,
    last_free: AtomicU64,
}

/// A thread that polls free device memory and acts when it stays below a
/// threshold. At most one runs per process; it is registered with the
/// process-exit registry ([`ExitPhase::Watchdog`]) and stopped and joined
/// on drop.
pub struct MemoryWatchdog {
    worker: ExitWorker,
    state: Arc<WatchdogState>,
    config: WatchdogConfig,
}

impl MemoryWatchdog {
    /// Starts a watchdog firing after [`DEFAULT_CONSECUTIVE_LOWS`] readings
    /// of `probe` below `threshold_bytes`, one reading every `interval`.
    ///
    /// # Errors
    /// As [`start_with`](Self::start_with).
    pub fn start(
        probe: FreeMemoryProbe,
        threshold_bytes: u64,
        interval: Duration,
        action: WatchdogAction,
    ) -> Result<Self> {
        Self::start_with(probe, WatchdogConfig::new(threshold_bytes, interval), action)
    }

    /// Starts a watchdog with `config`. The first reading is taken at once.
    ///
    /// # Errors
    /// [`Error::WatchdogRunning`] while another watchdog's thread runs in
    /// this process; [`Error::Config`] for a zero interval or zero
    /// `consecutive_lows`; [`Error::Io`] if the thread cannot be started.
    pub fn start_with(mut probe: FreeMemoryProbe, config: WatchdogConfig, mut action: WatchdogAction) -> Result<Self> {
        config.validate()?;
        let claim = Claim::take().ok_or(Error::WatchdogRunning)?;
        let state = Arc::new(WatchdogState {
            readings: AtomicU64::new(0),
            fired: AtomicU64::new(0),
            consecutive_low: AtomicU32::new(0),
            last_free: AtomicU64::new(NO_READING),
        });
        let thread_state = Arc::clone(&state);
        let cfg = config.clone();
        let worker = ExitWorker::builder("vramring-memwatch", ExitPhase::Watchdog)
            .join_timeout(config.join_timeout)
            .spawn(move |stop: StopSignal| {
                let _claim = claim;
                let mut counter = LowCounter::default();
                loop {
                    let reading = probe();
                    let fire = counter.observe(reading, cfg.threshold_bytes, cfg.consecutive_lows);
                    // Relaxed (these three): single writer, this thread; the
                    // Release on `readings` below publishes them.
                    thread_state
                        .consecutive_low
                        .store(counter.consecutive, Ordering::Relaxed);
                    if let Some(free) = reading {
                        thread_state.last_free.store(free, Ordering::Relaxed);
                        if free < cfg.threshold_bytes {
                            tracing::warn!(
                                free_bytes = free,
                                threshold_bytes = cfg.threshold_bytes,
                                "free device memory below the threshold [{}/{}]",
                                counter.consecutive,
                                cfg.consecutive_lows
                            );
                        }
                    }
                    if let (true, Some(free)) = (fire, reading) {
                        let low = LowMemory {
                            free_bytes: free,
                            threshold_bytes: cfg.threshold_bytes,
                            consecutive_lows: counter.consecutive,
                        };
                        tracing::error!(
                            free_bytes = free,
                            threshold_bytes = cfg.threshold_bytes,
                            "free device memory stayed below the threshold for {} readings",
                            counter.consecutive
                        );
                        thread_state.fired.fetch_add(1, Ordering::Relaxed);
                        if let WatchdogAction::Callback(f) = &mut action {
                            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(&low))) {
                                tracing::error!("memory watchdog callback panicked: {}", panic_message(&*payload));
                            }
                        }
                    }
                    // SYNC: watchdog-reading. Release: a reader that sees
                    // this count sees the state written for this reading.
                    thread_state.readings.fetch_add(1, Ordering::Release);
                    if stop.sleep(cfg.interval) {
                        break;
                    }
                }
            })?;
        Ok(MemoryWatchdog { worker, state, config })
    }

    /// Readings taken so far (failed ones included). Read this first: after
    /// it returns `n`, the other accessors are at least as new as reading `n`.
    pub fn readings(&self) -> u64 {
        // SYNC: watchdog-reading. Acquire pairs with the thread's Release.
        self.state.readings.load(Ordering::Acquire)
    }

    /// How many times the action fired.
    pub fn fired(&self) -> u64 {
        // Relaxed: a monitoring counter; `readings()` orders it when needed.
        self.state.fired.load(Ordering::Relaxed)
    }

    /// Low readings in a row so far.
    pub fn consecutive_lows(&self) -> u32 {
        // Relaxed: as `fired`.
        self.state.consecutive_low.load(Ordering::Relaxed)
    }

    /// The last successful reading, in bytes.
    pub fn last_free_bytes(&self) -> Option<u64> {
        // Relaxed: as `fired`.
        match self.state.last_free.load(Ordering::Relaxed) {
            NO_READING => None,
            free => Some(free),
        }
    }

    /// The settings it runs with.
    pub fn config(&self) -> &WatchdogConfig {
        &self.config
    }

    /// Whether its thread still runs.
    pub fn is_running(&self) -> bool {
        !self.worker.is_finished()
    }

    /// Stops and joins the thread (bounded by the join timeout); a new
    /// watchdog may start once this returns [`JoinOutcome::Joined`].
    pub fn stop(self) -> JoinOutcome {
        self.worker.stop()
    }
}

impl fmt::Debug for MemoryWatchdog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWatchdog")
            .field("config", &self.config)
            .field("readings", &self.readings())
            .field("fired", &self.fired())
            .field("last_free_bytes", &self.last_free_bytes())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Mutex, PoisonError};
    use std::time::Instant;

    use super::*;

    const GIB: u64 = 1 << 30;

    /// Watchdog tests share the one-per-process slot; run them one at a time.
    static ONE_WATCHDOG_AT_A_TIME: Mutex<()> = Mutex::new(());

    fn scripted(values: &[Option<u64>]) -> FreeMemoryProbe {
        let mut queue: VecDeque<Option<u64>> = values.iter().copied().collect();
        Box::new(move || queue.pop_front().flatten())
    }

    fn wait_for_readings(wd: &MemoryWatchdog, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while wd.readings() < n {
            assert!(Instant::now() < deadline, "only {} of {n} readings", wd.readings());
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn integrated_gpu_counts_the_larger_of_device_and_host_free() {
        assert_eq!(effective_free_bytes(2 * GIB, Some(5 * GIB), true), 5 * GIB);
        assert_eq!(effective_free_bytes(7 * GIB, Some(5 * GIB), true), 7 * GIB);
        assert_eq!(effective_free_bytes(2 * GIB, None, true), 2 * GIB);
    }

    #[test]
    fn discrete_gpu_ignores_host_memory() {
        assert_eq!(effective_free_bytes(2 * GIB, Some(64 * GIB), false), 2 * GIB);
        assert_eq!(effective_free_bytes(0, None, false), 0);
    }

    #[test]
    fn mem_available_is_read_in_kib_and_returned_in_bytes() {
        let meminfo = "MemTotal:       131072000 kB\n\
                       MemFree:         1000000 kB\n\
                       MemAvailable:    8388608 kB\n\
                       Buffers:          123456 kB\n";
        assert_eq!(parse_mem_available(meminfo), Some(8 * GIB));
    }

    #[test]
    fn malformed_or_missing_mem_available_reads_as_unknown() {
        assert_eq!(parse_mem_available("MemTotal: 1 kB\nMemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: 12 MB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: 12\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: 18446744073709551615 kB\n"), None);
        assert_eq!(parse_mem_available(""), None);
    }

    #[test]
    fn this_hosts_mem_available_is_readable() {
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(mem_available_bytes().is_some_and(|b| b > 0));
        }
    }

    #[test]
    fn counter_fires_once_at_the_nth_consecutive_low_reading() {
        let mut c = LowCounter::default();
        let fires: Vec<bool> = [Some(1), Some(1), Some(1), Some(1)]
            .into_iter()
            .map(|r| c.observe(r, 10, 3))
            .collect();
        assert_eq!(fires, [false, false, true, false]);
    }

    #[test]
    fn counter_resets_on_a_reading_at_the_threshold_and_ignores_failed_readings() {
        let mut c = LowCounter::default();
        assert!(!c.observe(Some(1), 10, 2));
        assert!(!c.observe(Some(10), 10, 2));
        assert_eq!(c.consecutive, 0);
        assert!(!c.observe(Some(1), 10, 2));
        assert!(!c.observe(None, 10, 2));
        assert_eq!(c.consecutive, 1);
        assert!(c.observe(Some(9), 10, 2));
    }

    #[test]
    fn watchdog_fires_after_n_consecutive_low_readings() {
        let _serial = ONE_WATCHDOG_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = Arc::clone(&seen);
        let config = WatchdogConfig::new(GIB, Duration::from_millis(1)).consecutive_lows(3);
        let wd = MemoryWatchdog::start_with(
            scripted(&[Some(2 * GIB), Some(100), Some(200), Some(300), Some(400)]),
            config,
            WatchdogAction::callback(move |low| seen2.lock().unwrap().push(*low)),
        )
        .unwrap();
        wait_for_readings(&wd, 5);
        assert_eq!(wd.fired(), 1);
        assert_eq!(wd.consecutive_lows(), 4);
        assert_eq!(wd.last_free_bytes(), Some(400));
        assert_eq!(
            *seen.lock().unwrap(),
            [LowMemory {
                free_bytes: 300,
                threshold_bytes: GIB,
                consecutive_lows: 3
            }]
        );
        assert_eq!(wd.stop(), JoinOutcome::Joined);
    }

    #[test]
    fn a_reading_above_threshold_resets_the_low_count() {
        let _serial = ONE_WATCHDOG_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        let wd = MemoryWatchdog::start(
            scripted(&[Some(1), Some(1), Some(GIB), Some(1), Some(1), None, Some(GIB)]),
            GIB,
            Duration::from_millis(1),
            WatchdogAction::Report,
        )
        .unwrap();
        wait_for_readings(&wd, 7);
        assert_eq!(wd.fired(), 0);
        assert_eq!(wd.consecutive_lows(), 0);
        assert_eq!(wd.last_free_bytes(), Some(GIB));
        wd.stop();
    }

    #[test]
    fn only_one_watchdog_runs_per_process_until_it_is_stopped() {
        let _serial = ONE_WATCHDOG_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        let interval = Duration::from_millis(5);
        let first = MemoryWatchdog::start(scripted(&[]), GIB, interval, WatchdogAction::Report).unwrap();
        assert!(matches!(
            MemoryWatchdog::start(scripted(&[]), GIB, interval, WatchdogAction::Report),
            Err(Error::WatchdogRunning)
        ));
        assert_eq!(first.stop(), JoinOutcome::Joined);
        let second = MemoryWatchdog::start(scripted(&[]), GIB, interval, WatchdogAction::Report).unwrap();
        drop(second);
        let third = MemoryWatchdog::start(scripted(&[]), GIB, interval, WatchdogAction::Report).unwrap();
        third.stop();
    }

    #[test]
    fn stopping_a_watchdog_with_a_long_interval_returns_promptly() {
        let _serial = ONE_WATCHDOG_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        let wd = MemoryWatchdog::start(
            Box::new(|| Some(GIB)),
            1,
            Duration::from_secs(3600),
            WatchdogAction::Report,
        )
        .unwrap();
        wait_for_readings(&wd, 1);
        assert!(wd.is_running());
        // Loose: a stop that waited for the next reading would take an hour.
        let start = Instant::now();
        assert_eq!(wd.stop(), JoinOutcome::Joined);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "stop took {:?}",
            start.elapsed()
        );
    }

    #[test]
    fn invalid_settings_are_refused_without_taking_the_slot() {
        let _serial = ONE_WATCHDOG_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        let zero_interval = WatchdogConfig::new(GIB, Duration::ZERO);
        assert!(matches!(
            MemoryWatchdog::start_with(scripted(&[]), zero_interval, WatchdogAction::Report),
            Err(Error::Config(_))
        ));
        let zero_lows = WatchdogConfig::new(GIB, Duration::from_millis(1)).consecutive_lows(0);
        assert!(matches!(
            MemoryWatchdog::start_with(scripted(&[]), zero_lows, WatchdogAction::Report),
            Err(Error::Config(_))
        ));
        let wd = MemoryWatchdog::start(scripted(&[]), GIB, Duration::from_millis(1), WatchdogAction::Report).unwrap();
        wd.stop();
    }

    #[test]
    fn a_panicking_callback_does_not_end_the_watchdog() {
        let _serial = ONE_WATCHDOG_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        let config = WatchdogConfig::new(GIB, Duration::from_millis(1)).consecutive_lows(1);
        let wd = MemoryWatchdog::start_with(
            scripted(&[Some(1), Some(GIB), Some(1)]),
            config,
            WatchdogAction::callback(|_| panic!("callback panics on purpose")),
        )
        .unwrap();
        wait_for_readings(&wd, 4);
        assert_eq!(wd.fired(), 2);
        assert!(wd.is_running());
        assert_eq!(wd.stop(), JoinOutcome::Joined);
    }
}
