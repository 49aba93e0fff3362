//! Raw video between GStreamer and a frame ring: the formats both know, and
//! the plane-by-plane, row-by-row copy between a GStreamer frame's layout
//! (`GstVideoInfo` offsets and strides) and a slot's (512-byte pitches,
//! 4 KiB-aligned planes: [`vramring::Geometry`]).

use gst_video::VideoFormat;
use vramring::{Format, Geometry};

/// The ring formats a `video/x-raw` stream can carry, and their
/// GStreamer names. [`Format::Raw`] (opaque bytes) has no video format.
pub const FORMATS: [(Format, VideoFormat); 5] = [
    (Format::Nv12, VideoFormat::Nv12),
    (Format::P010, VideoFormat::P01010le),
    (Format::Gray8, VideoFormat::Gray8),
    (Format::Rgb8, VideoFormat::Rgb),
    (Format::Rgba8, VideoFormat::Rgba),
];

/// The ring format of a GStreamer video format.
pub fn ring_format(f: VideoFormat) -> Option<Format> {
    FORMATS.iter().find(|(_, v)| *v == f).map(|(r, _)| *r)
}

/// The GStreamer video format of a ring format.
pub fn video_format(f: Format) -> Option<VideoFormat> {
    FORMATS.iter().find(|(r, _)| *r == f).map(|(_, v)| *v)
}

/// `video/x-raw` in system memory, every format in [`FORMATS`], any size
/// a ring accepts.
pub fn template_caps() -> gst::Caps {
    gst_video::VideoCapsBuilder::new()
        .format_list(FORMATS.iter().map(|(_, v)| *v))
        .width_range(1..=MAX_DIMENSION)
        .height_range(1..=MAX_DIMENSION)
        .build()
}

/// The same formats and sizes in GStreamer's CUDA memory
/// (`video/x-raw(memory:CUDAMemory)`), first, then [`template_caps`]:
/// upstream CUDA elements (`nvh264dec`, `cudaupload`) negotiate CUDA
/// memory, everything else system memory.
pub fn template_caps_with_cuda() -> gst::Caps {
    let mut caps = gst_video::VideoCapsBuilder::new()
        .features([crate::cuda::CUDA_MEMORY_FEATURE])
        .format_list(FORMATS.iter().map(|(_, v)| *v))
        .width_range(1..=MAX_DIMENSION)
        .height_range(1..=MAX_DIMENSION)
        .build();
    caps.merge(template_caps());
    caps
}

/// Whether `caps` (fixed) are in GStreamer's CUDA memory.
pub fn is_cuda_memory(caps: &gst::CapsRef) -> bool {
    caps.features(0)
        .is_some_and(|f| f.contains(crate::cuda::CUDA_MEMORY_FEATURE))
}

/// The largest side a ring accepts ([`Geometry::new`] refuses more; the
/// library does not export its constant).
const MAX_DIMENSION: i32 = 16384;

/// One plane to copy: where its rows start on each side, their strides,
/// how many bytes of each row and how many rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaneCopy {
    pub src_offset: usize,
    pub src_stride: usize,
    pub dst_offset: usize,
    pub dst_stride: usize,
    pub row_bytes: usize,
    pub rows: usize,
}

/// Why a copy could not be planned or done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyError(pub String);

impl std::fmt::Display for CopyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl PlaneCopy {
    /// Whether the plane's rows lie within `src_len` bytes on the source
    /// side and `dst_len` on the destination side, and a row within each
    /// stride. An empty copy always fits.
    ///
    /// # Errors
    /// What does not fit, in words.
    pub fn fits(&self, src_len: usize, dst_len: usize) -> Result<(), CopyError> {
        let p = self;
        if p.rows == 0 || p.row_bytes == 0 {
            return Ok(());
        }
        if p.row_bytes > p.src_stride || p.row_bytes > p.dst_stride {
            return Err(CopyError(format!(
                "a row of {} bytes exceeds a stride ({} source, {} destination)",
                p.row_bytes, p.src_stride, p.dst_stride
            )));
        }
        let end = |offset: usize, stride: usize| {
            (p.rows - 1)
                .checked_mul(stride)
                .and_then(|v| v.checked_add(offset))
                .and_then(|v| v.checked_add(p.row_bytes))
        };
        match (end(p.src_offset, p.src_stride), end(p.dst_offset, p.dst_stride)) {
            (Some(s), Some(d)) if s <= src_len && d <= dst_len => Ok(()),
            _ => Err(CopyError(format!(
                "plane of {} rows x {} bytes does not fit ({} source bytes, {} destination bytes)",
                p.rows, p.row_bytes, src_len, dst_len
            ))),
        }
    }
}

/// Copies `p.rows` rows of `p.row_bytes` bytes from `src` to `dst`, each
/// side at its own offset and stride. Checks every bound first
/// ([`PlaneCopy::fits`]): nothing is written unless the whole plane fits on
/// both sides.
pub fn copy_plane(src: &[u8], dst: &mut [u8], p: &PlaneCopy) -> Result<(), CopyError> {
    p.fits(src.len(), dst.len())?;
    if p.rows == 0 || p.row_bytes == 0 {
        return Ok(());
    }
    for r in 0..p.rows {
        let s = p.src_offset + r * p.src_stride;
        let d = p.dst_offset + r * p.dst_stride;
        dst[d..d + p.row_bytes].copy_from_slice(&src[s..s + p.row_bytes]);
    }
    Ok(())
}

/// The copies that move a frame between a mapped GStreamer frame and a
/// whole slot of `geometry`, one per plane. `gst` is each GStreamer plane's
/// (stride, bytes), as a mapped `VideoFrame` has them (its own layout, or
/// the `GstVideoMeta`'s); each copy works on that plane's own slice (offset
/// 0) and on the whole slot (the ring plane's offset). `to_ring` says which
/// side is the source. Each plane copies the rows and row bytes both sides
/// have: the ring's `row_bytes` (the format's bytes per row, rounded up to
/// whole chroma pairs) when the GStreamer stride holds them.
pub fn plan(gst: &[(usize, usize)], geometry: &Geometry, to_ring: bool) -> Result<Vec<PlaneCopy>, CopyError> {
    let ring = geometry.planes();
    if ring.len() != gst.len() {
        return Err(CopyError(format!(
            "the frame has {} planes, the ring's {} has {}",
            gst.len(),
            geometry.format.name(),
            ring.len()
        )));
    }
    let mut out = Vec::with_capacity(ring.len());
    for (r, &(g_stride, g_len)) in ring.iter().zip(gst.iter()) {
        let g_rows = g_len.checked_div(g_stride).unwrap_or(0);
        let rows = (r.rows as usize).min(g_rows);
        let row_bytes = (r.row_bytes as usize).min(g_stride);
        let (src_offset, src_stride, dst_offset, dst_stride) = if to_ring {
            (0, g_stride, r.offset as usize, r.pitch as usize)
        } else {
            (r.offset as usize, r.pitch as usize, 0, g_stride)
        };
        out.push(PlaneCopy {
            src_offset,
            src_stride,
            dst_offset,
            dst_stride,
            row_bytes,
            rows,
        });
    }
    Ok(out)
}

/// One contiguous copy that does the whole `plan` when the two layouts
/// differ only by where they start: every plane at the same stride on both
/// sides and at the same distance from the first plane. Each plane `k`
/// starts at `src[k]` and `dst[k]` (absolute addresses, the plane's offset
/// included). Returns `(src, dst, len)`: the span from the lowest plane's
/// first byte to the end of the highest plane's last row. Bytes between
/// planes (stride padding, rows one side skips) are copied too, which is
/// why the caller checks `len` against both memories. One copy call costs
/// the GPU no more and the CPU half of two (ADR 0028's sink).
pub fn span(plan: &[PlaneCopy], src: &[u64], dst: &[u64]) -> Option<(u64, u64, u64)> {
    let live: Vec<(usize, &PlaneCopy)> = plan
        .iter()
        .enumerate()
        .filter(|(_, p)| p.rows > 0 && p.row_bytes > 0)
        .collect();
    let &(first, _) = live.first()?;
    let (src0, dst0) = (*src.get(first)?, *dst.get(first)?);
    let mut lo: Option<(u64, u64)> = None;
    let mut end = 0u64;
    for &(k, p) in &live {
        let (s, d) = (*src.get(k)?, *dst.get(k)?);
        // The same distance from the first plane on both sides.
        if p.src_stride != p.dst_stride || s.wrapping_sub(src0) != d.wrapping_sub(dst0) {
            return None;
        }
        if lo.is_none_or(|(ls, _)| s < ls) {
            lo = Some((s, d));
        }
        let last = (p.rows as u64 - 1)
            .checked_mul(p.src_stride as u64)?
            .checked_add(p.row_bytes as u64)?
            .checked_add(s)?;
        end = end.max(last);
    }
    let (s, d) = lo?;
    Some((s, d, end - s))
}

/// Each plane's (stride, bytes) in a frame of `info`'s own layout.
#[cfg(test)]
fn info_planes(info: &gst_video::VideoInfo) -> Vec<(usize, usize)> {
    let n = info.n_planes() as usize;
    (0..n)
        .map(|k| {
            let end = if k + 1 < n { info.offset()[k + 1] } else { info.size() };
            (info.stride()[k] as usize, end - info.offset()[k])
        })
        .collect()
}

/// The caps of a ring's frames: its format and size, with the framerate
/// and pixel aspect ratio the publisher's trailer gave (0/1 and 1/1
/// without one).
pub fn caps_for(geometry: &Geometry, fps: (u32, u32), par: (u32, u32)) -> Option<gst::Caps> {
    let format = video_format(geometry.format)?;
    let info = gst_video::VideoInfo::builder(format, geometry.width, geometry.height)
        .fps(gst::Fraction::new(fps.0 as i32, fps.1 as i32))
        .par(gst::Fraction::new(par.0 as i32, par.1 as i32))
        .build()
        .ok()?;
    info.to_caps().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ring_format_but_raw_has_a_video_format_and_back() {
        for (r, v) in FORMATS {
            assert_eq!(ring_format(v), Some(r));
            assert_eq!(video_format(r), Some(v));
        }
        assert_eq!(video_format(Format::Raw), None);
        assert_eq!(ring_format(VideoFormat::I420), None);
    }

    #[test]
    fn a_plane_copies_row_by_row_between_strides() {
        let src: Vec<u8> = (0..40).collect();
        let mut dst = vec![0xee; 30];
        let p = PlaneCopy {
            src_offset: 2,
            src_stride: 10,
            dst_offset: 0,
            dst_stride: 8,
            row_bytes: 5,
            rows: 3,
        };
        copy_plane(&src, &mut dst, &p).unwrap();
        assert_eq!(&dst[0..5], &[2, 3, 4, 5, 6]);
        assert_eq!(&dst[5..8], &[0xee; 3], "padding untouched");
        assert_eq!(&dst[8..13], &[12, 13, 14, 15, 16]);
        assert_eq!(&dst[16..21], &[22, 23, 24, 25, 26]);
    }

    #[test]
    fn a_plane_that_does_not_fit_writes_nothing() {
        let src = vec![1u8; 20];
        let mut dst = vec![0u8; 20];
        let p = PlaneCopy {
            src_offset: 0,
            src_stride: 8,
            dst_offset: 0,
            dst_stride: 8,
            row_bytes: 8,
            rows: 3,
        };
        assert!(copy_plane(&src, &mut dst, &p).is_err());
        assert_eq!(dst, vec![0u8; 20]);
        let wide = PlaneCopy {
            row_bytes: 9,
            rows: 1,
            ..p
        };
        assert!(copy_plane(&src, &mut dst, &wide).is_err());
    }

    #[test]
    fn nv12_plans_two_planes_with_the_rings_pitch() {
        gst::init().unwrap();
        let g = Geometry::new(Format::Nv12, 322, 242).unwrap();
        let info = gst_video::VideoInfo::builder(VideoFormat::Nv12, 322, 242)
            .build()
            .unwrap();
        let plan = plan(&info_planes(&info), &g, true).unwrap();
        assert_eq!(plan.len(), 2);
        assert_eq!(plan[0].rows, 242);
        assert_eq!(plan[1].rows, 121);
        assert_eq!(plan[0].row_bytes, 322);
        assert_eq!(plan[0].dst_stride, 512);
        assert_eq!(plan[1].dst_offset as u64, g.planes[1].offset);
        assert_eq!(plan[1].src_offset, 0);
        assert_eq!(plan[1].src_stride, info.stride()[1] as usize);
    }

    #[test]
    fn odd_widths_copy_the_whole_chroma_pair() {
        gst::init().unwrap();
        let g = Geometry::new(Format::Nv12, 321, 241).unwrap();
        let info = gst_video::VideoInfo::builder(VideoFormat::Nv12, 321, 241)
            .build()
            .unwrap();
        let plan = plan(&info_planes(&info), &g, false).unwrap();
        assert_eq!(plan[1].row_bytes, 322, "interleaved UV of 161 pairs");
        assert_eq!(plan[1].rows, 121);
    }

    #[test]
    fn gstreamers_cuda_nv12_layout_is_the_rings_and_copies_as_one_span() {
        gst::init().unwrap();
        let g = Geometry::new(Format::Nv12, 1920, 1080).unwrap();
        // GstCudaBufferPool's NV12: both planes at the texture-aligned
        // pitch, UV right after the luma rows (gstcudamemory.cpp).
        let pitch = g.planes[0].pitch as usize;
        let gst = [(pitch, pitch * 1080), (pitch, pitch * 540)];
        let plan = plan(&gst, &g, true).unwrap();
        let base = 0x7000_0000u64;
        let slot = 0x9000_0000u64;
        let src = [base, base + (pitch * 1080) as u64];
        let dst: Vec<u64> = g.planes().iter().map(|p| slot + p.offset).collect();
        let (s, d, len) = span(&plan, &src, &dst).expect("one span");
        assert_eq!((s, d), (base, slot));
        assert_eq!(len, (pitch * 1619 + 1920) as u64, "to the last UV row's end");
    }

    #[test]
    fn layouts_that_differ_beyond_a_shift_copy_plane_by_plane() {
        gst::init().unwrap();
        let g = Geometry::new(Format::Nv12, 1920, 1080).unwrap();
        let pitch = g.planes[0].pitch as usize;
        let dst: Vec<u64> = g.planes().iter().map(|p| p.offset).collect();
        // Another stride.
        let narrow = plan(&[(1920, 1920 * 1080), (1920, 1920 * 540)], &g, true).unwrap();
        assert_eq!(span(&narrow, &[0, 1920 * 1080], &dst), None);
        // The same stride, the UV plane elsewhere (a decoder's aligned height).
        let tall = plan(&[(pitch, pitch * 1088), (pitch, pitch * 544)], &g, true).unwrap();
        assert_eq!(span(&tall, &[0, (pitch * 1088) as u64], &dst), None);
        // Planes in reverse order keep their distance: one span from the lower.
        let (s, d, len) = span(
            &tall,
            &[(pitch * 544) as u64, 0],
            &[dst[1] + 1000, 1000 + dst[1] - (pitch * 544) as u64],
        )
        .expect("a shift");
        assert_eq!((s, d), (0, 1000 + dst[1] - (pitch * 544) as u64));
        assert_eq!(len, (pitch * 544 + pitch * 1079 + 1920) as u64);
    }

    #[test]
    fn an_empty_plan_has_no_span() {
        assert_eq!(span(&[], &[], &[]), None);
        let none = PlaneCopy {
            src_offset: 0,
            src_stride: 8,
            dst_offset: 0,
            dst_stride: 8,
            row_bytes: 8,
            rows: 0,
        };
        assert_eq!(span(&[none], &[0], &[0]), None);
    }

    #[test]
    fn caps_carry_the_rings_format_and_size() {
        gst::init().unwrap();
        let g = Geometry::new(Format::P010, 64, 48).unwrap();
        let caps = caps_for(&g, (25, 1), (1, 1)).unwrap();
        let info = gst_video::VideoInfo::from_caps(&caps).unwrap();
        assert_eq!(info.format(), VideoFormat::P01010le);
        assert_eq!((info.width(), info.height()), (64, 48));
        assert_eq!(info.fps(), gst::Fraction::new(25, 1));
    }
}
