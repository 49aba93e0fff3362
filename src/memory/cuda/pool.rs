//! [`CudaPool`]: the publisher's slot pool, one VMM allocation exported as a
//! POSIX file descriptor.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::commit::{CommitDesc, CommitGraph, CommitKernel, Enqueued, MAX_FANOUT};
use super::context::with_context;
use super::driver::{attr, Access, CuContext, CuDevice, CuStream, DevicePtr, Driver};
use super::mapping::VmmMapping;
use super::real::RealDriver;
use super::{device_free_bytes, format_uuid, resolve_device, round_up, DeviceSelector};
use crate::error::{Error, IoContext, Result};
use crate::layout::GATE_BYTES;
use crate::memory::{
    check_range, BackendKind, ExportedPool, GateLine, MappedTarget, MappedTargets, StreamCommit, StreamCommits,
    TargetMapper, WriteCompletion,
};

/// The publisher's pool: one `cuMemCreate` of the whole pool (rounded up to
/// the allocation granularity once), mapped read-write into this process and
/// exportable as a file descriptor per subscriber.
///
/// Holds a reference to its device's primary context, which is the context
/// the allocation, its mapping and reservation belong to; every release runs
/// with it pushed. See `memory/cuda/mod.rs` for teardown.
pub struct CudaPool<D: Driver = RealDriver> {
    driver: Arc<D>,
    device: CuDevice,
    uuid: [u8; 16],
    bytes: u64,
    granularity: u64,
    /// Retained primary context; `None` before retain and after release.
    ctx: Option<CuContext>,
    /// The allocation, its reserved range and its mapping.
    mem: VmmMapping,
    /// The exported descriptor, duplicated per subscriber.
    fd: Option<OwnedFd>,
    /// Whether access was granted (the pool is usable).
    ready: bool,
    /// Push delivery: subscribers' buffers mapped read-write here.
    targets: Vec<(u64, VmmMapping)>,
    /// Whether the context is retained: cleared (Release) before the close
    /// releases it, for the pool's [`CudaMapper`]s.
    open: Arc<std::sync::atomic::AtomicBool>,
    next_target: u64,
    /// Stream-order commits: the commit kernel, once loaded.
    commit: Option<CommitKernel>,
    /// Stream-order commits: host memory registered for the GPU's stores.
    host_regs: Vec<HostReg>,
    /// When push commits replay the commit graph instead of launching the
    /// commit kernel: it costs the CPU less only when commits come close
    /// together (ADR 0022).
    commit_graph: CommitGraph,
}

/// The stream GPU work ordered after `completion`'s writes goes on: the
/// writer's, or the legacy default stream for writes already complete.
fn completion_stream(completion: WriteCompletion) -> CuStream {
    match completion {
        WriteCompletion::CudaStream(s) => CuStream::from_raw(s),
        WriteCompletion::Host => CuStream::from_raw(std::ptr::null_mut()),
    }
}

/// Imports and maps a subscriber's push buffers (`fd`, `bytes` bytes)
/// read-write for `dev` in `ctx`; anything half-made is released.
///
/// # Safety
/// `ctx` is live (retained) for the whole call.
unsafe fn map_target<D: Driver>(d: &D, ctx: CuContext, dev: CuDevice, fd: &OwnedFd, bytes: u64) -> Result<VmmMapping> {
    let mut m = VmmMapping::default();
    let body = |d: &D| -> Result<()> {
        let made = m.import(d, fd, bytes, dev, Access::ReadWrite);
        if made.is_err() {
            if let Err(e) = m.release(d) {
                tracing::warn!(error = %e, "releasing a half-attached push target");
            }
        }
        made
    };
    // SAFETY: `ctx` is live (this function's contract).
    unsafe { with_context(d, ctx, body) }?;
    Ok(m)
}

/// [`TargetMapper`] of a [`CudaPool`]: maps and unmaps push buffers in the
/// pool's context from any thread (the driver's VMM calls are thread-safe;
/// the context is pushed and popped around each call). `open` is cleared
/// when the pool releases its context, after which every call fails with
/// [`Error::Closed`]; the publisher stops using the mapper before that.
struct CudaMapper<D: Driver> {
    driver: Arc<D>,
    ctx: CuContext,
    device: CuDevice,
    open: Arc<std::sync::atomic::AtomicBool>,
}

impl<D: Driver> CudaMapper<D> {
    fn check_open(&self) -> Result<()> {
        // Acquire pairs with the close's Release: a mapper that sees the
        // pool open sees its context retained. (The publisher orders its
        // use of the mapper before the close in any case.)
        if self.open.load(std::sync::atomic::Ordering::Acquire) {
            Ok(())
        } else {
            Err(Error::Closed)
        }
    }
}

impl<D: Driver> TargetMapper for CudaMapper<D> {
    fn map(&self, fd: &OwnedFd, bytes: u64) -> Result<MappedTarget> {
        self.check_open()?;
        // SAFETY: the pool's context is retained while it is open (checked
        // above; the mapper's user stops before the close).
        let vmm = unsafe { map_target(&*self.driver, self.ctx, self.device, fd, bytes) }?;
        Ok(MappedTarget { vmm })
    }

    fn unmap(&self, t: &mut MappedTarget) -> Result<()> {
        if !t.vmm.is_live() {
            return Ok(());
        }
        self.check_open()?;
        let body = |d: &D| t.vmm.release(d);
        // SAFETY: as in `map`.
        unsafe { with_context(&*self.driver, self.ctx, body) }
    }
}

/// Host memory registered for the GPU's commit stores.
#[derive(Debug, Clone, Copy)]
struct HostReg {
    host: usize,
    len: usize,
    dev: DevicePtr,
}

impl<D: Driver> std::fmt::Debug for CudaPool<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaPool")
            .field("device", &self.device)
            .field("uuid", &format_uuid(&self.uuid))
            .field("bytes", &self.bytes)
            .field("base", &self.mem.addr())
            .field("open", &self.ctx.is_some())
            .finish()
    }
}

impl CudaPool<RealDriver> {
    /// [`CudaPool::create`] with the real driver on device `ordinal`.
    ///
    /// # Errors
    /// As [`CudaPool::create`].
    pub fn create_default(ordinal: i32, bytes: u64) -> Result<Self> {
        Self::create(RealDriver::shared()?, DeviceSelector::Ordinal(ordinal), bytes)
    }
}

impl<D: Driver> CudaPool<D> {
    /// Creates a pool of at least `bytes` on `device`: checks the device
    /// supports VMM and POSIX file descriptor handles, checks free device
    /// memory (integrated-GPU rule), makes one allocation rounded up to the
    /// granularity, exports it, reserves an address range, maps it and grants
    /// this device read-write access.
    ///
    /// On failure, everything made so far is released in the pool's context.
    ///
    /// # Errors
    /// [`Error::Config`] for zero bytes or an ordinal that does not exist;
    /// [`Error::DeviceNotVisible`] for an unknown UUID;
    /// [`Error::CudaUnavailable`] when the device lacks VMM or POSIX file
    /// descriptor handles; [`Error::OutOfDeviceMemory`] when the pool does
    /// not fit in free device memory; [`Error::Driver`] when a driver call
    /// fails.
    pub fn create(driver: Arc<D>, device: DeviceSelector, bytes: u64) -> Result<Self> {
        if bytes == 0 {
            return Err(Error::Config("a CUDA pool needs at least one byte".into()));
        }
        driver.init()?;
        let (dev, uuid) = resolve_device(&*driver, device)?;
        let mut pool = CudaPool {
            driver,
            device: dev,
            uuid,
            bytes: 0,
            granularity: 0,
            ctx: None,
            mem: VmmMapping::default(),
            fd: None,
            ready: false,
            targets: Vec::new(),
            open: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            next_target: 1,
            commit: None,
            host_regs: Vec::new(),
            commit_graph: CommitGraph::AUTO,
        };
        match pool.build(bytes) {
            Ok(()) => Ok(pool),
            Err(e) => {
                if let Err(ce) = pool.close() {
                    tracing::warn!(error = %ce, "unwinding a CUDA pool that failed to build; drop retries");
                }
                Err(e)
            }
        }
    }

    fn build(&mut self, requested: u64) -> Result<()> {
        let d = Arc::clone(&self.driver);
        let dev = self.device;
        let name = format_uuid(&self.uuid);
        if d.device_attribute(attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev)? == 0 {
            return Err(Error::CudaUnavailable(format!(
                "GPU {name} (ordinal {dev}) does not support virtual memory management (cuMemCreate/cuMemMap), \
                 which the CUDA backend needs; use the host backend"
            )));
        }
        if d.device_attribute(attr::HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev)? == 0 {
            return Err(Error::CudaUnavailable(format!(
                "GPU {name} (ordinal {dev}) cannot export allocations as POSIX file descriptors, \
                 which the CUDA backend needs to share the pool; use the host backend"
            )));
        }
        self.granularity = d.mem_granularity(dev)?;
        self.bytes = round_up(requested, self.granularity)
            .ok_or_else(|| Error::Config(format!("a pool of {requested} bytes is too large")))?;
        let ctx = d.primary_ctx_retain(dev)?;
        self.ctx = Some(ctx);
        // SAFETY: `ctx` is retained by `self` until `close` releases it last.
        let free = unsafe { device_free_bytes(&*d, ctx, dev) }?;
        if self.bytes > free {
            return Err(Error::OutOfDeviceMemory {
                needed: self.bytes,
                free,
            });
        }
        let body = |d: &D| -> Result<_> {
            // The driver hands us a new descriptor; the pool owns it and
            // closes it on `close` (the CUDA docs leave closing to the
            // application). `export_fd` gives each subscriber a dup.
            self.fd = Some(self.mem.create_exported(d, self.bytes, dev)?);
            Ok(())
        };
        // SAFETY: `ctx` is retained (above).
        unsafe { with_context(&*d, ctx, body) }?;
        self.ready = true;
        // Release: a mapper that sees the pool open sees it built.
        self.open.store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// The pool's context (its device's primary context). Push it (or make it
    /// current) to run work on the pool from this process.
    ///
    /// # Errors
    /// [`Error::Closed`] after `close`.
    pub fn context(&self) -> Result<CuContext> {
        self.ctx.filter(|_| self.ready).ok_or(Error::Closed)
    }

    /// Device address of the pool's first byte; 0 after `close`.
    pub fn device_ptr(&self) -> DevicePtr {
        if self.ready {
            self.mem.addr()
        } else {
            0
        }
    }

    /// The device ordinal, in this process.
    pub fn device(&self) -> CuDevice {
        self.device
    }

    /// The allocation granularity the size was rounded to.
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    /// Sets when push commits replay the commit graph instead of launching
    /// the commit kernel. The pool starts with [`CommitGraph::AUTO`]
    /// ([`RingConfig::commit_graph`](crate::RingConfig::commit_graph) sets
    /// it for a publisher's pool). Takes effect when the commit
    /// kernel is loaded, at the first
    /// [`register_commit_memory`](crate::memory::StreamCommits::register_commit_memory).
    pub fn set_commit_graph(&mut self, mode: CommitGraph) {
        self.commit_graph = mode;
    }

    /// The driver.
    pub fn driver(&self) -> &Arc<D> {
        &self.driver
    }

    /// Takes a mapped push target; returns its id.
    fn adopt(&mut self, m: VmmMapping) -> u64 {
        let id = self.next_target;
        self.next_target += 1;
        self.targets.push((id, m));
        id
    }

    /// Unmaps push target `id` in the pool's context; `synchronize` waits
    /// for the whole context first (copies into the target run on writers'
    /// streams of this context, whose other work the wait includes).
    fn drop_target(&mut self, id: u64, synchronize: bool) -> Result<()> {
        let Some(pos) = self.targets.iter().position(|(t, _)| *t == id) else {
            return Ok(());
        };
        let ctx = self.context()?;
        let t = &mut self.targets[pos].1;
        let body = |d: &D| -> Result<()> {
            if synchronize {
                d.ctx_synchronize()?;
            }
            t.release(d)
        };
        // SAFETY: `ctx` is retained while the pool is open.
        unsafe { with_context(&*self.driver, ctx, body) }?;
        self.targets.remove(pos);
        Ok(())
    }

    /// Releases everything, phase by phase, with the pool's context pushed
    /// and the caller's context restored: all work in the context is waited
    /// for, then the mapping is unmapped, the range freed and the allocation
    /// released; the exported descriptor is closed; the primary-context
    /// reference is released last. Each handle is forgotten only once the
    /// driver confirmed its release.
    ///
    /// Idempotent after success; after an error, call it again.
    ///
    /// # Errors
    /// The first driver call that failed; what it failed to release is still
    /// held.
    pub fn close(&mut self) -> Result<()> {
        self.ready = false;
        // Release pairs with the mappers' Acquire: none starts a call on
        // the context from here on.
        self.open.store(false, std::sync::atomic::Ordering::Release);
        let Some(ctx) = self.ctx else {
            self.fd = None;
            return Ok(());
        };
        let d = Arc::clone(&self.driver);
        if self.mem.is_live() || !self.targets.is_empty() || self.commit.is_some() || !self.host_regs.is_empty() {
            let body = |d: &D| -> Result<_> {
                if self.commit.is_some() || !self.host_regs.is_empty() {
                    // Commits enqueued on writers' streams store into the
                    // registered memory and run the kernel: let them land.
                    d.ctx_synchronize()?;
                    while let Some(r) = self.host_regs.last() {
                        // SAFETY: registered by `register_commit_memory`;
                        // the context is synchronised, so no commit uses it.
                        unsafe { d.mem_host_unregister(r.host as *mut std::ffi::c_void) }?;
                        self.host_regs.pop();
                    }
                    if let Some(k) = self.commit.as_mut() {
                        k.release(d)?;
                        self.commit = None;
                    }
                }
                if !self.targets.is_empty() {
                    // Push copies run on writers' streams in this context.
                    d.ctx_synchronize()?;
                    while let Some((_, t)) = self.targets.last_mut() {
                        t.release(d)?;
                        self.targets.pop();
                    }
                }
                if self.mem.is_mapped() {
                    // Writers' streams live in this context: let them
                    // finish before the memory goes away.
                    d.ctx_synchronize()?;
                }
                // The exported descriptor keeps nothing alive in this
                // process once closed; subscribers hold their own dups.
                self.fd = None;
                // Unmap, free the range, release the allocation.
                self.mem.release(d)
            };
            // SAFETY: `ctx` stays retained until the last phase below.
            unsafe { with_context(&*d, ctx, body) }?;
        }
        self.fd = None;
        d.primary_ctx_release(self.device)?;
        self.ctx = None;
        Ok(())
    }
}

impl<D: Driver> ExportedPool for CudaPool<D> {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn pool_bytes(&self) -> u64 {
        self.bytes
    }

    fn device_uuid(&self) -> [u8; 16] {
        self.uuid
    }

    fn export_fd(&self) -> Result<OwnedFd> {
        let fd = self.fd.as_ref().filter(|_| self.ready).ok_or(Error::Closed)?;
        // A dup of the driver's descriptor: the caller owns it and closes it
        // after sending; the pool keeps its own.
        fd.try_clone()
            .ctx(|| "dup of the CUDA pool's exported descriptor".into())
    }

    fn base_addr(&self) -> u64 {
        self.device_ptr()
    }

    fn complete_writes(&self, completion: WriteCompletion) -> Result<()> {
        let ctx = self.context()?;
        let body = |d: &D| -> Result<()> {
            match completion {
                WriteCompletion::CudaStream(s) => {
                    // SAFETY: the stream is the caller's, named by the raw
                    // handle it made; the publisher's contract is that it is
                    // live until `publish` returns.
                    unsafe { d.stream_synchronize(CuStream::from_raw(s)) }?;
                    Ok(())
                }
                // Writes the user says are complete may still be queued on
                // some stream of this context; waiting for the context costs
                // microseconds and cannot hand out a half-written frame.
                WriteCompletion::Host => Ok(d.ctx_synchronize()?),
            }
        };
        // SAFETY: `ctx` is retained while the pool is open (checked above).
        unsafe { with_context(&*self.driver, ctx, body) }
    }

    fn attach_target(&mut self, fd: &OwnedFd, bytes: u64) -> Result<u64> {
        let ctx = self.context()?;
        // SAFETY: `ctx` is retained while the pool is open (checked above).
        let m = unsafe { map_target(&*self.driver, ctx, self.device, fd, bytes) }?;
        Ok(self.adopt(m))
    }

    fn push_copy(
        &mut self,
        id: u64,
        dst_offset: u64,
        src_offset: u64,
        len: u64,
        completion: WriteCompletion,
    ) -> Result<()> {
        let ctx = self.context()?;
        let (_, t) = self.targets.iter().find(|(t, _)| *t == id).ok_or(Error::Closed)?;
        check_range("push buffer", dst_offset, len, t.bytes())?;
        check_range("pool", src_offset, len, self.bytes)?;
        let (dst, src) = (t.addr() + dst_offset, self.device_ptr() + src_offset);
        let stream = completion_stream(completion);
        let body = |d: &D| -> Result<()> {
            // SAFETY: both ranges are inside live mappings of this context
            // (checked above); `stream` is the caller's live stream (or the
            // legacy default stream), which orders the copy after its writes.
            Ok(unsafe { d.memcpy_dtod_async(dst, src, len, stream) }?)
        };
        // SAFETY: `ctx` is retained while the pool is open.
        unsafe { with_context(&*self.driver, ctx, body) }
    }

    fn detach_target(&mut self, id: u64) -> Result<()> {
        self.drop_target(id, true)
    }

    fn release_target(&mut self, id: u64) -> Result<()> {
        self.drop_target(id, false)
    }

    fn close(&mut self) -> Result<()> {
        CudaPool::close(self)
    }

    fn mapped_targets(&mut self) -> Option<&mut dyn MappedTargets> {
        Some(self)
    }

    fn stream_commits(&mut self) -> Option<&mut dyn StreamCommits> {
        Some(self)
    }

    fn gate_line(&mut self) -> Option<&mut dyn GateLine> {
        Some(self)
    }
}

impl<D: Driver> MappedTargets for CudaPool<D> {
    fn target_mapper(&self) -> Option<Arc<dyn TargetMapper>> {
        let ctx = self.context().ok()?;
        Some(Arc::new(CudaMapper {
            driver: Arc::clone(&self.driver),
            ctx,
            device: self.device,
            open: Arc::clone(&self.open),
        }))
    }
    fn adopt_target(&mut self, mut t: MappedTarget) -> Result<u64> {
        self.context()?;
        Ok(self.adopt(std::mem::take(&mut t.vmm)))
    }
    fn disown_target(&mut self, id: u64) -> Option<MappedTarget> {
        let pos = self.targets.iter().position(|(t, _)| *t == id)?;
        let (_, vmm) = self.targets.remove(pos);
        Some(MappedTarget { vmm })
    }
}

impl<D: Driver> StreamCommits for CudaPool<D> {
    unsafe fn register_commit_memory(&mut self, ptr: *mut u8, len: usize) -> Result<bool> {
        let ctx = self.context()?;
        let page = rustix::param::page_size();
        let bytes = len.next_multiple_of(page);
        if ptr.is_null() || len == 0 || (ptr as usize) % page != 0 {
            return Err(Error::Config(format!(
                "commit memory at {ptr:?} ({len} bytes) is not a page-aligned mapping"
            )));
        }
        let load = self.commit.is_none();
        let graph = self.commit_graph;
        let body = |d: &D| -> Result<(Option<CommitKernel>, DevicePtr)> {
            let kernel = if load {
                Some(CommitKernel::load(d, graph)?)
            } else {
                None
            };
            // SAFETY: the range is a mapping of this process that stays
            // mapped until `close` (this method's contract); `bytes` only
            // rounds it up to the end of its last page.
            let registered = unsafe { d.mem_host_register(ptr.cast(), bytes as u64) }.and_then(|()| {
                // SAFETY: just registered.
                unsafe { d.mem_host_device_pointer(ptr.cast()) }.inspect_err(|_| {
                    // SAFETY: registered just above; nothing uses it yet.
                    if let Err(ue) = unsafe { d.mem_host_unregister(ptr.cast()) } {
                        tracing::warn!(error = %ue, "unregistering commit memory after a failed lookup");
                    }
                })
            });
            match registered {
                Ok(dev) => Ok((kernel, dev)),
                Err(e) => {
                    if let Some(mut k) = kernel {
                        if let Err(re) = k.release(d) {
                            tracing::warn!(error = %re, "releasing the commit kernel after a failed registration");
                        }
                    }
                    Err(e.into())
                }
            }
        };
        // SAFETY: `ctx` is retained while the pool is open (checked above).
        let (kernel, dev) = unsafe { with_context(&*self.driver, ctx, body) }?;
        if kernel.is_some() {
            self.commit = kernel;
        }
        self.host_regs.push(HostReg {
            host: ptr as usize,
            len: bytes,
            dev,
        });
        Ok(true)
    }
    unsafe fn enqueue_commit(&mut self, c: &StreamCommit<'_>, completion: WriteCompletion) -> Result<()> {
        let ctx = self.context()?;
        let stream = completion_stream(completion);
        let regs = &self.host_regs;
        let word = |w: &crate::sync::atomic::AtomicU64| -> Result<DevicePtr> {
            let a = w as *const _ as usize;
            regs.iter()
                .find(|r| a >= r.host && a + 8 <= r.host + r.len)
                .map(|r| r.dev + (a - r.host) as u64)
                .ok_or_else(|| Error::LayoutMismatch(format!("commit word at {a:#x} is outside registered memory")))
        };
        check_range("pool", c.src_offset, c.len, self.bytes)?;
        let src = self.device_ptr() + c.src_offset;
        let mut dsts = Vec::with_capacity(c.targets.len());
        for t in c.targets {
            let (_, m) = self.targets.iter().find(|(id, _)| *id == t.id).ok_or(Error::Closed)?;
            check_range("push buffer", t.dst_offset, c.len, m.bytes())?;
            dsts.push((m.addr() + t.dst_offset, word(t.push_seq)?));
        }
        let (slot_seq, global_seq) = (word(c.slot_seq)?, word(c.global_seq)?);
        let gate = match c.gate {
            Some(off) => {
                check_range("pool", off, 8, self.bytes)?;
                self.device_ptr() + off
            }
            None => 0,
        };
        // The kernel moves 16-byte vectors; a frame of another size (none
        // of the crate's formats makes one) is copied by the copy engine
        // first and the kernel only commits.
        let by_kernel = c.len % 16 == 0 && src % 16 == 0 && dsts.iter().all(|(a, _)| a % 16 == 0);
        // With no push target there is nothing to copy: one block only
        // stores the seqs (it would otherwise read the whole slot for
        // nothing).
        let vecs = if by_kernel && !dsts.is_empty() { c.len / 16 } else { 0 };
        // One launch per MAX_FANOUT targets, and one with none.
        let launches = dsts.len().div_ceil(MAX_FANOUT).max(1);
        // With no push target and a gate line, nothing is copied: the
        // commit is its three stores, in the kernel's order, as one batched
        // stream memory operation instead of a launch (ADR 0013). A gate
        // line exists only where 64-bit stream memory operations do (checked
        // when it was enabled).
        let stores_only = dsts.is_empty() && gate != 0;
        let kernel = self.commit.as_mut().ok_or(Error::WrongBackend {
            what: "a stream-order commit before commit memory was registered",
            backend: "cuda",
        })?;
        let body = |d: &D| -> Result<()> {
            tracing::trace!(target: "vramring::publish", "context current");
            if stores_only {
                let writes = [(gate, c.seq), (slot_seq, c.seq), (global_seq, c.seq)];
                // SAFETY: the gate lies in the pool's live mapping (checked
                // above) and the seq words in registered memory that stays
                // mapped until `close`, which synchronises first; the stream
                // is the writer's.
                unsafe { d.stream_write_values64(stream, &writes) }?;
                tracing::trace!(target: "vramring::publish", "stores enqueued");
                return Ok(());
            }
            if !by_kernel {
                for &(dst, _) in &dsts {
                    // SAFETY: both ranges were checked against live
                    // mappings of this context; the stream is the writer's.
                    unsafe { d.memcpy_dtod_async(dst, src, c.len, stream) }?;
                }
            }
            let mut last = Enqueued::Launched;
            for i in 0..launches {
                let chunk = &dsts[(i * MAX_FANOUT).min(dsts.len())..((i + 1) * MAX_FANOUT).min(dsts.len())];
                let mut desc = CommitDesc {
                    src,
                    vecs,
                    count: chunk.len() as u64,
                    seq: c.seq,
                    ..CommitDesc::default()
                };
                for (j, &(dst, ps)) in chunk.iter().enumerate() {
                    desc.dst[j] = dst;
                    desc.push_seq[j] = ps;
                }
                if i == launches - 1 {
                    desc.slot_seq = slot_seq;
                    desc.global_seq = global_seq;
                    desc.gate = gate;
                }
                // SAFETY: source and targets were range-checked against
                // live mappings of this context and are 16-byte aligned
                // when `vecs > 0`; the seq words lie in registered memory
                // that stays mapped until `close`, which synchronises
                // first (this method's contract).
                last = unsafe { kernel.launch(d, stream, desc, c.global_seq) }?;
            }
            match last {
                Enqueued::Launched => tracing::trace!(target: "vramring::publish", "kernel launched"),
                Enqueued::Replayed => tracing::trace!(target: "vramring::publish", "graph replayed"),
            }
            Ok(())
        };
        // SAFETY: `ctx` is retained while the pool is open.
        unsafe { with_context(&*self.driver, ctx, body) }
    }
}

impl<D: Driver> GateLine for CudaPool<D> {
    fn enable_gate_line(&mut self, offset: u64) -> Result<bool> {
        let ctx = self.context()?;
        check_range("pool", offset, GATE_BYTES, self.bytes)?;
        if offset % 8 != 0 {
            return Err(Error::Config(format!(
                "gate line at pool offset {offset} is not 8-byte aligned"
            )));
        }
        let (d, dev) = (Arc::clone(&self.driver), self.device);
        if d.device_attribute(attr::CAN_USE_64_BIT_STREAM_MEM_OPS, dev)? != 1 {
            return Ok(false);
        }
        let at = self.device_ptr() + offset;
        let body = |d: &D| -> Result<()> {
            // SAFETY: `GATE_BYTES` at `at` lie in the pool's live mapping
            // (checked above); nothing reads them yet.
            Ok(unsafe { d.memset_d8(at, 0, GATE_BYTES) }?)
        };
        // SAFETY: `ctx` is retained while the pool is open (checked above).
        unsafe { with_context(&*self.driver, ctx, body) }?;
        Ok(true)
    }
    fn write_gate(&mut self, offset: u64, seq: u64, completion: WriteCompletion) -> Result<()> {
        let ctx = self.context()?;
        check_range("pool", offset, 8, self.bytes)?;
        let at = self.device_ptr() + offset;
        let stream = completion_stream(completion);
        let body = |d: &D| -> Result<()> {
            // SAFETY: 8 bytes at `at` lie in the pool's live mapping (checked
            // above), which `close` unmaps only after synchronising; the
            // stream is the caller's live stream or the legacy default one.
            Ok(unsafe { d.stream_write_value64(stream, at, seq) }?)
        };
        // SAFETY: `ctx` is retained while the pool is open (checked above).
        unsafe { with_context(&*self.driver, ctx, body) }
    }
}

impl<D: Driver> Drop for CudaPool<D> {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, pool = ?self, "CUDA pool dropped without a successful close; resources leak");
        }
    }
}
