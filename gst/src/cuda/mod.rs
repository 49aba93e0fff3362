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
//!
//! Files: `gstcuda` (the `dlopen` binding of `libgstcuda-1.0`), `primary`
//! (the primary context and its `GstCudaContext`), `mapped` (a CUDA buffer
//! mapped for the device), `copier` (the sink's copy in), `filler` (the
//! source's copy out).

mod copier;
mod filler;
mod gstcuda;
mod mapped;
mod primary;

use std::sync::OnceLock;

use cudarc::driver::sys::{self as cu, CUcontext, CUdeviceptr, CUresult};
use gst::glib;

use crate::video::PlaneCopy;
pub use copier::Copier;
pub use filler::Filler;
use gstcuda::gst_cuda;
pub use mapped::MappedCuda;
pub use primary::Primary;

/// The caps feature of GStreamer's CUDA memory.
pub const CUDA_MEMORY_FEATURE: &str = "memory:CUDAMemory";
/// The context type of `GstCudaContext` (`GST_CUDA_CONTEXT_TYPE`).
pub const CONTEXT_TYPE: &str = "gst.cuda.context";

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
