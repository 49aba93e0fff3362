//! Stoppable worker threads as shutdown owners: `ExitJoin` joins one with a
//! bounded wait, `ExitWorker` spawns and registers one.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use super::registry::{register, ExitPhase, ExitRegistration, ExitShutdown};
use super::stop::StopSignal;
use super::{lock, panic_message};
use crate::error::{Error, Result};

/// How [`ExitJoin::stop_and_join`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum JoinOutcome {
    /// The thread finished and was joined.
    Joined,
    /// The thread finished by panicking (logged) and was joined.
    Panicked,
    /// The thread did not finish within the join timeout; it was logged and
    /// left running. A later call waits for it again.
    TimedOut,
    /// Called on the worker thread itself (for example its own code called
    /// `std::process::exit`): stop was requested but a thread cannot join
    /// itself.
    CurrentThread,
    /// Joined by an earlier call.
    AlreadyDone,
}

/// Default bound on how long [`ExitJoin`] waits for its thread.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(2);

/// A stoppable worker thread as a shutdown owner: stopping raises its
/// [`StopSignal`], runs an optional wake callback (to unblock a thread parked
/// in `poll` or `accept`), and joins with a bounded wait, after which it
/// logs and leaves the thread running rather than hang process exit.
pub struct ExitJoin {
    name: String,
    phase: ExitPhase,
    stop: StopSignal,
    wake: Option<Box<dyn Fn() + Send + Sync>>,
    join_timeout: Duration,
    thread_id: ThreadId,
    handle: Mutex<Option<JoinHandle<()>>>,
    joining: Mutex<()>,
}

impl ExitJoin {
    /// An owner for `handle`, a thread that returns soon after `stop` is
    /// raised. Join timeout: [`DEFAULT_JOIN_TIMEOUT`].
    pub fn new(name: impl Into<String>, phase: ExitPhase, stop: StopSignal, handle: JoinHandle<()>) -> Self {
        ExitJoin {
            name: name.into(),
            phase,
            stop,
            wake: None,
            join_timeout: DEFAULT_JOIN_TIMEOUT,
            thread_id: handle.thread().id(),
            handle: Mutex::new(Some(handle)),
            joining: Mutex::new(()),
        }
    }

    /// Runs `wake` after raising the stop signal, to unblock the thread.
    pub fn with_wake(mut self, wake: impl Fn() + Send + Sync + 'static) -> Self {
        self.wake = Some(Box::new(wake));
        self
    }

    /// Waits at most `timeout` for the thread, then logs and leaves it.
    pub fn with_join_timeout(mut self, timeout: Duration) -> Self {
        self.join_timeout = timeout;
        self
    }

    /// The thread's stop signal.
    pub fn stop_signal(&self) -> &StopSignal {
        &self.stop
    }

    /// Whether the thread has finished (or was joined already).
    pub fn is_finished(&self) -> bool {
        lock(&self.handle).as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Requests stop, wakes the thread and joins it, waiting at most the
    /// join timeout.
    pub fn stop_and_join(&self) -> JoinOutcome {
        self.stop.raise();
        if let Some(wake) = &self.wake {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(wake)) {
                tracing::error!(
                    worker = %self.name,
                    "wake callback panicked: {}",
                    panic_message(&*payload)
                );
            }
        }
        if thread::current().id() == self.thread_id {
            // A thread cannot join itself; a later call from another thread
            // may.
            return JoinOutcome::CurrentThread;
        }
        // One joiner at a time: a second caller (the exit hook racing an
        // owner's drop) waits here, so it never returns while the thread
        // may still run unless its own bounded wait ran out.
        let _joining = lock(&self.joining);
        let deadline = crate::time::deadline_after(Instant::now(), self.join_timeout);
        let mut nap = Duration::from_micros(50);
        let handle = loop {
            {
                // The slot lock is held only briefly, so `is_finished` does
                // not wait for a join in progress.
                let mut slot = lock(&self.handle);
                match slot.as_ref().map(JoinHandle::is_finished) {
                    None => return JoinOutcome::AlreadyDone,
                    Some(true) => break slot.take(),
                    Some(false) => {}
                }
            }
            let now = Instant::now();
            if now >= deadline {
                // The handle stays in the slot, so that `is_finished` stays
                // true to the thread and a later call may join it.
                tracing::error!(
                    worker = %self.name,
                    phase = ?self.phase,
                    timeout = ?self.join_timeout,
                    "worker thread did not stop in time; leaving it running"
                );
                return JoinOutcome::TimedOut;
            }
            thread::sleep(nap.min(deadline - now));
            nap = (nap * 2).min(Duration::from_millis(5));
        };
        let Some(handle) = handle else {
            return JoinOutcome::AlreadyDone;
        };
        match handle.join() {
            Ok(()) => JoinOutcome::Joined,
            Err(payload) => {
                tracing::error!(
                    worker = %self.name,
                    "worker thread panicked: {}",
                    panic_message(&*payload)
                );
                JoinOutcome::Panicked
            }
        }
    }
}

impl ExitShutdown for ExitJoin {
    fn phase(&self) -> ExitPhase {
        self.phase
    }

    fn shutdown_for_process_exit(&self) {
        let outcome = self.stop_and_join();
        tracing::debug!(worker = %self.name, ?outcome, "stopped for process exit");
    }

    fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for ExitJoin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExitJoin")
            .field("name", &self.name)
            .field("phase", &self.phase)
            .field("stop", &self.stop)
            .field("join_timeout", &self.join_timeout)
            .finish_non_exhaustive()
    }
}

/// A named worker thread registered with the process-exit registry: stopped
/// and joined at process exit, by [`stop`](Self::stop), or on drop.
#[derive(Debug)]
pub struct ExitWorker {
    join: Arc<ExitJoin>,
    registration: Option<ExitRegistration>,
}

/// Options for [`ExitWorker`]; made by [`ExitWorker::builder`].
pub struct ExitWorkerBuilder {
    name: String,
    phase: ExitPhase,
    join_timeout: Duration,
    wake: Option<Box<dyn Fn() + Send + Sync>>,
}

impl ExitWorker {
    /// Spawns `body` on a thread named `name` and registers it for phase
    /// `phase`. `body` must return soon after its [`StopSignal`] is raised.
    ///
    /// # Errors
    /// [`Error::Io`] if the thread cannot be spawned or the exit hook cannot
    /// be installed (the thread is then stopped and joined).
    pub fn spawn<F>(name: impl Into<String>, phase: ExitPhase, body: F) -> Result<Self>
    where
        F: FnOnce(StopSignal) + Send + 'static,
    {
        Self::builder(name, phase).spawn(body)
    }

    /// A builder, for a join timeout or a wake callback.
    pub fn builder(name: impl Into<String>, phase: ExitPhase) -> ExitWorkerBuilder {
        ExitWorkerBuilder {
            name: name.into(),
            phase,
            join_timeout: DEFAULT_JOIN_TIMEOUT,
            wake: None,
        }
    }

    /// The worker's stop signal.
    pub fn stop_signal(&self) -> &StopSignal {
        self.join.stop_signal()
    }

    /// Whether the thread has finished.
    pub fn is_finished(&self) -> bool {
        self.join.is_finished()
    }

    /// Stops and joins the thread (bounded), then unregisters it.
    pub fn stop(mut self) -> JoinOutcome {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> JoinOutcome {
        let outcome = self.join.stop_and_join();
        if let Some(registration) = self.registration.take() {
            registration.unregister();
        }
        outcome
    }
}

impl Drop for ExitWorker {
    fn drop(&mut self) {
        if self.registration.is_some() {
            let outcome = self.stop_inner();
            tracing::debug!(worker = %self.join.name, ?outcome, "worker stopped on drop");
        }
    }
}

impl ExitWorkerBuilder {
    /// Waits at most `timeout` for the thread when stopping it, then logs
    /// and leaves it running.
    pub fn join_timeout(mut self, timeout: Duration) -> Self {
        self.join_timeout = timeout;
        self
    }

    /// Runs `wake` after raising the stop signal, to unblock the thread (for
    /// example, write to the eventfd its `poll` waits on).
    pub fn on_stop(mut self, wake: impl Fn() + Send + Sync + 'static) -> Self {
        self.wake = Some(Box::new(wake));
        self
    }

    /// Spawns the thread and registers it; see [`ExitWorker::spawn`].
    ///
    /// # Errors
    /// As [`ExitWorker::spawn`].
    pub fn spawn<F>(self, body: F) -> Result<ExitWorker>
    where
        F: FnOnce(StopSignal) + Send + 'static,
    {
        let stop = StopSignal::new();
        let worker_stop = stop.clone();
        // The worker logs where the thread that made it logs (its own
        // `tracing` subscriber, if it set one, else the global one).
        let dispatch = tracing::dispatcher::get_default(tracing::Dispatch::clone);
        let handle = thread::Builder::new()
            .name(self.name.clone())
            .spawn(move || tracing::dispatcher::with_default(&dispatch, || body(worker_stop)))
            .map_err(|e| Error::io(format!("spawning thread {}", self.name), e))?;
        let mut join = ExitJoin::new(self.name, self.phase, stop, handle).with_join_timeout(self.join_timeout);
        join.wake = self.wake;
        let join = Arc::new(join);
        match register(Arc::clone(&join) as Arc<dyn ExitShutdown>) {
            Ok(registration) => Ok(ExitWorker {
                join,
                registration: Some(registration),
            }),
            Err(e) => {
                join.stop_and_join();
                Err(e)
            }
        }
    }
}

impl fmt::Debug for ExitWorkerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExitWorkerBuilder")
            .field("name", &self.name)
            .field("phase", &self.phase)
            .field("join_timeout", &self.join_timeout)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn exit_worker_stops_and_joins_its_thread() {
        let ran = Arc::new(AtomicBool::new(false));
        let ran2 = Arc::clone(&ran);
        let worker = ExitWorker::spawn("test-loop", ExitPhase::Service, move |stop| {
            while !stop.sleep(Duration::from_millis(1)) {}
            // Relaxed: the join below orders this store before the
            // test's load.
            ran2.store(true, Ordering::Relaxed);
        })
        .unwrap();
        assert_eq!(worker.stop(), JoinOutcome::Joined);
        // Relaxed: the join happened-before this load.
        assert!(ran.load(Ordering::Relaxed));
    }

    #[test]
    fn join_of_a_stuck_thread_gives_up_after_the_timeout_and_can_retry() {
        let release = StopSignal::new();
        let hold = release.clone();
        let join = ExitJoin::new(
            "stuck",
            ExitPhase::Service,
            StopSignal::new(),
            thread::spawn(move || {
                // Ignores its own stop signal.
                hold.sleep(Duration::from_secs(30));
            }),
        )
        .with_join_timeout(Duration::from_millis(50));
        let start = Instant::now();
        assert_eq!(join.stop_and_join(), JoinOutcome::TimedOut);
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(!join.is_finished());
        release.raise();
        // The retry joins a thread that has finished: the 50 ms timeout is
        // not raced against its wake-up.
        let start = Instant::now();
        while !join.is_finished() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the released thread never finished"
            );
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(join.stop_and_join(), JoinOutcome::Joined);
        assert_eq!(join.stop_and_join(), JoinOutcome::AlreadyDone);
    }

    #[test]
    fn a_second_joiner_returns_only_after_the_thread_finished() {
        let stop = StopSignal::new();
        let worker_stop = stop.clone();
        let handle = thread::spawn(move || {
            worker_stop.sleep(Duration::from_secs(30));
            // Still busy for a while after the stop request.
            thread::sleep(Duration::from_millis(100));
        });
        let join = Arc::new(ExitJoin::new("slow", ExitPhase::Service, stop, handle));
        let joiners: Vec<_> = (0..2)
            .map(|_| {
                let join = Arc::clone(&join);
                thread::spawn(move || {
                    let outcome = join.stop_and_join();
                    (outcome, join.is_finished())
                })
            })
            .collect();
        let mut outcomes: Vec<_> = joiners.into_iter().map(|j| j.join().unwrap()).collect();
        outcomes.sort_by_key(|(o, _)| *o == JoinOutcome::AlreadyDone);
        assert_eq!(
            outcomes,
            [(JoinOutcome::Joined, true), (JoinOutcome::AlreadyDone, true)]
        );
    }

    #[test]
    fn stopping_a_worker_from_its_own_thread_does_not_self_join() {
        let slot: Arc<Mutex<Option<Arc<ExitJoin>>>> = Arc::default();
        let inner = Arc::clone(&slot);
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = StopSignal::new();
        let handle = thread::spawn(move || {
            let join = loop {
                if let Some(j) = lock(&inner).clone() {
                    break j;
                }
                thread::yield_now();
            };
            tx.send(join.stop_and_join()).unwrap();
        });
        let join = Arc::new(ExitJoin::new("self", ExitPhase::Watchdog, stop, handle));
        *lock(&slot) = Some(Arc::clone(&join));
        assert_eq!(rx.recv().unwrap(), JoinOutcome::CurrentThread);
        assert!(join.stop_signal().is_raised());
        assert_eq!(join.stop_and_join(), JoinOutcome::Joined);
    }

    #[test]
    fn wake_callback_runs_when_the_worker_is_stopped() {
        let woken = Arc::new(AtomicBool::new(false));
        let w = Arc::clone(&woken);
        let worker = ExitWorker::builder("wake", ExitPhase::Service)
            // Relaxed: read after the join, which orders it.
            .on_stop(move || w.store(true, Ordering::Relaxed))
            .spawn(|stop| while !stop.sleep(Duration::from_millis(1)) {})
            .unwrap();
        assert_eq!(worker.stop(), JoinOutcome::Joined);
        // Relaxed: `stop` ran the callback on this thread.
        assert!(woken.load(Ordering::Relaxed));
    }
}
