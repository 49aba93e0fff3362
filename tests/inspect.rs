//! `vramring::inspect` and `Frame::copy_to_host` in-process on the host
//! backend: an inspector sees the producer line, the slots and every
//! subscriber's entry, never holds a lossless publisher back, and notices
//! the publisher going; a frame copied to host memory is the frame.

use std::time::{Duration, Instant};

use vramring::inspect::{EntryState, InspectOptions, Inspector, ProducerState, RingDetail, RingKind};
use vramring::packet::{
    PacketMeta, PacketPublisher, PacketPublisherConfig, PacketRingConfig, PacketSubscriber, PacketSubscriberOptions,
    PACKET_KEY,
};
use vramring::BackendChoice;
use vramring::ClientOptions;
use vramring::{Error, Format, FrameMeta, Mode, Policy, Publisher, RingConfig, Subscriber, SubscriberOptions};
use vramring_testkit::pattern as testpattern;

/// A socket path in a temp dir of its own (removed with its lock file).
fn sock(name: &str) -> vramring_testkit::procs::SocketPath {
    vramring_testkit::procs::SocketPath::new(&format!("inspect-{name}"))
}

fn publish(p: &mut Publisher) -> u64 {
    let mut slot = p.loan(Duration::from_millis(200)).unwrap();
    let seq = slot.seq();
    testpattern::fill(slot.bytes_mut().unwrap(), seq);
    slot.publish(FrameMeta::pts(seq as i64 * 10)).unwrap()
}

#[test]
fn an_inspector_sees_the_producer_the_slots_and_every_subscriber_and_never_holds_a_lossless_publisher() {
    let path = sock("frames");
    let cfg = RingConfig::new(Format::Nv12, 64, 32)
        .slots(4)
        .backend(BackendChoice::Host)
        .policy(Policy::Lossless);
    let mut p = Publisher::create(&path, cfg).unwrap();
    let mut rec = Subscriber::connect(&path, SubscriberOptions::default().name("rec").lossless(true)).unwrap();
    let mut det = Subscriber::connect(&path, SubscriberOptions::default().name("det").mode(Mode::Latest)).unwrap();
    let mut ins = Inspector::connect(&path, InspectOptions::default()).unwrap();
    assert_eq!(ins.kind(), RingKind::Frames);
    for _ in 0..3 {
        publish(&mut p);
    }
    for _ in 0..2 {
        rec.next(Duration::from_secs(1)).unwrap();
    }
    det.next(Duration::from_secs(1)).unwrap();

    // The publisher counts a connect just after its Welcome is sent, and
    // copies each subscriber's counters into the table on its service tick
    // (250 ms): wait for both.
    let mirrored = |st: &vramring::inspect::RingStatus| {
        st.subscribers
            .iter()
            .any(|r| r.name == "rec" && r.delivered == 2 && r.released_seq == 2)
            && st.subscribers.iter().any(|r| r.name == "det" && r.delivered == 1)
    };
    let mut st = ins.status().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while (st.producer.connects < 3 || !mirrored(&st)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        st = ins.status().unwrap();
    }
    assert_eq!(st.producer.state, ProducerState::Live);
    assert_eq!(st.producer.published, 3);
    assert_eq!(st.producer.connects, 3);
    assert_eq!(st.newest_seq(), 3);
    let RingDetail::Frames(f) = &st.detail else {
        panic!("a frame ring")
    };
    assert_eq!(f.info.geometry().format, Format::Nv12);
    assert_eq!((f.info.geometry().width, f.info.slot_count()), (64, 4));
    assert_eq!(f.backend_name(), "host");
    assert_eq!(f.policy_name(), "lossless");
    assert!(f.gpu_uuid().is_none());
    let mut seqs: Vec<u64> = f.slots.iter().map(|s| s.seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [0, 1, 2, 3]);
    let s3 = f.slots.iter().find(|s| s.seq == 3).unwrap();
    assert_eq!(s3.pts, 30);
    assert!(!s3.writing);
    assert_eq!(st.subscriber_count(), 2);
    let row = |n: &str| st.subscribers.iter().find(|r| r.name == n).unwrap();
    let r = row("rec");
    assert!(r.lossless() && r.state == EntryState::Active && !r.is_self);
    assert_eq!((r.delivered, r.released_seq, r.lag(3)), (2, 2, Some(1)));
    let d = row("det");
    assert_eq!((d.mode_name(), d.delivered, d.lag(3)), ("latest", 1, None));
    let me = row("vramring-inspect");
    assert!(me.is_self && !me.lossless());

    // The subscriber's own view marks its own entry.
    let own = rec.ring_status();
    assert!(own.subscribers.iter().any(|r| r.name == "rec" && r.is_self));
    assert_eq!(own.subscriber_count(), 2, "det and the inspector");

    // The inspector reads nothing, yet the lossless publisher never waits
    // for it: many rings' worth of frames pass while the recorder keeps up.
    for _ in 0..20 {
        publish(&mut p);
        while rec
            .next(Duration::from_millis(500))
            .is_ok_and(|f| f.seq() < p.stats().published)
        {}
    }
    assert_eq!(ins.status().unwrap().producer.published, 23);

    p.close().unwrap();
    let gone = (0..1000).find_map(|_| match ins.status() {
        Err(e) => Some(e),
        Ok(_) => {
            std::thread::sleep(Duration::from_millis(10));
            None
        }
    });
    assert!(matches!(gone, Some(Error::ProducerGone { .. })), "{gone:?}");
}

#[test]
fn an_inspector_of_a_packet_ring_sees_codec_parameters_keyframe_and_records() {
    let path = sock("packets");
    let cfg = PacketPublisherConfig::new(PacketRingConfig::new(1 << 16, 16, 4096).codec(u32::from_le_bytes(*b"H265")));
    let mut p = PacketPublisher::create(&path, cfg).unwrap();
    p.set_codec_params(b"\0\0\0\x01vps-sps-pps").unwrap();
    let meta = |k: bool, pts: i64| PacketMeta {
        pts,
        dts: pts,
        flags: if k { PACKET_KEY } else { 0 },
        codec: 0,
    };
    p.write(&[1u8; 100], meta(true, 0)).unwrap();
    p.write(&[2u8; 50], meta(false, 1)).unwrap();
    p.write(&[3u8; 70], meta(false, 2)).unwrap();
    let mut ins = Inspector::connect(&path, InspectOptions::default()).unwrap();
    assert_eq!(ins.kind(), RingKind::Packets);
    let st = ins.status().unwrap();
    let RingDetail::Packets(k) = &st.detail else {
        panic!("a packet ring")
    };
    assert_eq!(k.codec_name(), "H265");
    assert_eq!((k.write_seq, k.keyframe_seq), (3, 1));
    assert_eq!(k.params, b"\0\0\0\x01vps-sps-pps");
    assert_eq!(k.params_version, 1);
    let lens: Vec<(u64, u32, bool)> = k.records.iter().map(|r| (r.seq, r.len, r.is_key())).collect();
    assert_eq!(lens, [(1, 100, true), (2, 50, false), (3, 70, false)]);
    assert_eq!(st.producer.published, 3);
    assert!(st.recent_rate_hz().is_some_and(|r| r > 0.0));

    let sub = PacketSubscriber::connect(&path, PacketSubscriberOptions::new().name("recorder")).unwrap();
    let st = ins.status().unwrap();
    assert_eq!(st.subscriber_count(), 1);
    assert!(st.subscribers.iter().any(|r| r.name == "recorder" && !r.is_self));
    assert!(sub
        .ring_status()
        .subscribers
        .iter()
        .any(|r| r.name == "recorder" && r.is_self));
}

#[test]
fn copy_to_host_gives_the_whole_frame_pulled_or_pushed_and_refuses_a_short_buffer() {
    let path = sock("copy");
    let cfg = RingConfig::new(Format::Gray8, 128, 64)
        .slots(4)
        .backend(BackendChoice::Host);
    let mut p = Publisher::create(&path, cfg).unwrap();
    let mut pull = Subscriber::connect(&path, SubscriberOptions::default().mode(Mode::Sequential)).unwrap();
    let mut push = Subscriber::connect(&path, SubscriberOptions::default().push(true)).unwrap();
    let len = pull.geometry().frame_bytes as usize;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut pushed_checked = false;
    while !pushed_checked {
        assert!(Instant::now() < deadline, "push delivery never became active");
        let seq = publish(&mut p);
        let f = pull.next(Duration::from_secs(1)).unwrap();
        let mut buf = vec![0u8; len + 7];
        f.copy_to_host(&mut buf).unwrap();
        testpattern::verify(&buf[..len], seq).unwrap();
        assert_eq!(&buf[..len], f.host_bytes().unwrap());
        assert!(matches!(
            f.copy_to_host(&mut buf[..len - 1]),
            Err(Error::TooLarge { .. })
        ));
        // A push subscriber's stream starts once its buffers are mapped
        // (it never holds the pool): until then it sees no frame.
        let active = push.push_active();
        let f = match push.next(Duration::from_millis(100)) {
            Err(Error::Timeout(..)) if !active => continue,
            other => other.unwrap(),
        };
        let mut buf = vec![0u8; len];
        f.copy_to_host(&mut buf).unwrap();
        testpattern::verify(&buf, f.seq()).unwrap();
        pushed_checked = f.pushed();
    }
}

#[test]
fn an_inspector_shows_which_delivery_each_subscriber_was_granted() {
    use vramring::{Delivery, PullAccess};
    let path = sock("delivery");
    let cfg = RingConfig::new(Format::Gray8, 64, 16)
        .backend(BackendChoice::Host)
        .pull(PullAccess::Nobody);
    let mut p = Publisher::create(&path, cfg).unwrap();
    // Refused the pool, the default subscriber is pushed to, in its mode.
    let seq = Subscriber::connect(
        &path,
        SubscriberOptions::default().name("auto-seq").mode(Mode::Sequential),
    )
    .unwrap();
    assert_eq!(seq.delivery(), Delivery::Push);
    let mut ins = Inspector::connect(&path, InspectOptions::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut st = ins.status().unwrap();
    while !st
        .subscribers
        .iter()
        .any(|r| r.name == "auto-seq" && r.push_buffers != 0)
    {
        assert!(Instant::now() < deadline, "the push buffers were never mapped: {st:?}");
        publish(&mut p);
        std::thread::sleep(Duration::from_millis(5));
        st = ins.status().unwrap();
    }
    let row = st.subscribers.iter().find(|r| r.name == "auto-seq").unwrap();
    assert_eq!((row.mode_name(), row.delivery_name()), ("sequential", "push"));
    assert_eq!(row.push_buffers, SubscriberOptions::default().push_buffers);
}
