//! A stop flag set by SIGINT and SIGTERM, for the examples' loops and the
//! benches' orchestrators (the benches include this file by path).

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_signal: libc::c_int) {
    // Relaxed: a flag polled by the caller's loops; nothing else is
    // published with it.
    STOP.store(true, Ordering::Relaxed);
}

/// Makes SIGINT (Ctrl-C) and SIGTERM set the stop flag instead of killing
/// the process, so its loops end cleanly: an example prints its summary, a
/// bench orchestrator kills and reaps its children and quits the MPS
/// daemon before it exits.
pub fn install_stop_handler() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe; `signal` is a valid, catchable signal number.
        unsafe {
            libc::signal(
                signal,
                on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
}

/// Whether SIGINT or SIGTERM arrived.
pub fn stop_requested() -> bool {
    // Relaxed: see `on_stop_signal`.
    STOP.load(Ordering::Relaxed)
}
