//! Memory the Python objects own: a CUDA device context ([`Cuda`]) and
//! pools of per-frame buffers ([`BufPool`], [`Buf`]).
//!
//! Every `Frame` handed to Python owns one [`Buf`] through an `Arc`; every
//! DLPack capsule made from the frame holds another clone of that `Arc`, so a
//! tensor keeps the bytes it views alive, and the subscriber never writes a
//! buffer while any clone lives: `next()` copies into a buffer taken from
//! the pool's free list (or a fresh allocation), and a buffer goes back to
//! the free list only when its last `Arc` drops. The one exception is a
//! subscriber that caches tensors (`Subscriber(tensors=)`): its buffers stay
//! shared with their cached tensors, and `cache` proves one unreferenced
//! before it is written again.
//!
//! On the GPU, a tensor's last Python reference can go while work reading
//! it is still queued on the consumer's stream (`del t` right after
//! launching a kernel on it). Each export notes the consumer's stream (the
//! DLPack `stream` argument, [`Consumers`]); when the memory's last
//! reference goes, an event is recorded on each noted stream that is not
//! idle ([`Cuda::fence`]), and whoever writes the memory next waits for
//! those events first: our copy stream (GPU-side, [`Cuda::wait_on_stream`])
//! before reusing a pool buffer, the host ([`Cuda::sync_events`]) before a
//! push buffer is let go to the publisher or memory is freed.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys as cu;
use vramring::seam::cuda::{self as vc, ContextGuard, CuContext, CuDevice, CuStream, DevicePtr, Driver, RealDriver};
use vramring::{Error, Result};

/// The primary context of one GPU, retained, and a non-blocking stream of
/// ours in it. The ring's memory (publisher pool, subscriber import) lives
/// in the same primary context, so its addresses are valid here, and so are
/// torch's (torch uses the primary context too).
pub struct Cuda {
    driver: Arc<RealDriver>,
    device: CuDevice,
    /// The device's ordinal in this process (DLPack's `device_id`).
    pub ordinal: i32,
    ctx: CuContext,
    stream: CuStream,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda").field("ordinal", &self.ordinal).finish()
    }
}

fn check(call: &'static str, r: cu::CUresult) -> Result<()> {
    let code = r as u32;
    if code == vc::code::SUCCESS {
        Ok(())
    } else {
        Err(Error::Driver {
            call,
            code,
            name: vc::error_name(code).to_string(),
        })
    }
}

/// Whether `stream` has nothing queued that could still read memory: then
/// no event is needed, and none is queued (no GPU work of this context
/// that would make the GPU switch to it between the publisher's frames).
/// A stream being captured into a graph is never queried (the query
/// would end the capture): it gets its event as before, and so does any
/// stream the driver answers about with anything but "idle".
fn idle(stream: cu::CUstream) -> bool {
    let mut status = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    // SAFETY: the consumer's handle or a sentinel the driver defines (a bad
    // handle is an error it reports); `status` is an out-parameter.
    let captured = unsafe { cu::cuStreamIsCapturing(stream, &mut status) };
    if captured as u32 != vc::code::SUCCESS || status != cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return false;
    }
    // Relaxed capture mode for the query: in the default (global) mode a
    // query made while another thread captures a graph would end that
    // capture.
    let mut mode = cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: an in-out parameter the driver reads and fills.
    if unsafe { cu::cuThreadExchangeStreamCaptureMode(&mut mode) } as u32 != vc::code::SUCCESS {
        return false;
    }
    // SAFETY: as above; a stream not being captured may be queried.
    let r = unsafe { cu::cuStreamQuery(stream) };
    // SAFETY: as above: puts this thread's own mode back.
    unsafe { cu::cuThreadExchangeStreamCaptureMode(&mut mode) };
    r as u32 == vc::code::SUCCESS
}

/// A CUDA event recorded on a consumer's stream when the memory it read lost
/// its last Python reference: it completes when all the work queued on that
/// stream by then is done.
#[derive(Debug)]
pub struct Event(cu::CUevent);

// SAFETY: a driver handle; the driver lets any thread use it (every use here
// has the owning context current).
unsafe impl Send for Event {}

/// The consumer streams exported tensors were promised to be used on (raw
/// `CUstream` values: 1 is the legacy default stream, 2 the per-thread one).
#[derive(Debug, Default)]
pub struct Consumers(Mutex<Vec<usize>>);

impl Consumers {
    /// Notes `stream` (once).
    pub fn note(&self, stream: usize) {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if !v.contains(&stream) {
            v.push(stream);
        }
    }

    /// Whether no stream is noted.
    pub fn is_empty(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// The noted streams, forgotten here.
    pub fn take(&self) -> Vec<usize> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// One side of a 2D copy.
#[derive(Debug, Clone, Copy)]
pub enum Side {
    /// Host memory at this address.
    Host(u64),
    /// Device memory at this address (in the primary context).
    Device(u64),
}

impl Cuda {
    /// The GPU with this UUID.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`], [`Error::DeviceNotVisible`], driver errors.
    pub fn for_uuid(uuid: &[u8; 16]) -> Result<Arc<Cuda>> {
        let driver = RealDriver::shared()?;
        driver.init()?;
        let n = driver.device_count()?;
        for ordinal in 0..n {
            let dev = driver.device_get(ordinal)?;
            if driver.device_uuid(dev)? == *uuid {
                return Self::open(driver, ordinal);
            }
        }
        Err(Error::DeviceNotVisible {
            uuid: vc::format_uuid(uuid),
        })
    }

    /// The GPU with this ordinal.
    ///
    /// # Errors
    /// As [`Cuda::for_uuid`]; [`Error::Config`] for an ordinal out of range.
    pub fn for_ordinal(ordinal: i32) -> Result<Arc<Cuda>> {
        let driver = RealDriver::shared()?;
        driver.init()?;
        let n = driver.device_count()?;
        if !(0..n).contains(&ordinal) {
            return Err(Error::Config(format!(
                "CUDA device ordinal {ordinal} does not exist here ({n} visible)"
            )));
        }
        Self::open(driver, ordinal)
    }

    fn open(driver: Arc<RealDriver>, ordinal: i32) -> Result<Arc<Cuda>> {
        let device = driver.device_get(ordinal)?;
        let ctx = driver.primary_ctx_retain(device)?;
        // SAFETY: `ctx` was retained just above and stays retained here.
        let made = unsafe { ContextGuard::push(&*driver, ctx) }.and_then(|g| {
            let s = driver.stream_create_non_blocking();
            g.restore()?;
            s
        });
        match made {
            Ok(stream) => Ok(Arc::new(Cuda {
                driver,
                device,
                ordinal,
                ctx,
                stream,
            })),
            Err(e) => {
                let _ = driver.primary_ctx_release(device);
                Err(e.into())
            }
        }
    }

    /// Runs `f` with the context current, restoring the caller's after.
    fn with<R>(&self, f: impl FnOnce(&RealDriver) -> Result<R>) -> Result<R> {
        // SAFETY: `self.ctx` is retained for as long as `self` lives.
        let guard = unsafe { ContextGuard::push(&*self.driver, self.ctx) }?;
        let r = f(&self.driver);
        guard.restore()?;
        r
    }

    /// Our stream, as the driver API takes it.
    pub fn raw_stream(&self) -> cu::CUstream {
        self.stream.as_raw()
    }

    /// `cuMemAlloc` of `bytes`.
    ///
    /// # Errors
    /// The driver's error (out of memory, for instance).
    pub fn alloc(&self, bytes: u64) -> Result<DevicePtr> {
        self.with(|d| Ok(d.mem_alloc(bytes.max(1))?))
    }

    /// Frees a buffer from [`Cuda::alloc`].
    ///
    /// # Safety
    /// `p` came from [`Cuda::alloc`] on this object and no copy uses it.
    pub unsafe fn free(&self, p: DevicePtr) -> Result<()> {
        self.with(|d| {
            // SAFETY: the caller's contract: our allocation, idle (our only
            // stream is synchronised after every copy).
            Ok(unsafe { d.mem_free(p) }?)
        })
    }

    /// Copies `bytes` from device `src` to device `dst` on our stream and
    /// waits for it.
    ///
    /// # Safety
    /// Both ranges are device memory valid in the primary context for the
    /// duration of the call; `dst` is not read or written by anyone else
    /// meanwhile.
    pub unsafe fn copy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<()> {
        self.with(|d| {
            // SAFETY: the caller's contract; the stream is ours and live.
            unsafe { d.memcpy_dtod_async(dst, src, bytes, self.stream) }?;
            // SAFETY: our live stream.
            unsafe { d.stream_synchronize(self.stream) }?;
            Ok(())
        })
    }

    /// Enqueues a 2D copy (`rows` rows of `width` bytes) on our stream, or on
    /// `stream` when given; does not wait.
    ///
    /// # Safety
    /// Both sides are valid for `rows` rows at their pitches (host memory
    /// in this process, device memory in the primary context) until the
    /// stream has passed the copy.
    pub unsafe fn copy_2d(
        &self,
        dst: Side,
        dst_pitch: u64,
        src: Side,
        src_pitch: u64,
        width: u64,
        rows: u64,
    ) -> Result<()> {
        let (src_type, src_host, src_dev) = match src {
            Side::Host(a) => (
                cu::CUmemorytype::CU_MEMORYTYPE_HOST,
                a as usize as *const std::ffi::c_void,
                0,
            ),
            Side::Device(a) => (cu::CUmemorytype::CU_MEMORYTYPE_DEVICE, std::ptr::null(), a),
        };
        let (dst_type, dst_host, dst_dev) = match dst {
            Side::Host(a) => (
                cu::CUmemorytype::CU_MEMORYTYPE_HOST,
                a as usize as *mut std::ffi::c_void,
                0,
            ),
            Side::Device(a) => (cu::CUmemorytype::CU_MEMORYTYPE_DEVICE, std::ptr::null_mut(), a),
        };
        let p = cu::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: src_type,
            srcHost: src_host,
            srcDevice: src_dev,
            srcArray: std::ptr::null_mut(),
            srcPitch: src_pitch as usize,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: dst_type,
            dstHost: dst_host,
            dstDevice: dst_dev,
            dstArray: std::ptr::null_mut(),
            dstPitch: dst_pitch as usize,
            WidthInBytes: width as usize,
            Height: rows as usize,
        };
        let stream = self.stream.as_raw();
        self.with(|_| {
            // SAFETY: the caller's contract on both sides; `p` lives for the
            // call (the driver copies the descriptor); our stream is live.
            check("cuMemcpy2DAsync", unsafe { cu::cuMemcpy2DAsync_v2(&p, stream) })
        })
    }

    /// An event on each of `streams` (see [`Consumers`]) that still has work
    /// queued, recorded after that work. When one cannot be recorded (a stream of
    /// another context, say), waits for the whole context instead, so the
    /// memory is idle either way; returns the events that were recorded.
    pub fn fence(&self, streams: &[usize]) -> Vec<Event> {
        let mut events = Vec::with_capacity(streams.len());
        let r = self.with(|_| {
            for &s in streams {
                if idle(s as cu::CUstream) {
                    continue;
                }
                let mut ev: cu::CUevent = std::ptr::null_mut();
                // Blocking: a host wait on it (`sync_events`, before a push
                // buffer is lent again) sleeps instead of spinning a core,
                // which many reader threads of one process would each do.
                let flags = cu::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as u32
                    | cu::CUevent_flags_enum::CU_EVENT_BLOCKING_SYNC as u32;
                // SAFETY: an out-parameter the driver fills; our context is current.
                check("cuEventCreate", unsafe { cu::cuEventCreate(&mut ev, flags) })?;
                let ev = Event(ev);
                // SAFETY: `ev` is our live event; `s` is the handle the
                // consumer gave (or a sentinel the driver defines); a bad
                // handle is an error the driver reports.
                let recorded = check("cuEventRecord", unsafe { cu::cuEventRecord(ev.0, s as cu::CUstream) });
                if let Err(e) = recorded {
                    // SAFETY: our event, never recorded nor used again.
                    unsafe { cu::cuEventDestroy_v2(ev.0) };
                    return Err(e);
                }
                events.push(ev);
            }
            Ok(())
        });
        if let Err(e) = r {
            eprintln!("vramring: ordering a consumer stream before reuse failed ({e}); waiting for the GPU instead");
            self.sync_events(std::mem::take(&mut events));
            if let Err(e) = self.with(|_| {
                // SAFETY: no arguments; our context is current.
                check("cuCtxSynchronize", unsafe { cu::cuCtxSynchronize() })
            }) {
                eprintln!("vramring: cuCtxSynchronize failed: {e}");
            }
        }
        events
    }

    /// Makes our stream wait (on the GPU, not here) for `events`, then
    /// frees them; copies we enqueue after this run after the consumers'
    /// work. Falls back to [`Cuda::sync_events`] on an error.
    pub fn wait_on_stream(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let stream = self.stream.as_raw();
        let r = self.with(|_| {
            for ev in &events {
                // SAFETY: our live stream and a live event of this context.
                check("cuStreamWaitEvent", unsafe { cu::cuStreamWaitEvent(stream, ev.0, 0) })?;
            }
            Ok(())
        });
        if let Err(e) = r {
            eprintln!("vramring: {e}; waiting for the consumer's stream on the host instead");
            self.sync_events(events);
            return;
        }
        self.destroy_events(events);
    }

    /// Waits here until every one of `events` completed, then frees them.
    pub fn sync_events(&self, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        let r = self.with(|_| {
            for ev in &events {
                // SAFETY: a live event of this context.
                check("cuEventSynchronize", unsafe { cu::cuEventSynchronize(ev.0) })?;
            }
            Ok(())
        });
        if let Err(e) = r {
            eprintln!("vramring: {e}; waiting for the whole GPU context instead");
            if let Err(e) = self.with(|_| {
                // SAFETY: no arguments; our context is current.
                check("cuCtxSynchronize", unsafe { cu::cuCtxSynchronize() })
            }) {
                eprintln!("vramring: cuCtxSynchronize failed: {e}");
            }
        }
        self.destroy_events(events);
    }

    fn destroy_events(&self, events: Vec<Event>) {
        let r = self.with(|_| {
            for ev in events {
                // SAFETY: our event, used no more here; the driver frees it
                // once any wait on it enqueued before has passed.
                check("cuEventDestroy", unsafe { cu::cuEventDestroy_v2(ev.0) })?;
            }
            Ok(())
        });
        if let Err(e) = r {
            eprintln!("vramring: freeing a CUDA event failed: {e}");
        }
    }

    /// Waits for our stream.
    ///
    /// # Errors
    /// The driver's error.
    pub fn sync(&self) -> Result<()> {
        self.with(|d| {
            // SAFETY: our live stream.
            Ok(unsafe { d.stream_synchronize(self.stream) }?)
        })
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        let r = self.with(|d| {
            // SAFETY: our live stream; nothing enqueues on it any more.
            unsafe { d.stream_synchronize(self.stream) }?;
            // SAFETY: our stream, idle now.
            unsafe { d.stream_destroy(self.stream) }?;
            Ok(())
        });
        if let Err(e) = r.and_then(|()| Ok(self.driver.primary_ctx_release(self.device)?)) {
            eprintln!("vramring: releasing the CUDA stream/context failed: {e}");
        }
    }
}

/// Host memory of one buffer (8-byte aligned, zeroed when made): a
/// `Box<[u64]>` taken apart, so that its bytes are reached through a raw
/// pointer only. Consumers view them through that pointer (numpy arrays),
/// and a buffer whose tensors are cached is written again while its `Buf`
/// is shared (see `cache`); a `Vec` reached through `&` would not allow it.
#[derive(Debug)]
pub struct HostMem {
    ptr: NonNull<u64>,
    words: usize,
}

// SAFETY: an owned heap allocation, like the `Box<[u64]>` it was; moving
// the handle to another thread moves only its address.
unsafe impl Send for HostMem {}
// SAFETY: `&HostMem` gives out the address, never a reference to the bytes;
// who may read or write them when is what `Buf::host_ptr`'s callers prove
// (an exclusive `&mut Buf`, or the tensor cache's check).
unsafe impl Sync for HostMem {}

impl HostMem {
    fn zeroed(bytes: u64) -> HostMem {
        let b = vec![0u64; (bytes as usize).div_ceil(8)].into_boxed_slice();
        let words = b.len();
        HostMem {
            ptr: NonNull::from(Box::leak(b)).cast::<u64>(),
            words,
        }
    }
}

impl Drop for HostMem {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.words);
        // SAFETY: `ptr` and `words` are the `Box<[u64]>` `zeroed` leaked,
        // rebuilt once, here; nothing reads the bytes any more (the `Buf`
        // owning this is gone, and with it every tensor's reference).
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// Where a buffer lives.
#[derive(Debug)]
pub enum Mem {
    /// Host memory.
    Host(HostMem),
    /// A `cuMemAlloc` buffer in [`BufPool::cuda`]'s context.
    Cuda(DevicePtr),
}

/// Buffers of one size for the frames of one subscriber.
#[derive(Debug)]
pub struct BufPool {
    /// `Some` for a CUDA ring.
    pub cuda: Option<Arc<Cuda>>,
    /// Bytes of each buffer.
    pub bytes: u64,
    /// Free buffers, each with the events its last consumers' work must
    /// pass before it is written again.
    free: Mutex<Vec<(Mem, Vec<Event>)>>,
    live: AtomicUsize,
    allocated: AtomicUsize,
    keep: usize,
}

/// One frame's buffer; back to its pool's free list when dropped.
#[derive(Debug)]
pub struct Buf {
    mem: Option<Mem>,
    pool: Arc<BufPool>,
    /// Streams of the tensors exported from it.
    pub consumers: Consumers,
}

impl BufPool {
    /// A pool of `bytes`-byte buffers, keeping at most `keep` free ones.
    pub fn new(cuda: Option<Arc<Cuda>>, bytes: u64, keep: usize) -> Arc<BufPool> {
        Arc::new(BufPool {
            cuda,
            bytes,
            free: Mutex::new(Vec::new()),
            live: AtomicUsize::new(0),
            allocated: AtomicUsize::new(0),
            keep,
        })
    }

    /// Buffers handed out and not yet back.
    pub fn live(&self) -> usize {
        // Relaxed: a count for a limit and for stats; no data is published
        // through it (the Arc and the mutex order the buffer contents).
        self.live.load(Ordering::Relaxed)
    }

    /// Buffers this pool allocated so far (not per frame: they are reused).
    pub fn allocated(&self) -> usize {
        // Relaxed: see `live`.
        self.allocated.load(Ordering::Relaxed)
    }

    /// Orders our copy stream after the consumers' work on every free
    /// buffer (a GPU-side wait, enqueued now so that `take` finds nothing to
    /// do on the frame's path). Host pools: nothing.
    pub fn settle(&self) {
        let Some(c) = &self.cuda else { return };
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        for (_, events) in free.iter_mut() {
            c.wait_on_stream(std::mem::take(events));
        }
    }

    /// A buffer nobody else references: from the free list, or new. Copies
    /// into it enqueued on the pool's stream run after the work its last
    /// consumers queued on it.
    ///
    /// # Errors
    /// Allocation errors.
    pub fn take(self: &Arc<Self>) -> Result<Buf> {
        let reused = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mem = match reused {
            Some((m, events)) => {
                if let Some(c) = &self.cuda {
                    c.wait_on_stream(events);
                }
                m
            }
            None => {
                let m = match &self.cuda {
                    Some(c) => Mem::Cuda(c.alloc(self.bytes)?),
                    None => Mem::Host(HostMem::zeroed(self.bytes)),
                };
                // Relaxed: see `live`.
                self.allocated.fetch_add(1, Ordering::Relaxed);
                m
            }
        };
        // Relaxed: see `live`.
        self.live.fetch_add(1, Ordering::Relaxed);
        Ok(Buf {
            mem: Some(mem),
            pool: Arc::clone(self),
            consumers: Consumers::default(),
        })
    }

    fn release(&self, mem: Mem, events: Vec<Event>) {
        // Relaxed: see `live`.
        self.live.fetch_sub(1, Ordering::Relaxed);
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < self.keep {
            free.push((mem, events));
            return;
        }
        drop(free);
        self.destroy(mem, events);
    }

    fn destroy(&self, mem: Mem, events: Vec<Event>) {
        if let (Mem::Cuda(p), Some(c)) = (mem, &self.cuda) {
            c.sync_events(events);
            // SAFETY: a buffer of this pool, from `c.alloc`; nobody holds it
            // (its Buf is gone, or it sat on the free list), copies into it
            // were synchronised before the Frame was handed out, and its
            // consumers' work is done (the events above).
            if let Err(e) = unsafe { c.free(p) } {
                eprintln!("vramring: freeing a frame buffer failed: {e}");
            }
        }
    }
}

impl Drop for BufPool {
    fn drop(&mut self) {
        let free = std::mem::take(self.free.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (m, events) in free {
            self.destroy(m, events);
        }
    }
}

impl Buf {
    /// Host pointer or `CUdeviceptr` of the buffer.
    pub fn addr(&self) -> u64 {
        match &self.mem {
            Some(Mem::Host(h)) => h.ptr.as_ptr() as u64,
            Some(Mem::Cuda(p)) => *p,
            None => 0,
        }
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<BufPool> {
        &self.pool
    }

    /// The buffer as bytes, when it is host memory. Needs `&mut`: only a
    /// buffer nobody else references yet (before it goes into an `Arc`).
    pub fn host_mut(&mut self) -> Option<&mut [u8]> {
        let p = self.host_ptr()?;
        // SAFETY: `host_ptr`'s bytes; `&mut self` is exclusive: no `Arc`
        // of this buffer exists, so no tensor or export views it.
        Some(unsafe { std::slice::from_raw_parts_mut(p, self.pool.bytes as usize) })
    }

    /// The buffer's first byte, when it is host memory: valid for reads
    /// and writes of the pool's `bytes` (initialised: zeroed when made),
    /// with the allocation's provenance (taken from the leaked `Box`, never
    /// from a reference), for as long as the `Buf` lives. Who may write
    /// through it when is the caller's to prove: `host_mut`, or a buffer
    /// whose cached tensors were proven unreferenced (see `cache`).
    pub fn host_ptr(&self) -> Option<*mut u8> {
        match &self.mem {
            Some(Mem::Host(h)) => Some(h.ptr.as_ptr().cast::<u8>()),
            _ => None,
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Some(m) = self.mem.take() {
            let streams = self.consumers.take();
            let events = match &self.pool.cuda {
                Some(c) if !streams.is_empty() => c.fence(&streams),
                _ => Vec::new(),
            };
            self.pool.release(m, events);
        }
    }
}

/// A value reachable only through `&mut`: `Sync` for any `Send` value, as
/// Python classes must be (PyO3 hands out `&mut` one borrower at a time).
#[derive(Debug, Default)]
pub struct Excl<T>(T);

// SAFETY: an `&Excl<T>` gives no access to the `T` (there is no `&self`
// accessor), so sharing it between threads shares nothing; access needs
// `&mut Excl<T>`, which is exclusive (the `SyncWrapper` argument).
unsafe impl<T: Send> Sync for Excl<T> {}

impl<T> Excl<T> {
    /// Wraps `v`.
    pub fn new(v: T) -> Self {
        Excl(v)
    }
    /// The value.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.0
    }
}
