//! Frame bytes to an 8-bit image for PNG: YUV 4:2:0 (NV12, P010) to RGB
//! with a documented colour matrix, the other formats copied.
//!
//! YUV → RGB (ITU-R BT.601 / BT.709 / BT.2020 non-constant luminance, with
//! `Kg = 1 - Kr - Kb`):
//!
//! ```text
//! y = (Y - 16) / 219          u = (Cb - 128) / 224      v = (Cr - 128) / 224   (8-bit, limited range)
//! y = (Y - 64) / 876          u = (Cb - 512) / 896      v = (Cr - 512) / 896   (10-bit, limited range)
//! y = Y / 255 (1023)          u = (Cb - 128 (512)) / 255 (1023), v alike       (full range)
//! R = y + 2 (1 - Kr) v
//! B = y + 2 (1 - Kb) u
//! G = (y - Kr R - Kb B) / Kg
//! out = clamp(round(255 * X), 0, 255)
//! ```
//!
//! Chroma is not interpolated: each 2×2 block of pixels uses its one
//! chroma sample. P010 samples are the high 10 bits of little-endian 16-bit
//! words. `auto` picks BT.709 for frames 720 rows high or more (HD) and
//! BT.601 below (SD), limited range: what decoders output for untagged
//! streams.

use vramring::{Format, Geometry};

/// The YUV → RGB matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MatrixArg {
    /// BT.709 for HD (720 rows or more), BT.601 for SD.
    Auto,
    /// ITU-R BT.601 (SD): Kr 0.299, Kb 0.114.
    Bt601,
    /// ITU-R BT.709 (HD): Kr 0.2126, Kb 0.0722.
    Bt709,
    /// ITU-R BT.2020 non-constant luminance: Kr 0.2627, Kb 0.0593.
    Bt2020,
}

/// The YUV quantisation range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RangeArg {
    /// Limited ("TV", "studio") range: Y 16-235, C 16-240 (8-bit).
    Limited,
    /// Full ("PC", "JPEG") range: 0-255.
    Full,
}

/// A resolved matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matrix {
    /// BT.601.
    Bt601,
    /// BT.709.
    Bt709,
    /// BT.2020.
    Bt2020,
}

impl Matrix {
    /// `auto` resolved for a frame `height` rows high.
    pub fn resolve(arg: MatrixArg, height: u32) -> Matrix {
        match arg {
            MatrixArg::Auto if height >= 720 => Matrix::Bt709,
            MatrixArg::Auto => Matrix::Bt601,
            MatrixArg::Bt601 => Matrix::Bt601,
            MatrixArg::Bt709 => Matrix::Bt709,
            MatrixArg::Bt2020 => Matrix::Bt2020,
        }
    }
    /// `(Kr, Kb)`.
    fn k(self) -> (f64, f64) {
        match self {
            Matrix::Bt601 => (0.299, 0.114),
            Matrix::Bt709 => (0.2126, 0.0722),
            Matrix::Bt2020 => (0.2627, 0.0593),
        }
    }
    /// `"bt601"`, `"bt709"` or `"bt2020"`.
    pub fn name(self) -> &'static str {
        match self {
            Matrix::Bt601 => "bt601",
            Matrix::Bt709 => "bt709",
            Matrix::Bt2020 => "bt2020",
        }
    }
}

impl RangeArg {
    /// `"limited"` or `"full"`.
    pub fn name(self) -> &'static str {
        match self {
            RangeArg::Limited => "limited",
            RangeArg::Full => "full",
        }
    }
}

/// An 8-bit image, rows packed.
#[derive(Debug)]
pub struct Image {
    /// Pixels per row.
    pub width: u32,
    /// Rows.
    pub height: u32,
    /// 1 (gray), 3 (RGB) or 4 (RGBA).
    pub channels: u8,
    /// `width * height * channels` bytes.
    pub data: Vec<u8>,
    /// Whether a YUV → RGB conversion was made.
    pub converted: bool,
}

struct Yuv {
    kr: f64,
    kb: f64,
    y0: f64,
    ys: f64,
    c0: f64,
    cs: f64,
}

impl Yuv {
    fn new(m: Matrix, range: RangeArg, bits: u32) -> Yuv {
        let (kr, kb) = m.k();
        let scale = f64::from(1u32 << (bits - 8));
        let c0 = 128.0 * scale;
        let (y0, ys, cs) = match range {
            RangeArg::Limited => (16.0 * scale, 219.0 * scale, 224.0 * scale),
            RangeArg::Full => (0.0, f64::from((1u32 << bits) - 1), f64::from((1u32 << bits) - 1)),
        };
        Yuv { kr, kb, y0, ys, c0, cs }
    }

    fn rgb(&self, y: u32, cb: u32, cr: u32) -> [u8; 3] {
        let y = (f64::from(y) - self.y0) / self.ys;
        let u = (f64::from(cb) - self.c0) / self.cs;
        let v = (f64::from(cr) - self.c0) / self.cs;
        let r = y + 2.0 * (1.0 - self.kr) * v;
        let b = y + 2.0 * (1.0 - self.kb) * u;
        let g = (y - self.kr * r - self.kb * b) / (1.0 - self.kr - self.kb);
        let q = |x: f64| (x * 255.0).round().clamp(0.0, 255.0) as u8;
        [q(r), q(g), q(b)]
    }
}

fn plane<'a>(g: &Geometry, bytes: &'a [u8], k: usize) -> Result<(&'a [u8], usize), String> {
    let p = g.planes[k];
    let end = p.offset + p.pitch * p.rows;
    let slice = bytes
        .get(p.offset as usize..end as usize)
        .ok_or_else(|| format!("plane {k} ends at byte {end}, the frame has {}", bytes.len()))?;
    Ok((slice, p.pitch as usize))
}

/// Converts one frame (`bytes`, planes as in `g`) to an 8-bit image.
///
/// # Errors
/// For `raw` frames (no pixel layout) and frames shorter than their planes.
pub fn to_image(g: &Geometry, bytes: &[u8], matrix: Matrix, range: RangeArg) -> Result<Image, String> {
    let (w, h) = (g.width as usize, g.height as usize);
    let mut img = Image {
        width: g.width,
        height: g.height,
        channels: 3,
        data: Vec::new(),
        converted: false,
    };
    match g.format {
        Format::Nv12 | Format::P010 => {
            let ten = g.format == Format::P010;
            let yuv = Yuv::new(matrix, range, if ten { 10 } else { 8 });
            let (yp, ypitch) = plane(g, bytes, 0)?;
            let (cp, cpitch) = plane(g, bytes, 1)?;
            let sample = |row: &[u8], i: usize| -> u32 {
                if ten {
                    u32::from(u16::from_le_bytes([row[2 * i], row[2 * i + 1]]) >> 6)
                } else {
                    u32::from(row[i])
                }
            };
            img.data.reserve(w * h * 3);
            for r in 0..h {
                let yrow = &yp[r * ypitch..];
                let crow = &cp[(r / 2) * cpitch..];
                for x in 0..w {
                    let c = (x / 2) * 2;
                    img.data
                        .extend_from_slice(&yuv.rgb(sample(yrow, x), sample(crow, c), sample(crow, c + 1)));
                }
            }
            img.converted = true;
        }
        Format::Gray8 | Format::Rgb8 | Format::Rgba8 => {
            let ch = match g.format {
                Format::Gray8 => 1,
                Format::Rgb8 => 3,
                _ => 4,
            };
            img.channels = ch as u8;
            let (p, pitch) = plane(g, bytes, 0)?;
            for r in 0..h {
                img.data.extend_from_slice(&p[r * pitch..r * pitch + w * ch]);
            }
        }
        other => {
            return Err(format!(
                "a {} frame has no pixel layout to draw; snapshot takes nv12, p010, gray8, rgb8 and rgba8",
                other.name()
            ))
        }
    }
    Ok(img)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limited_range_black_white_and_primaries_map_to_their_rgb() {
        let y = Yuv::new(Matrix::Bt709, RangeArg::Limited, 8);
        assert_eq!(y.rgb(16, 128, 128), [0, 0, 0]);
        assert_eq!(y.rgb(235, 128, 128), [255, 255, 255]);
        // BT.709 limited-range red: Y 63, Cb 102, Cr 240.
        let red = y.rgb(63, 102, 240);
        assert!(red[0] >= 254 && red[1] <= 1 && red[2] <= 1, "{red:?}");
        let ten = Yuv::new(Matrix::Bt601, RangeArg::Limited, 10);
        assert_eq!(ten.rgb(940, 512, 512), [255, 255, 255]);
        assert_eq!(ten.rgb(64, 512, 512), [0, 0, 0]);
    }

    #[test]
    fn auto_is_bt709_from_720_rows_and_bt601_below() {
        assert_eq!(Matrix::resolve(MatrixArg::Auto, 720), Matrix::Bt709);
        assert_eq!(Matrix::resolve(MatrixArg::Auto, 576), Matrix::Bt601);
    }
}
