//! Process lifecycle: the threads vramring runs for you, and how they end.
//!
//! * [`exit`]: a process-exit registry. Every library thread that may touch
//!   CUDA (the publisher's socket service, a subscriber's reconnect thread,
//!   the memory watchdog) registers an owner that stops and joins it. A C
//!   `atexit` hook runs the owners in [`ExitPhase`] order when the process
//!   calls `exit` or returns from `main`, before the CUDA runtime's own exit
//!   handlers; [`ExitWorker`] spawns a thread and registers it in one step.
//! * [`memwatch`]: free device memory with the integrated-GPU rule
//!   ([`effective_free_bytes`]), and an optional [`MemoryWatchdog`] (at most
//!   one per process) that reports, or calls back, when it stays low.
//!
//! # Examples
//! A service thread that stops at process exit, on [`ExitWorker::stop`] or
//! on drop:
//! ```
//! use std::time::Duration;
//! use vramring::seam::lifecycle::{ExitPhase, ExitWorker};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let worker = ExitWorker::spawn("example-service", ExitPhase::Service, |stop| {
//!     while !stop.sleep(Duration::from_millis(10)) {
//!         // serve one round
//!     }
//! })?;
//! worker.stop();
//! # Ok(()) }
//! ```

pub mod exit;
pub mod memwatch;

pub use exit::{
    install_exit_hook, register, shutdown_now, shutdown_started, ExitGuard, ExitJoin, ExitPhase, ExitRegistration,
    ExitShutdown, ExitWorker, ExitWorkerBuilder, JoinOutcome, StopSignal, DEFAULT_JOIN_TIMEOUT,
};
pub use memwatch::{
    effective_free_bytes, mem_available_bytes, parse_mem_available, FreeMemoryProbe, LowMemory, MemoryWatchdog,
    WatchdogAction, WatchdogConfig, DEFAULT_CONSECUTIVE_LOWS,
};
