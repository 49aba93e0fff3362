//! GStreamer's CUDA memory, reached without linking against it: the few
//! calls of `libgstcuda-1.0` that gstreamer-rs does not bind, opened with
//! `dlopen` at run time, and the driver calls of the copy (through
//! `cudarc`'s dynamically loaded driver). Where `libgstcuda-1.0` or the
//! NVIDIA driver is missing, [`available`] is false and the elements work
//! with system memory only; nothing here is called then.
//!
//! The contexts (ADR 0025, "CUDA memory input"): a vramring CUDA ring lives
//! in its device's **primary** context, and `SlotMut::publish_cuda` needs a
//! stream of that context. GStreamer's elements make their own contexts
//! (`cuCtxCreate`) unless a neighbour hands them one through the
//! `gst.cuda.context` context query, so `vramringsink` answers that query
//! with a `GstCudaContext` that wraps the primary context
//! ([`Primary::gst_context`]): a decoder or `cudaupload` upstream then
//! allocates in the ring's context and the frame is copied on the memory's
//! own stream. Memory of another context (one the application set on the
//! pipeline) is copied on the element's stream in the primary context with
//! `cuMemcpy3DPeerAsync`, fenced both ways with events
//! ([`Copier::copy`]); no path waits on the host.
//!
//! The source side (ADR 0027, "The source side"): `vramringsrc` on a CUDA
//! ring answers downstream's query with the same wrapper and copies each
//! frame from the subscriber's buffer into a `GstCudaBufferPool` buffer
//! of the primary context ([`Filler::fill`]), waiting for that copy
//! before the push.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::sys::{self as cu, CUcontext, CUdevice, CUdeviceptr, CUevent, CUresult, CUstream};
use gst::glib;
use gst::glib::translate::ToGlibPtr;

use crate::video::PlaneCopy;

/// The caps feature of GStreamer's CUDA memory.
pub const CUDA_MEMORY_FEATURE: &str = "memory:CUDAMemory";
/// The context type of `GstCudaContext` (`GST_CUDA_CONTEXT_TYPE`).
pub const CONTEXT_TYPE: &str = "gst.cuda.context";
/// `GST_MAP_CUDA` (`gstcudamemory.h`): map a `GstCudaMemory` for its
/// `CUdeviceptr` instead of a host copy.
const GST_MAP_CUDA: gst::ffi::GstMapFlags = gst::ffi::GST_MAP_FLAG_LAST << 1;

/// `struct _GstCudaMemory` (`gstcudamemory.h`, public since 1.22): the
/// `GstMemory`, then the public `context` and `info`.
#[repr(C)]
struct GstCudaMemoryRaw {
    mem: gst::ffi::GstMemory,
    context: *mut c_void,
    info: gst_video::ffi::GstVideoInfo,
    private: *mut c_void,
}

/// The functions of `libgstcuda-1.0` the sink calls.
struct GstCudaLib {
    _lib: libloading::Library,
    is_cuda_memory: unsafe extern "C" fn(*mut gst::ffi::GstMemory) -> glib::ffi::gboolean,
    /// Since 1.24; absent means every memory uses the default stream.
    memory_get_stream: Option<unsafe extern "C" fn(*mut GstCudaMemoryRaw) -> *mut c_void>,
    stream_get_handle: Option<unsafe extern "C" fn(*mut c_void) -> CUstream>,
    context_get_handle: unsafe extern "C" fn(*mut c_void) -> CUcontext,
    context_new_wrapped: unsafe extern "C" fn(CUcontext, CUdevice) -> *mut c_void,
    handle_context_query:
        unsafe extern "C" fn(*mut gst::ffi::GstElement, *mut gst::ffi::GstQuery, *mut c_void) -> glib::ffi::gboolean,
    /// `vramringsrc`'s CUDA output: a pool of `GstCudaMemory` buffers.
    buffer_pool_new: unsafe extern "C" fn(*mut c_void) -> *mut gst::ffi::GstBufferPool,
    /// Fills libgstcuda's table of driver calls, which only the nvcodec
    /// plugin's init fills otherwise: without it, a process with no
    /// nvcodec element aborts at its first CUDA call.
    load_library: unsafe extern "C" fn() -> glib::ffi::gboolean,
    /// `vramringsrc`'s zero-copy output: a `GstCudaMemory` around device
    /// memory it does not own (since 1.24).
    alloc_wrapped: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut c_void,
            *mut c_void,
            *const gst_video::ffi::GstVideoInfo,
            CUdeviceptr,
            glib::ffi::gpointer,
            glib::ffi::GDestroyNotify,
        ) -> *mut gst::ffi::GstMemory,
    >,
}

impl GstCudaLib {
    fn open() -> Result<Self, String> {
        // SAFETY: libgstcuda-1.0 runs no code at load that depends on us;
        // it is loaded (or already is, by the nvcodec plugin) once.
        let lib = unsafe { libloading::Library::new("libgstcuda-1.0.so.0") }.map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the type is the C prototype of `$name` in
                // gst-libs/gst/cuda (1.22 or later).
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| format!("{}: {e}", $name))?
            };
        }
        macro_rules! opt {
            ($name:literal) => {
                // SAFETY: as for `sym!`.
                unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .ok()
                    .map(|s| *s)
            };
        }
        Ok(GstCudaLib {
            is_cuda_memory: sym!("gst_is_cuda_memory"),
            memory_get_stream: opt!("gst_cuda_memory_get_stream"),
            stream_get_handle: opt!("gst_cuda_stream_get_handle"),
            context_get_handle: sym!("gst_cuda_context_get_handle"),
            context_new_wrapped: sym!("gst_cuda_context_new_wrapped"),
            handle_context_query: sym!("gst_cuda_handle_context_query"),
            buffer_pool_new: sym!("gst_cuda_buffer_pool_new"),
            load_library: sym!("gst_cuda_load_library"),
            alloc_wrapped: opt!("gst_cuda_allocator_alloc_wrapped"),
            _lib: lib,
        })
    }
}

fn gst_cuda() -> Option<&'static GstCudaLib> {
    static LIB: OnceLock<Option<GstCudaLib>> = OnceLock::new();
    LIB.get_or_init(|| GstCudaLib::open().ok()).as_ref()
}

/// Whether CUDA memory can be taken here: `libgstcuda-1.0` opens and loads
/// the driver, and a GPU the CUDA backend can use is present (which also
/// means `cudarc` finds the driver). Probed once.
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        vramring::cuda::cuda_usable()
            && gst_cuda().is_some_and(|l| {
                // SAFETY: takes no arguments; safe to call more than once
                // (it loads once).
                unsafe { (l.load_library)() != glib::ffi::GFALSE }
            })
    })
}

/// Whether CUDA memory can be made around memory we own
/// (`gst_cuda_allocator_alloc_wrapped`, GStreamer 1.24 and later): what
/// `vramringsrc`'s zero-copy CUDA output needs.
pub fn can_wrap() -> bool {
    available() && gst_cuda().is_some_and(|l| l.alloc_wrapped.is_some())
}

/// The descriptor of plane copy `p` from device memory at `src` to device
/// memory at `dst` (both already at the plane's offset). Every field is
/// spelled out: `CUmemorytype` has no zero value, so a zeroed descriptor
/// is not a valid one.
fn device_copy_2d(src: CUdeviceptr, dst: CUdeviceptr, p: &PlaneCopy) -> cu::CUDA_MEMCPY2D {
    cu::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: p.src_stride,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        dstPitch: p.dst_stride,
        WidthInBytes: p.row_bytes,
        Height: p.rows,
    }
}

fn check(call: &'static str, r: CUresult) -> Result<(), String> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {r:?}"))
    }
}

/// A device's primary context, retained for the life of the process, and
/// a `GstCudaContext` that wraps it (handed to upstream elements). Never
/// released: GStreamer elements may hold the wrapper (and memory of the
/// context) past any one sink, and the wrapper does not retain.
pub struct Primary {
    pub ordinal: u32,
    ctx: CUcontext,
    gst_context: *mut c_void,
}

// SAFETY: a CUcontext is a process-wide handle usable from any thread, and
// a GstCudaContext is a thread-safe GObject; neither is ever freed.
unsafe impl Send for Primary {}
// SAFETY: as above; `Primary` is immutable after creation.
unsafe impl Sync for Primary {}

impl Primary {
    /// The primary context of device `ordinal`, made once per process.
    ///
    /// # Errors
    /// Without [`available`], or a driver call's failure.
    pub fn get(ordinal: u32) -> Result<&'static Primary, String> {
        static ALL: Mutex<Vec<&'static Primary>> = Mutex::new(Vec::new());
        if !available() {
            return Err("CUDA memory needs libgstcuda-1.0 and a CUDA GPU; neither is usable here".into());
        }
        let lib = gst_cuda().ok_or("libgstcuda-1.0 is not loaded")?;
        let mut all = ALL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(p) = all.iter().find(|p| p.ordinal == ordinal) {
            return Ok(p);
        }
        let mut dev: CUdevice = 0;
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: `available()` saw the driver, so cudarc's lazy loader
        // finds it; out-parameters are valid locals.
        unsafe {
            check("cuInit", cu::cuInit(0))?;
            check("cuDeviceGet", cu::cuDeviceGet(&mut dev, ordinal as c_int))?;
            check("cuDevicePrimaryCtxRetain", cu::cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
        }
        // SAFETY: `ctx` and `dev` stay alive for ever (never released), as
        // `gst_cuda_context_new_wrapped` requires.
        let gst_context = unsafe { (lib.context_new_wrapped)(ctx, dev) };
        if gst_context.is_null() {
            return Err(format!("gst_cuda_context_new_wrapped failed for device {ordinal}"));
        }
        let p: &'static Primary = Box::leak(Box::new(Primary {
            ordinal,
            ctx,
            gst_context,
        }));
        all.push(p);
        Ok(p)
    }

    /// A read-only `GstCudaMemory` of this context around `ptr`, laid out
    /// as `info` (its strides, offsets and size), that owns `keep` and
    /// drops it when GStreamer frees the memory: no copy, no GPU work.
    ///
    /// # Safety
    /// `ptr..ptr + info.size` is device memory readable in this context
    /// that nothing writes while `keep` lives.
    ///
    /// # Errors
    /// A `libgstcuda-1.0` older than 1.24 (no
    /// `gst_cuda_allocator_alloc_wrapped`), or its failure.
    pub unsafe fn wrap<T: Send + 'static>(
        &self,
        info: &gst_video::ffi::GstVideoInfo,
        ptr: CUdeviceptr,
        keep: T,
    ) -> Result<gst::Memory, String> {
        unsafe extern "C" fn drop_keep<T>(data: glib::ffi::gpointer) {
            // SAFETY: `data` is the `Box<T>` leaked below, freed once
            // (GStreamer calls the notify once, when the memory goes).
            // Downstream's GPU reads are not fenced here (ADR 0028: a
            // context synchronise could wait on a commit that never lands).
            drop(unsafe { Box::from_raw(data.cast::<T>()) });
        }
        let lib = gst_cuda().ok_or("libgstcuda-1.0 is not loaded")?;
        let alloc = lib
            .alloc_wrapped
            .ok_or("this libgstcuda-1.0 has no gst_cuda_allocator_alloc_wrapped")?;
        let data = Box::into_raw(Box::new(keep));
        // SAFETY: default allocator (null), our live context wrapper, no
        // stream (the memory is complete: nothing to wait for), a valid
        // info (the caller's contract); a memory made calls `drop_keep`
        // with `data` once, when freed (gstcudamemory.cpp, 1.24).
        let raw = unsafe {
            alloc(
                std::ptr::null_mut(),
                self.gst_context,
                std::ptr::null_mut(),
                info,
                ptr,
                data.cast(),
                Some(drop_keep::<T>),
            )
        };
        if raw.is_null() {
            // SAFETY: not taken by a memory that failed to be made.
            drop(unsafe { Box::from_raw(data) });
            return Err("gst_cuda_allocator_alloc_wrapped failed".into());
        }
        // SAFETY: a new GstMemory nobody else sees yet: its flags are ours
        // to set. Read-only: downstream copies before it writes.
        unsafe { (*raw).mini_object.flags |= gst::ffi::GST_MEMORY_FLAG_READONLY };
        // SAFETY: a new GstMemory, full ownership.
        Ok(unsafe { gst::Memory::from_glib_full(raw) })
    }

    /// Answers a `gst.cuda.context` query with this context. Returns
    /// whether it did.
    pub fn answer_context_query(&self, element: &gst::Element, query: &mut gst::QueryRef) -> bool {
        let Some(lib) = gst_cuda() else { return false };
        // SAFETY: `element` and `query` are live for the call; the query
        // is writable (`&mut`); the context is a live GstCudaContext.
        unsafe {
            (lib.handle_context_query)(element.to_glib_none().0, query.as_mut_ptr(), self.gst_context)
                != glib::ffi::GFALSE
        }
    }
}

/// The context pushed on this thread, popped on drop.
struct Pushed;

impl Pushed {
    fn push(ctx: CUcontext) -> Result<Pushed, String> {
        // SAFETY: `ctx` is a live context (the primary context, retained
        // for ever, or a GstCudaContext's, whose object the caller holds).
        check("cuCtxPushCurrent", unsafe { cu::cuCtxPushCurrent_v2(ctx) })?;
        Ok(Pushed)
    }
}

impl Drop for Pushed {
    fn drop(&mut self) {
        let mut old: CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context `push` pushed on this thread.
        let _ = unsafe { cu::cuCtxPopCurrent_v2(&mut old) };
    }
}

/// A buffer of CUDA memory mapped with `GST_MAP_CUDA`: each plane's device
/// address, stride and bytes to the end of the memory, its context and
/// stream. Unmapped on drop.
pub struct MappedCuda {
    frame: gst_video::ffi::GstVideoFrame,
    /// (device address, stride, bytes from the address to the memory's end)
    pub planes: Vec<(CUdeviceptr, usize, usize)>,
    context: CUcontext,
    /// The memory's `GstCudaContext` (a GObject; referenced while mapped).
    gst_context: *mut c_void,
    stream: CUstream,
}

impl MappedCuda {
    /// Maps `buffer` (one `GstCudaMemory`) as a frame of `info` for the
    /// device.
    ///
    /// # Errors
    /// Without [`available`], when the buffer is not one CUDA memory, or
    /// when the map fails.
    pub fn map(buffer: &gst::BufferRef, info: &gst_video::VideoInfo) -> Result<MappedCuda, String> {
        Self::map_with(buffer, info, gst::ffi::GST_MAP_READ)
    }

    /// Maps `buffer` (one `GstCudaMemory`, writable) as a frame of `info`
    /// for device writes: on unmap the memory knows its device copy is the
    /// newer one.
    ///
    /// # Errors
    /// As [`MappedCuda::map`]; also when the buffer is not writable.
    pub fn map_writable(buffer: &mut gst::BufferRef, info: &gst_video::VideoInfo) -> Result<MappedCuda, String> {
        Self::map_with(buffer, info, gst::ffi::GST_MAP_WRITE)
    }

    fn map_with(
        buffer: &gst::BufferRef,
        info: &gst_video::VideoInfo,
        access: gst::ffi::GstMapFlags,
    ) -> Result<MappedCuda, String> {
        let lib = gst_cuda()
            .filter(|_| available())
            .ok_or("CUDA memory is not usable here")?;
        if buffer.n_memory() != 1 {
            return Err(format!(
                "a CUDA buffer of {} memories (one expected)",
                buffer.n_memory()
            ));
        }
        let mem = buffer.peek_memory(0);
        let mem_ptr = mem.as_ptr() as *mut gst::ffi::GstMemory;
        // SAFETY: `mem_ptr` is a live memory of `buffer`.
        if unsafe { (lib.is_cuda_memory)(mem_ptr) } == glib::ffi::GFALSE {
            return Err("the buffer's memory is not CUDA memory".into());
        }
        let cmem = mem_ptr as *mut GstCudaMemoryRaw;
        // SAFETY: a CUDA memory is a `GstCudaMemory` (checked above), whose
        // public `context` field is a live GstCudaContext.
        let gst_context = unsafe { (*cmem).context };
        // SAFETY: as above.
        let context = unsafe { (lib.context_get_handle)(gst_context) };
        let stream = match (lib.memory_get_stream, lib.stream_get_handle) {
            // SAFETY: `cmem` is a GstCudaMemory; the GstCudaStream it
            // returns (or null) lives as long as the memory.
            (Some(get), Some(handle)) => unsafe {
                let s = get(cmem);
                if s.is_null() {
                    std::ptr::null_mut()
                } else {
                    handle(s)
                }
            },
            _ => std::ptr::null_mut(),
        };
        let mut frame = std::mem::MaybeUninit::<gst_video::ffi::GstVideoFrame>::zeroed();
        // SAFETY: `frame` is writable; `info` and `buffer` are live (a
        // write map is asked for through `map_writable`'s `&mut`); the
        // flags ask for device addresses (the memory's map function
        // uploads pending host writes first).
        let ok = unsafe {
            gst_video::ffi::gst_video_frame_map(
                frame.as_mut_ptr(),
                info.to_glib_none().0,
                buffer.as_ptr() as *mut gst::ffi::GstBuffer,
                access | GST_MAP_CUDA,
            )
        };
        if ok == glib::ffi::GFALSE {
            return Err("cannot map the CUDA memory for the device".into());
        }
        // SAFETY: mapped successfully above.
        let frame = unsafe { frame.assume_init() };
        let base = frame.map[0].data as usize;
        let size = frame.map[0].size;
        let n = info.n_planes() as usize;
        let planes = (0..n)
            .map(|k| {
                let addr = frame.data[k] as usize;
                let stride = frame.info.stride[k].max(0) as usize;
                let bytes = (base + size).saturating_sub(addr);
                (addr as CUdeviceptr, stride, bytes)
            })
            .collect();
        // SAFETY: a live GObject; unreferenced in `drop`.
        unsafe { glib::gobject_ffi::g_object_ref(gst_context as *mut glib::gobject_ffi::GObject) };
        Ok(MappedCuda {
            frame,
            planes,
            context,
            gst_context,
            stream,
        })
    }
}

impl Drop for MappedCuda {
    fn drop(&mut self) {
        // SAFETY: mapped in `map`, unmapped once here; the reference was
        // taken in `map`.
        unsafe {
            gst_video::ffi::gst_video_frame_unmap(&mut self.frame);
            glib::gobject_ffi::g_object_unref(self.gst_context as *mut glib::gobject_ffi::GObject);
        }
    }
}

/// An event made in a foreign context, and that context's GstCudaContext
/// (referenced, so the context outlives the event).
struct Fence {
    context: CUcontext,
    gst_context: *mut c_void,
    event: CUevent,
}

/// The sink's device-side copier: a stream and an event of the primary
/// context, and one event per foreign context it met.
pub struct Copier {
    primary: &'static Primary,
    stream: CUstream,
    done: CUevent,
    fences: Vec<Fence>,
}

// SAFETY: CUDA handles are process-wide; the copier is used by one thread
// at a time (behind the sink's state mutex).
unsafe impl Send for Copier {}

impl Copier {
    /// # Errors
    /// A driver call's failure.
    pub fn new(primary: &'static Primary) -> Result<Copier, String> {
        let _ctx = Pushed::push(primary.ctx)?;
        let mut stream: CUstream = std::ptr::null_mut();
        let mut done: CUevent = std::ptr::null_mut();
        // SAFETY: out-parameters are valid locals; the primary context is
        // current.
        unsafe {
            check(
                "cuStreamCreate",
                cu::cuStreamCreate(&mut stream, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint),
            )?;
            if let Err(e) = check(
                "cuEventCreate",
                cu::cuEventCreate(&mut done, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint),
            ) {
                let _ = cu::cuStreamDestroy_v2(stream);
                return Err(e);
            }
        }
        Ok(Copier {
            primary,
            stream,
            done,
            fences: Vec::new(),
        })
    }

    fn fence_for(&mut self, src: &MappedCuda) -> Result<CUevent, String> {
        if let Some(f) = self.fences.iter().find(|f| f.context == src.context) {
            return Ok(f.event);
        }
        let _ctx = Pushed::push(src.context)?;
        let mut event: CUevent = std::ptr::null_mut();
        // SAFETY: valid out-parameter; the memory's context is current.
        check("cuEventCreate", unsafe {
            cu::cuEventCreate(&mut event, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint)
        })?;
        // SAFETY: a live GObject; unreferenced in `drop`.
        unsafe { glib::gobject_ffi::g_object_ref(src.gst_context as *mut glib::gobject_ffi::GObject) };
        self.fences.push(Fence {
            context: src.context,
            gst_context: src.gst_context,
            event,
        });
        Ok(event)
    }

    /// Enqueues the copies of `plan` from `src` into the slot at `dst`
    /// (`dst_len` bytes) and returns the stream, of the primary context,
    /// to commit the frame on.
    ///
    /// Memory of the primary context with a stream of its own is copied on
    /// that stream (later work on the memory is ordered after the copy by
    /// stream order). Any other memory is copied on the copier's stream
    /// after an event recorded on the memory's stream, and the memory's
    /// stream then waits for the copy (`cuStreamWaitEvent` takes events of
    /// other contexts), so upstream cannot overwrite the buffer before the
    /// copy has read it. The host never waits.
    ///
    /// # Safety
    /// `dst..dst + dst_len` is device memory of the primary context that
    /// stays allocated until the copy completes (a loaned slot, committed
    /// on the returned stream).
    ///
    /// # Errors
    /// A plane that does not fit either side, or a driver call's failure
    /// (some planes may have been enqueued: do not publish the slot).
    pub unsafe fn copy(
        &mut self,
        src: &MappedCuda,
        plan: &[PlaneCopy],
        dst: CUdeviceptr,
        dst_len: u64,
    ) -> Result<CUstream, String> {
        for (k, p) in plan.iter().enumerate() {
            let src_len = src.planes.get(k).map_or(0, |pl| pl.2);
            p.fits(src_len, dst_len as usize)
                .map_err(|e| format!("plane {k}: {e}"))?;
        }
        let same = src.context == self.primary.ctx;
        let direct = same && !src.stream.is_null();
        let stream = if direct { src.stream } else { self.stream };
        if !direct {
            let fence = self.fence_for(src)?;
            let _ctx = Pushed::push(src.context)?;
            // SAFETY: `fence` belongs to the memory's context (current);
            // `src.stream` is the memory's stream (or null: its default).
            check("cuEventRecord", unsafe { cu::cuEventRecord(fence, src.stream) })?;
            // SAFETY: our stream, and an event of another context, which
            // cuStreamWaitEvent allows.
            check("cuStreamWaitEvent", unsafe {
                cu::cuStreamWaitEvent(self.stream, fence, 0)
            })?;
        }
        let _ctx = Pushed::push(self.primary.ctx)?;
        tracing::trace!(target: "vramring::publish", "sink: context pushed");
        // Both layouts alike but for where they start (GStreamer's CUDA
        // pool and the ring agree for NV12): one copy call, not one a plane.
        // Only within one context (a peer copy goes plane by plane).
        let one = same
            .then(|| {
                let src_at: Vec<u64> = plan
                    .iter()
                    .zip(&src.planes)
                    .map(|(p, &(addr, _, _))| addr + p.src_offset as u64)
                    .collect();
                let dst_at: Vec<u64> = plan.iter().map(|p| dst + p.dst_offset as u64).collect();
                crate::video::span(plan, &src_at, &dst_at).filter(|&(s, d, len)| {
                    let in_src = src_at.iter().zip(&src.planes).any(|(&at, &(addr, _, bytes))| {
                        at == s && (s - addr).checked_add(len).is_some_and(|end| end <= bytes as u64)
                    });
                    in_src && (d - dst).checked_add(len).is_some_and(|end| end <= dst_len)
                })
            })
            .flatten();
        if let Some((s, d, len)) = one {
            // SAFETY: `s..s + len` lies in the source memory and
            // `d..d + len` in the slot (checked just above), both of the
            // current context; the stream is of that context.
            let r = unsafe { cu::cuMemcpyDtoDAsync_v2(d, s, len as usize, stream) };
            check("cuMemcpyDtoDAsync", r)?;
        }
        let planes = if one.is_some() { &[][..] } else { plan };
        for (k, p) in planes.iter().enumerate() {
            if p.rows == 0 || p.row_bytes == 0 {
                continue;
            }
            let (addr, _, _) = src.planes[k];
            let src_dev = addr + p.src_offset as CUdeviceptr;
            let dst_dev = dst + p.dst_offset as CUdeviceptr;
            let r = if same {
                let copy = device_copy_2d(src_dev, dst_dev, p);
                // SAFETY: both ranges were checked against their memory
                // (`fits`); the stream is of the current context.
                unsafe { cu::cuMemcpy2DAsync_v2(&copy, stream) }
            } else {
                let copy = cu::CUDA_MEMCPY3D_PEER {
                    srcXInBytes: 0,
                    srcY: 0,
                    srcZ: 0,
                    srcLOD: 0,
                    srcMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                    srcHost: std::ptr::null(),
                    srcDevice: src_dev,
                    srcArray: std::ptr::null_mut(),
                    srcContext: src.context,
                    srcPitch: p.src_stride,
                    srcHeight: p.rows,
                    dstXInBytes: 0,
                    dstY: 0,
                    dstZ: 0,
                    dstLOD: 0,
                    dstMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                    dstHost: std::ptr::null_mut(),
                    dstDevice: dst_dev,
                    dstArray: std::ptr::null_mut(),
                    dstContext: self.primary.ctx,
                    dstPitch: p.dst_stride,
                    dstHeight: p.rows,
                    WidthInBytes: p.row_bytes,
                    Height: p.rows,
                    Depth: 1,
                };
                // SAFETY: as above; each side names its own context.
                unsafe { cu::cuMemcpy3DPeerAsync(&copy, stream) }
            };
            check("cuMemcpy2DAsync", r).map_err(|e| format!("plane {k}: {e}"))?;
        }
        if !direct {
            // SAFETY: our event and stream, of the current context.
            check("cuEventRecord", unsafe { cu::cuEventRecord(self.done, self.stream) })?;
            drop(_ctx);
            let _ctx = Pushed::push(src.context)?;
            // SAFETY: the memory's stream (or its context's default
            // stream) waits for our copy; the event may be of another
            // context.
            check("cuStreamWaitEvent", unsafe {
                cu::cuStreamWaitEvent(src.stream, self.done, 0)
            })?;
        }
        Ok(stream)
    }
}

impl Drop for Copier {
    fn drop(&mut self) {
        // The driver finishes enqueued work before it frees a stream.
        if let Ok(_ctx) = Pushed::push(self.primary.ctx) {
            // SAFETY: made in `new`, destroyed once.
            unsafe {
                let _ = cu::cuEventDestroy_v2(self.done);
                let _ = cu::cuStreamDestroy_v2(self.stream);
            }
        }
        for f in self.fences.drain(..) {
            if let Ok(_ctx) = Pushed::push(f.context) {
                // SAFETY: made in `fence_for`, destroyed once, while its
                // context is alive (we hold its GstCudaContext).
                let _ = unsafe { cu::cuEventDestroy_v2(f.event) };
            }
            // SAFETY: the reference taken in `fence_for`.
            unsafe { glib::gobject_ffi::g_object_unref(f.gst_context as *mut glib::gobject_ffi::GObject) };
        }
    }
}

/// The ordinal of the GPU whose UUID is `uuid` (a ring's
/// `RingInfo::device_uuid`), as this process numbers its devices.
///
/// # Errors
/// Without [`available`], a failed probe, or no such GPU here.
pub fn ordinal_of(uuid: [u8; 16]) -> Result<u32, String> {
    if !available() {
        return Err("CUDA memory is not usable here".into());
    }
    let devices = vramring::cuda::probe().map_err(|e| e.to_string())?;
    devices
        .iter()
        .find(|d| d.uuid == uuid)
        .and_then(|d| u32::try_from(d.ordinal).ok())
        .ok_or_else(|| format!("no GPU {} here", vramring::cuda::format_uuid(&uuid)))
}

/// `vramringsrc`'s CUDA output: a `GstCudaBufferPool` in the primary
/// context (the one the source offers downstream) and a stream of that
/// context. Each frame is copied device to device, plane by plane, from
/// the subscriber's own copy into a pooled `GstCudaMemory` buffer.
///
/// The copy is waited for on the host before the buffer is pushed
/// ([`Filler::fill`]): the subscriber's copy is rewritten by the next
/// `Subscriber::next` on the library's own stream, which cannot be made to
/// wait for ours, so our copy must have read it by then anyway; and a
/// finished copy leaves downstream (`cudadownload`, `nvh264enc`,
/// `cudaconvert`, whichever stream they read on) nothing to wait for.
pub struct Filler {
    primary: &'static Primary,
    stream: CUstream,
    pool: gst::BufferPool,
    info: gst_video::VideoInfo,
}

// SAFETY: CUDA handles are process-wide; the pool is a thread-safe
// GObject; the filler is used by one thread at a time (behind the
// source's state mutex).
unsafe impl Send for Filler {}

impl Filler {
    /// A pool of `caps` (`video/x-raw(memory:CUDAMemory)`, fixed) in
    /// `primary`'s context, active, and a stream.
    ///
    /// # Errors
    /// Caps that are not raw video, or a pool or driver call's failure.
    pub fn new(primary: &'static Primary, caps: &gst::Caps) -> Result<Filler, String> {
        use glib::translate::FromGlibPtrFull;
        use gst::prelude::*;
        let lib = gst_cuda().ok_or("libgstcuda-1.0 is not loaded")?;
        let info = gst_video::VideoInfo::from_caps(caps).map_err(|_| format!("caps {caps} are not raw video"))?;
        // SAFETY: the primary context's wrapper is a live GstCudaContext
        // (never freed).
        let raw = unsafe { (lib.buffer_pool_new)(primary.gst_context) };
        if raw.is_null() {
            return Err("gst_cuda_buffer_pool_new failed".into());
        }
        // SAFETY: a new GstBufferPool (a GstObject): its floating
        // reference, if it is one, is sunk into the one we take over.
        let pool = unsafe {
            if glib::gobject_ffi::g_object_is_floating(raw as *mut glib::gobject_ffi::GObject) != glib::ffi::GFALSE {
                glib::gobject_ffi::g_object_ref_sink(raw as *mut glib::gobject_ffi::GObject);
            }
            gst::BufferPool::from_glib_full(raw)
        };
        let mut config = pool.config();
        config.set_params(Some(caps), info.size() as u32, 2, 0);
        // The pool pitches its planes (cuMemAllocPitch): the video meta
        // carries the strides, to our map and to downstream.
        config.add_option(gst_video::BUFFER_POOL_OPTION_VIDEO_META);
        pool.set_config(config)
            .map_err(|e| format!("the CUDA buffer pool refused {caps}: {e}"))?;
        pool.set_active(true)
            .map_err(|e| format!("the CUDA buffer pool does not start: {e}"))?;
        let _ctx = Pushed::push(primary.ctx)?;
        let mut stream: CUstream = std::ptr::null_mut();
        // A blocking stream (not CU_STREAM_NON_BLOCKING): memory without a
        // stream of its own is read by downstream on the context's legacy
        // default stream, and a blocking stream's copy waits for that work
        // before it overwrites a recycled buffer.
        // SAFETY: valid out-parameter; the primary context is current.
        check("cuStreamCreate", unsafe {
            cu::cuStreamCreate(&mut stream, cu::CUstream_flags::CU_STREAM_DEFAULT as c_uint)
        })?;
        Ok(Filler {
            primary,
            stream,
            pool,
            info,
        })
    }

    /// The video info the pool's buffers are made for.
    pub fn info(&self) -> &gst_video::VideoInfo {
        &self.info
    }

    /// A pooled CUDA buffer holding the frame at `src` (`src_len` bytes,
    /// laid out as `geometry`), complete when this returns.
    ///
    /// The copy runs on the memory's own stream when it has one (it is of
    /// the primary context: the pool's), so that it follows whatever
    /// downstream last enqueued on the buffer; else on the filler's stream.
    ///
    /// # Safety
    /// `src..src + src_len` is device memory of the primary context's
    /// device, readable in that context, not written until this returns.
    ///
    /// # Errors
    /// No buffer from the pool, planes that do not fit, or a driver call's
    /// failure.
    pub unsafe fn fill(
        &mut self,
        src: CUdeviceptr,
        src_len: u64,
        geometry: &vramring::Geometry,
    ) -> Result<gst::Buffer, String> {
        use gst::prelude::*;
        let mut buffer = self
            .pool
            .acquire_buffer(None)
            .map_err(|e| format!("no buffer from the CUDA pool: {e:?}"))?;
        {
            let bref = buffer.get_mut().ok_or("a pooled buffer is shared")?;
            let dst = MappedCuda::map_writable(bref, &self.info)?;
            let gst_planes: Vec<(usize, usize)> = dst.planes.iter().map(|p| (p.1, p.2)).collect();
            let plan = crate::video::plan(&gst_planes, geometry, false).map_err(|e| e.0)?;
            for (k, p) in plan.iter().enumerate() {
                p.fits(src_len as usize, dst.planes[k].2)
                    .map_err(|e| format!("plane {k}: {e}"))?;
            }
            let stream = if dst.context == self.primary.ctx && !dst.stream.is_null() {
                dst.stream
            } else {
                self.stream
            };
            let _ctx = Pushed::push(self.primary.ctx)?;
            for (k, p) in plan.iter().enumerate() {
                if p.rows == 0 || p.row_bytes == 0 {
                    continue;
                }
                let copy = device_copy_2d(
                    src + p.src_offset as CUdeviceptr,
                    dst.planes[k].0 + p.dst_offset as CUdeviceptr,
                    p,
                );
                // SAFETY: both ranges were checked against their memory
                // (`fits`; the source's by the caller's contract); the
                // stream is of the current (primary) context, the one the
                // pool allocates in.
                check("cuMemcpy2DAsync", unsafe { cu::cuMemcpy2DAsync_v2(&copy, stream) })
                    .map_err(|e| format!("plane {k}: {e}"))?;
            }
            // SAFETY: a stream of the current context (ours, or the
            // memory's, alive while the memory is mapped).
            check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(stream) })?;
        }
        Ok(buffer)
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        use gst::prelude::*;
        let _ = self.pool.set_active(false);
        if let Ok(_ctx) = Pushed::push(self.primary.ctx) {
            // SAFETY: made in `new`, destroyed once; the driver finishes
            // enqueued work (none: every fill waited) before freeing it.
            let _ = unsafe { cu::cuStreamDestroy_v2(self.stream) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_symbol_resolves_where_libgstcuda_is_installed() {
        // SAFETY: as in `GstCudaLib::open`.
        if unsafe { libloading::Library::new("libgstcuda-1.0.so.0") }.is_err() {
            return; // CI: no libgstcuda-1.0, CUDA memory is simply not offered.
        }
        if let Err(e) = GstCudaLib::open() {
            panic!("libgstcuda-1.0 opens but lacks a symbol: {e}");
        }
    }

    /// Offsets `offsetof(GstCudaMemory, …)` gives with gstcudamemory.h of
    /// GStreamer 1.28.6 on x86_64 (a C program compiled against its
    /// headers printed them).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn the_cuda_memory_struct_matches_the_c_header() {
        assert_eq!(std::mem::size_of::<gst::ffi::GstMemory>(), 112);
        assert_eq!(std::mem::offset_of!(GstCudaMemoryRaw, context), 112);
        assert_eq!(std::mem::offset_of!(GstCudaMemoryRaw, info), 120);
        assert_eq!(std::mem::offset_of!(GstCudaMemoryRaw, private), 272);
    }

    #[test]
    fn gst_map_cuda_is_the_flag_after_the_last_core_one() {
        assert_eq!(GST_MAP_CUDA, 1 << 17);
    }
}
