//! Process-exit registry: stop and join library threads before the C
//! runtime's later exit handlers tear CUDA down.
//!
//! Rust detaches a thread when its [`JoinHandle`](std::thread::JoinHandle)
//! is dropped, and `std::process::exit` (or a return from `main`) runs no
//! destructor on any other thread. A vramring thread that may touch CUDA (the publisher's
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

use std::sync::{Mutex, MutexGuard, PoisonError};

mod registry;
mod stop;
mod worker;

pub use registry::{
    install_exit_hook, register, shutdown_now, shutdown_started, ExitGuard, ExitPhase, ExitRegistration, ExitShutdown,
};
pub use stop::StopSignal;
pub use worker::{ExitJoin, ExitWorker, ExitWorkerBuilder, JoinOutcome, DEFAULT_JOIN_TIMEOUT};

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
