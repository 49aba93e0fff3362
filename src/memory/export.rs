//! The publisher's side of a slot pool: one allocation holding every slot,
//! exportable as a file descriptor ([`ExportedPool`]), and the capabilities
//! only some backends have, each its own trait: push targets mapped off the
//! producer's thread, stream-order commits, the gate line.

use std::os::fd::OwnedFd;

use super::{BackendKind, MappedTarget, StreamCommit, TargetMapper, WriteCompletion};
use crate::error::Result;

/// The publisher's side of a slot pool.
pub trait ExportedPool: Send {
    /// The backend.
    fn kind(&self) -> BackendKind;
    /// Bytes of the allocation a subscriber maps.
    fn pool_bytes(&self) -> u64;
    /// UUID of the GPU holding the pool; zero for host memory.
    fn device_uuid(&self) -> [u8; 16];
    /// A new descriptor for the pool, to send to one subscriber. The caller
    /// owns it and closes it after sending.
    fn export_fd(&self) -> Result<OwnedFd>;
    /// A descriptor for a subscriber without write access: for host memory
    /// a read-only reopen of the memfd (a writable shared mapping,
    /// `fallocate` or `ftruncate` through it fail). A CUDA VMM handle has
    /// no access mode: the importer picks its own with `cuMemSetAccess`, so
    /// the default is [`ExportedPool::export_fd`] (see `docs/SECURITY.md`).
    fn export_read_only_fd(&self) -> Result<OwnedFd> {
        self.export_fd()
    }
    /// Address of the pool in the publisher's own address space (host
    /// pointer or `CUdeviceptr`).
    fn base_addr(&self) -> u64;
    /// Makes every write made through `completion` complete and visible to
    /// other processes' readers of the pool.
    fn complete_writes(&self, completion: WriteCompletion) -> Result<()>;
    /// Push delivery: maps a subscriber's own buffers (`fd`, `bytes` bytes)
    /// for writing and returns an id for [`ExportedPool::push_copy`]. The
    /// descriptor stays the caller's.
    fn attach_target(&mut self, fd: &OwnedFd, bytes: u64) -> Result<u64>;
    /// Push delivery: copies `len` bytes at pool offset `src_offset` into
    /// target `id` at `dst_offset`, ordered after the writes of
    /// `completion` (enqueued on its stream for CUDA; done now for host).
    /// The copy is complete after the next [`ExportedPool::complete_writes`]
    /// with the same completion.
    fn push_copy(
        &mut self,
        id: u64,
        dst_offset: u64,
        src_offset: u64,
        len: u64,
        completion: WriteCompletion,
    ) -> Result<()>;
    /// Push delivery: unmaps target `id` (in its owning context), after
    /// waiting for every copy into it to complete (for CUDA a
    /// `cuCtxSynchronize`, which also waits for the context's other work).
    /// Unknown ids are ignored.
    fn detach_target(&mut self, id: u64) -> Result<()>;
    /// Push delivery: unmaps target `id` without waiting: the caller knows
    /// that no copy into it is in flight (none was enqueued, or the commit
    /// of the last one has landed). Unknown ids are ignored.
    fn release_target(&mut self, id: u64) -> Result<()> {
        self.detach_target(id)
    }
    /// Releases everything. Retryable after an error; idempotent after success.
    fn close(&mut self) -> Result<()>;
    /// Push targets mapped off the producer's thread, where the backend's
    /// mapping is too slow for it (CUDA); `None`: map with
    /// [`ExportedPool::attach_target`].
    fn mapped_targets(&mut self) -> Option<&mut dyn MappedTargets> {
        None
    }
    /// Stream-order commits, where the backend has them (CUDA); `None`:
    /// this backend commits on the CPU only.
    fn stream_commits(&mut self) -> Option<&mut dyn StreamCommits> {
        None
    }
    /// The gate line at the end of the pool, where the backend can keep one
    /// (CUDA with 64-bit stream memory operations); `None`: nothing waits
    /// on the GPU (host memory).
    fn gate_line(&mut self) -> Option<&mut dyn GateLine> {
        None
    }
}

/// Push targets mapped off the producer's thread (CUDA: mapping takes the
/// driver long enough to stall a publish).
pub trait MappedTargets {
    /// The mapper for this pool's push targets, which the service thread
    /// runs.
    fn target_mapper(&self) -> Option<std::sync::Arc<dyn TargetMapper>>;
    /// Push delivery: takes `t`, mapped by this pool's
    /// [`MappedTargets::target_mapper`], as a target and returns its id for
    /// [`ExportedPool::push_copy`] and the stream-order commit.
    fn adopt_target(&mut self, t: MappedTarget) -> Result<u64>;
    /// Push delivery: removes target `id` from the pool without unmapping
    /// it, for its mapper's `TargetMapper::unmap`; no copy into it may be
    /// in flight. `None` for an unknown id.
    fn disown_target(&mut self, id: u64) -> Option<MappedTarget>;
}

/// Stream-order commits: the GPU stores the frame's seqs behind its writes.
pub trait StreamCommits {
    /// Stream-order commits: lets the GPU store into this process's host
    /// memory `ptr..ptr+len` (a shared-memory region the commit words live
    /// in).
    ///
    /// # Safety
    /// The range is mapped in this process and stays mapped until
    /// [`ExportedPool::close`] has succeeded.
    ///
    /// # Errors
    /// The driver's error (registration, or loading the commit kernel).
    unsafe fn register_commit_memory(&mut self, ptr: *mut u8, len: usize) -> Result<bool>;
    /// Stream-order commits: enqueues `commit` on `completion`'s stream,
    /// behind the frame's writes, and returns without waiting.
    ///
    /// # Safety
    /// Every word in `commit` lies in memory registered with
    /// [`StreamCommits::register_commit_memory`] and stays there until the
    /// commit has run (a `close` waits for it).
    ///
    /// # Errors
    /// The driver's error.
    unsafe fn enqueue_commit(&mut self, commit: &StreamCommit<'_>, completion: WriteCompletion) -> Result<()>;
}

/// The gate line (ADR 0011): a word in device memory at the end of the pool
/// that queued pull copies wait on.
pub trait GateLine {
    /// The gate line (ADR 0011): zeroes the [`crate::layout::GATE_BYTES`]
    /// at pool offset `offset` and returns `true` when this pool can keep a
    /// gate word there (the device has the 64-bit stream memory operations
    /// [`GateLine::write_gate`] needs).
    ///
    /// # Errors
    /// The offset outside the pool; the driver's error.
    fn enable_gate_line(&mut self, offset: u64) -> Result<bool>;
    /// A CPU commit (PROTOCOL.md §10 step 7): after `global_seq = seq`,
    /// enqueues the store of `seq` into the gate word at pool offset
    /// `offset` on `completion`'s stream (a stream-order commit's kernel
    /// stores it itself).
    ///
    /// # Errors
    /// The driver's error.
    fn write_gate(&mut self, offset: u64, seq: u64, completion: WriteCompletion) -> Result<()>;
}
