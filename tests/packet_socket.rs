//! The packet ring served over the socket, in one process (threads as the
//! two sides): handshake, keyframe join, codec parameters, futex wakeups,
//! lossless delivery and its lease, the wrong kind of socket, and the drain
//! after the publisher closes. The multi-process tests (recorder, late
//! joiner, killed publisher) are in `tests/packet_multiprocess.rs`.

use vramring::ClientOptions;
use vramring_testkit::procs as common;

use std::time::{Duration, Instant};
use vramring::ServeOptions;

use common::{wait_until, TempDir};
use vramring::packet::{
    PacketMeta, PacketPublisher, PacketPublisherConfig, PacketRingConfig, PacketSubscriber, PacketSubscriberOptions,
    PACKET_KEY,
};
use vramring::seam::socket::msg::REJECT_KIND;
use vramring::{Error, Format, Publisher, RingConfig, Subscriber, SubscriberOptions};

const SEC: Duration = Duration::from_secs(1);

fn meta(key: bool, pts: i64) -> PacketMeta {
    PacketMeta {
        pts,
        dts: pts,
        flags: if key { PACKET_KEY } else { 0 },
        codec: 0,
    }
}

/// Packet `i`: its length and bytes derive from `i`, so a reader can check it.
fn packet(i: u64) -> Vec<u8> {
    let len = 100 + (i as usize * 7919) % 3000;
    (0..len).map(|k| (i as usize * 31 + k) as u8).collect()
}

/// A lossless lease of 5 s against 200 ms write timeouts: a lossless
/// reader is evicted only by a test that stalls it on purpose, and a
/// blocked write fails with `LosslessBlocked` (not an eviction) unless the
/// writer itself stalls for the lease.
fn publisher(dir: &TempDir, data_bytes: u64, records: u32) -> PacketPublisher {
    let cfg = PacketPublisherConfig::new(PacketRingConfig::new(data_bytes, records, 4096))
        .write_timeout(Duration::from_millis(200))
        .lossless_lease(Duration::from_secs(5));
    PacketPublisher::create(dir.join("p.sock"), cfg).expect("packet publisher")
}

#[test]
fn a_subscriber_joins_at_the_newest_keyframe_and_reads_params_and_packets() {
    let dir = TempDir::new("pk-join");
    let mut p = publisher(&dir, 1 << 16, 64);
    p.set_codec_params(b"sps+pps v1").unwrap();
    for i in 1..=10u64 {
        p.write(&packet(i), meta(i % 4 == 1, i as i64)).unwrap();
    }
    // Keyframes at 1, 5, 9: a late joiner starts at 9.
    let mut s = PacketSubscriber::connect(dir.join("p.sock"), PacketSubscriberOptions::new()).unwrap();
    let mut params = Vec::new();
    assert_eq!(s.codec_params(&mut params).unwrap(), 1);
    assert_eq!(params, b"sps+pps v1");
    let mut buf = Vec::new();
    let first = s.next_copy(&mut buf, SEC).unwrap();
    assert_eq!(first.seq, 9);
    assert!(first.is_key());
    assert_eq!(buf, packet(9));
    let second = s.next_copy(&mut buf, SEC).unwrap();
    assert_eq!((second.seq, second.pts), (10, 10));
    assert_eq!(buf, packet(10));
    assert!(s.try_next_copy(&mut buf).unwrap().is_none());
    assert_eq!(p.stats().subscribers, 1);
}

#[test]
fn a_parked_subscriber_is_woken_by_the_next_write() {
    let dir = TempDir::new("pk-wake");
    let mut p = publisher(&dir, 1 << 16, 64);
    let path = dir.join("p.sock");
    let (connected, ready) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut s = PacketSubscriber::connect(&path, PacketSubscriberOptions::new().spin(Duration::ZERO)).unwrap();
        connected.send(()).unwrap();
        let mut buf = Vec::new();
        let mut got = Vec::new();
        for _ in 0..50 {
            let pk = s.next_copy(&mut buf, Duration::from_secs(5)).unwrap();
            assert_eq!(buf, packet(pk.seq));
            got.push(pk.seq);
        }
        got
    });
    // Its start is set once `connect` returns: nothing is written before.
    ready
        .recv_timeout(Duration::from_secs(10))
        .expect("the reader connected");
    for i in 1..=50u64 {
        // Spaced out so the reader parks between packets.
        std::thread::sleep(Duration::from_millis(2));
        p.write(&packet(i), meta(true, 0)).unwrap();
    }
    assert_eq!(reader.join().unwrap(), (1..=50).collect::<Vec<_>>());
}

#[test]
fn a_packet_wait_of_duration_max_waits_for_the_packet_instead_of_panicking() {
    let dir = TempDir::new("pk-forever");
    let mut p = publisher(&dir, 1 << 16, 64);
    let path = dir.join("p.sock");
    let (connected, ready) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut s = PacketSubscriber::connect(&path, PacketSubscriberOptions::new()).unwrap();
        connected.send(()).unwrap();
        let mut buf = Vec::new();
        let first = s.next_copy(&mut buf, Duration::MAX).unwrap().seq;
        let second = s.borrow(Duration::MAX).unwrap().seq();
        (first, second)
    });
    ready
        .recv_timeout(Duration::from_secs(10))
        .expect("the reader connected");
    for i in 1..=2u64 {
        std::thread::sleep(Duration::from_millis(20));
        p.write(&packet(i), meta(true, 0)).unwrap();
    }
    assert_eq!(reader.join().unwrap(), (1, 2));
}

/// A lossless reader that joins when the newest keyframe is already gone
/// (a GOP longer than the ring) does not hold the writer for it: nobody can
/// read that keyframe any more, so its cursor starts at the newest packet.
#[test]
fn a_lossless_reader_joining_after_its_keyframe_is_gone_does_not_block_the_writer() {
    let dir = TempDir::new("pk-gone-key");
    // 16 KiB, 8 records: one keyframe, then 20 packets push it out.
    let mut p = publisher(&dir, 1 << 14, 8);
    p.write(&packet(1), meta(true, 1)).unwrap();
    for i in 2..=21u64 {
        p.write(&[i as u8; 100], meta(false, i as i64)).unwrap();
    }
    let _s = PacketSubscriber::connect(dir.join("p.sock"), PacketSubscriberOptions::new().lossless(true)).unwrap();
    assert!(wait_until(Duration::from_secs(5), || p.stats().subscribers == 1));
    // The reader has not read anything yet; the writer's 200 ms timeout
    // would report it blocked on a packet nobody can read.
    let waits = p.stats().lossless_waits;
    p.write(&[22; 100], meta(false, 22))
        .expect("the write was held for a keyframe that is gone");
    assert_eq!(
        p.stats().lossless_waits,
        waits,
        "the write waited for the lossless reader"
    );
}

#[test]
fn a_lossless_subscriber_gets_every_packet_through_many_wraps() {
    let dir = TempDir::new("pk-lossless");
    // 16 KiB of data and 8 records: a slow reader forces the writer to wait.
    let mut p = publisher(&dir, 1 << 14, 8);
    let path = dir.join("p.sock");
    let n = 2000u64;
    let reader = std::thread::spawn(move || {
        let mut s = PacketSubscriber::connect(&path, PacketSubscriberOptions::new().lossless(true)).unwrap();
        let mut buf = Vec::new();
        for i in 1..=n {
            if i % 2 == 0 {
                let pk = s.next_copy(&mut buf, Duration::from_secs(5)).unwrap();
                assert_eq!((pk.seq, pk.skipped), (i, 0));
                assert_eq!(buf, packet(i));
            } else {
                let b = s.borrow(Duration::from_secs(5)).unwrap();
                let mut copy = vec![0u8; b.len()];
                b.copy_to(&mut copy).unwrap();
                if i % 100 == 1 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let pk = b.release().unwrap();
                assert_eq!(pk.seq, i);
                assert_eq!(copy, packet(i));
            }
        }
        s.stats()
    });
    assert!(wait_until(Duration::from_secs(5), || p.stats().subscribers == 1));
    for i in 1..=n {
        // A write that times out on a reader left unscheduled for 200 ms is
        // written again, as a producer does; the 5 s lease still runs.
        loop {
            match p.write(&packet(i), meta(i == 1, 0)) {
                Ok(_) => break,
                Err(Error::LosslessBlocked { .. }) => continue,
                Err(e) => panic!("write {i}: {e}"),
            }
        }
    }
    let st = reader.join().unwrap();
    assert_eq!((st.delivered, st.skipped, st.overruns), (n, 0, 0));
    assert!(
        p.stats().lossless_waits > 0,
        "the writer never had to wait: the test proves nothing"
    );
}

#[test]
fn a_stalled_lossless_subscriber_blocks_the_writer_then_is_evicted_after_its_lease() {
    let dir = TempDir::new("pk-evict");
    let mut p = publisher(&dir, 1 << 14, 8);
    let mut s = PacketSubscriber::connect(
        dir.join("p.sock"),
        PacketSubscriberOptions::new().lossless(true).name("stuck-recorder"),
    )
    .unwrap();
    let mut i = 0u64;
    let blocked = loop {
        i += 1;
        match p.write(&packet(i), meta(i == 1, 0)) {
            Ok(_) => assert!(i < 100, "the writer never blocked"),
            Err(e) => break e,
        }
    };
    match blocked {
        Error::LosslessBlocked { name, held_seq, .. } => {
            assert_eq!(name, "stuck-recorder");
            assert_eq!(held_seq, 1);
        }
        other => panic!("expected LosslessBlocked, got {other}"),
    }
    // Keep trying: past the 5 s lease the reader is evicted and the write
    // goes through.
    let start = Instant::now();
    loop {
        match p.write(&packet(i), meta(false, 0)) {
            Ok(_) => break,
            Err(Error::LosslessBlocked { .. }) => assert!(start.elapsed() < Duration::from_secs(30), "never evicted"),
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(p.stats().evictions, 1);
    let mut buf = Vec::new();
    match s.next_copy(&mut buf, SEC) {
        Err(Error::Evicted { reason }) => assert!(reason.contains("lease"), "{reason}"),
        other => panic!("expected Evicted, got {other:?}"),
    }
}

#[test]
fn a_subscriber_drains_what_is_left_then_sees_producer_gone() {
    let dir = TempDir::new("pk-drain");
    let mut p = publisher(&dir, 1 << 16, 64);
    let mut s = PacketSubscriber::connect(dir.join("p.sock"), PacketSubscriberOptions::new().lossless(true)).unwrap();
    for i in 1..=5u64 {
        p.write(&packet(i), meta(i == 1, 0)).unwrap();
    }
    p.close();
    assert!(matches!(p.write(&packet(6), meta(false, 0)), Err(Error::Closed)));
    let mut buf = Vec::new();
    for i in 1..=5u64 {
        assert_eq!(s.next_copy(&mut buf, SEC).unwrap().seq, i);
    }
    // Told, not left to wait out a timeout of ten times the hang guard.
    let (s, gone) = vramring_testkit::hang::ends("a read after the close", move || {
        let gone = s.next_copy(&mut buf, 10 * vramring_testkit::hang::HANG).map(|p| p.seq);
        (s, gone)
    });
    let mut s = s;
    let mut buf = Vec::new();
    assert!(matches!(gone, Err(Error::ProducerGone { .. })), "{gone:?}");
    // And again on every later call.
    assert!(matches!(s.try_next_copy(&mut buf), Err(Error::ProducerGone { .. })));
}

#[test]
fn the_wrong_kind_of_subscriber_is_refused_on_both_kinds_of_socket() {
    let dir = TempDir::new("pk-kind");
    let _p = publisher(&dir, 1 << 16, 64);
    let frame_cfg = RingConfig::new(Format::Gray8, 64, 16).backend(vramring::BackendChoice::Host);
    let _f = Publisher::create(dir.join("f.sock"), frame_cfg).unwrap();
    match Subscriber::connect(dir.join("p.sock"), SubscriberOptions::default()) {
        Err(Error::Refused { code, .. }) => assert_eq!(code, REJECT_KIND),
        other => panic!("expected a Refused, got {other:?}"),
    }
    match PacketSubscriber::connect(dir.join("f.sock"), PacketSubscriberOptions::new()) {
        Err(Error::Refused { code, .. }) => assert_eq!(code, REJECT_KIND),
        other => panic!("expected a Refused, got {other:?}"),
    }
}

#[test]
fn an_oversized_packet_is_refused_with_a_typed_error_and_nothing_is_written() {
    let dir = TempDir::new("pk-big");
    let mut p = publisher(&dir, 1 << 16, 64);
    match p.write(&vec![0u8; 4097], meta(true, 0)) {
        Err(Error::TooLarge { len: 4097, max: 4096 }) => {}
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(p.seq(), 0);
    assert_eq!(p.write(&vec![1u8; 4096], meta(true, 0)).unwrap(), 1);
}
