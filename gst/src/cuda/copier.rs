//! `vramringsink`'s copy of a CUDA buffer into a ring slot, on the device.

use std::ffi::{c_uint, c_void};

use cudarc::driver::sys::{self as cu, CUcontext, CUdeviceptr, CUevent, CUstream};
use gst::glib;

use super::{check, device_copy_2d, MappedCuda, Primary, Pushed};
use crate::video::PlaneCopy;

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
