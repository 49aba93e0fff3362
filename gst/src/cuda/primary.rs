//! A device's primary context and the `GstCudaContext` that wraps it.

use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use cudarc::driver::sys::{self as cu, CUcontext, CUdevice, CUdeviceptr};
use gst::glib;
use gst::glib::translate::ToGlibPtr;

use super::{available, check, gst_cuda};

/// A device's primary context, retained for the life of the process, and
/// a `GstCudaContext` that wraps it (handed to upstream elements). Never
/// released: GStreamer elements may hold the wrapper (and memory of the
/// context) past any one sink, and the wrapper does not retain.
pub struct Primary {
    pub ordinal: u32,
    pub(super) ctx: CUcontext,
    pub(super) gst_context: *mut c_void,
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
