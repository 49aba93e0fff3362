//! The `dlopen` binding of the few `libgstcuda-1.0` calls gstreamer-rs does
//! not bind, and the public part of `GstCudaMemory` they hand out.

use std::ffi::c_void;
use std::sync::OnceLock;

use cudarc::driver::sys::{CUcontext, CUdevice, CUdeviceptr, CUstream};
use gst::glib;

/// `GST_MAP_CUDA` (`gstcudamemory.h`): map a `GstCudaMemory` for its
/// `CUdeviceptr` instead of a host copy.
pub(super) const GST_MAP_CUDA: gst::ffi::GstMapFlags = gst::ffi::GST_MAP_FLAG_LAST << 1;

/// `struct _GstCudaMemory` (`gstcudamemory.h`, public since 1.22): the
/// `GstMemory`, then the public `context` and `info`.
#[repr(C)]
pub(super) struct GstCudaMemoryRaw {
    mem: gst::ffi::GstMemory,
    pub(super) context: *mut c_void,
    info: gst_video::ffi::GstVideoInfo,
    private: *mut c_void,
}

/// The functions of `libgstcuda-1.0` the elements call.
pub(super) struct GstCudaLib {
    _lib: libloading::Library,
    pub(super) is_cuda_memory: unsafe extern "C" fn(*mut gst::ffi::GstMemory) -> glib::ffi::gboolean,
    /// Since 1.24; absent means every memory uses the default stream.
    pub(super) memory_get_stream: Option<unsafe extern "C" fn(*mut GstCudaMemoryRaw) -> *mut c_void>,
    pub(super) stream_get_handle: Option<unsafe extern "C" fn(*mut c_void) -> CUstream>,
    pub(super) context_get_handle: unsafe extern "C" fn(*mut c_void) -> CUcontext,
    pub(super) context_new_wrapped: unsafe extern "C" fn(CUcontext, CUdevice) -> *mut c_void,
    pub(super) handle_context_query:
        unsafe extern "C" fn(*mut gst::ffi::GstElement, *mut gst::ffi::GstQuery, *mut c_void) -> glib::ffi::gboolean,
    /// `vramringsrc`'s CUDA output: a pool of `GstCudaMemory` buffers.
    pub(super) buffer_pool_new: unsafe extern "C" fn(*mut c_void) -> *mut gst::ffi::GstBufferPool,
    /// Fills libgstcuda's table of driver calls, which only the nvcodec
    /// plugin's init fills otherwise: without it, a process with no
    /// nvcodec element aborts at its first CUDA call.
    pub(super) load_library: unsafe extern "C" fn() -> glib::ffi::gboolean,
    /// `vramringsrc`'s zero-copy output: a `GstCudaMemory` around device
    /// memory it does not own (since 1.24).
    pub(super) alloc_wrapped: Option<
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

pub(super) fn gst_cuda() -> Option<&'static GstCudaLib> {
    static LIB: OnceLock<Option<GstCudaLib>> = OnceLock::new();
    LIB.get_or_init(|| GstCudaLib::open().ok()).as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `libgstcuda-1.0` ships with the bad plugins, which these tests need
    /// anyway (`.ci/run` installs them).
    #[test]
    fn every_symbol_resolves_in_the_installed_libgstcuda() {
        if let Err(e) = GstCudaLib::open() {
            panic!("libgstcuda-1.0 (gstreamer1.0-plugins-bad) is missing or lacks a symbol: {e}");
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
