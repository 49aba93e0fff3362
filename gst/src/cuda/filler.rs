//! `vramringsrc`'s copy of a frame into a pooled CUDA buffer.

use std::ffi::c_uint;

use cudarc::driver::sys::{self as cu, CUdeviceptr, CUstream};
use gst::glib;

use super::{check, device_copy_2d, gst_cuda, MappedCuda, Primary, Pushed};

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
