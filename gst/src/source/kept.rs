//! `vramringsrc`'s zero-copy output (ADR 0028): a frame a queued push
//! subscriber keeps (`Frame::hold`) goes downstream as the subscriber's own
//! push buffer, laid out as the ring lays it out (a `GstVideoMeta` and,
//! for CUDA memory, the memory's own video info say where the planes are),
//! and the buffer is let go when GStreamer frees the memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use gst::glib::translate::ToGlibPtr;
use vramring::{FrameHold, Geometry};

/// What a buffer needs of a frame besides its bytes.
pub(super) struct Facts {
    pub seq: u64,
    pub pts: i64,
    pub commit_ns: u64,
    pub user: Vec<u8>,
    pub skipped: u64,
    pub geometry: Geometry,
    /// The ring's backend, and its GPU (for a CUDA ring).
    pub backend: vramring::BackendKind,
    pub device_uuid: [u8; 16],
}

impl Facts {
    pub fn of(frame: &vramring::Frame<'_>) -> Facts {
        Facts {
            seq: frame.seq(),
            pts: frame.pts(),
            commit_ns: frame.commit_ns(),
            user: frame.user(),
            skipped: frame.skipped(),
            geometry: *frame.geometry(),
            backend: if frame.device().is_some() {
                vramring::BackendKind::Cuda
            } else {
                vramring::BackendKind::Host
            },
            device_uuid: frame.info().device_uuid(),
        }
    }
}

/// `info` (the caps' video info) with the ring's plane offsets, strides
/// and size: the layout of a frame in a slot or push buffer.
pub(super) fn ring_info(info: &gst_video::VideoInfo, geometry: &Geometry) -> gst_video::ffi::GstVideoInfo {
    let ptr: *const gst_video::ffi::GstVideoInfo = info.to_glib_none().0;
    // SAFETY: a valid GstVideoInfo, copied by value (a plain C struct).
    let mut raw = unsafe { *ptr };
    for (k, p) in geometry.planes().iter().enumerate().take(raw.offset.len()) {
        raw.offset[k] = p.offset as usize;
        raw.stride[k] = p.pitch as i32;
    }
    raw.size = geometry.frame_bytes as usize;
    raw
}

/// Whether GStreamer's CUDA elements read a frame of `geometry` right from
/// wrapped memory: each plane starts where the one before ends, with a
/// pitch in proportion to its row (NVENC reads planes from the first
/// pitch and the height, ignoring offsets), and the frame is whole rows of
/// the first pitch (a host map copies `size / stride[0]` rows). The ring
/// aligns planes to 4 KiB, so this holds at 1080p, not at every size.
pub(super) fn cuda_layout(geometry: &Geometry) -> bool {
    let planes = geometry.planes();
    let Some(first) = planes.first() else { return false };
    first.pitch > 0
        && geometry.frame_bytes % first.pitch == 0
        && planes.windows(2).all(|w| w[1].offset == w[0].offset + w[0].span())
        && planes
            .iter()
            .all(|p| p.pitch * first.row_bytes == first.pitch * p.row_bytes)
}

/// Whether the ring lays a frame out as GStreamer's default layout for
/// `info` does (then downstream needs no video meta to read it).
pub(super) fn default_layout(info: &gst_video::VideoInfo, geometry: &Geometry) -> bool {
    let planes = geometry.planes();
    planes.len() == info.n_planes() as usize
        && planes
            .iter()
            .enumerate()
            .all(|(k, p)| info.offset()[k] == p.offset as usize && info.stride()[k] as u64 == p.pitch)
}

/// Tells downstream where the ring's planes are (`layout`: [`ring_info`]).
pub(super) fn add_ring_meta(
    buffer: &mut gst::BufferRef,
    info: &gst_video::VideoInfo,
    layout: &gst_video::ffi::GstVideoInfo,
) -> Result<(), String> {
    let n = info.n_planes() as usize;
    let strides: Vec<i32> = layout.stride[..n].to_vec();
    gst_video::VideoMeta::add_full(
        buffer,
        gst_video::VideoFrameFlags::empty(),
        info.format(),
        info.width(),
        info.height(),
        &layout.offset[..n],
        &strides,
    )
    .map(|_| ())
    .map_err(|e| format!("video meta of the ring's layout: {e}"))
}

/// A kept frame lent downstream: counted in `lent` until GStreamer frees
/// its memory (the source falls back to copies when downstream keeps
/// buffers and its queue runs dry, see `VramringSrc::starved`).
pub(super) struct Lent {
    hold: FrameHold,
    lent: Arc<AtomicUsize>,
}

impl Lent {
    pub fn new(hold: FrameHold, lent: &Arc<AtomicUsize>) -> Lent {
        // Relaxed: a count for a heuristic.
        lent.fetch_add(1, Ordering::Relaxed);
        Lent {
            hold,
            lent: Arc::clone(lent),
        }
    }

    /// The kept frame's device memory, on a CUDA ring.
    pub fn device(&self) -> Option<vramring::cuda::DeviceView<'_>> {
        self.hold.device()
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        // Relaxed: as above.
        self.lent.fetch_sub(1, Ordering::Relaxed);
    }
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        self.hold.host_bytes().unwrap_or_default()
    }
}

/// System memory that is the lent host frame itself (`None` for a frame of
/// a CUDA ring).
pub(super) fn host_memory(lent: Lent) -> Option<gst::Memory> {
    lent.hold.host_bytes()?;
    // Locked read-only: downstream copies before it writes.
    Some(gst::Memory::from_slice(lent))
}

#[cfg(test)]
mod tests {
    use super::cuda_layout;
    use vramring::{Format, Geometry};

    fn layout(format: Format, width: u32, height: u32) -> bool {
        cuda_layout(&Geometry::new(format, width, height).expect("a geometry"))
    }

    #[test]
    fn wrapped_cuda_memory_is_only_made_where_gstreamer_reads_the_planes_right() {
        // 1080p: the 4 KiB plane alignment adds no gap.
        assert!(layout(Format::Nv12, 1920, 1080));
        assert!(layout(Format::P010, 1920, 1080));
        assert!(layout(Format::Rgba8, 1920, 1080));
        // A gap before the chroma plane (NVENC would read it from pitch x
        // height): copied instead.
        assert!(!layout(Format::Nv12, 1280, 721));
        assert!(!layout(Format::P010, 1280, 721));
    }
}
