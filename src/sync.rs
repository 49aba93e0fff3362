//! Atomics facade: `std` normally, `loom` under `--cfg loom`, so the ring
//! protocol in `frame/protocol/` can be model-checked unchanged.

#[cfg(loom)]
pub(crate) use loom::sync::atomic;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic;

/// A spin hint that loom understands as a yield point.
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// A mutex loom can see (the table's per-entry client slots).
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
