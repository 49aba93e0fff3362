//! A small H.264 Annex-B splitter: NAL units, access units and parameter
//! sets, for publishing an elementary stream on a packet ring one access
//! unit per packet (`examples/packet_producer.rs`, `vramring play`).
//!
//! The splitter is lossless: every byte of the input belongs to exactly one
//! NAL unit range or access unit, so concatenating the pieces reproduces the
//! input byte-for-byte (bytes before the first start code go to the first
//! access unit). It never panics, whatever the input bytes are; garbage is
//! simply grouped by the same rules.
//!
//! Access units are split with the first-slice rule of H.264 §7.4.1.2.3
//! (see [`access_units`]). Arbitrary slice order (ASO, baseline only), where
//! the first slice of a picture may have `first_mb_in_slice != 0`, is not
//! detected; neither are the finer "first VCL NAL of a new primary picture"
//! tests of §7.4.1.2.4 (frame_num, pps_id, … changes). Streams from common
//! encoders (x264, NVENC, …) are split correctly.
//!
//! # Examples
//! ```
//! use vramring::packet::annexb;
//! // SPS, PPS, IDR slice, then a non-IDR slice: two access units.
//! let stream = [
//!     0, 0, 0, 1, 0x67, 0x42, 0, 0, 0, 1, 0x68, 0xce, 0, 0, 1, 0x65, 0x88, 0x84, 0, 0, 1, 0x41, 0x9a,
//! ];
//! let aus = annexb::access_units(&stream);
//! assert_eq!(aus.len(), 2);
//! assert!(aus[0].key && !aus[1].key);
//! assert_eq!(aus.iter().map(|a| a.bytes.len()).sum::<usize>(), stream.len());
//! assert_eq!(annexb::parameter_sets(aus[0].bytes), &stream[..12]);
//! ```

/// `nal_unit_type` of a non-IDR coded slice.
pub const NAL_SLICE: u8 = 1;
/// `nal_unit_type` of coded slice data partition A.
pub const NAL_SLICE_DPA: u8 = 2;
/// `nal_unit_type` of an IDR coded slice (a keyframe).
pub const NAL_IDR: u8 = 5;
/// `nal_unit_type` of supplemental enhancement information.
pub const NAL_SEI: u8 = 6;
/// `nal_unit_type` of a sequence parameter set.
pub const NAL_SPS: u8 = 7;
/// `nal_unit_type` of a picture parameter set.
pub const NAL_PPS: u8 = 8;
/// `nal_unit_type` of an access unit delimiter.
pub const NAL_AUD: u8 = 9;

/// Byte ranges `(start, end)` of the NAL units of an Annex-B byte stream.
///
/// Each range starts at its start code, including every zero byte directly
/// before the `00 00 01` (so 3-byte and 4-byte start codes, `zero_byte`,
/// `leading_zero_8bits` and the previous unit's `trailing_zero_8bits` all
/// count as part of the start code), and ends where the next range starts,
/// or at the end of the stream. The ranges are therefore contiguous and
/// cover `stream[ranges[0].0..]`; only bytes before the first start code
/// (not valid Annex B) are in no range. A stream without any `00 00 01`
/// yields no ranges.
///
/// A range may hold a start code and nothing else (e.g. `00 00 01 00 00 01`);
/// [`nal_type`] returns `None` for it.
pub fn nal_units(stream: &[u8]) -> Vec<(usize, usize)> {
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    // End of the previous start code: zeros before a new `00 00 01` are
    // only claimed back to here, so a NAL header byte is never taken.
    let mut floor = 0usize;
    let mut i = 0usize;
    while i + 3 <= stream.len() {
        if stream[i] == 0 && stream[i + 1] == 0 && stream[i + 2] == 1 {
            let mut start = i;
            while start > floor && stream[start - 1] == 0 {
                start -= 1;
            }
            if let Some(last) = ranges.last_mut() {
                last.1 = start;
            }
            ranges.push((start, stream.len()));
            floor = i + 3;
            i += 3;
        } else if stream[i + 2] > 1 {
            // No start code can begin at i, i+1 or i+2.
            i += 3;
        } else {
            i += 1;
        }
    }
    ranges
}

/// Length of the start code (all leading zero bytes plus the `01`) at the
/// beginning of `nal`, or `None` if `nal` does not begin with one.
pub fn start_code_len(nal: &[u8]) -> Option<usize> {
    let zeros = nal.iter().take_while(|&&b| b == 0).count();
    (zeros >= 2 && nal.get(zeros) == Some(&1)).then_some(zeros + 1)
}

/// The NAL unit without its start code (header byte first), or `None` if
/// `nal` does not begin with a start code.
pub fn nal_payload(nal: &[u8]) -> Option<&[u8]> {
    start_code_len(nal).map(|n| &nal[n..])
}

/// `nal_unit_type` (low 5 bits of the header byte) of a NAL unit given with
/// its start code, as returned by [`nal_units`]; `None` if there is no start
/// code or no header byte.
pub fn nal_type(nal: &[u8]) -> Option<u8> {
    nal_payload(nal)?.first().map(|h| h & 0x1f)
}

/// Whether `nal_unit_type` is a VCL (coded slice) type: 1 to 5.
pub fn is_vcl(nal_type: u8) -> bool {
    (1..=5).contains(&nal_type)
}

/// For a slice NAL unit (type 1, 2 or 5, given with its start code): whether
/// `first_mb_in_slice == 0`, i.e. the first bit after the 1-byte header is 1
/// (`ue(v)` codes 0 as the single bit `1`). `false` if the unit is too short
/// to tell. The byte after the header can never be an emulation-prevention
/// byte, since the header byte of a slice is non-zero.
pub fn first_mb_is_zero(nal: &[u8]) -> bool {
    match nal_payload(nal) {
        Some(p) if p.len() >= 2 => p[1] & 0x80 != 0,
        _ => false,
    }
}

/// One access unit (one coded picture plus its non-VCL units) of an Annex-B
/// stream, borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessUnit<'a> {
    /// The access unit's bytes, start codes included.
    pub bytes: &'a [u8],
    /// Whether it contains an IDR slice (`nal_unit_type` 5): a keyframe.
    pub key: bool,
}

/// Whether a NAL unit of this type, seen after a VCL unit, starts a new
/// access unit whatever its content (§7.4.1.2.3): SEI, SPS, PPS, AUD, and
/// types 14 to 18.
fn starts_au_when_after_vcl(nal_type: u8) -> bool {
    matches!(nal_type, NAL_SEI | NAL_SPS | NAL_PPS | NAL_AUD | 14..=18)
}

/// Split an Annex-B byte stream into access units (H.264 §7.4.1.2.3).
///
/// Once the current access unit holds a VCL NAL unit, a new one starts at an
/// AUD (9), SPS (7), PPS (8), SEI (6), a type 14–18 unit, or a slice (type 1,
/// 2 or 5) whose `first_mb_in_slice` is 0. Non-VCL units before the first VCL
/// unit of an access unit (SPS, PPS, SEI, … before an IDR, as written by
/// encoders with repeated headers) belong to it; units that start no access
/// unit (end of sequence/stream, filler, other slices of the same picture,
/// unknown types, header-less ranges) belong to the current one.
///
/// The first access unit starts at byte 0, so it also holds any bytes before
/// the first start code; concatenating all `bytes` gives back `stream`
/// exactly. An empty stream gives no access units; a non-empty stream
/// without start codes gives one (not key).
pub fn access_units(stream: &[u8]) -> Vec<AccessUnit<'_>> {
    let mut aus = Vec::new();
    if stream.is_empty() {
        return aus;
    }
    let mut cur_start = 0usize;
    let mut has_vcl = false;
    let mut key = false;
    for (start, end) in nal_units(stream) {
        let nal = &stream[start..end];
        let Some(t) = nal_type(nal) else { continue };
        let vcl = is_vcl(t);
        let new_au = has_vcl
            && (starts_au_when_after_vcl(t)
                || (matches!(t, NAL_SLICE | NAL_SLICE_DPA | NAL_IDR) && first_mb_is_zero(nal)));
        if new_au && start > cur_start {
            aus.push(AccessUnit {
                bytes: &stream[cur_start..start],
                key,
            });
            cur_start = start;
            has_vcl = false;
            key = false;
        }
        if vcl {
            has_vcl = true;
            key |= t == NAL_IDR;
        }
    }
    aus.push(AccessUnit {
        bytes: &stream[cur_start..],
        key,
    });
    aus
}

/// The SPS and PPS NAL units (types 7 and 8) of an access unit, with their
/// start codes, concatenated in stream order: the codec parameters a
/// decoder needs before the access unit's IDR. Empty if there are none.
pub fn parameter_sets(au: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (start, end) in nal_units(au) {
        let nal = &au[start..end];
        if matches!(nal_type(nal), Some(NAL_SPS | NAL_PPS)) {
            out.extend_from_slice(nal);
        }
    }
    out
}
