//! The stop request a worker thread watches, with a sleep that wakes as soon as
//! it is raised.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::lock;

/// A stop request shared between a worker and whoever stops it, with a sleep
/// that wakes as soon as the request is raised.
#[derive(Clone, Default)]
pub struct StopSignal {
    inner: Arc<StopInner>,
}

/// A callback run when a stop is raised (e.g. a write to a worker's
/// eventfd, so a worker blocked in `poll` sees the stop at once).
type OnRaise = Box<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct StopInner {
    raised: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
    on_raise: Mutex<Vec<OnRaise>>,
}

impl StopSignal {
    /// A signal not raised yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises the stop request and wakes every [`sleep`](Self::sleep).
    pub fn raise(&self) {
        {
            // The store is made under the lock that `sleep` checks the flag
            // under, so a sleeper cannot miss the wakeup between its check
            // and its wait.
            let _guard = lock(&self.inner.lock);
            // SYNC: stop-signal. Release: what the stopper wrote before
            // raising is visible to a worker that sees the flag.
            self.inner.raised.store(true, Ordering::Release);
        }
        self.inner.wake.notify_all();
        for f in lock(&self.inner.on_raise).iter() {
            f();
        }
    }

    /// Runs `f` when the stop is raised (at once if it already is), for a
    /// worker that waits in something other than [`StopSignal::sleep`]:
    /// e.g. `f` writes to an eventfd the worker polls.
    pub fn on_raise(&self, f: impl Fn() + Send + Sync + 'static) {
        let mut hooks = lock(&self.inner.on_raise);
        if self.is_raised() {
            drop(hooks);
            f();
            return;
        }
        hooks.push(Box::new(f));
    }

    /// Whether stop was requested.
    pub fn is_raised(&self) -> bool {
        // SYNC: stop-signal. Acquire pairs with the Release in `raise`.
        self.inner.raised.load(Ordering::Acquire)
    }

    /// Sleeps up to `timeout`; returns early, with `true`, once stop is
    /// requested. Returns `false` when the time ran out.
    pub fn sleep(&self, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut guard = lock(&self.inner.lock);
        loop {
            if self.is_raised() {
                return true;
            }
            guard = match deadline {
                None => self.inner.wake.wait(guard).unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return false;
                    }
                    self.inner
                        .wake
                        .wait_timeout(guard, deadline - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }
}

impl fmt::Debug for StopSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StopSignal").field("raised", &self.is_raised()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    #[test]
    fn stop_signal_wakes_a_long_sleep_promptly() {
        let stop = StopSignal::new();
        let sleeper = stop.clone();
        let t = thread::spawn(move || {
            let start = Instant::now();
            let stopped = sleeper.sleep(Duration::from_secs(3600));
            (stopped, start.elapsed())
        });
        thread::sleep(Duration::from_millis(20));
        stop.raise();
        let (stopped, waited) = t.join().unwrap();
        assert!(stopped);
        assert!(waited < Duration::from_secs(5), "slept {waited:?}");
        assert!(!StopSignal::new().sleep(Duration::from_millis(1)));
    }

    #[test]
    fn on_raise_hooks_run_at_the_raise_or_at_once_if_already_raised() {
        use std::sync::atomic::AtomicUsize;
        let stop = StopSignal::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&calls);
        stop.on_raise(move || {
            c.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(calls.load(Ordering::Relaxed), 0);
        stop.raise();
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        let c = Arc::clone(&calls);
        stop.on_raise(move || {
            c.fetch_add(10, Ordering::Relaxed);
        });
        assert_eq!(calls.load(Ordering::Relaxed), 11);
    }
}
