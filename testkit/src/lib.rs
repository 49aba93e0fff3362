//! Test scaffolding for vramring, a dev-dependency only: nothing here is
//! part of the library's API.
//!
//! * [`pattern`]: the test pattern every test frame carries (its sequence
//!   number and a checksum in its pixels), written and checked on the CPU.
//! * [`gpu`]: the same pattern written and checked on the GPU by PTX
//!   kernels ([`gpu::GpuTestPattern`]).
//! * [`fake`]: the CUDA driver API over host memory ([`fake::FakeDriver`]),
//!   with fault injection, context tracking and a leak list, for testing the
//!   CUDA backend without a GPU.
//! * [`procs`]: multi-process tests: the test binary re-executed as a child
//!   in a named role, subscriber roles that verify every frame, temporary
//!   directories, the examples' binaries.
//! * [`data`]: `tests/data` (or `VRAMRING_TEST_DATA`) and framemd5 files.
//! * [`json`], [`finals`]: the examples' one-line JSON reports, read back.
//! * [`marks`]: the library's TRACE stage marks, collected per thread.
//! * [`hang`]: a guard that fails a test whose wait does not end.
//! * [`events`]: the library's log events on one thread, as text.
//!
//! The library's internals it needs come through `vramring::seam`, which
//! is hidden from the API and carries no stability promise.

pub mod data;
pub mod events;
pub mod fake;
pub mod finals;
pub mod gpu;
mod gpu_kernels;
pub mod hang;
pub mod json;
pub mod marks;
pub mod pattern;
pub mod procs;

pub use gpu_kernels::{PatternCheck, PatternKernels};

/// The `p`-th percentile (0..=100, nearest rank) of `v`, sorting it; 0 when
/// empty.
pub fn percentile_of(v: &mut [u64], p: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}
