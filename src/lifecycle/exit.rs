//! Process-exit registry: stop and join library threads before the C
//! runtime's later exit handlers tear CUDA down.
//!
//! Rust detaches a thread when its [`JoinHandle`] is dropped, and
//! `std::process::exit` (or a return from `main`) runs no destructor on any
//! other thread. A vramring thread that may touch CUDA (the publisher's
//! socket-service thread, a subscriber's reconnect thread, the memory
//! watchdog) would otherwise keep running while the process's exit handlers
//! unload the CUDA libraries under it. Each such thread registers a small,
//! non-GPU *shutdown owner* ([`ExitShutdown`]) here; one C `atexit` hook runs
//! every registered owner once, in [`ExitPhase`] order, and each owner stops
//! and joins its thread (with a bounded wait) before the hook returns.
//!
//! # Ordering against CUDA's own exit handlers
//!
//! glibc's `exit()` runs the handlers registered with `atexit` (and
//! `__cxa_atexit`, which C++ static destructors use) in the reverse order of
//! their registration, last registered first; after all of them it runs the
//! shared libraries' ELF destructors.
//!
//! * vramring reaches CUDA through the **driver API** only (cudarc, with
//!   `libcuda.so` loaded at run time). There is no `libcudart` in vramring and
//!   so no runtime exit handler of ours to race. The driver tears itself down
//!   from its library destructors, after every `atexit` handler, ours
//!   included.
//! * Application code in the same process may use the **CUDA runtime**
//!   (`libcudart`: a decoder, NPP, PyTorch). The runtime registers its
//!   teardown with the C runtime during its first runtime call. Because the
//!   handlers run last-in first-out, our hook runs *before* the runtime's
//!   teardown exactly when it was registered *after* the runtime's first
//!   call; that is the "LIFO priority" this module relies on.
//!
//! **When we register.** The hook is installed lazily, by the first
//! [`register`] in the process, never at load time. vramring threads register
//! when they start: the publisher's service thread when the publisher is
//! created, a subscriber's reconnect thread when it connects, the watchdog in
//! [`MemoryWatchdog::start`](crate::lifecycle::MemoryWatchdog::start). With
//! the CUDA backend each of these comes after the backend's first driver
//! call, and in an application that initialises the runtime before it
//! creates vramring objects, after the runtime's first call too. An
//! application that enters the CUDA runtime for the first time only *after*
//! vramring started its threads should call [`install_exit_hook`] once more
//! after that first runtime call: each call adds one more `atexit` entry, the
//! hook is idempotent, and the latest entry is the one that runs first.
//!
//! Nothing runs on `_exit`, `abort`, `kill -9` or a fatal signal; the kernel
//! then reclaims the process and the driver its contexts, and peers see the
//! socket close (the liveness rule in `DESIGN.md`).
//!
//! # Contract for owners
//!
//! [`ExitShutdown::shutdown_for_process_exit`] must not return while its
//! thread can still call CUDA, except after a bounded wait it logs (a stuck
//! thread must never hang process exit forever; [`ExitJoin`] gives up after
//! its join timeout and leaves the thread running). Owners run with the
//! registry lock released, so they may unregister themselves or register
//! others. A panic in one owner is caught and logged; the others still run,
//! and no panic crosses the C ABI.
//!
//! The control atomics here are process-local (not the shared-memory ring
//! protocol), live in statics, and so use `std::sync` directly, not the loom
//! facade in `crate::sync`.

use std::collections::BTreeMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Dependency order of shutdown at process exit: owners of an earlier phase
/// are stopped and joined before any owner of a later phase runs. Within a
/// phase, owners run in registration order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExitPhase {
    /// Socket-service threads (the publisher's accept and connection
    /// threads): stop accepting, drop connections, release subscriber pins.
    /// First, because they create work (imports, holds) for later phases.
    Service,
    /// A subscriber's reconnect thread: stop before it imports a new
    /// publisher's memory behind a teardown that already ran.
    Reconnect,
    /// The device-memory watchdog: its action may stop a publisher, so it
    /// stops after the service threads and before the CUDA work it watches
    /// is torn down.
    Watchdog,
    /// Threads that wait on CUDA events or streams for copy completion:
    /// drained after every thread that could enqueue more work has stopped.
    Completion,
    /// Last: owners that release streams, mappings and contexts once no
    /// vramring thread can use them any more.
    CudaTeardown,
}

/// A non-GPU owner able to synchronously stop one library thread.
///
/// Implementations must not return from
/// [`shutdown_for_process_exit`](Self::shutdown_for_process_exit) while their
/// thread can still call CUDA, except after a bounded wait that they log (see
/// the [module docs](self)).
pub trait ExitShutdown: Send + Sync {
    /// The phase this owner runs in.
    fn phase(&self) -> ExitPhase;

    /// Stops the thread and waits (bounded) until it has finished.
    fn shutdown_for_process_exit(&self);

    /// A name for logs.
    fn name(&self) -> &str {
        std::any::type_name::<Self>()
    }
}

/// Locks `m`, taking the data over if a panicking holder poisoned it: every
/// critical section in this module leaves its data consistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The text of a panic payload, for logs.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "non-string panic payload"
    }
}

/// Runs one owner, catching and logging a panic so that the remaining
/// owners still run and nothing unwinds into the C runtime.
fn shutdown_owner(owner: &Arc<dyn ExitShutdown>) {
    let result = catch_unwind(AssertUnwindSafe(|| owner.shutdown_for_process_exit()));
    if let Err(payload) = result {
        tracing::error!(
            owner = owner.name(),
            phase = ?owner.phase(),
            "process-exit shutdown owner panicked: {}; continuing with the other owners",
            panic_message(&*payload)
        );
    }
}

#[derive(Default)]
struct RegistryState {
    next_id: u64,
    owners: BTreeMap<u64, Arc<dyn ExitShutdown>>,
    shutdown_started: bool,
}

/// The set of live owners. The process has one ([`GLOBAL`]); tests build
/// their own.
struct Registry {
    state: Mutex<Option<RegistryState>>,
}

impl Registry {
    const fn new() -> Self {
        Registry {
            state: Mutex::new(None),
        }
    }

    fn register(&'static self, owner: Arc<dyn ExitShutdown>) -> ExitRegistration {
        let id = {
            let mut guard = lock(&self.state);
            let state = guard.get_or_insert_with(RegistryState::default);
            if state.shutdown_started {
                None
            } else {
                let id = state.next_id;
                // A u64 of registrations does not wrap in a process lifetime.
                state.next_id += 1;
                state.owners.insert(id, Arc::clone(&owner));
                Some(id)
            }
        };
        if id.is_none() {
            // The exit snapshot was taken already: an owner left out of it
            // would race CUDA's teardown, so stop its thread now, here.
            tracing::debug!(
                owner = owner.name(),
                "registration after process-exit shutdown began; stopping the worker inline"
            );
            shutdown_owner(&owner);
        }
        ExitRegistration { registry: self, id }
    }

    fn unregister(&self, id: u64) {
        if let Some(state) = lock(&self.state).as_mut() {
            state.owners.remove(&id);
        }
    }

    /// Runs every registered owner once, in phase order, with the lock
    /// released while owners run. Later calls do nothing.
    fn shutdown(&self) {
        let mut owners: Vec<Arc<dyn ExitShutdown>> = {
            let mut guard = lock(&self.state);
            let state = guard.get_or_insert_with(RegistryState::default);
            if state.shutdown_started {
                return;
            }
            state.shutdown_started = true;
            // BTreeMap order is registration order; the sort below is stable.
            std::mem::take(&mut state.owners).into_values().collect()
        };
        owners.sort_by_key(|owner| owner.phase());
        for owner in &owners {
            shutdown_owner(owner);
        }
    }

    fn shutdown_started(&self) -> bool {
        lock(&self.state).as_ref().is_some_and(|s| s.shutdown_started)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.state).as_ref().map_or(0, |s| s.owners.len())
    }
}

static GLOBAL: Registry = Registry::new();

/// Whether our `atexit` hook is installed; the lock serialises installs.
static HOOK_INSTALLED: Mutex<bool> = Mutex::new(false);

extern "C" fn process_exit_hook() {
    // No panic may cross this C ABI callback; `shutdown_owner` already
    // catches each owner's, this catches the registry's own.
    let _ = catch_unwind(|| GLOBAL.shutdown());
}

fn add_atexit_entry() -> Result<()> {
    // SAFETY: `process_exit_hook` is an `extern "C" fn()` that never unwinds
    // (it catches every panic) and touches only `GLOBAL`, a static that
    // outlives every exit handler. Registering it more than once is fine: the
    // registry runs its owners only the first time.
    let status = unsafe { libc::atexit(process_exit_hook) };
    if status != 0 {
        return Err(Error::io(
            "installing vramring's process-exit hook with atexit",
            std::io::Error::other(format!("atexit returned {status}")),
        ));
    }
    Ok(())
}

fn ensure_exit_hook() -> Result<()> {
    let mut installed = lock(&HOOK_INSTALLED);
    if !*installed {
        add_atexit_entry()?;
        *installed = true;
    }
    Ok(())
}

/// Adds one more `atexit` entry for the process-exit hook, so that it runs
/// before every exit handler registered until now.
///
/// [`register`] installs the hook by itself the first time; call this only
/// if your application entered the CUDA runtime (`libcudart`) for the first
/// time *after* vramring started its threads (see the [module docs](self)).
///
/// # Errors
/// [`Error::Io`] if the C runtime refuses the registration.
pub fn install_exit_hook() -> Result<()> {
    let mut installed = lock(&HOOK_INSTALLED);
    add_atexit_entry()?;
    *installed = true;
    Ok(())
}

/// Registers `owner` to be run at process exit, installing the `atexit` hook
/// on the first call.
///
/// If process-exit shutdown has already begun, `owner` is run here, before
/// this returns, and the returned registration is empty
/// ([`ExitRegistration::is_registered`] is false).
///
/// The owner stays registered until [`ExitRegistration::unregister`] (or the
/// drop of an [`ExitGuard`]); a registration that is simply dropped keeps
/// the owner for the rest of the process.
///
/// # Errors
/// [`Error::Io`] if the `atexit` hook cannot be installed; nothing is
/// registered then.
pub fn register(owner: Arc<dyn ExitShutdown>) -> Result<ExitRegistration> {
    ensure_exit_hook()?;
    Ok(GLOBAL.register(owner))
}

/// Runs process-exit shutdown now, as the `atexit` hook would: every
/// registered owner once, in phase order. Later registrations are stopped
/// inline. For a program that leaves by `_exit` or a signal handler after an
/// orderly stop; idempotent.
pub fn shutdown_now() {
    GLOBAL.shutdown();
}

/// Whether process-exit shutdown has begun.
pub fn shutdown_started() -> bool {
    GLOBAL.shutdown_started()
}

/// Proof that an owner was offered to the registry. Empty when shutdown had
/// already begun and the owner was run inline.
#[must_use = "dropping a registration keeps the owner registered for the whole process; call unregister() or into_guard()"]
pub struct ExitRegistration {
    registry: &'static Registry,
    id: Option<u64>,
}

impl ExitRegistration {
    /// Whether the owner is in the registry (false when it was run inline
    /// because shutdown had begun).
    pub fn is_registered(&self) -> bool {
        self.id.is_some()
    }

    /// Removes the owner. Call it once the owner's thread has stopped and
    /// joined by other means (the thread's owner was closed or dropped).
    pub fn unregister(self) {
        if let Some(id) = self.id {
            self.registry.unregister(id);
        }
    }

    /// A guard that unregisters on drop.
    pub fn into_guard(self) -> ExitGuard {
        ExitGuard {
            registration: Some(self),
        }
    }
}

impl fmt::Debug for ExitRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExitRegistration").field("id", &self.id).finish()
    }
}

/// Unregisters its owner when dropped.
#[derive(Debug)]
pub struct ExitGuard {
    registration: Option<ExitRegistration>,
}

impl ExitGuard {
    /// Unregisters now (the same as dropping the guard).
    pub fn unregister(mut self) {
        self.take_and_unregister();
    }

    fn take_and_unregister(&mut self) {
        if let Some(registration) = self.registration.take() {
            registration.unregister();
        }
    }
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        self.take_and_unregister();
    }
}

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
        let handle = thread::Builder::new()
            .name(self.name.clone())
            .spawn(move || body(worker_stop))
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

    type Events = Arc<Mutex<Vec<&'static str>>>;

    struct Probe {
        phase: ExitPhase,
        label: &'static str,
        events: Events,
        panics: bool,
    }

    impl ExitShutdown for Probe {
        fn phase(&self) -> ExitPhase {
            self.phase
        }
        fn shutdown_for_process_exit(&self) {
            lock(&self.events).push(self.label);
            if self.panics {
                panic!("probe {} panics on purpose", self.label);
            }
        }
    }

    fn probe(phase: ExitPhase, label: &'static str, events: &Events) -> Arc<dyn ExitShutdown> {
        Arc::new(Probe {
            phase,
            label,
            events: Arc::clone(events),
            panics: false,
        })
    }

    fn local_registry() -> &'static Registry {
        Box::leak(Box::new(Registry::new()))
    }

    #[test]
    fn owners_run_in_phase_order_then_registration_order() {
        let registry = local_registry();
        let events = Events::default();
        let regs = [
            registry.register(probe(ExitPhase::CudaTeardown, "teardown", &events)),
            registry.register(probe(ExitPhase::Watchdog, "watchdog", &events)),
            registry.register(probe(ExitPhase::Service, "service-a", &events)),
            registry.register(probe(ExitPhase::Completion, "completion", &events)),
            registry.register(probe(ExitPhase::Service, "service-b", &events)),
            registry.register(probe(ExitPhase::Reconnect, "reconnect", &events)),
        ];
        assert!(regs.iter().all(ExitRegistration::is_registered));
        registry.shutdown();
        assert_eq!(
            *lock(&events),
            [
                "service-a",
                "service-b",
                "reconnect",
                "watchdog",
                "completion",
                "teardown"
            ]
        );
        assert_eq!(registry.len(), 0);
    }

    #[test]
    fn shutdown_runs_each_owner_only_once() {
        let registry = local_registry();
        let events = Events::default();
        let _reg = registry.register(probe(ExitPhase::Service, "once", &events));
        registry.shutdown();
        registry.shutdown();
        assert_eq!(*lock(&events), ["once"]);
        assert!(registry.shutdown_started());
    }

    #[test]
    fn registration_after_shutdown_began_runs_the_owner_inline() {
        let registry = local_registry();
        let events = Events::default();
        let _early = registry.register(probe(ExitPhase::Service, "snapshot", &events));
        registry.shutdown();
        let late = registry.register(probe(ExitPhase::Service, "late", &events));
        assert_eq!(*lock(&events), ["snapshot", "late"]);
        assert!(!late.is_registered());
        assert_eq!(registry.len(), 0);
        late.unregister();
    }

    #[test]
    fn unregistered_owner_is_not_run() {
        let registry = local_registry();
        let events = Events::default();
        let gone = registry.register(probe(ExitPhase::Service, "gone", &events));
        let guarded = registry
            .register(probe(ExitPhase::Service, "guarded", &events))
            .into_guard();
        let _kept = registry.register(probe(ExitPhase::Watchdog, "kept", &events));
        assert_eq!(registry.len(), 3);
        gone.unregister();
        drop(guarded);
        assert_eq!(registry.len(), 1);
        registry.shutdown();
        assert_eq!(*lock(&events), ["kept"]);
    }

    #[test]
    fn panicking_owner_does_not_stop_the_others() {
        let registry = local_registry();
        let events = Events::default();
        let _a = registry.register(probe(ExitPhase::Service, "before", &events));
        let _b = registry.register(Arc::new(Probe {
            phase: ExitPhase::Watchdog,
            label: "panics",
            events: Arc::clone(&events),
            panics: true,
        }));
        let _c = registry.register(probe(ExitPhase::CudaTeardown, "after", &events));
        registry.shutdown();
        assert_eq!(*lock(&events), ["before", "panics", "after"]);
    }

    #[test]
    fn owner_may_unregister_and_register_while_shutdown_runs() {
        // The registry lock is released while owners run; an owner that
        // touches the registry must not deadlock.
        struct Reentrant {
            registry: &'static Registry,
            events: Events,
        }
        impl ExitShutdown for Reentrant {
            fn phase(&self) -> ExitPhase {
                ExitPhase::Service
            }
            fn shutdown_for_process_exit(&self) {
                lock(&self.events).push("reentrant");
                let late = self
                    .registry
                    .register(probe(ExitPhase::Service, "nested", &self.events));
                late.unregister();
            }
        }
        let registry = local_registry();
        let events = Events::default();
        let _r = registry.register(Arc::new(Reentrant {
            registry,
            events: Arc::clone(&events),
        }));
        registry.shutdown();
        assert_eq!(*lock(&events), ["reentrant", "nested"]);
    }

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
