//! The stream's codec, the decoder's options and what it learns from the
//! stream's sequence header.

use std::ffi::c_uint;

use super::sys;
use crate::{Error, Result};

/// The codec of the elementary stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Codec {
    /// H.264 / AVC, Annex-B.
    H264,
    /// H.265 / HEVC, Annex-B.
    Hevc,
}

impl Codec {
    pub(super) fn raw(self) -> c_uint {
        match self {
            Codec::H264 => sys::CODEC_H264,
            Codec::Hevc => sys::CODEC_HEVC,
        }
    }

    /// Name, as a person says it.
    pub const fn name(self) -> &'static str {
        match self {
            Codec::H264 => "H.264",
            Codec::Hevc => "HEVC",
        }
    }

    pub(super) fn from_raw(raw: c_uint) -> String {
        match raw {
            sys::CODEC_H264 => "H.264".into(),
            sys::CODEC_HEVC => "HEVC".into(),
            sys::CODEC_AV1 => "AV1".into(),
            n => format!("codec {n}"),
        }
    }
}

impl std::str::FromStr for Codec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "h264" | "h.264" | "avc" => Ok(Codec::H264),
            "h265" | "h.265" | "hevc" => Ok(Codec::Hevc),
            other => Err(Error::Config(format!("unknown codec {other:?}: use h264 or hevc"))),
        }
    }
}

/// How to make a [`Decoder`](super::Decoder).
#[derive(Debug, Clone)]
pub struct DecoderOptions {
    /// The stream's codec.
    pub codec: Codec,
    /// CUDA device ordinal (in this process) to decode on; use the ring's.
    pub device: u32,
    /// Pictures the parser may hold back before display (NVDEC's
    /// `ulMaxDisplayDelay`): 0 gives the lowest latency, 1 to 4 let decode
    /// run ahead of the copy out.
    pub display_delay: u32,
    /// Decode surfaces beyond the stream's minimum (headroom for the
    /// display delay and the copy out).
    pub extra_surfaces: u32,
    /// Whether each [`Decoder::decode`](super::Decoder::decode) call holds
    /// exactly one access unit (`CUVID_PKT_ENDOFPICTURE`: the picture
    /// decodes at once). With `false`, any chunking is fine and a picture
    /// decodes when the next one starts.
    pub access_units: bool,
    /// Units of the timestamps passed in, in Hz (the parser's
    /// `ulClockRate`); 90 kHz like the packet ring.
    pub clock_rate: u32,
}

impl DecoderOptions {
    /// Defaults for `codec`: device 0, display delay 1, 4 extra surfaces,
    /// whole access units, 90 kHz timestamps.
    pub fn new(codec: Codec) -> Self {
        DecoderOptions {
            codec,
            device: 0,
            display_delay: 1,
            extra_surfaces: 4,
            access_units: true,
            clock_rate: 90_000,
        }
    }
    /// Sets the device ordinal.
    pub fn device(mut self, ordinal: u32) -> Self {
        self.device = ordinal;
        self
    }
    /// Sets the display delay.
    pub fn display_delay(mut self, pictures: u32) -> Self {
        self.display_delay = pictures;
        self
    }
    /// Sets whether each decode call holds one whole access unit.
    pub fn access_units(mut self, yes: bool) -> Self {
        self.access_units = yes;
        self
    }
}

/// What the decoder learnt from the stream's sequence header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamInfo {
    /// The codec.
    pub codec: Codec,
    /// Coded size (macroblock-aligned, e.g. 1920x1088).
    pub coded_width: u32,
    /// Coded height.
    pub coded_height: u32,
    /// Display size after cropping (e.g. 1920x1080): the frames' size.
    pub width: u32,
    /// Display height.
    pub height: u32,
    /// Left edge of the display area in the coded picture.
    pub crop_left: u32,
    /// Top edge of the display area in the coded picture.
    pub crop_top: u32,
    /// Frame rate numerator from the stream (0 when unspecified).
    pub frame_rate_num: u32,
    /// Frame rate denominator from the stream (0 when unspecified).
    pub frame_rate_den: u32,
    /// Whether the sequence is progressive.
    pub progressive: bool,
    /// Decode surfaces allocated.
    pub surfaces: u32,
}
