//! [`CudaPool`]: the publisher's slot pool, one VMM allocation exported as a
//! POSIX file descriptor.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::context::with_context;
use super::driver::{attr, Access, CuContext, CuDevice, CuStream, DevicePtr, Driver};
use super::mapping::VmmMapping;
use super::real::RealDriver;
use super::{device_free_bytes, format_uuid, resolve_device, round_up, DeviceSelector};
use crate::error::{Error, IoContext, Result};
use crate::memory::{check_range, BackendKind, ExportedPool, WriteCompletion};

/// The publisher's pool: one `cuMemCreate` of the whole pool (rounded up to
/// the allocation granularity once), mapped read-write into this process and
/// exportable as a file descriptor per subscriber.
///
/// Holds a reference to its device's primary context, which is the context
/// the allocation, its mapping and reservation belong to; every release runs
/// with it pushed. See the [module docs](super) for teardown.
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
    next_target: u64,
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
            next_target: 1,
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

    /// The driver.
    pub fn driver(&self) -> &Arc<D> {
        &self.driver
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
        let Some(ctx) = self.ctx else {
            self.fd = None;
            return Ok(());
        };
        let d = Arc::clone(&self.driver);
        if self.mem.is_live() || !self.targets.is_empty() {
            let body = |d: &D| -> Result<_> {
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
        let dev = self.device;
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
        // SAFETY: `ctx` is retained while the pool is open (checked above).
        unsafe { with_context(&*self.driver, ctx, body) }?;
        let id = self.next_target;
        self.next_target += 1;
        self.targets.push((id, m));
        Ok(id)
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
        let stream = match completion {
            WriteCompletion::CudaStream(s) => CuStream::from_raw(s),
            WriteCompletion::Host => CuStream::from_raw(std::ptr::null_mut()),
        };
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
        let Some(pos) = self.targets.iter().position(|(t, _)| *t == id) else {
            return Ok(());
        };
        let ctx = self.context()?;
        let t = &mut self.targets[pos].1;
        let body = |d: &D| -> Result<()> {
            // Copies into the target run on writers' streams of this context.
            d.ctx_synchronize()?;
            t.release(d)
        };
        // SAFETY: `ctx` is retained while the pool is open.
        unsafe { with_context(&*self.driver, ctx, body) }?;
        self.targets.remove(pos);
        Ok(())
    }

    fn close(&mut self) -> Result<()> {
        CudaPool::close(self)
    }
}

impl<D: Driver> Drop for CudaPool<D> {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, pool = ?self, "CUDA pool dropped without a successful close; resources leak");
        }
    }
}
