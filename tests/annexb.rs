//! Tests of the Annex-B access-unit splitter in `vramring::packet::annexb`,
//! against the committed clip `tests/data/clip.h264` (see
//! `tests/data/README.md`), hand-built streams, and random bytes.

use vramring::packet::annexb;

use annexb::{access_units, nal_type, nal_units, parameter_sets, AccessUnit};
use proptest::prelude::*;

/// The committed clip and its documented numbers (tests/data/README.md).
const CLIP: &[u8] = include_bytes!("data/clip.h264");
const CLIP_BYTES: usize = 285_591;
const CLIP_FRAMES: usize = 300;
const CLIP_IDRS: usize = 10;
const CLIP_GOP: usize = 30;
const CLIP_SLICES_PER_FRAME: usize = 2;

fn concat(aus: &[AccessUnit<'_>]) -> Vec<u8> {
    aus.iter().flat_map(|au| au.bytes.iter().copied()).collect()
}

/// NAL unit types of a piece of stream, in order.
fn types(bytes: &[u8]) -> Vec<u8> {
    nal_units(bytes)
        .into_iter()
        .filter_map(|(s, e)| nal_type(&bytes[s..e]))
        .collect()
}

#[test]
fn clip_splits_into_documented_frames() {
    assert_eq!(CLIP.len(), CLIP_BYTES);
    let aus = access_units(CLIP);
    assert_eq!(aus.len(), CLIP_FRAMES);
    assert_eq!(concat(&aus), CLIP, "access units must concatenate to the input");

    let first = aus[0];
    assert!(first.key);
    let ps = parameter_sets(first.bytes);
    assert_eq!(types(&ps), [7, 8], "first AU carries one SPS and one PPS");
    assert!(first.bytes.windows(ps.len()).any(|w| w == ps.as_slice()));

    let keys: Vec<usize> = aus
        .iter()
        .enumerate()
        .filter(|(_, au)| au.key)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(keys.len(), CLIP_IDRS);
    assert_eq!(keys, (0..CLIP_FRAMES).step_by(CLIP_GOP).collect::<Vec<_>>());

    for (i, au) in aus.iter().enumerate() {
        let t = types(au.bytes);
        let vcl: Vec<u8> = t.iter().copied().filter(|&t| annexb::is_vcl(t)).collect();
        assert_eq!(vcl.len(), CLIP_SLICES_PER_FRAME, "AU {i}: {t:?}");
        if au.key {
            // Repeated headers: SPS, PPS (and on the first, x264's SEI) lead the IDR.
            assert_eq!(&t[..2], [7, 8], "AU {i}: {t:?}");
            assert!(vcl.iter().all(|&t| t == 5), "AU {i}: {t:?}");
            assert_eq!(parameter_sets(au.bytes), ps, "AU {i}: same SPS/PPS as the first");
        } else {
            assert!(t.iter().all(|&t| t == 1), "AU {i}: {t:?}");
            assert!(parameter_sets(au.bytes).is_empty());
        }
    }
}

/// A NAL unit: start code (3 or 4 bytes) + header byte + payload.
fn nal(four: bool, header: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = if four { vec![0, 0, 0, 1] } else { vec![0, 0, 1] };
    v.push(header);
    v.extend_from_slice(payload);
    v
}

#[test]
fn hand_built_two_slices_per_picture() {
    // first_mb_in_slice: a first payload byte with the top bit set is ue(v) 0;
    // 0x0b = 0b0000_1011 is ue(v) 22 (not the picture's first slice).
    let sps = nal(true, 0x67, &[0x42, 0xc0, 0x0d, 0xff]);
    let pps = nal(false, 0x68, &[0xce, 0x3c, 0x80]);
    let idr0 = nal(true, 0x65, &[0x88, 0x84, 0x00, 0x33]);
    let idr1 = nal(false, 0x65, &[0x0b, 0x84, 0x02]);
    let p0 = nal(false, 0x41, &[0x9a, 0x21, 0x6c]);
    let p1 = nal(true, 0x41, &[0x2c, 0x21]);
    let sei = nal(false, 0x06, &[0x05, 0x01, 0xaa, 0x80]);
    let p2 = nal(true, 0x41, &[0x9a, 0x00, 0x00, 0x03, 0x01]);
    let p3 = nal(false, 0x41, &[0x20, 0x11]);
    let eos = nal(false, 0x0a, &[]);

    let au0 = [&sps[..], &pps, &idr0, &idr1].concat();
    let au1 = [&p0[..], &p1].concat();
    let au2 = [&sei[..], &p2, &p3, &eos].concat();
    let mut stream = [&au0[..], &au1, &au2].concat();
    stream.extend_from_slice(&[0, 0]); // trailing_zero_8bits

    let ranges = nal_units(&stream);
    assert_eq!(ranges.len(), 10);
    assert_eq!(ranges[0], (0, sps.len()));
    assert_eq!(ranges[1], (sps.len(), sps.len() + pps.len()));
    assert_eq!(ranges.last().unwrap().1, stream.len());

    let aus = access_units(&stream);
    assert_eq!(aus.len(), 3);
    assert_eq!(aus[0], AccessUnit { bytes: &au0, key: true });
    assert_eq!(
        aus[1],
        AccessUnit {
            bytes: &au1,
            key: false
        }
    );
    assert_eq!(aus[2].bytes[..au2.len()], au2[..]);
    assert!(!aus[2].key);
    assert_eq!(concat(&aus), stream);

    assert_eq!(parameter_sets(aus[0].bytes), [&sps[..], &pps].concat());
    assert!(parameter_sets(aus[1].bytes).is_empty());

    // Leading garbage goes to the first AU; an AUD starts an AU.
    let aud = nal(true, 0x09, &[0xf0]);
    let garbage = [0x12u8, 0x34];
    let stream2 = [&garbage[..], &p0, &p1, &aud, &p2, &p3].concat();
    let aus2 = access_units(&stream2);
    assert_eq!(aus2.len(), 2);
    assert_eq!(aus2[0].bytes, [&garbage[..], &p0, &p1].concat());
    assert_eq!(aus2[1].bytes, [&aud[..], &p2, &p3].concat());
    assert_eq!(concat(&aus2), stream2);
}

#[test]
fn start_codes_and_leading_zeros() {
    // Extra leading zeros belong to the start code that follows them.
    let s = [
        0, 0, 0, 0, 0, 1, 0x67, 0xaa, 0, 0, 1, 0x68, 0xbb, 0, 0, 0, 1, 0x65, 0x88,
    ];
    assert_eq!(nal_units(&s), [(0, 8), (8, 13), (13, 19)]);
    assert_eq!(types(&s), [7, 8, 5]);
    // A start code with no header byte before the next one.
    assert_eq!(nal_units(&[0, 0, 1, 0, 0, 1, 0x41]), [(0, 3), (3, 7)]);
    assert_eq!(nal_type(&[0, 0, 1]), None);
    // No start code at all.
    assert!(nal_units(&[0, 0, 2, 1, 0, 0]).is_empty());
    assert!(access_units(&[]).is_empty());
    let aus = access_units(&[1, 2, 3]);
    assert_eq!(
        aus,
        [AccessUnit {
            bytes: &[1, 2, 3],
            key: false
        }]
    );
}

/// Bytes biased towards start codes and NAL headers, so random streams have
/// plenty of NAL units of every kind.
fn stream_bytes() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        4 => Just(0u8),
        2 => Just(1u8),
        1 => prop::sample::select(vec![0x65u8, 0x41, 0x67, 0x68, 0x06, 0x09, 0x0a, 0x0e, 0x14, 0x80, 0x88, 0x0b]),
        3 => any::<u8>(),
    ];
    prop::collection::vec(byte, 0..1024)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_split_losslessly(stream in stream_bytes()) {
        let ranges = nal_units(&stream);
        let mut at = ranges.first().map_or(stream.len(), |r| r.0);
        for &(s, e) in &ranges {
            prop_assert_eq!(s, at);
            prop_assert!(s < e && e <= stream.len());
            prop_assert!(annexb::start_code_len(&stream[s..e]).is_some());
            at = e;
        }
        prop_assert_eq!(at, stream.len());

        let aus = access_units(&stream);
        prop_assert_eq!(concat(&aus), stream.clone());
        prop_assert!(aus.iter().all(|au| !au.bytes.is_empty()));
        for au in &aus {
            let ps = parameter_sets(au.bytes);
            prop_assert!(ps.len() <= au.bytes.len());
        }
    }

    #[test]
    fn random_nal_sequences_split_at_slices(
        nals in prop::collection::vec((any::<bool>(), any::<u8>(), prop::collection::vec(any::<u8>(), 0..8)), 0..64)
    ) {
        let stream: Vec<u8> = nals.iter().flat_map(|(four, h, p)| nal(*four, *h, p)).collect();
        let aus = access_units(&stream);
        prop_assert_eq!(concat(&aus), stream.clone());
        prop_assert!(aus.len() <= nal_units(&stream).len().max(1));
    }
}
