//! Slot-memory backends behind one pair of traits.
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

use std::os::fd::{BorrowedFd, OwnedFd};

use crate::error::Result;

pub mod cuda;
pub mod host;
pub mod view;

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
/// to [`ExportedPool::adopt_target`], or back to the mapper's
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
/// ([`ExportedPool::enqueue_commit`]): copy the slot into each push target,
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
    /// Push delivery: a mapper for this pool's push targets, for a backend
    /// whose mapping is too slow for the producer's thread (CUDA); `None`:
    /// map with [`ExportedPool::attach_target`] (host memory: an `mmap`).
    fn target_mapper(&self) -> Option<std::sync::Arc<dyn TargetMapper>> {
        None
    }
    /// Push delivery: takes `t`, mapped by this pool's
    /// [`ExportedPool::target_mapper`], as a target and returns its id for
    /// [`ExportedPool::push_copy`] and the stream-order commit.
    ///
    /// # Errors
    /// [`crate::Error::WrongBackend`] for a pool without a mapper (`t` is
    /// dropped, leaking its mapping: no such pool makes one).
    fn adopt_target(&mut self, t: MappedTarget) -> Result<u64> {
        drop(t);
        Err(crate::Error::WrongBackend {
            what: "adopting push buffers mapped off the producer's thread",
            backend: "host",
        })
    }
    /// Push delivery: removes target `id` from the pool without unmapping
    /// it, for its mapper's `TargetMapper::unmap`; no copy into it may be
    /// in flight. `None` for an unknown id or a pool without a mapper.
    fn disown_target(&mut self, id: u64) -> Option<MappedTarget> {
        let _ = id;
        None
    }
    /// Stream-order commits: lets the GPU store into this process's host
    /// memory `ptr..ptr+len` (a shared-memory region the commit words live
    /// in). `Ok(false)`: this backend commits on the CPU only.
    ///
    /// # Safety
    /// The range is mapped in this process and stays mapped until
    /// [`ExportedPool::close`] has succeeded.
    ///
    /// # Errors
    /// The driver's error (registration, or loading the commit kernel).
    unsafe fn register_commit_memory(&mut self, ptr: *mut u8, len: usize) -> Result<bool> {
        let _ = (ptr, len);
        Ok(false)
    }
    /// Stream-order commits: enqueues `commit` on `completion`'s stream,
    /// behind the frame's writes, and returns without waiting.
    ///
    /// # Safety
    /// Every word in `commit` lies in memory registered with
    /// [`ExportedPool::register_commit_memory`] and stays there until the
    /// commit has run (a `close` waits for it).
    ///
    /// # Errors
    /// [`crate::Error::WrongBackend`] where the backend has none; the
    /// driver's error.
    unsafe fn enqueue_commit(&mut self, commit: &StreamCommit<'_>, completion: WriteCompletion) -> Result<()> {
        let _ = (commit, completion);
        Err(crate::Error::WrongBackend {
            what: "a stream-order commit",
            backend: self.kind().name(),
        })
    }
    /// The gate line (ADR 0011): zeroes the [`crate::layout::GATE_BYTES`]
    /// at pool offset `offset` and returns `true` when this pool can keep a
    /// gate word there (CUDA, with 64-bit stream memory operations, which
    /// [`ExportedPool::write_gate`] needs); `Ok(false)` otherwise (host
    /// memory: nothing waits on the GPU).
    ///
    /// # Errors
    /// The offset outside the pool; the driver's error.
    fn enable_gate_line(&mut self, offset: u64) -> Result<bool> {
        let _ = offset;
        Ok(false)
    }
    /// A CPU commit (PROTOCOL.md §10 step 7): after `global_seq = seq`,
    /// enqueues the store of `seq` into the gate word at pool offset
    /// `offset` on `completion`'s stream (a stream-order commit's kernel
    /// stores it itself).
    ///
    /// # Errors
    /// [`crate::Error::WrongBackend`] where the backend has no gate; the
    /// driver's error.
    fn write_gate(&mut self, offset: u64, seq: u64, completion: WriteCompletion) -> Result<()> {
        let _ = (offset, seq, completion);
        Err(crate::Error::WrongBackend {
            what: "a gate word",
            backend: self.kind().name(),
        })
    }
    /// Releases everything. Retryable after an error; idempotent after success.
    fn close(&mut self) -> Result<()>;
}

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
        _control: BorrowedFd<'_>,
        _control_bytes: u64,
        _word_offset: u64,
        _only_mps: bool,
    ) -> Result<bool> {
        Ok(false)
    }
    /// Queued pull on a ring with a gate line (ADR 0011): copies wait on
    /// the GPU for the 64-bit gate word at pool offset `offset`, in this
    /// import's own mapping of the pool (device memory: no host
    /// registration). `Ok(false)` as [`ImportedPool::enable_gate`].
    ///
    /// # Errors
    /// [`crate::Error::Closed`]; a word outside the pool or misaligned.
    fn enable_pool_gate(&mut self, _offset: u64, _only_mps: bool) -> Result<bool> {
        Ok(false)
    }
    /// Whether [`ImportedPool::enable_gate`] or
    /// [`ImportedPool::enable_pool_gate`] succeeded.
    fn gate_enabled(&self) -> bool {
        false
    }
    /// As [`ImportedPool::copy_out`], but the copy waits on the GPU until
    /// the gate word is at least `seq`: it is enqueued before the commit of
    /// frame `seq` has landed and starts the moment it does, with no CPU in
    /// between. Never wait for it with [`ImportedPool::complete`] (a commit
    /// that never lands would block for good): poll
    /// [`ImportedPool::poll_complete`], and give up with
    /// [`ImportedPool::abandon_copies`].
    ///
    /// # Errors
    /// [`crate::Error::WrongBackend`] without a gate; as `copy_out`.
    fn copy_out_gated(&mut self, _seq: u64, _src_offset: u64, _len: u64) -> Result<()> {
        Err(crate::Error::WrongBackend {
            what: "a copy queued behind a GPU wait",
            backend: self.kind().name(),
        })
    }
    /// Whether every copy enqueued so far has completed, without waiting.
    ///
    /// # Errors
    /// [`crate::Error::Closed`]; the backend's error.
    fn poll_complete(&mut self) -> Result<bool> {
        self.complete().map(|()| true)
    }
    /// Gives up on the copies enqueued so far (a gate that has not opened
    /// and may never): later copies go to a fresh stream and buffer, and
    /// the abandoned ones keep what they use until they complete, or, if
    /// they never do, until the process exits.
    ///
    /// # Errors
    /// [`crate::Error::Closed`]; the backend's error.
    fn abandon_copies(&mut self) -> Result<()> {
        Ok(())
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
}
