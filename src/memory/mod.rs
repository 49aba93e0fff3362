//! Slot-memory backends behind one pair of traits, with the capabilities
//! only some backends have as traits of their own.
//!
//! The publisher owns an [`ExportedPool`]: one allocation holding every slot,
//! exportable as a file descriptor. Each subscriber owns an [`ImportedPool`]:
//! the same allocation imported from that descriptor and mapped (read-only
//! unless write access was granted), plus the subscriber's own destination
//! buffer that frames are copied into.
//!
//! Addresses cross this boundary as `u64`: a host pointer for the host
//! backend, a `CUdeviceptr` for the CUDA backend.
//!
//! Backends: [`host`] (memfd; "copy" is `memcpy`) and [`cuda`] (CUDA VMM,
//! exported as a POSIX file descriptor).

use std::os::fd::OwnedFd;

use crate::error::Result;

pub mod cuda;
mod export;
pub mod host;
mod import;
pub mod view;

pub use export::{ExportedPool, GateLine, MappedTargets, StreamCommits};
pub use import::{ImportedPool, OwnBuffer, QueuedCopies};

/// Checks that `len` bytes at `offset` lie inside a `total`-byte `what`.
///
/// # Errors
/// [`crate::Error::LayoutMismatch`] naming the range, also on overflow.
pub(crate) fn check_range(what: &str, offset: u64, len: u64, total: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= total => Ok(()),
        _ => Err(crate::Error::LayoutMismatch(format!(
            "{len} bytes at offset {offset} leave the {total}-byte {what}"
        ))),
    }
}

/// A subscriber's push buffers mapped by a [`TargetMapper`] off the
/// producer's thread, not (or no longer) part of the pool's targets: hand it
/// to [`MappedTargets::adopt_target`], or back to the mapper's
/// [`TargetMapper::unmap`]. Dropping one that is still mapped leaks the
/// mapping (a warning says so).
#[derive(Debug)]
pub struct MappedTarget {
    pub(crate) vmm: cuda::VmmMapping,
}

impl MappedTarget {
    /// Bytes mapped.
    pub fn bytes(&self) -> u64 {
        self.vmm.bytes()
    }
}

impl Drop for MappedTarget {
    fn drop(&mut self) {
        if self.vmm.is_live() {
            tracing::warn!(mapping = ?self.vmm, "push buffers dropped while mapped; the mapping leaks until the process exits");
        }
    }
}

/// Maps and unmaps subscribers' push buffers in the pool's context on a
/// thread other than the producer's (ADR 0018): importing a peer's
/// allocation costs a few hundred microseconds, which a publish must not
/// pay for a peer that comes and goes.
///
/// A mapper may be used only while its pool is open: whoever uses it
/// stops doing so before [`ExportedPool::close`].
pub trait TargetMapper: Send + Sync {
    /// Imports and maps `fd` (`bytes` bytes) read-write for the pool's
    /// device. The descriptor stays the caller's.
    ///
    /// # Errors
    /// The driver's error; nothing stays mapped.
    fn map(&self, fd: &OwnedFd, bytes: u64) -> Result<MappedTarget>;
    /// Unmaps and releases `t`; no copy into it may be in flight. After an
    /// error what is left stays in `t`, for a retry.
    ///
    /// # Errors
    /// The driver's error.
    fn unmap(&self, t: &mut MappedTarget) -> Result<()>;
}

/// A raw CUDA stream handle (`CUstream`), as the driver API takes it.
pub type RawCuStream = cudarc::driver::sys::CUstream;

/// How the producer's writes into a loaned slot are made complete before the
/// frame is committed.
#[derive(Debug, Clone, Copy)]
pub enum WriteCompletion {
    /// The writes were made by the CPU and are already complete (host backend).
    Host,
    /// The writes were enqueued on this CUDA stream; the publisher
    /// synchronises it before committing.
    CudaStream(RawCuStream),
}

/// A frame's commit, enqueued on the GPU behind the frame's writes
/// ([`StreamCommits::enqueue_commit`]): copy the slot into each push target,
/// then store `seq` into each target's `push_seq` word and the slot's seq
/// word, then into `global_seq`, each group after a system-scope fence.
#[derive(Debug)]
pub struct StreamCommit<'a> {
    /// The frame's seq.
    pub seq: u64,
    /// Pool offset of the slot.
    pub src_offset: u64,
    /// Bytes of the frame.
    pub len: u64,
    /// Push targets: copy into, then store the seq.
    pub targets: &'a [PushWrite<'a>],
    /// The slot's seq word.
    pub slot_seq: &'a crate::sync::atomic::AtomicU64,
    /// The ring's `global_seq`.
    pub global_seq: &'a crate::sync::atomic::AtomicU64,
    /// Pool offset of the gate word (`RING_GATE`), stored after
    /// `global_seq`; `None` when the pool has no gate line.
    pub gate: Option<u64>,
}

/// One push target of a [`StreamCommit`].
#[derive(Debug)]
pub struct PushWrite<'a> {
    /// The target ([`ExportedPool::attach_target`]).
    pub id: u64,
    /// Offset of the buffer the frame goes to.
    pub dst_offset: u64,
    /// The entry's `push_seq` word for that buffer.
    pub push_seq: &'a crate::sync::atomic::AtomicU64,
}

/// Which backend a ring uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Host shared memory (memfd).
    Host,
    /// CUDA device memory (VMM, POSIX file descriptor handles).
    Cuda,
}

impl BackendKind {
    /// The layout's `BACKEND_*` code.
    pub const fn code(self) -> u32 {
        match self {
            BackendKind::Host => crate::layout::BACKEND_HOST,
            BackendKind::Cuda => crate::layout::BACKEND_CUDA,
        }
    }

    /// The backend with layout code `code`.
    pub const fn from_code(code: u32) -> Option<Self> {
        match code {
            crate::layout::BACKEND_HOST => Some(BackendKind::Host),
            crate::layout::BACKEND_CUDA => Some(BackendKind::Cuda),
            _ => None,
        }
    }

    /// Lowercase name.
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
        }
    }
}
