//! What `vramringsink` writes into a frame's user metadata
//! ([`vramring::FrameMeta::with_user`], 64 bytes at most) beside the pts,
//! and `vramringsrc` reads back.
//!
//! The frame's [`vramring::FrameMeta::pts`] is the buffer's PTS in
//! nanoseconds, as the sink received it (`-1`, i.e. `GST_CLOCK_TIME_NONE`'s
//! bits, when the buffer had none), so a Rust subscriber reads it directly.
//! The trailer carries the rest, little-endian:
//!
//! | bytes | field | meaning |
//! | --- | --- | --- |
//! | 0..4 | magic | `b"GSTV"` |
//! | 4..8 | version | 1 |
//! | 8..16 | duration | buffer duration, ns; `u64::MAX`: none |
//! | 16..24 | presentation | when the sink would have rendered the frame (its running time + base time + latency), as `CLOCK_MONOTONIC` ns; `u64::MAX`: unknown (no clock, or no PTS) |
//! | 24..32 | dts | buffer DTS, ns; `u64::MAX`: none |
//! | 32..36, 36..40 | fps_n, fps_d | the caps' framerate (0/1: variable or unknown) |
//! | 40..44, 44..48 | par_n, par_d | the caps' pixel aspect ratio |
//!
//! A frame whose user bytes do not start with the magic (a publisher that
//! is not `vramringsink`) has no trailer; `vramringsrc` then stamps it from
//! its commit time.

/// The trailer's first four bytes.
pub const TRAILER_MAGIC: [u8; 4] = *b"GSTV";
/// The layout version this build writes and reads.
pub const TRAILER_VERSION: u32 = 1;
/// Bytes of the trailer.
pub const TRAILER_BYTES: usize = 48;

/// The stream facts `vramringsink` attaches to every frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameTrailer {
    /// Buffer duration in ns.
    pub duration: Option<u64>,
    /// Presentation time on `CLOCK_MONOTONIC`, ns.
    pub presentation: Option<u64>,
    /// Buffer DTS in ns.
    pub dts: Option<u64>,
    /// Framerate (numerator, denominator); 0/1 when variable or unknown.
    pub fps: (u32, u32),
    /// Pixel aspect ratio (numerator, denominator).
    pub par: (u32, u32),
}

impl Default for FrameTrailer {
    fn default() -> Self {
        FrameTrailer {
            duration: None,
            presentation: None,
            dts: None,
            fps: (0, 1),
            par: (1, 1),
        }
    }
}

fn opt(v: Option<u64>) -> [u8; 8] {
    v.unwrap_or(u64::MAX).to_le_bytes()
}

fn unopt(b: [u8; 8]) -> Option<u64> {
    Some(u64::from_le_bytes(b)).filter(|&v| v != u64::MAX)
}

impl FrameTrailer {
    /// The trailer's bytes.
    pub fn encode(&self) -> [u8; TRAILER_BYTES] {
        let mut b = [0u8; TRAILER_BYTES];
        b[0..4].copy_from_slice(&TRAILER_MAGIC);
        b[4..8].copy_from_slice(&TRAILER_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&opt(self.duration));
        b[16..24].copy_from_slice(&opt(self.presentation));
        b[24..32].copy_from_slice(&opt(self.dts));
        b[32..36].copy_from_slice(&self.fps.0.to_le_bytes());
        b[36..40].copy_from_slice(&self.fps.1.to_le_bytes());
        b[40..44].copy_from_slice(&self.par.0.to_le_bytes());
        b[44..48].copy_from_slice(&self.par.1.to_le_bytes());
        b
    }

    /// The trailer in a frame's user bytes, if they hold one of this
    /// version. Values a peer could make absurd are clamped where they
    /// would reach caps: a zero denominator reads as 0/1 or 1/1.
    pub fn decode(user: &[u8]) -> Option<FrameTrailer> {
        let b: &[u8; TRAILER_BYTES] = user.get(..TRAILER_BYTES)?.try_into().ok()?;
        if b[0..4] != TRAILER_MAGIC || b[4..8] != TRAILER_VERSION.to_le_bytes() {
            return None;
        }
        let u64_at = |i: usize| -> [u8; 8] { b[i..i + 8].try_into().unwrap_or([0xff; 8]) };
        let u32_at = |i: usize| -> u32 { u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4])) };
        let fps = match (u32_at(32), u32_at(36)) {
            (n, d) if d != 0 && n <= i32::MAX as u32 && d <= i32::MAX as u32 => (n, d),
            _ => (0, 1),
        };
        let par = match (u32_at(40), u32_at(44)) {
            (n, d) if n != 0 && d != 0 && n <= i32::MAX as u32 && d <= i32::MAX as u32 => (n, d),
            _ => (1, 1),
        };
        Some(FrameTrailer {
            duration: unopt(u64_at(8)),
            presentation: unopt(u64_at(16)),
            dts: unopt(u64_at(24)),
            fps,
            par,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trailer_reads_back_what_was_written() {
        let t = FrameTrailer {
            duration: Some(33_333_333),
            presentation: None,
            dts: Some(7),
            fps: (30000, 1001),
            par: (4, 3),
        };
        let b = t.encode();
        assert_eq!(FrameTrailer::decode(&b), Some(t));
        let mut longer = b.to_vec();
        longer.extend_from_slice(&[9; 16]);
        assert_eq!(FrameTrailer::decode(&longer), Some(t));
    }

    #[test]
    fn foreign_user_bytes_are_no_trailer() {
        assert_eq!(FrameTrailer::decode(&[]), None);
        assert_eq!(FrameTrailer::decode(&[0; TRAILER_BYTES]), None);
        let mut b = FrameTrailer::default().encode();
        b[4] = 2;
        assert_eq!(FrameTrailer::decode(&b), None, "another version");
        assert_eq!(FrameTrailer::decode(&b[..TRAILER_BYTES - 1]), None, "short");
    }

    #[test]
    fn zero_denominators_from_a_peer_never_reach_caps() {
        let mut b = FrameTrailer::default().encode();
        b[32..36].copy_from_slice(&25u32.to_le_bytes());
        b[36..40].copy_from_slice(&0u32.to_le_bytes());
        b[40..44].copy_from_slice(&0u32.to_le_bytes());
        let t = FrameTrailer::decode(&b).unwrap();
        assert_eq!(t.fps, (0, 1));
        assert_eq!(t.par, (1, 1));
    }
}
