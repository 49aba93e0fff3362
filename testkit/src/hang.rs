//! A guard against hangs for tests that prove a wait ends: the work runs on
//! its own thread and the test fails if it has not returned within
//! [`HANG`]. The guard is no claim about speed: [`HANG`] is far beyond what
//! a busy machine adds, and a test sets the wait it proves absent (an idle
//! tick, a linger, a timeout) far beyond [`HANG`].

use std::time::Duration;

/// How long a wait that must end may take before the test calls it a hang.
pub const HANG: Duration = Duration::from_secs(60);

/// Runs `work` on a thread of its own and returns what it returned; panics
/// (naming `what`) when it has not returned within [`HANG`], and passes on
/// its panic when it panicked.
pub fn ends<T: Send + 'static>(what: &str, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(work());
    });
    match rx.recv_timeout(HANG) {
        Ok(v) => {
            let _ = worker.join();
            v
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => panic!("{what}: the worker ended without a result"),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not end within {HANG:?}: it hangs")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_returns_what_the_work_returned() {
        assert_eq!(ends("adding", || 2 + 2), 4);
    }

    #[test]
    #[should_panic(expected = "inner")]
    fn the_guard_passes_the_works_panic_on() {
        ends("panicking", || panic!("inner"));
    }
}
