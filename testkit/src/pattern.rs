//! The self-checking test pattern the examples, tests and benchmarks write
//! into every frame: its seq and a checksum travel in its pixels, so a reader
//! can prove a frame is whole and is the frame it was told it is.
//!
//! The frame is read as little-endian `u32` words `w[0..n)`, `n = len / 4`
//! (at least 4):
//!
//! | word | value |
//! | --- | --- |
//! | `w[0]`, `w[1]` | seq, low then high half |
//! | `w[2]` | checksum: wrapping sum of `w[4..n)` |
//! | `w[3]` | `n` |
//! | `w[i]`, `i >= 4` | [`word`]`(seq, i)` |
//!
//! Every body word depends on the seq, so a frame torn between two seqs fails
//! both the word check and the checksum. The CUDA backend has a PTX kernel
//! that writes and checks the same pattern on the GPU.

/// The murmur3 `fmix32` finalizer.
#[inline]
pub const fn mix32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x85eb_ca6b);
    x ^= x >> 13;
    x = x.wrapping_mul(0xc2b2_ae35);
    x ^= x >> 16;
    x
}

/// Body word `i` of frame `seq`.
#[inline]
pub const fn word(seq: u64, i: u32) -> u32 {
    mix32((seq as u32).wrapping_mul(0x9E37_79B1) ^ i.wrapping_add((seq >> 32) as u32))
}

/// Why a frame failed [`verify`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Shorter than the 16-byte header.
    #[error("frame of {0} bytes is too short for the pattern")]
    TooShort(usize),
    /// The seq in the pixels is not the seq the frame was delivered as.
    #[error("pixels carry seq {found}, frame is seq {expected}")]
    WrongSeq {
        /// Seq the frame was delivered as.
        expected: u64,
        /// Seq found in the pixels.
        found: u64,
    },
    /// The word count does not match the frame length.
    #[error("word count {found}, expected {expected}")]
    WrongLength {
        /// Words in the frame.
        expected: u32,
        /// Words the header claims.
        found: u32,
    },
    /// A body word differs from the pattern, or the checksum is wrong.
    #[error("{mismatches} words differ from the pattern of seq {seq}; checksum {checksum_ok}")]
    Corrupt {
        /// The seq in the pixels.
        seq: u64,
        /// Body words that differ.
        mismatches: u64,
        /// Whether the checksum matched.
        checksum_ok: bool,
    },
}

fn words_of(len: usize) -> u32 {
    u32::try_from(len / 4).unwrap_or(u32::MAX)
}

/// Writes the pattern of `seq` into `frame` (whose length should be a
/// multiple of 4; trailing bytes are zeroed).
///
/// # Panics
/// When `frame` is shorter than 16 bytes.
pub fn fill(frame: &mut [u8], seq: u64) {
    assert!(frame.len() >= 16, "a pattern frame needs at least 16 bytes");
    let n = words_of(frame.len());
    let mut sum = 0u32;
    let (words, tail) = frame.split_at_mut(n as usize * 4);
    for (i, chunk) in words.chunks_exact_mut(4).enumerate().skip(4) {
        let w = word(seq, i as u32);
        sum = sum.wrapping_add(w);
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    tail.fill(0);
    words[0..4].copy_from_slice(&(seq as u32).to_le_bytes());
    words[4..8].copy_from_slice(&((seq >> 32) as u32).to_le_bytes());
    words[8..12].copy_from_slice(&sum.to_le_bytes());
    words[12..16].copy_from_slice(&n.to_le_bytes());
}

/// The seq carried in the pixels, without checking the rest.
pub fn seq_of(frame: &[u8]) -> Option<u64> {
    let lo = u32::from_le_bytes(frame.get(0..4)?.try_into().ok()?);
    let hi = u32::from_le_bytes(frame.get(4..8)?.try_into().ok()?);
    Some(lo as u64 | (hi as u64) << 32)
}

/// Checks that `frame` holds the whole pattern of `expected_seq`.
///
/// # Errors
/// A [`PatternError`] saying what is wrong.
pub fn verify(frame: &[u8], expected_seq: u64) -> Result<(), PatternError> {
    if frame.len() < 16 {
        return Err(PatternError::TooShort(frame.len()));
    }
    let seq = seq_of(frame).unwrap_or(0);
    let rd = |k: usize| u32::from_le_bytes([frame[k * 4], frame[k * 4 + 1], frame[k * 4 + 2], frame[k * 4 + 3]]);
    let n = words_of(frame.len());
    if rd(3) != n {
        return Err(PatternError::WrongLength {
            expected: n,
            found: rd(3),
        });
    }
    let mut sum = 0u32;
    let mut mismatches = 0u64;
    for (i, chunk) in frame[..n as usize * 4].chunks_exact(4).enumerate().skip(4) {
        let w = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        sum = sum.wrapping_add(w);
        mismatches += u64::from(w != word(seq, i as u32));
    }
    let checksum_ok = sum == rd(2);
    if mismatches != 0 || !checksum_ok {
        return Err(PatternError::Corrupt {
            seq,
            mismatches,
            checksum_ok,
        });
    }
    if seq != expected_seq {
        return Err(PatternError::WrongSeq {
            expected: expected_seq,
            found: seq,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_frame_verifies_as_its_own_seq_only() {
        let mut f = vec![0u8; 4096];
        fill(&mut f, 0x1_0000_0007);
        verify(&f, 0x1_0000_0007).unwrap();
        assert!(matches!(verify(&f, 8), Err(PatternError::WrongSeq { .. })));
    }

    #[test]
    fn a_frame_torn_between_two_seqs_fails() {
        let mut a = vec![0u8; 8192];
        let mut b = vec![0u8; 8192];
        fill(&mut a, 10);
        fill(&mut b, 11);
        a[4096..].copy_from_slice(&b[4096..]);
        assert!(matches!(verify(&a, 10), Err(PatternError::Corrupt { .. })));
    }

    #[test]
    fn one_flipped_byte_fails() {
        let mut f = vec![0u8; 1024];
        fill(&mut f, 3);
        f[700] ^= 1;
        assert!(verify(&f, 3).is_err());
    }
}
