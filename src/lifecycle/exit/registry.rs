//! The process-exit registry: shutdown owners, their phases, and the `atexit`
//! hook that runs them.

use std::collections::BTreeMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use super::{lock, panic_message};
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
/// the [module docs](super)).
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
/// time *after* vramring started its threads (see the [module docs](super)).
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
}
