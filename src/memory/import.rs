//! A subscriber's side of a slot pool ([`ImportedPool`]): the publisher's
//! allocation imported from its descriptor and mapped (read-only unless
//! write access was granted), the subscriber's own buffers, and queued
//! pull ([`QueuedCopies`]) where the backend can wait on the GPU.

use std::os::fd::{BorrowedFd, OwnedFd};

use super::BackendKind;
use crate::error::Result;

/// One of a subscriber's own buffers (never the shared pool), for
/// [`ImportedPool::read_own`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnBuffer {
    /// The buffer [`ImportedPool::copy_out`] copies frames into.
    Dest,
    /// Push delivery: buffer `k` of the subscriber's push buffers.
    Push(usize),
}

/// A subscriber's side of a slot pool.
pub trait ImportedPool: Send {
    /// The backend.
    fn kind(&self) -> BackendKind;
    /// Address of the mapped pool in this process (host pointer or `CUdeviceptr`).
    fn base_addr(&self) -> u64;
    /// Bytes mapped.
    fn pool_bytes(&self) -> u64;
    /// Whether the mapping allows writes.
    fn writable(&self) -> bool;
    /// Enqueues a copy of `len` bytes at `src_offset` in the pool into the
    /// subscriber's own buffer at offset 0 (grown as needed).
    fn copy_out(&mut self, src_offset: u64, len: u64) -> Result<()>;
    /// Waits until every copy enqueued so far has completed.
    fn complete(&mut self) -> Result<()>;
    /// Whether [`QueuedCopies::enable_gate`] or
    /// [`QueuedCopies::enable_pool_gate`] succeeded.
    fn gate_enabled(&self) -> bool {
        false
    }
    /// Address of the subscriber's own buffer (host pointer or `CUdeviceptr`).
    fn dest_addr(&self) -> u64;
    /// The subscriber's own buffer, when it is host memory.
    fn dest_host(&self) -> Option<&[u8]>;
    /// Push delivery: makes `count` buffers of `stride` bytes the publisher
    /// can write, and returns the descriptor to send it and the bytes of the
    /// allocation.
    fn alloc_push(&mut self, count: u32, stride: u64) -> Result<(OwnedFd, u64)>;
    /// Push delivery: address of buffer `k` (0 when none).
    fn push_addr(&self, k: usize) -> u64;
    /// Push delivery: the first `len` bytes of buffer `k`, when host memory.
    fn push_host(&self, k: usize, len: usize) -> Option<&[u8]>;
    /// Copies the first `dst.len()` bytes of one of this subscriber's own
    /// buffers into host memory, synchronously (for CUDA a device-to-host
    /// copy in the import's context). Call it after [`ImportedPool::complete`]
    /// for the copy that filled the buffer. The shared pool is never read
    /// here: the bytes are the subscriber's own, so they cannot tear.
    ///
    /// # Errors
    /// [`crate::Error::LayoutMismatch`] when `dst` is longer than the
    /// buffer (or the buffer does not exist); [`crate::Error::Closed`];
    /// [`crate::Error::Driver`].
    fn read_own(&self, buf: OwnBuffer, dst: &mut [u8]) -> Result<()>;
    /// Releases everything. Retryable after an error; idempotent after success.
    fn close(&mut self) -> Result<()>;
    /// Queued pull, where the backend and device can wait on the GPU
    /// (CUDA); `None` otherwise.
    fn queued(&mut self) -> Option<&mut dyn QueuedCopies> {
        None
    }
}

/// Queued pull (ADR 0010, 0011): copies enqueued on the GPU behind a wait
/// for the frame's commit.
pub trait QueuedCopies {
    /// Queued pull (ADR 0010): maps the ring's control region `control`
    /// (`control_bytes` long) again, read-only, and registers it so that
    /// copies can wait on the GPU for the 64-bit word at `word_offset`
    /// (`global_seq`). `Ok(false)` when this backend or device cannot (host
    /// rings; no read-only host registration or 64-bit stream memory
    /// operations; a push-only import), or when `only_mps` and the device
    /// is not shared through MPS.
    ///
    /// # Errors
    /// [`crate::Error::Closed`]; a word outside the region.
    fn enable_gate(
        &mut self,
        control: BorrowedFd<'_>,
        control_bytes: u64,
        word_offset: u64,
        only_mps: bool,
    ) -> Result<bool>;
    /// Queued pull on a ring with a gate line (ADR 0011): copies wait on
    /// the GPU for the 64-bit gate word at pool offset `offset`, in this
    /// import's own mapping of the pool (device memory: no host
    /// registration). `Ok(false)` as [`QueuedCopies::enable_gate`].
    ///
    /// # Errors
    /// [`crate::Error::Closed`]; a word outside the pool or misaligned.
    fn enable_pool_gate(&mut self, offset: u64, only_mps: bool) -> Result<bool>;
    /// As [`ImportedPool::copy_out`], but the copy waits on the GPU until
    /// the gate word is at least `seq`: it is enqueued before the commit of
    /// frame `seq` has landed and starts the moment it does, with no CPU in
    /// between. Never wait for it with [`ImportedPool::complete`] (a commit
    /// that never lands would block for good): poll
    /// [`QueuedCopies::poll_complete`], and give up with
    /// [`QueuedCopies::abandon_copies`].
    ///
    /// # Errors
    /// As `copy_out`; [`crate::Error::Config`] before a gate is enabled.
    fn copy_out_gated(&mut self, seq: u64, src_offset: u64, len: u64) -> Result<()>;
    /// Whether every copy enqueued so far has completed, without waiting.
    ///
    /// # Errors
    /// [`crate::Error::Closed`]; the backend's error.
    fn poll_complete(&mut self) -> Result<bool>;
    /// Gives up on the copies enqueued so far (a gate that has not opened
    /// and may never): later copies go to a fresh stream and buffer, and
    /// the abandoned ones keep what they use until they complete, or, if
    /// they never do, until the process exits.
    ///
    /// # Errors
    /// [`crate::Error::Closed`]; the backend's error.
    fn abandon_copies(&mut self) -> Result<()>;
}
