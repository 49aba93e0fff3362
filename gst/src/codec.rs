//! The codecs the packet elements carry: their caps, the FourCC a packet
//! ring stores as its codec, and their parameter sets (the NAL units a
//! decoder needs before a keyframe), in Annex-B byte streams.

use vramring::packet::annexb;

/// A codec the packet elements carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    H264,
    H265,
}

impl Codec {
    /// The ring's codec code: the FourCC as a little-endian `u32`, as
    /// `vramring play` and the packet producer example store H.264.
    pub const fn fourcc(self) -> u32 {
        match self {
            Codec::H264 => u32::from_le_bytes(*b"H264"),
            Codec::H265 => u32::from_le_bytes(*b"H265"),
        }
    }

    /// The codec of a ring's code (`HEVC` is read as H.265 too).
    pub fn from_fourcc(code: u32) -> Option<Codec> {
        match &code.to_le_bytes() {
            b"H264" | b"h264" | b"AVC1" | b"avc1" => Some(Codec::H264),
            b"H265" | b"h265" | b"HEVC" | b"hevc" | b"HVC1" | b"hvc1" => Some(Codec::H265),
            _ => None,
        }
    }

    /// The caps media type.
    pub const fn media_type(self) -> &'static str {
        match self {
            Codec::H264 => "video/x-h264",
            Codec::H265 => "video/x-h265",
        }
    }

    /// The codec of a caps media type.
    pub fn from_media_type(name: &str) -> Option<Codec> {
        match name {
            "video/x-h264" => Some(Codec::H264),
            "video/x-h265" => Some(Codec::H265),
            _ => None,
        }
    }

    /// Annex-B byte stream, one access unit per buffer.
    pub fn caps(self) -> gst::Caps {
        gst::Caps::builder(self.media_type())
            .field("stream-format", "byte-stream")
            .field("alignment", "au")
            .build()
    }

    /// The NAL unit type of `nal` (start code included).
    fn nal_type(self, nal: &[u8]) -> Option<u8> {
        let header = *nal.get(annexb::start_code_len(nal)?)?;
        Some(match self {
            Codec::H264 => header & 0x1f,
            Codec::H265 => (header >> 1) & 0x3f,
        })
    }

    /// Whether a NAL unit type is a parameter set: SPS and PPS for H.264
    /// (7, 8), VPS, SPS and PPS for H.265 (32, 33, 34).
    fn is_parameter_set(self, t: u8) -> bool {
        match self {
            Codec::H264 => matches!(t, annexb::NAL_SPS | annexb::NAL_PPS),
            Codec::H265 => matches!(t, 32..=34),
        }
    }

    /// The parameter sets of an access unit, with their start codes,
    /// concatenated in stream order; empty when it has none.
    pub fn parameter_sets(self, au: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for (start, end) in annexb::nal_units(au) {
            let Some(nal) = au.get(start..end) else { continue };
            if self.nal_type(nal).is_some_and(|t| self.is_parameter_set(t)) {
                out.extend_from_slice(nal);
            }
        }
        out
    }
}

/// Both codecs, byte stream, one access unit per buffer.
pub fn template_caps() -> gst::Caps {
    let mut caps = Codec::H264.caps();
    caps.merge(Codec::H265.caps());
    caps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fourccs_round_trip() {
        for c in [Codec::H264, Codec::H265] {
            assert_eq!(Codec::from_fourcc(c.fourcc()), Some(c));
            assert_eq!(Codec::from_media_type(c.media_type()), Some(c));
        }
        assert_eq!(Codec::from_fourcc(0), None);
    }

    #[test]
    fn h264_parameter_sets_are_sps_and_pps() {
        let au = [
            &[0, 0, 0, 1, 0x09, 0xf0][..],    // AUD
            &[0, 0, 0, 1, 0x67, 1, 2, 3][..], // SPS
            &[0, 0, 1, 0x68, 4, 5][..],       // PPS
            &[0, 0, 1, 0x65, 0x88, 0x84][..], // IDR slice
        ]
        .concat();
        assert_eq!(
            Codec::H264.parameter_sets(&au),
            [&[0, 0, 0, 1, 0x67, 1, 2, 3][..], &[0, 0, 1, 0x68, 4, 5][..]].concat()
        );
        assert!(Codec::H264.parameter_sets(&[0, 0, 1, 0x41, 9]).is_empty());
    }

    #[test]
    fn h265_parameter_sets_are_vps_sps_and_pps() {
        // NAL header: type << 1 in the first byte, then a layer/tid byte.
        let vps = [0, 0, 0, 1, 32 << 1, 1, 0xaa];
        let sps = [0, 0, 0, 1, 33 << 1, 1, 0xbb];
        let pps = [0, 0, 0, 1, 34 << 1, 1, 0xcc];
        let idr = [0, 0, 0, 1, 19 << 1, 1, 0xdd];
        let au = [&vps[..], &sps, &pps, &idr].concat();
        assert_eq!(Codec::H265.parameter_sets(&au), [&vps[..], &sps, &pps].concat());
        // The same bytes read as H.264 hold no SPS or PPS.
        assert!(Codec::H264.parameter_sets(&au).is_empty());
    }
}
