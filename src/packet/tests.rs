use std::time::Duration;

use proptest::prelude::*;

use super::layout::{PacketHeader, PacketInfo, PARAMS_BYTES};
use super::*;
use crate::error::Error;
use crate::shm::Region;

const T: Duration = Duration::from_secs(5);

/// Length and bytes of packet `seq`, derived from the seq alone so a reader
/// can check any packet it receives.
fn packet_len(seq: u64, max: u32) -> usize {
    (seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize % (max as usize + 1)
}

fn fill(seq: u64, len: usize, buf: &mut Vec<u8>) {
    buf.clear();
    buf.extend((0..len).map(|i| (seq as u8).wrapping_mul(31).wrapping_add(i as u8) ^ (seq >> 8) as u8));
}

fn check(seq: u64, data: &[u8], max: u32) {
    let mut want = Vec::new();
    fill(seq, packet_len(seq, max), &mut want);
    assert_eq!(data, &want[..], "packet {seq} is torn or wrong");
}

fn key_every(n: u64) -> impl Fn(u64) -> PacketMeta {
    move |seq| PacketMeta {
        pts: seq as i64 * 10,
        dts: seq as i64 * 10 - 5,
        flags: if seq % n == 1 { PACKET_KEY } else { 0 },
        codec: 0,
    }
}

fn ring(data_bytes: u64, records: u32, max: u32) -> (PacketWriter, PacketReader) {
    let w = PacketWriter::create(
        "packet-test",
        PacketRingConfig::new(data_bytes, records, max).codec(264),
    )
    .unwrap();
    let r = PacketReader::open(w.fd()).unwrap();
    (w, r)
}

#[test]
fn variable_length_packets_round_trip_through_many_wraparounds() {
    let max = 3000;
    let (mut w, mut r) = ring(8192, 8, max);
    let meta = key_every(1_000_000);
    let mut buf = Vec::new();
    let mut out = Vec::new();
    for seq in 1..=5000u64 {
        fill(seq, packet_len(seq, max), &mut buf);
        assert_eq!(w.write(&buf, meta(seq)).unwrap(), seq);
        let p = r.next_copy(&mut out, T).unwrap();
        assert_eq!((p.seq, p.len, p.skipped), (seq, buf.len(), 0));
        assert_eq!((p.pts, p.dts, p.codec), (seq as i64 * 10, seq as i64 * 10 - 5, 264));
        check(seq, &out, max);
    }
    assert_eq!(r.stats().delivered, 5000);
}

#[test]
fn a_late_joiner_starts_at_the_newest_keyframe() {
    let (mut w, _) = ring(1 << 16, 64, 1000);
    let meta = key_every(10);
    let mut buf = Vec::new();
    for seq in 1..=35u64 {
        fill(seq, packet_len(seq, 1000), &mut buf);
        w.write(&buf, meta(seq)).unwrap();
    }
    let mut late = PacketReader::open(w.fd()).unwrap();
    let p = late.next_copy(&mut buf, T).unwrap();
    assert_eq!(p.seq, 31);
    assert!(p.is_key());
    assert_eq!(p.skipped, 0);
    check(31, &buf, 1000);
    assert_eq!(late.next_copy(&mut buf, T).unwrap().seq, 32);
}

#[test]
fn a_reader_that_joins_before_any_keyframe_waits_for_the_first() {
    let (mut w, mut r) = ring(1 << 14, 16, 100);
    w.write(b"delta", PacketMeta::default()).unwrap();
    w.write(
        b"key",
        PacketMeta {
            flags: PACKET_KEY,
            ..Default::default()
        },
    )
    .unwrap();
    let mut buf = Vec::new();
    let p = r.next_copy(&mut buf, T).unwrap();
    assert_eq!((p.seq, &buf[..]), (2, &b"key"[..]));
    assert!(matches!(r.try_next_copy(&mut buf), Ok(None)));
}

#[test]
fn an_overrun_reader_gets_counts_and_resumes_at_the_next_keyframe() {
    // 16 records, keyframe every 8 packets: record reuse overruns the reader.
    let (mut w, mut r) = ring(1 << 16, 16, 1000);
    let meta = key_every(8);
    let mut buf = Vec::new();
    for seq in 1..=3u64 {
        fill(seq, packet_len(seq, 1000), &mut buf);
        w.write(&buf, meta(seq)).unwrap();
    }
    assert_eq!(r.next_copy(&mut buf, T).unwrap().seq, 1);
    for seq in 4..=40u64 {
        fill(seq, packet_len(seq, 1000), &mut buf);
        w.write(&buf, meta(seq)).unwrap();
    }
    // Packet 2 lived in record 2, now holding packet 34.
    match r.next_copy(&mut buf, T) {
        Err(Error::PacketOverrun { seq, newest, overruns }) => assert_eq!((seq, newest, overruns), (2, 40, 1)),
        other => panic!("expected an overrun, got {other:?}"),
    }
    // Records hold 25..=40; keyframes are 1, 9, 17, 25, 33: 25 is the oldest intact one.
    let p = r.next_copy(&mut buf, T).unwrap();
    assert_eq!((p.seq, p.skipped), (25, 23));
    assert!(p.is_key());
    check(25, &buf, 1000);
    assert_eq!(r.next_copy(&mut buf, T).unwrap().seq, 26);
    assert_eq!(
        r.stats(),
        PacketReaderStats {
            delivered: 3,
            skipped: 23,
            overruns: 1
        }
    );
}

#[test]
fn bytes_overwritten_under_an_intact_record_are_detected() {
    // Many records, few bytes: the data ring wraps long before records do.
    let (mut w, mut r) = ring(8192, 1024, 4096);
    let big = vec![7u8; 4096];
    w.write(
        &big,
        PacketMeta {
            flags: PACKET_KEY,
            ..Default::default()
        },
    )
    .unwrap();
    let b = r.try_borrow().unwrap().unwrap();
    assert_eq!(b.seq(), 1);
    drop(b); // delivered
    w.write(&big, PacketMeta::default()).unwrap(); // seq 2 at 4096..8192
    w.write(&big, PacketMeta::default()).unwrap(); // seq 3 overwrites seq 1's bytes
    let b = r.try_borrow().unwrap().unwrap();
    assert_eq!(b.seq(), 2);
    w.write(
        &big,
        PacketMeta {
            flags: PACKET_KEY,
            ..Default::default()
        },
    )
    .unwrap(); // seq 4 over seq 2
    match b.release() {
        Err(Error::PacketOverrun { seq: 2, newest: 4, .. }) => {}
        other => panic!("expected an overrun of packet 2, got {other:?}"),
    }
    let mut buf = Vec::new();
    let p = r.next_copy(&mut buf, T).unwrap();
    assert_eq!((p.seq, p.skipped), (4, 2));
}

#[test]
fn a_borrow_reads_the_packet_in_place() {
    let (mut w, mut r) = ring(1 << 14, 16, 1000);
    w.write(
        b"hello packet",
        PacketMeta {
            flags: PACKET_KEY,
            pts: 5,
            ..Default::default()
        },
    )
    .unwrap();
    let b = r.borrow(T).unwrap();
    let mut dst = vec![0u8; b.len()];
    b.copy_to(&mut dst).unwrap();
    let p = b.release().unwrap();
    assert_eq!((p.seq, p.pts, &dst[..]), (1, 5, &b"hello packet"[..]));
}

#[test]
fn an_oversize_packet_is_refused_and_nothing_is_written() {
    let (mut w, mut r) = ring(1 << 14, 16, 1000);
    assert!(matches!(
        w.write(
            &[0u8; 1001],
            PacketMeta {
                flags: PACKET_KEY,
                ..Default::default()
            }
        ),
        Err(Error::TooLarge { len: 1001, max: 1000 })
    ));
    assert_eq!(w.seq(), 0);
    let mut buf = Vec::new();
    assert!(matches!(r.try_next_copy(&mut buf), Ok(None)));
    assert!(matches!(
        w.set_codec_params(&[0u8; PARAMS_BYTES + 1]),
        Err(Error::TooLarge { .. })
    ));
}

#[test]
fn bad_configs_are_refused() {
    for cfg in [
        PacketRingConfig::new(1000, 16, 100),
        PacketRingConfig::new(4096, 3, 100),
        PacketRingConfig::new(4096, 16, 2049),
        PacketRingConfig::new(4096, 16, 0),
    ] {
        assert!(
            matches!(PacketWriter::create("t", cfg), Err(Error::Config(_))),
            "{cfg:?}"
        );
    }
}

#[test]
fn a_reader_racing_a_writer_on_a_small_ring_never_sees_a_torn_packet() {
    let max = 1500;
    let (mut w, mut r) = ring(4096, 8, max);
    let n: u64 = if cfg!(miri) { 200 } else { 100_000 };
    let writer = std::thread::spawn(move || {
        let meta = key_every(4);
        let mut buf = Vec::new();
        for seq in 1..=n {
            fill(seq, packet_len(seq, max), &mut buf);
            w.write(&buf, meta(seq)).unwrap();
        }
        w
    });
    let mut buf = Vec::new();
    let (mut got, mut overruns, mut last) = (0u64, 0u64, 0u64);
    while last < n {
        match r.next_copy(&mut buf, T) {
            Ok(p) => {
                assert!(p.seq > last);
                if p.skipped > 0 {
                    assert!(p.is_key(), "resumed at a non-keyframe {}", p.seq);
                }
                check(p.seq, &buf, max);
                last = p.seq;
                got += 1;
            }
            Err(Error::PacketOverrun { .. }) => overruns += 1,
            Err(e) => panic!("{e}"),
        }
        if got % 64 == 0 {
            std::thread::yield_now();
        }
    }
    writer.join().unwrap();
    assert_eq!(r.stats().overruns, overruns);
    assert_eq!(r.stats().delivered, got);
    eprintln!("delivered {got}, overruns {overruns}");
}

fn params_for(version: u64) -> Vec<u8> {
    let len = (version as usize * 37) % (PARAMS_BYTES + 1);
    vec![version as u8; len]
}

#[test]
fn codec_params_are_seen_whole_while_they_change() {
    let (mut w, r) = ring(1 << 14, 16, 100);
    let mut out = Vec::new();
    assert_eq!(r.codec_params(&mut out).unwrap(), 0);
    assert!(out.is_empty());
    let n = if cfg!(miri) { 20 } else { 20_000 };
    let writer = std::thread::spawn(move || {
        for v in 1..=n {
            assert_eq!(w.set_codec_params(&params_for(v)).unwrap(), v);
        }
        w
    });
    let mut seen = 0;
    while !writer.is_finished() {
        match r.codec_params(&mut out) {
            Ok(0) => assert!(out.is_empty()),
            Ok(v) => {
                assert_eq!(out, params_for(v), "params version {v} torn");
                seen += 1;
            }
            Err(Error::Timeout(..)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let w = writer.join().unwrap();
    drop(w);
    assert_eq!(r.codec_params(&mut out).unwrap(), n);
    assert_eq!(out, params_for(n));
    assert!(seen > 0);
}

fn raw_write(region: &Region, offset: usize, bytes: &[u8]) {
    assert!(offset + bytes.len() <= region.len());
    // SAFETY: in bounds (checked); test-only writes to our own writable
    // mapping while no other thread touches it.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), region.as_ptr().add(offset), bytes.len()) };
}

const HEADER: usize = std::mem::size_of::<PacketHeader>();
const INFO: usize = std::mem::size_of::<PacketInfo>();

fn valid_ring() -> PacketWriter {
    let mut w = PacketWriter::create("fuzz", PacketRingConfig::new(8192, 8, 1024)).unwrap();
    let mut buf = Vec::new();
    for seq in 1..=12u64 {
        fill(seq, packet_len(seq, 1024), &mut buf);
        w.write(&buf, key_every(3)(seq)).unwrap();
    }
    w
}

/// Reads until nothing new or an error; every error must be typed.
fn drain(r: &mut PacketReader) {
    let mut buf = Vec::new();
    for _ in 0..64 {
        match r.try_next_copy(&mut buf) {
            Ok(Some(p)) => assert_eq!(p.len, buf.len()),
            Ok(None) => return,
            Err(Error::PacketOverrun { .. } | Error::LayoutMismatch(_)) => {}
            Err(e) => panic!("untyped failure {e}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 256 }))]

    #[test]
    fn random_header_bytes_are_rejected_with_a_typed_error(bytes in prop::collection::vec(any::<u8>(), HEADER)) {
        let (region, _fd) = Region::create("fuzz", 3 * HEADER as u64).unwrap();
        raw_write(&region, 0, &bytes);
        let r = PacketRingInfo::validate(region.at(0), region.len() as u64);
        prop_assert!(matches!(r, Err(Error::LayoutMismatch(_))), "{:?}", r);
    }

    #[test]
    fn a_mutated_header_is_rejected_or_read_in_bounds(word in 0usize..INFO / 8, value in any::<u64>(), small in any::<bool>()) {
        let w = valid_ring();
        let value = if small { value % 1_000_000 } else { value };
        raw_write(w.region_for_tests(), word * 8, &value.to_le_bytes());
        match PacketReader::open(w.fd()) {
            Ok(mut r) => drain(&mut r),
            Err(Error::LayoutMismatch(_)) => {}
            Err(e) => prop_assert!(false, "untyped failure {}", e),
        }
    }

    #[test]
    fn random_records_never_read_out_of_bounds(bytes in prop::collection::vec(any::<u8>(), 8 * 64), tail in any::<u64>(), small in any::<bool>()) {
        let w = valid_ring();
        let info = *w.info();
        let mut bytes = bytes;
        if small {
            // Plausible seqs and lengths, to get past the seq checks.
            for (k, rec) in bytes.chunks_mut(64).enumerate() {
                rec[..8].copy_from_slice(&(k as u64 + 8).to_le_bytes());
                rec[16] = rec[16].min(16);
            }
        }
        raw_write(w.region_for_tests(), info.records_offset as usize, &bytes);
        raw_write(w.region_for_tests(), std::mem::offset_of!(PacketHeader, tail), &(tail % 100_000).to_le_bytes());
        let mut r = PacketReader::open(w.fd()).unwrap();
        drain(&mut r);
        let borrowed = r.try_borrow().map(|b| b.map(|b| b.len()));
        prop_assert!(!matches!(borrowed, Err(Error::Timeout(..))));
    }
}

/// A lossless reader's stream starts at the first keyframe after the cursor
/// the service gave it, even when the writer got further (past newer
/// keyframes) before the reader mapped the ring: it loses nothing.
#[test]
fn a_lossless_reader_starts_at_the_first_keyframe_after_its_cursor_not_the_newest() {
    let max = 100;
    let (mut w, _) = ring(1 << 16, 64, max);
    let meta = key_every(10);
    let mut buf = Vec::new();
    for seq in 1..=25u64 {
        fill(seq, packet_len(seq, max), &mut buf);
        w.write(&buf, meta(seq)).unwrap();
    }
    for (cursor, first) in [(0, 1), (5, 11), (11, 21)] {
        let (client, _) = Region::create("packet-test-client", crate::layout::CLIENT_BYTES).unwrap();
        client
            .at::<crate::layout::ClientLine>(0)
            .released_seq
            .store(cursor, std::sync::atomic::Ordering::Relaxed);
        let entry = crate::ring::lease::ClientRef::for_tests(client);
        let mut r = PacketReader::open_for(w.fd(), entry, true).unwrap();
        let mut out = Vec::new();
        for seq in first..=25 {
            let p = r.next_copy(&mut out, T).unwrap();
            assert_eq!(
                (p.seq, p.skipped),
                (seq, 0),
                "a reader given cursor {cursor} reads every packet from keyframe {first}"
            );
            check(seq, &out, max);
        }
    }
}
