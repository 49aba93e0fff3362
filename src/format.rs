//! Frame formats and the plane layout of a slot.
//!
//! Alignment rule (documented in `proto/PROTOCOL.md`): every plane pitch is a
//! multiple of [`PITCH_ALIGN`] (512 bytes, which satisfies NVDEC output
//! surfaces, NVENC input surfaces and CUDA's 2D texture pitch), every plane
//! starts at a multiple of [`PLANE_ALIGN`] (4 KiB) inside its slot, and the
//! slot stride is a multiple of [`SLOT_ALIGN`] (64 KiB). The CUDA backend
//! additionally rounds the whole pool up to the device's allocation
//! granularity, paid once for the pool, not per slot.

use crate::error::{Error, Result};

/// Every plane pitch is a multiple of this many bytes.
pub const PITCH_ALIGN: u64 = 512;
/// Every plane starts at a multiple of this many bytes inside its slot.
pub const PLANE_ALIGN: u64 = 4096;
/// The slot stride is a multiple of this many bytes.
pub const SLOT_ALIGN: u64 = 64 * 1024;
/// The most planes a frame has.
pub const MAX_PLANES: usize = 4;
/// Largest accepted width or height, in pixels.
pub const MAX_DIMENSION: u32 = 16384;
/// Largest accepted raw frame, in bytes (1 GiB).
pub const MAX_RAW_BYTES: u32 = 1 << 30;

/// Pixel format of a frame. Stored in shared memory as its `u32` code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// Opaque bytes: `width` is the byte length, `height` is 1.
    Raw,
    /// 8-bit luma only.
    Gray8,
    /// 8-bit 4:2:0, Y plane then interleaved UV plane (NVDEC's output).
    Nv12,
    /// 10-bit 4:2:0 in 16-bit words, Y plane then interleaved UV plane.
    P010,
    /// Packed 8-bit R, G, B.
    Rgb8,
    /// Packed 8-bit R, G, B, A.
    Rgba8,
}

impl Format {
    /// The wire code of this format.
    pub const fn code(self) -> u32 {
        match self {
            Format::Raw => 1,
            Format::Gray8 => 2,
            Format::Nv12 => 3,
            Format::P010 => 4,
            Format::Rgb8 => 5,
            Format::Rgba8 => 6,
        }
    }

    /// The format with wire code `code`, if any.
    pub const fn from_code(code: u32) -> Option<Format> {
        Some(match code {
            1 => Format::Raw,
            2 => Format::Gray8,
            3 => Format::Nv12,
            4 => Format::P010,
            5 => Format::Rgb8,
            6 => Format::Rgba8,
            _ => return None,
        })
    }

    /// Bytes of each plane's row and rows of each plane, for `width`×`height`.
    /// Returns `(plane count, [(row bytes, rows); MAX_PLANES])`.
    fn planes(self, width: u32, height: u32) -> (usize, [(u64, u64); MAX_PLANES]) {
        let (w, h) = (width as u64, height as u64);
        let mut p = [(0u64, 0u64); MAX_PLANES];
        let n = match self {
            Format::Raw => {
                p[0] = (w, 1);
                1
            }
            Format::Gray8 => {
                p[0] = (w, h);
                1
            }
            Format::Nv12 => {
                let we = w.div_ceil(2) * 2;
                p[0] = (we, h);
                p[1] = (we, h.div_ceil(2));
                2
            }
            Format::P010 => {
                let we = w.div_ceil(2) * 2;
                p[0] = (we * 2, h);
                p[1] = (we * 2, h.div_ceil(2));
                2
            }
            Format::Rgb8 => {
                p[0] = (w * 3, h);
                1
            }
            Format::Rgba8 => {
                p[0] = (w * 4, h);
                1
            }
        };
        (n, p)
    }

    /// Short lowercase name, as the CLI prints it.
    pub const fn name(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Gray8 => "gray8",
            Format::Nv12 => "nv12",
            Format::P010 => "p010",
            Format::Rgb8 => "rgb8",
            Format::Rgba8 => "rgba8",
        }
    }
}

impl std::str::FromStr for Format {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "raw" => Format::Raw,
            "gray8" | "gray" => Format::Gray8,
            "nv12" => Format::Nv12,
            "p010" => Format::P010,
            "rgb8" | "rgb" => Format::Rgb8,
            "rgba8" | "rgba" => Format::Rgba8,
            other => return Err(Error::Config(format!("unknown format {other:?}"))),
        })
    }
}

/// One plane of a slot: where it starts in the slot, its pitch, its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Plane {
    /// Byte offset of the plane from the start of the slot.
    pub offset: u64,
    /// Bytes from one row to the next (a multiple of [`PITCH_ALIGN`]).
    pub pitch: u64,
    /// Bytes of pixel data in one row (at most `pitch`).
    pub row_bytes: u64,
    /// Number of rows.
    pub rows: u64,
}

impl Plane {
    /// Bytes spanned by the plane, `pitch * rows`.
    pub const fn span(&self) -> u64 {
        self.pitch * self.rows
    }
}

/// The geometry of every slot of a ring: format, size and plane layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Pixel format.
    pub format: Format,
    /// Width in pixels (bytes for [`Format::Raw`]).
    pub width: u32,
    /// Height in rows (1 for [`Format::Raw`]).
    pub height: u32,
    /// Number of planes in use.
    pub plane_count: usize,
    /// The planes; entries past `plane_count` are zero.
    pub planes: [Plane; MAX_PLANES],
    /// Bytes from the start of the slot to the end of the last plane.
    pub frame_bytes: u64,
    /// Bytes between consecutive slots (a multiple of [`SLOT_ALIGN`]).
    pub slot_stride: u64,
}

impl Geometry {
    /// The layout for a `width`×`height` frame of `format`.
    ///
    /// # Errors
    /// [`Error::Config`] when a dimension is zero or too large.
    pub fn new(format: Format, width: u32, height: u32) -> Result<Self> {
        let height = if format == Format::Raw { 1 } else { height };
        if width == 0 || height == 0 {
            return Err(Error::Config(format!("frame size {width}x{height} has a zero side")));
        }
        if format == Format::Raw {
            if width > MAX_RAW_BYTES {
                return Err(Error::Config(format!(
                    "raw frame of {width} bytes exceeds {MAX_RAW_BYTES}"
                )));
            }
        } else if width > MAX_DIMENSION || height > MAX_DIMENSION {
            return Err(Error::Config(format!(
                "frame size {width}x{height} exceeds {MAX_DIMENSION}x{MAX_DIMENSION}"
            )));
        }
        let (plane_count, dims) = format.planes(width, height);
        let mut planes = [Plane::default(); MAX_PLANES];
        let mut offset = 0u64;
        for (plane, &(row_bytes, rows)) in planes.iter_mut().zip(dims.iter()).take(plane_count) {
            let pitch = row_bytes.next_multiple_of(PITCH_ALIGN);
            *plane = Plane {
                offset,
                pitch,
                row_bytes,
                rows,
            };
            offset = (offset + pitch * rows).next_multiple_of(PLANE_ALIGN);
        }
        let last = planes[plane_count - 1];
        let frame_bytes = last.offset + last.span();
        let slot_stride = frame_bytes.next_multiple_of(SLOT_ALIGN);
        Ok(Geometry {
            format,
            width,
            height,
            plane_count,
            planes,
            frame_bytes,
            slot_stride,
        })
    }

    /// The planes in use.
    pub fn planes(&self) -> &[Plane] {
        &self.planes[..self.plane_count]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nv12_1080p_has_aligned_pitch_and_half_height_chroma() {
        let g = Geometry::new(Format::Nv12, 1920, 1080).unwrap();
        assert_eq!(g.plane_count, 2);
        assert_eq!(g.planes[0].pitch, 2048);
        assert_eq!(g.planes[0].rows, 1080);
        assert_eq!(g.planes[1].rows, 540);
        assert_eq!(g.planes[1].offset % PLANE_ALIGN, 0);
        assert!(g.planes[1].offset >= 2048 * 1080);
        assert_eq!(g.slot_stride % SLOT_ALIGN, 0);
        assert!(g.slot_stride >= g.frame_bytes);
    }

    #[test]
    fn every_format_round_trips_its_code_and_aligns_every_plane() {
        for f in [
            Format::Raw,
            Format::Gray8,
            Format::Nv12,
            Format::P010,
            Format::Rgb8,
            Format::Rgba8,
        ] {
            assert_eq!(Format::from_code(f.code()), Some(f));
            let g = Geometry::new(f, 641, 359).unwrap();
            for p in g.planes() {
                assert_eq!(p.pitch % PITCH_ALIGN, 0);
                assert_eq!(p.offset % PLANE_ALIGN, 0);
                assert!(p.row_bytes <= p.pitch);
            }
        }
        assert_eq!(Format::from_code(0), None);
        assert_eq!(Format::from_code(99), None);
    }

    #[test]
    fn zero_or_huge_sizes_are_refused() {
        assert!(Geometry::new(Format::Nv12, 0, 10).is_err());
        assert!(Geometry::new(Format::Nv12, 20000, 10).is_err());
        assert!(Geometry::new(Format::Raw, MAX_RAW_BYTES + 1, 1).is_err());
    }
}
