//! [`CudaImport`]: a subscriber's mapping of the publisher's pool, with its
//! own stream and its own device buffer that frames are copied into.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::context::with_context;
use super::driver::{attr, Access, CuContext, CuDevice, CuStream, DevicePtr, Driver};
use super::mapping::VmmMapping;
use super::real::RealDriver;
use super::{find_device_by_uuid, format_uuid, round_up};
use crate::error::{Error, Result};
use crate::memory::{check_range, BackendKind, ImportedPool, OwnBuffer, QueuedCopies};
use crate::shm::Region;

/// The subscriber's own buffer grows in steps of this many bytes.
const DEST_STEP: u64 = 2 << 20;

/// A subscriber's import of a [`CudaPool`](super::CudaPool): the pool FD
/// imported once, mapped read-only (unless write access was granted) on the
/// GPU with the publisher's UUID, a non-blocking stream of its own, and its
/// own device buffer (`cuMemAlloc`, grown as needed) that
/// [`copy_out`](ImportedPool::copy_out) copies a slot into.
///
/// Holds a reference to the device's primary context, which owns the
/// mapping, stream and buffer. See `memory/cuda/mod.rs` for teardown.
pub struct CudaImport<D: Driver = RealDriver> {
    driver: Arc<D>,
    device: CuDevice,
    uuid: [u8; 16],
    bytes: u64,
    writable: bool,
    ctx: Option<CuContext>,
    /// The imported pool, its reserved range and its mapping.
    mem: VmmMapping,
    stream: Option<CuStream>,
    dest: Option<DevicePtr>,
    dest_cap: u64,
    ready: bool,
    /// Push delivery: this subscriber's own buffers, exported to the publisher.
    push: VmmMapping,
    push_stride: u64,
    /// Queued pull: the word copies wait on. ADR 0011: the gate word at
    /// the end of the pool, in device memory; or, where the ring has none,
    /// ADR 0010: `global_seq` in the ring's control region, mapped again
    /// read-only by this import and registered for the device.
    gate: Option<Gate>,
    /// Copies given up on behind a gate that had not opened: each one's
    /// stream and the buffer it writes. See [`QueuedCopies::abandon_copies`].
    stuck: Vec<(CuStream, Option<DevicePtr>)>,
}

/// The word a queued copy waits for: in this import's mapping of the pool
/// (`region` is `None`), or in its own registered mapping of the
/// publisher's control region.
#[derive(Debug)]
struct Gate {
    region: Option<Region>,
    word: DevicePtr,
}

impl<D: Driver> std::fmt::Debug for CudaImport<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaImport")
            .field("device", &self.device)
            .field("uuid", &format_uuid(&self.uuid))
            .field("bytes", &self.bytes)
            .field("writable", &self.writable)
            .field("base", &self.mem.addr())
            .field("open", &self.ctx.is_some())
            .finish()
    }
}

impl CudaImport<RealDriver> {
    /// [`CudaImport::import`] with the real driver.
    ///
    /// # Errors
    /// As [`CudaImport::import`].
    pub fn import_default(fd: OwnedFd, bytes: u64, device_uuid: [u8; 16], writable: bool) -> Result<Self> {
        Self::import(RealDriver::shared()?, fd, bytes, device_uuid, writable)
    }
}

impl<D: Driver> CudaImport<D> {
    /// Imports the pool `fd` of `bytes` bytes (the publisher's
    /// `pool_bytes`), which lives on the GPU with UUID `device_uuid`, and maps
    /// it read-only, or read-write when `writable`.
    ///
    /// `fd` is closed when this returns: the driver does not take ownership
    /// of an imported descriptor, and the imported handle keeps the memory
    /// alive without it.
    ///
    /// On failure, everything made so far is released in the import's
    /// context.
    ///
    /// # Errors
    /// [`Error::DeviceNotVisible`] when no GPU here has that UUID;
    /// [`Error::LayoutMismatch`] when `bytes` is not a whole number of
    /// allocation granules; [`Error::Driver`] when a driver call fails (for
    /// instance an FD that is not a CUDA allocation).
    pub fn import(driver: Arc<D>, fd: OwnedFd, bytes: u64, device_uuid: [u8; 16], writable: bool) -> Result<Self> {
        let imp = Self::open(driver, Some(&fd), bytes, device_uuid, writable);
        // The driver did not take `fd` (CUDA docs: import does not take
        // ownership of the descriptor); we own it and close it now.
        drop(fd);
        imp
    }

    /// A push-only subscriber's side: the context and stream on the GPU
    /// with UUID `device_uuid`, with no pool imported (a push subscriber
    /// never receives it); [`ImportedPool::alloc_push`] then makes the
    /// buffers the publisher copies into. Pulling from it fails.
    ///
    /// # Errors
    /// As [`CudaImport::import`].
    pub fn push_only(driver: Arc<D>, device_uuid: [u8; 16]) -> Result<Self> {
        Self::open(driver, None, 0, device_uuid, false)
    }

    fn open(driver: Arc<D>, fd: Option<&OwnedFd>, bytes: u64, device_uuid: [u8; 16], writable: bool) -> Result<Self> {
        driver.init()?;
        let dev = find_device_by_uuid(&*driver, &device_uuid)?;
        let mut imp = CudaImport {
            driver,
            device: dev,
            uuid: device_uuid,
            bytes,
            writable,
            ctx: None,
            mem: VmmMapping::default(),
            stream: None,
            dest: None,
            dest_cap: 0,
            ready: false,
            push: VmmMapping::default(),
            push_stride: 0,
            gate: None,
            stuck: Vec::new(),
        };
        match imp.build(fd) {
            Ok(()) => Ok(imp),
            Err(e) => {
                if let Err(ce) = imp.close() {
                    tracing::warn!(error = %ce, "unwinding a CUDA import that failed to build; drop retries");
                }
                Err(e)
            }
        }
    }

    fn build(&mut self, fd: Option<&OwnedFd>) -> Result<()> {
        let d = Arc::clone(&self.driver);
        let dev = self.device;
        let ctx = d.primary_ctx_retain(dev)?;
        self.ctx = Some(ctx);
        let access = if self.writable { Access::ReadWrite } else { Access::Read };
        let body = |d: &D| -> Result<_> {
            // Checks `bytes` is whole granules, imports, reserves, maps and
            // sets `access` for this device.
            if let Some(fd) = fd {
                self.mem.import(d, fd, self.bytes, dev, access)?;
            }
            self.stream = Some(d.stream_create_non_blocking()?);
            Ok(())
        };
        // SAFETY: `ctx` is retained by `self` until `close` releases it last.
        unsafe { with_context(&*d, ctx, body) }?;
        self.ready = true;
        Ok(())
    }

    fn open_ctx(&self) -> Result<CuContext> {
        self.ctx.filter(|_| self.ready).ok_or(Error::Closed)
    }

    /// The import's context (its device's primary context).
    ///
    /// # Errors
    /// [`Error::Closed`] after `close`.
    pub fn context(&self) -> Result<CuContext> {
        self.open_ctx()
    }

    /// The import's own non-blocking stream, which copies run on.
    ///
    /// # Errors
    /// [`Error::Closed`] after `close`.
    pub fn stream(&self) -> Result<CuStream> {
        self.stream.filter(|_| self.ready).ok_or(Error::Closed)
    }

    /// The device ordinal, in this process, of the publisher's GPU.
    pub fn device(&self) -> CuDevice {
        self.device
    }

    /// The driver.
    pub fn driver(&self) -> &Arc<D> {
        &self.driver
    }

    /// Whether device attribute `a` reads 1.
    fn able(&self, a: u32) -> bool {
        self.driver
            .device_attribute(a, self.device)
            .map(|v| v == 1)
            .unwrap_or(false)
    }

    /// Whether copies may wait on the GPU here: 64-bit stream memory
    /// operations, and MPS when `only_mps`.
    fn can_wait(&self, only_mps: bool) -> bool {
        (!only_mps || self.able(attr::MPS_ENABLED)) && self.able(attr::CAN_USE_64_BIT_STREAM_MEM_OPS)
    }

    /// Device address of the word queued copies wait on (ADR 0010 / 0011),
    /// once [`QueuedCopies::enable_gate`] or
    /// [`QueuedCopies::enable_pool_gate`] succeeded.
    pub fn gate_word(&self) -> Option<DevicePtr> {
        self.gate.as_ref().map(|g| g.word)
    }

    /// Bytes the subscriber's own buffer holds now.
    pub fn dest_capacity(&self) -> u64 {
        self.dest_cap
    }

    /// Releases everything, phase by phase, with the import's context pushed
    /// and the caller's context restored: the stream is synchronised and
    /// destroyed; the mapping unmapped, the range freed, the imported handle
    /// released; the own buffer freed; the primary-context reference
    /// released last. Each handle is forgotten only once the driver
    /// confirmed its release.
    ///
    /// Idempotent after success; after an error, call it again.
    ///
    /// # Errors
    /// The first driver call that failed; what it failed to release is still
    /// held.
    pub fn close(&mut self) -> Result<()> {
        self.ready = false;
        let Some(ctx) = self.ctx else { return Ok(()) };
        let d = Arc::clone(&self.driver);
        self.reap_stuck()?;
        // A queued copy that still waits for a commit that never landed (its
        // publisher died with the frame in flight) reads the registered
        // control region and the pool and writes its buffer, whenever the
        // word comes; releasing any of them, or the context (whose
        // destruction waits for the stream), could fault or hang. So they
        // stay, until this process exits (ADR 0010); our copy stream, our
        // own buffer and the push buffers go as usual.
        let stuck = !self.stuck.is_empty();
        if stuck {
            tracing::warn!(
                stuck = self.stuck.len(),
                "a queued copy waits for a commit that never landed; its pool mapping, control-region registration and CUDA context stay until this process exits"
            );
        }
        if self.stream.is_some()
            || self.push.is_live()
            || self.mem.is_live()
            || self.dest.is_some()
            || self.gate.is_some()
        {
            let body = |d: &D| -> Result<_> {
                if let Some(s) = self.stream {
                    // SAFETY: our live stream (never one of the stuck ones).
                    unsafe { d.stream_synchronize(s) }?;
                    // SAFETY: our live stream, now idle.
                    unsafe { d.stream_destroy(s) }?;
                    self.stream = None;
                }
                if self.push.is_live() {
                    // The publisher writes these buffers from its context;
                    // our mapping goes, the memory lives on until the
                    // publisher drops its import too. No stuck copy reads
                    // them.
                    self.push.release(d)?;
                }
                if !stuck {
                    if let Some(r) = self.gate.as_ref().and_then(|g| g.region.as_ref()) {
                        // SAFETY: registered by `enable_gate`; no wait on it
                        // is pending (the stream is gone, nothing is stuck).
                        unsafe { d.mem_host_unregister(r.as_ptr().cast()) }?;
                    }
                    // Unmapped when dropped (a pool gate goes with the pool).
                    self.gate = None;
                    // Unmap, free the range, release the imported handle: no
                    // copy reads the pool any more (the stream is gone).
                    self.mem.release(d)?;
                }
                if let Some(p) = self.dest {
                    // SAFETY: our `cuMemAlloc` buffer; no copy writes it
                    // any more (its stream is gone; a stuck copy writes the
                    // buffer set aside with it).
                    unsafe { d.mem_free(p) }?;
                    self.dest = None;
                    self.dest_cap = 0;
                }
                Ok(())
            };
            // SAFETY: `ctx` stays retained until the last phase below (or
            // for good, with a stuck copy).
            unsafe { with_context(&*d, ctx, body) }?;
        }
        if stuck {
            // Dropping the record releases nothing: the pool stays mapped.
            self.mem = VmmMapping::default();
            // The registration stays, and so must the pages it pins.
            std::mem::forget(self.gate.take());
            self.stuck.clear();
            self.ctx = None;
            return Ok(());
        }
        d.primary_ctx_release(self.device)?;
        self.ctx = None;
        Ok(())
    }

    /// Enqueues a copy of `len` bytes at `src_offset` into our own buffer
    /// (grown as needed) on our stream; with `gate`, behind a GPU wait
    /// until the control region's `global_seq` is at least that seq.
    fn enqueue_copy(&mut self, src_offset: u64, len: u64, gate: Option<u64>) -> Result<()> {
        let ctx = self.open_ctx()?;
        let (va, Some(stream)) = (self.mem.addr(), self.stream) else {
            return Err(Error::Closed);
        };
        if va == 0 {
            return Err(Error::Closed);
        }
        check_range("pool", src_offset, len, self.bytes)?;
        let word = match gate {
            Some(seq) => Some((
                self.gate
                    .as_ref()
                    .ok_or(Error::WrongBackend {
                        what: "a queued copy without a gate",
                        backend: "cuda",
                    })?
                    .word,
                seq,
            )),
            None => None,
        };
        self.reap_stuck()?;
        let d = Arc::clone(&self.driver);
        let body = |d: &D| -> Result<_> {
            if self.dest_cap < len {
                if let Some(old) = self.dest {
                    // SAFETY: our stream; wait for copies into the old buffer.
                    unsafe { d.stream_synchronize(stream) }?;
                    // SAFETY: our buffer, idle now.
                    unsafe { d.mem_free(old) }?;
                    self.dest = None;
                    self.dest_cap = 0;
                }
                let cap = round_up(len.max(1), DEST_STEP).ok_or(Error::TooLarge {
                    len: len as usize,
                    max: usize::MAX,
                })?;
                self.dest = Some(d.mem_alloc(cap)?);
                self.dest_cap = cap;
            }
            let dest = self.dest.ok_or(Error::Closed)?;
            if let Some((word, seq)) = word {
                // SAFETY: our live stream; `word` lies in our registered
                // mapping of the control region, which stays registered
                // while a wait may be pending (`close` and
                // `abandon_copies`).
                unsafe { d.stream_wait_value_geq(stream, word, seq) }?;
            }
            // SAFETY: the source lies inside our mapping (checked above),
            // the destination inside our buffer of `dest_cap >= len`
            // bytes; both stay alive until `close`, which synchronises
            // the stream first (or keeps them, for a stuck copy).
            unsafe { d.memcpy_dtod_async(dest, va + src_offset, len, stream) }?;
            Ok(())
        };
        // SAFETY: `ctx` is retained while the import is open (checked above).
        let done = unsafe { with_context(&*d, ctx, body) };
        if done.is_err() && word.is_some() {
            // A wait may be enqueued with nothing behind it: never let
            // `close` synchronise a stream that may block for good.
            if let Err(ae) = QueuedCopies::abandon_copies(self) {
                tracing::warn!(error = %ae, "setting aside a stream after a failed queued copy");
            }
        }
        done
    }

    /// Releases the abandoned copies that have completed since (their word
    /// came after all: a live publisher that was only slow).
    fn reap_stuck(&mut self) -> Result<()> {
        let Some(ctx) = self.ctx else { return Ok(()) };
        if self.stuck.is_empty() {
            return Ok(());
        }
        let d = Arc::clone(&self.driver);
        let body = |d: &D| -> Result<()> {
            let mut k = 0;
            while k < self.stuck.len() {
                let (s, buf) = self.stuck[k];
                // SAFETY: a stream of ours, set aside but not destroyed.
                if unsafe { d.stream_query(s) }? {
                    // SAFETY: idle now; nothing else uses it.
                    unsafe { d.stream_destroy(s) }?;
                    if let Some(p) = buf {
                        // SAFETY: the buffer only that stream wrote.
                        unsafe { d.mem_free(p) }?;
                    }
                    self.stuck.swap_remove(k);
                } else {
                    k += 1;
                }
            }
            Ok(())
        };
        // SAFETY: `ctx` is retained while set (checked above).
        unsafe { with_context(&*d, ctx, body) }
    }
}

impl<D: Driver> ImportedPool for CudaImport<D> {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn base_addr(&self) -> u64 {
        if self.ready {
            self.mem.addr()
        } else {
            0
        }
    }

    fn pool_bytes(&self) -> u64 {
        self.bytes
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn copy_out(&mut self, src_offset: u64, len: u64) -> Result<()> {
        self.enqueue_copy(src_offset, len, None)
    }

    fn gate_enabled(&self) -> bool {
        self.gate.is_some()
    }

    fn complete(&mut self) -> Result<()> {
        let ctx = self.open_ctx()?;
        let stream = self.stream.ok_or(Error::Closed)?;
        let body = |d: &D| -> Result<()> {
            // SAFETY: our stream, live while open (checked above).
            Ok(unsafe { d.stream_synchronize(stream) }?)
        };
        // SAFETY: `ctx` is retained while open (checked above).
        unsafe { with_context(&*self.driver, ctx, body) }
    }

    fn dest_addr(&self) -> u64 {
        self.dest.unwrap_or(0)
    }

    fn dest_host(&self) -> Option<&[u8]> {
        None
    }

    fn alloc_push(&mut self, count: u32, stride: u64) -> Result<(OwnedFd, u64)> {
        let ctx = self.open_ctx()?;
        if self.push.is_live() {
            return Err(Error::Config("push buffers are already allocated".into()));
        }
        let bytes = stride
            .checked_mul(u64::from(count))
            .filter(|&b| b > 0)
            .ok_or_else(|| Error::Config(format!("{count} push buffers of {stride} bytes")))?;
        let dev = self.device;
        let mut fd = None;
        let body = |d: &D| -> Result<()> {
            match self.push.create_exported(d, bytes, dev) {
                Ok(f) => {
                    fd = Some(f);
                    Ok(())
                }
                Err(e) => {
                    if let Err(re) = self.push.release(d) {
                        tracing::warn!(error = %re, "releasing half-made push buffers");
                    }
                    Err(e)
                }
            }
        };
        // SAFETY: `ctx` is retained while open (checked above).
        unsafe { with_context(&*self.driver, ctx, body) }?;
        self.push_stride = stride;
        // The exported descriptor is the caller's to send and close.
        Ok((fd.ok_or(Error::Closed)?, self.push.bytes()))
    }

    fn push_addr(&self, k: usize) -> u64 {
        match self.push.addr() {
            0 => 0,
            base => base + k as u64 * self.push_stride,
        }
    }

    fn push_host(&self, _k: usize, _len: usize) -> Option<&[u8]> {
        None
    }

    fn read_own(&self, buf: OwnBuffer, dst: &mut [u8]) -> Result<()> {
        let ctx = self.open_ctx()?;
        let len = dst.len() as u64;
        let src = match buf {
            OwnBuffer::Dest => {
                check_range("subscriber's own buffer", 0, len, self.dest_cap)?;
                self.dest.ok_or(Error::Closed)?
            }
            OwnBuffer::Push(k) => {
                let off = (k as u64).saturating_mul(self.push_stride);
                check_range("push buffer", 0, len, self.push_stride)?;
                check_range("push buffers", off, self.push_stride, self.push.bytes())?;
                match self.push.addr() {
                    0 => return Err(Error::Closed),
                    base => base + off,
                }
            }
        };
        if len == 0 {
            return Ok(());
        }
        let body = |d: &D| -> Result<()> {
            // SAFETY: `src..src + len` lies inside one of our own live
            // allocations (checked above), in `ctx`; `dst` is a host buffer
            // of exactly `len` bytes.
            Ok(unsafe { d.memcpy_dtoh(dst, src) }?)
        };
        // SAFETY: `ctx` is retained while the import is open (checked above).
        unsafe { with_context(&*self.driver, ctx, body) }
    }

    fn close(&mut self) -> Result<()> {
        CudaImport::close(self)
    }

    fn queued(&mut self) -> Option<&mut dyn QueuedCopies> {
        Some(self)
    }
}

impl<D: Driver> QueuedCopies for CudaImport<D> {
    fn enable_gate(
        &mut self,
        control: BorrowedFd<'_>,
        control_bytes: u64,
        word_offset: u64,
        only_mps: bool,
    ) -> Result<bool> {
        let ctx = self.open_ctx()?;
        if self.gate.is_some() {
            return Ok(true);
        }
        if !self.mem.is_live() {
            return Ok(false);
        }
        let d = Arc::clone(&self.driver);
        if !self.can_wait(only_mps) || !self.able(attr::READ_ONLY_HOST_REGISTER_SUPPORTED) {
            return Ok(false);
        }
        check_range("control region", word_offset, 8, control_bytes)?;
        if word_offset % 8 != 0 {
            return Err(Error::LayoutMismatch(format!(
                "gate word at {word_offset} is not 8-byte aligned"
            )));
        }
        let region = match Region::map(control, control_bytes, false) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "queued pull unavailable: mapping the control region again failed");
                return Ok(false);
            }
        };
        let base = region.as_ptr();
        let mut gate = Gate {
            region: Some(region),
            word: 0,
        };
        let mut registered = false;
        let body = |d: &D| -> Result<()> {
            // SAFETY: `base` starts our own read-only mapping of
            // `control_bytes` bytes (`gate.region`); it stays mapped until it is
            // unregistered (`close`) or, if a wait on it is stuck, forever.
            unsafe { d.mem_host_register_read_only(base.cast_const().cast(), control_bytes) }?;
            registered = true;
            // SAFETY: `base` was registered just above.
            let dev_base = unsafe { d.mem_host_device_pointer(base.cast()) }?;
            gate.word = dev_base + word_offset;
            Ok(())
        };
        // SAFETY: `ctx` is retained while open (checked above).
        let made = unsafe { with_context(&*d, ctx, body) };
        match made {
            Ok(()) => {
                self.gate = Some(gate);
                Ok(true)
            }
            Err(e) => {
                if registered {
                    let undo = |d: &D| -> Result<()> {
                        // SAFETY: registered above; nothing waits on it.
                        Ok(unsafe { d.mem_host_unregister(base.cast()) }?)
                    };
                    // SAFETY: as above.
                    if let Err(ue) = unsafe { with_context(&*d, ctx, undo) } {
                        tracing::warn!(error = %ue, "unregistering the control region after a failed gate setup");
                        // Keep the pages mapped: the registration may still pin them.
                        std::mem::forget(gate);
                    }
                }
                tracing::debug!(error = %e, "queued pull unavailable; copies start after the commit");
                Ok(false)
            }
        }
    }
    fn enable_pool_gate(&mut self, offset: u64, only_mps: bool) -> Result<bool> {
        self.open_ctx()?;
        if self.gate.is_some() {
            return Ok(true);
        }
        if !self.mem.is_live() || !self.can_wait(only_mps) {
            return Ok(false);
        }
        check_range("pool", offset, 8, self.bytes)?;
        if offset % 8 != 0 {
            return Err(Error::LayoutMismatch(format!(
                "gate word at pool offset {offset} is not 8-byte aligned"
            )));
        }
        self.gate = Some(Gate {
            region: None,
            word: self.mem.addr() + offset,
        });
        Ok(true)
    }
    fn copy_out_gated(&mut self, seq: u64, src_offset: u64, len: u64) -> Result<()> {
        self.enqueue_copy(src_offset, len, Some(seq))
    }
    fn poll_complete(&mut self) -> Result<bool> {
        let ctx = self.open_ctx()?;
        let stream = self.stream.ok_or(Error::Closed)?;
        let body = |d: &D| -> Result<bool> {
            // SAFETY: our stream, live while open (checked above).
            Ok(unsafe { d.stream_query(stream) }?)
        };
        // SAFETY: `ctx` is retained while open (checked above).
        unsafe { with_context(&*self.driver, ctx, body) }
    }
    fn abandon_copies(&mut self) -> Result<()> {
        let ctx = self.open_ctx()?;
        let old = self.stream.take().ok_or(Error::Closed)?;
        // The old stream and the buffer its copy writes are set aside first
        // (the copy may still run, whenever its word comes), so that even
        // if no fresh stream can be made, nothing ever synchronises it.
        self.stuck.push((old, self.dest.take()));
        self.dest_cap = 0;
        let body = |d: &D| -> Result<CuStream> { Ok(d.stream_create_non_blocking()?) };
        // SAFETY: `ctx` is retained while open (checked above).
        let fresh = unsafe { with_context(&*self.driver, ctx, body) }?;
        self.stream = Some(fresh);
        Ok(())
    }
}

impl<D: Driver> Drop for CudaImport<D> {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, import = ?self, "CUDA import dropped without a successful close; resources leak");
        }
    }
}
