//! A decoded picture, mapped for the sink call, and its copy out into a ring
//! slot or host memory.

use std::ffi::c_void;

use super::{check, sys, Decoder, StreamInfo};
use crate::memory::cuda::{CuStream, Driver, RealDriver};
use crate::memory::view::{DeviceView, Stream};
use crate::{BackendKind, Error, Format, Result, SlotMut};

/// A decoded picture, mapped, valid during the sink call it is passed to.
#[derive(Debug)]
pub struct DecodedFrame<'d> {
    pub(super) ptr: u64,
    pub(super) pitch: u32,
    pub(super) info: StreamInfo,
    pub(super) timestamp: i64,
    pub(super) stream: CuStream,
    pub(super) memcpy2d: sys::Memcpy2DAsync,
    pub(super) index: u64,
    pub(super) _decoder: std::marker::PhantomData<&'d Decoder>,
}

/// Bytes from a plane's first displayed byte to its last: `rows - 1` pitches
/// and one row of `width`.
fn plane_span(rows: u64, pitch: u32, width: u32) -> u64 {
    rows.saturating_sub(1) * u64::from(pitch) + if rows == 0 { 0 } else { u64::from(width) }
}

impl DecodedFrame<'_> {
    /// Display width (cropped).
    pub fn width(&self) -> u32 {
        self.info.width
    }
    /// Display height (cropped).
    pub fn height(&self) -> u32 {
        self.info.height
    }
    /// Bytes per row of the decoded surface.
    pub fn pitch(&self) -> u32 {
        self.pitch
    }
    /// The stream's properties.
    pub fn info(&self) -> &StreamInfo {
        &self.info
    }
    /// The timestamp given with the access unit that held this picture.
    pub fn timestamp(&self) -> i64 {
        self.timestamp
    }
    /// Pictures output before this one by this decoder (display order).
    pub fn index(&self) -> u64 {
        self.index
    }
    /// The displayed luma plane: `height` rows of `width` bytes, `pitch`
    /// apart, from its first displayed byte.
    pub fn luma(&self) -> DeviceView<'_> {
        let rows = u64::from(self.height());
        DeviceView::new(self.luma_addr(), plane_span(rows, self.pitch, self.width()))
    }
    /// The displayed chroma plane (interleaved UV): `height / 2` rows of
    /// `width` bytes, `pitch` apart, from its first displayed byte.
    pub fn chroma(&self) -> DeviceView<'_> {
        let rows = u64::from(self.height() / 2);
        DeviceView::new(self.chroma_addr(), plane_span(rows, self.pitch, self.width()))
    }
    /// Device address of the first displayed luma byte.
    pub(crate) fn luma_addr(&self) -> u64 {
        self.ptr + u64::from(self.info.crop_top) * u64::from(self.pitch) + u64::from(self.info.crop_left)
    }
    /// Device address of the first displayed chroma (interleaved UV) byte:
    /// the chroma plane follows the luma plane's `coded_height` rows.
    pub(crate) fn chroma_addr(&self) -> u64 {
        let row = u64::from(self.info.coded_height) + u64::from(self.info.crop_top / 2);
        self.ptr + row * u64::from(self.pitch) + u64::from(self.info.crop_left)
    }
    /// The decoder's stream: the copies are enqueued on it; pass it to
    /// `SlotMut::publish_cuda`.
    pub fn stream(&self) -> Stream<'_> {
        // SAFETY: the decoder's stream outlives every frame it decodes.
        unsafe { Stream::from_raw(self.stream.as_raw()) }
    }

    /// Enqueues the copy of the displayed picture into `slot` (an NV12 slot
    /// of the same size): one 2-D copy per plane, surface pitch to slot
    /// pitch, on [`DecodedFrame::stream`]. On a CUDA ring, commit with
    /// `slot.publish_cuda(meta, frame.stream())`; on a host ring the copy is
    /// complete when this returns (the stream is synchronised) and
    /// `slot.publish(meta)` commits.
    ///
    /// The ring must be on the decoder's device.
    ///
    /// # Errors
    /// [`Error::Config`] when the slot is not NV12 of the frame's size;
    /// [`Error::Driver`] when the copy cannot be enqueued.
    pub fn copy_to_slot(&self, slot: &mut SlotMut<'_>) -> Result<()> {
        let g = *slot.geometry();
        if g.format != Format::Nv12 || g.width != self.width() || g.height != self.height() {
            return Err(Error::Config(format!(
                "the decoded frame is NV12 {}x{} but the ring's slots are {} {}x{}; make the ring NV12 of the decoded size",
                self.width(),
                self.height(),
                g.format.name(),
                g.width,
                g.height
            )));
        }
        let host = slot.backend() == BackendKind::Host;
        let planes = g.planes();
        let (y, uv) = (planes[0], planes[1]);
        let dst_y = slot.plane_addr(0)?;
        let dst_uv = slot.plane_addr(1)?;
        // SAFETY: both destination ranges are the slot's planes (rows x
        // pitch inside the slot, which this `&mut` loan owns), in device
        // memory of this device's primary context or in the host pool's
        // mapping; the sources are the mapped surface's display rectangle.
        unsafe {
            self.copy_plane(
                self.luma_addr(),
                dst_y,
                y.pitch,
                u64::from(self.width()),
                u64::from(self.height()),
                host,
            )?;
            self.copy_plane(
                self.chroma_addr(),
                dst_uv,
                uv.pitch,
                u64::from(self.width()),
                u64::from(self.height() / 2),
                host,
            )?;
        }
        if host {
            let d = RealDriver::shared()?;
            // SAFETY: the decoder's stream is live for this frame's lifetime.
            unsafe { d.stream_synchronize(self.stream) }?;
        }
        Ok(())
    }

    /// Copies the displayed picture into host memory, tightly packed (Y rows
    /// of `width` bytes, then UV rows), and waits for the copy: what a
    /// software decoder outputs as raw NV12.
    ///
    /// # Errors
    /// [`Error::Driver`] when the copy fails.
    pub fn copy_to_host(&self, out: &mut Vec<u8>) -> Result<()> {
        let (w, h) = (u64::from(self.width()), u64::from(self.height()));
        out.clear();
        out.resize((w * h * 3 / 2) as usize, 0);
        let base = out.as_mut_ptr() as u64;
        // SAFETY: `out` holds w*h*3/2 bytes: the Y rows at 0, the UV rows
        // at w*h, both packed with pitch w; the stream is synchronised
        // before `out` is touched again.
        unsafe {
            self.copy_plane(self.luma_addr(), base, w, w, h, true)?;
            self.copy_plane(self.chroma_addr(), base + w * h, w, w, h / 2, true)?;
            RealDriver::shared()?.stream_synchronize(self.stream)?;
        }
        Ok(())
    }

    /// One `cuMemcpy2DAsync` of `rows` rows of `width` bytes from the
    /// surface to `dst` (device or host) with pitch `dst_pitch`.
    ///
    /// # Safety
    /// `dst .. dst + dst_pitch * rows` is writable memory of that kind that
    /// no Rust reference covers until the stream has finished the copy.
    unsafe fn copy_plane(&self, src: u64, dst: u64, dst_pitch: u64, width: u64, rows: u64, host: bool) -> Result<()> {
        use cudarc::driver::sys::{CUmemorytype, CUDA_MEMCPY2D};
        let c = CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src,
            srcArray: std::ptr::null_mut(),
            srcPitch: self.pitch as usize,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: if host {
                CUmemorytype::CU_MEMORYTYPE_HOST
            } else {
                CUmemorytype::CU_MEMORYTYPE_DEVICE
            },
            dstHost: if host {
                dst as usize as *mut c_void
            } else {
                std::ptr::null_mut()
            },
            dstDevice: if host { 0 } else { dst },
            dstArray: std::ptr::null_mut(),
            dstPitch: dst_pitch as usize,
            WidthInBytes: width as usize,
            Height: rows as usize,
        };
        // SAFETY: `c` describes a copy from the mapped surface (valid until
        // unmap, which waits for the stream) to memory the caller vouches
        // for; the stream is the decoder's, live; the decoder's context is
        // current during the sink call.
        check("cuMemcpy2DAsync", unsafe {
            (self.memcpy2d)(&c, self.stream.as_raw().cast())
        })
    }
}
