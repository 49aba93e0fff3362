//! A `GstCudaMemory` buffer mapped for the device.

use std::ffi::c_void;

use cudarc::driver::sys::{CUcontext, CUdeviceptr, CUstream};
use gst::glib;
use gst::glib::translate::ToGlibPtr;

use super::gstcuda::{GstCudaMemoryRaw, GST_MAP_CUDA};
use super::{available, gst_cuda};

/// A buffer of CUDA memory mapped with `GST_MAP_CUDA`: each plane's device
/// address, stride and bytes to the end of the memory, its context and
/// stream. Unmapped on drop.
pub struct MappedCuda {
    frame: gst_video::ffi::GstVideoFrame,
    /// (device address, stride, bytes from the address to the memory's end)
    pub planes: Vec<(CUdeviceptr, usize, usize)>,
    pub(super) context: CUcontext,
    /// The memory's `GstCudaContext` (a GObject; referenced while mapped).
    pub(super) gst_context: *mut c_void,
    pub(super) stream: CUstream,
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
