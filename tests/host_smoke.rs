//! In-process end-to-end checks of the host backend: one publisher thread,
//! subscribers in this process (the multi-process suite is `host_multiprocess`).

use std::time::Duration;
use vramring::ClientOptions;
use vramring::ServeOptions;

use vramring::BackendChoice;
use vramring::{
    Error, Format, FrameMeta, Mode, Policy, Publisher, RingConfig, Subscriber, SubscriberOptions, WaitStrategy,
};
use vramring_testkit::hang::{ends, HANG};
use vramring_testkit::pattern as testpattern;

/// A socket path in a temp dir of its own (removed with its lock file).
fn sock(name: &str) -> vramring_testkit::procs::SocketPath {
    vramring_testkit::procs::SocketPath::new(&format!("smoke-{name}"))
}

fn host(format: Format, w: u32, h: u32) -> RingConfig {
    RingConfig::new(format, w, h).backend(BackendChoice::Host)
}

#[test]
fn a_published_frame_arrives_whole_with_its_meta() {
    let path = sock("meta");
    let mut p = Publisher::create(&path, host(Format::Gray8, 64, 32).slots(4)).unwrap();
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().mode(Mode::Sequential)).unwrap();
    let mut slot = p.loan(Duration::from_millis(10)).unwrap();
    let seq = slot.seq();
    testpattern::fill(slot.bytes_mut().unwrap(), seq);
    slot.publish(FrameMeta::pts(1234).with_user(b"cam-7").unwrap().with_flags(1))
        .unwrap();
    let f = s.next(Duration::from_secs(1)).unwrap();
    assert_eq!(f.seq(), 1);
    assert_eq!(f.pts(), 1234);
    assert_eq!(f.flags(), 1);
    assert_eq!(f.user(), b"cam-7");
    testpattern::verify(f.host_bytes().unwrap(), 1).unwrap();
}

#[test]
fn next_times_out_when_nothing_is_published() {
    let path = sock("timeout");
    let _p = Publisher::create(&path, host(Format::Gray8, 16, 16)).unwrap();
    let mut s = Subscriber::connect(&path, SubscriberOptions::default()).unwrap();
    // The read ends (the guard) and says it timed out.
    let r = ends("a 100 ms read", move || {
        s.next(Duration::from_millis(100)).map(|f| f.seq())
    });
    assert!(
        matches!(r, Err(Error::Timeout(d, _)) if d == Duration::from_millis(100)),
        "{r:?}"
    );
}

#[test]
fn a_timeout_or_spin_of_duration_max_waits_for_the_frame_instead_of_panicking() {
    // `Duration::MAX` is the natural "wait for ever"; adding it to an
    // `Instant` panics, so the waits must not.
    for (name, opts) in [
        ("forever", SubscriberOptions::default()),
        ("spin-forever", SubscriberOptions::default().spin(Duration::MAX)),
        (
            "park-forever",
            SubscriberOptions::default()
                .wait(WaitStrategy::Park)
                .spin(Duration::MAX),
        ),
    ] {
        let path = sock(name);
        let mut p = Publisher::create(&path, host(Format::Gray8, 16, 16)).unwrap();
        let mut s = Subscriber::connect(&path, opts).unwrap();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let mut slot = p.loan(Duration::MAX).unwrap();
            testpattern::fill(slot.bytes_mut().unwrap(), 1);
            slot.publish(FrameMeta::pts(1)).unwrap();
            p
        });
        assert_eq!(s.next(Duration::MAX).unwrap().seq(), 1, "{name}");
        drop(h.join().unwrap());
    }
}

/// A read given an hour, parked in slices of ten times the hang guard,
/// ends when the publisher closes: the close rings it, and neither the
/// timeout nor a slice is waited out.
#[test]
fn a_closed_publisher_ends_a_long_read_with_gone() {
    let path = sock("gone");
    let mut p = Publisher::create(&path, host(Format::Gray8, 16, 16)).unwrap();
    let opts = SubscriberOptions::default().park_slice(10 * HANG);
    let mut s = Subscriber::connect(&path, opts).unwrap();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        p.close().unwrap();
    });
    let r = ends("a read across the close", move || {
        s.next(Duration::from_secs(3600)).map(|f| f.seq())
    });
    assert!(matches!(r, Err(Error::ProducerGone { .. })), "{r:?}");
    h.join().unwrap();
}

#[test]
fn a_second_publisher_cannot_take_a_live_socket() {
    let path = sock("live");
    let _p = Publisher::create(&path, host(Format::Gray8, 16, 16)).unwrap();
    assert!(matches!(
        Publisher::create(&path, host(Format::Gray8, 16, 16)),
        Err(Error::AddressInUse(_))
    ));
}

#[test]
fn sequential_reader_counts_gaps_exactly() {
    let path = sock("gaps");
    let mut p = Publisher::create(&path, host(Format::Gray8, 32, 8).slots(4)).unwrap();
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().mode(Mode::Sequential)).unwrap();
    for _ in 0..20 {
        let mut slot = p.loan(Duration::from_millis(10)).unwrap();
        let seq = slot.seq();
        testpattern::fill(slot.bytes_mut().unwrap(), seq);
        slot.publish(FrameMeta::pts(seq as i64)).unwrap();
    }
    let mut got = vec![];
    let mut skipped = vec![];
    while let Ok(f) = s.next(Duration::from_millis(50)) {
        testpattern::verify(f.host_bytes().unwrap(), f.seq()).unwrap();
        got.push(f.seq());
        skipped.push(f.skipped());
    }
    // 4 slots: the safe window is the newest 3 frames.
    assert_eq!(got, vec![18, 19, 20]);
    assert_eq!(s.stats().dropped, 17);
    // The first frame reports the 17 frames before it it never got.
    assert_eq!(skipped, vec![17, 0, 0]);
}

#[test]
fn lossless_reader_gets_every_frame_and_the_producer_waits() {
    let path = sock("lossless");
    // A lease the reader thread, however late it runs, never comes near.
    let cfg = host(Format::Gray8, 32, 8)
        .slots(2)
        .policy(Policy::Lossless)
        .lossless_lease(Duration::from_secs(60));
    let mut p = Publisher::create(&path, cfg).unwrap();
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().lossless(true)).unwrap();
    let reader = std::thread::spawn(move || {
        let mut seqs = vec![];
        for _ in 0..200 {
            let f = s.next(Duration::from_secs(5)).unwrap();
            testpattern::verify(f.host_bytes().unwrap(), f.seq()).unwrap();
            seqs.push(f.seq());
        }
        seqs
    });
    for _ in 0..200 {
        let mut slot = p.loan(Duration::from_secs(30)).unwrap();
        let seq = slot.seq();
        testpattern::fill(slot.bytes_mut().unwrap(), seq);
        slot.publish(FrameMeta::pts(0)).unwrap();
    }
    let seqs = reader.join().unwrap();
    assert_eq!(seqs, (1..=200).collect::<Vec<_>>());
}

#[test]
fn lossless_is_refused_by_an_overwrite_publisher() {
    let path = sock("refuse");
    let _p = Publisher::create(&path, host(Format::Gray8, 16, 16)).unwrap();
    let e = Subscriber::connect(&path, SubscriberOptions::default().lossless(true)).unwrap_err();
    assert!(matches!(e, Error::Refused { code: 5, .. }), "{e}");
}

#[test]
fn a_reconnecting_subscriber_follows_the_next_publisher_instance() {
    let path = sock("reconnect");
    let mut s;
    let first_epoch;
    {
        let mut p = Publisher::create(&path, host(Format::Gray8, 32, 8)).unwrap();
        s = Subscriber::connect(
            &path,
            SubscriberOptions::default().mode(Mode::Sequential).reconnect(true),
        )
        .unwrap();
        first_epoch = s.epoch();
        let slot = p.loan(Duration::from_millis(10)).unwrap();
        slot.publish(FrameMeta::pts(1)).unwrap();
        assert_eq!(s.next(Duration::from_secs(1)).unwrap().seq(), 1);
        p.close().unwrap();
    }
    assert!(matches!(
        s.next(Duration::from_secs(1)),
        Err(Error::ProducerGone { .. })
    ));
    let mut p2 = Publisher::create(&path, host(Format::Gray8, 32, 8)).unwrap();
    // The second publisher publishes once, and stays open until the
    // subscriber has checked the frame.
    let (checked, hold) = std::sync::mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let mut slot = p2.loan(Duration::from_millis(10)).unwrap();
        testpattern::fill(slot.bytes_mut().unwrap(), 1);
        slot.publish(FrameMeta::pts(2)).unwrap();
        let _ = hold.recv();
        p2
    });
    let f = s.next(Duration::from_secs(10)).unwrap();
    assert_eq!((f.seq(), f.pts()), (1, 2));
    testpattern::verify(f.host_bytes().unwrap(), 1).unwrap();
    assert_ne!(s.epoch(), first_epoch);
    assert_eq!(s.stats().reconnects, 1);
    checked.send(()).unwrap();
    drop(h.join().unwrap());
}

/// A reconnecting `next()` keeps to its own timeout even when something at
/// the path accepts the connection but never answers the Hello (a frozen or
/// still-starting publisher): the Welcome wait is cut to what is left of the
/// call's timeout, not the full `connect_timeout`.
#[test]
fn a_reconnecting_next_returns_within_its_timeout_when_nothing_answers_the_hello() {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let path = sock("reconnect-mute");
    let mut p = Publisher::create(&path, host(Format::Gray8, 32, 8)).unwrap();
    // A `connect_timeout` of ten times the hang guard: a Welcome wait that
    // ignored the call's timeout would outlast the guard.
    let opts = SubscriberOptions::default().reconnect(true).connect_timeout(10 * HANG);
    let mut s = Subscriber::connect(&path, opts).unwrap();
    p.close().unwrap();
    drop(p);
    assert!(matches!(
        s.next(Duration::from_secs(1)),
        Err(Error::ProducerGone { .. })
    ));
    // A listener that queues connections and never accepts them.
    let mute =
        rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
    rustix::net::bind(&mute, &SocketAddrUnix::new(&*path).unwrap()).unwrap();
    rustix::net::listen(&mute, 8).unwrap();
    let r = ends("a 200 ms reconnecting read", move || {
        s.next(Duration::from_millis(200)).map(|f| f.seq())
    });
    let _ = std::fs::remove_file(&path);
    assert!(matches!(r, Err(Error::Timeout(..))), "{r:?}");
}

#[test]
fn a_push_subscriber_receives_whole_frames_without_copying_them_itself() {
    let path = sock("push");
    let mut p = Publisher::create(&path, host(Format::Gray8, 256, 64).slots(4)).unwrap();
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().push(true)).unwrap();
    // A push subscriber never holds the pool: its stream starts at the first
    // frame pushed after the publisher mapped its buffers (at a publish
    // after the Attach); every frame from then on is pushed, none dropped.
    let t = std::time::Instant::now();
    while !s.push_active() {
        assert!(t.elapsed() < HANG, "push never became active");
        let slot = p.loan(Duration::from_millis(10)).unwrap();
        slot.publish(FrameMeta::pts(0)).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut pushed = 0;
    for _ in 0..200 {
        let mut slot = p.loan(Duration::from_millis(10)).unwrap();
        let seq = slot.seq();
        testpattern::fill(slot.bytes_mut().unwrap(), seq);
        slot.publish(FrameMeta::pts(seq as i64)).unwrap();
        let f = s.next(Duration::from_secs(1)).unwrap();
        assert_eq!(f.seq(), seq);
        assert_eq!(f.pts(), seq as i64);
        testpattern::verify(f.host_bytes().unwrap(), seq).unwrap();
        pushed += u64::from(f.pushed());
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(pushed, 200, "every frame after the attach is pushed");
    assert_eq!(s.stats().pushed, pushed);
    assert_eq!(s.stats().dropped, 0, "no gap once the stream started");
}

#[test]
fn a_held_push_frame_is_never_overwritten() {
    let path = sock("push-held");
    let mut p = Publisher::create(&path, host(Format::Gray8, 256, 64).slots(2)).unwrap();
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().push(true)).unwrap();
    let publish = |p: &mut Publisher| {
        let mut slot = p.loan(Duration::from_millis(10)).unwrap();
        let seq = slot.seq();
        testpattern::fill(slot.bytes_mut().unwrap(), seq);
        slot.publish(FrameMeta::pts(0)).unwrap();
    };
    // The publisher maps the buffers at a publish after the Attach arrived.
    let t = std::time::Instant::now();
    while !s.push_active() {
        assert!(t.elapsed() < HANG, "push buffers never attached");
        publish(&mut p);
        std::thread::sleep(Duration::from_millis(5));
    }
    publish(&mut p);
    let f = s.next(Duration::from_secs(1)).unwrap();
    assert!(f.pushed());
    let (seq, addr, len) = (f.seq(), f.host_bytes().unwrap().as_ptr() as usize, f.len() as usize);
    // Publish many more frames while the reader still holds `seq`.
    for _ in 0..20 {
        publish(&mut p);
    }
    // SAFETY: the held push buffer stays mapped while the subscriber lives.
    let held = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
    testpattern::verify(held, seq).unwrap();
    let newest = p.next_seq() - 1;
    let g = s.next(Duration::from_secs(1)).unwrap();
    assert_eq!(g.seq(), newest);
    assert_eq!(g.skipped(), newest - seq - 1);
    testpattern::verify(g.host_bytes().unwrap(), newest).unwrap();
}

#[test]
fn a_push_borrow_reads_the_newest_buffer_in_place_and_leaves_the_held_one_alone() {
    let path = sock("push-borrow");
    let mut p = Publisher::create(&path, host(Format::Gray8, 256, 64).slots(2)).unwrap();
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().push(true)).unwrap();
    let publish = |p: &mut Publisher| {
        let mut slot = p.loan(Duration::from_millis(10)).unwrap();
        let seq = slot.seq();
        testpattern::fill(slot.bytes_mut().unwrap(), seq);
        slot.publish(FrameMeta::pts(seq as i64)).unwrap();
    };
    let t = std::time::Instant::now();
    while !s.push_active() {
        assert!(t.elapsed() < HANG, "push buffers never attached");
        publish(&mut p);
        std::thread::sleep(Duration::from_millis(5));
    }
    publish(&mut p);
    let f = s.next(Duration::from_secs(1)).unwrap();
    assert!(f.pushed());
    let (held_seq, held_addr, len) = (f.seq(), f.host_bytes().unwrap().as_ptr() as usize, f.len() as usize);
    let mut whole = 0;
    for _ in 0..20 {
        publish(&mut p);
        let newest = p.next_seq() - 1;
        let b = s.borrow(Duration::from_secs(1)).unwrap();
        assert!(b.pushed());
        assert_eq!((b.seq(), b.pts()), (newest, newest as i64));
        assert_ne!(
            b.host_ptr().unwrap() as usize,
            held_addr,
            "the borrow reads another buffer than the held one"
        );
        let mut copy = vec![0u8; len];
        b.copy_to(&mut copy).unwrap();
        b.release().unwrap();
        testpattern::verify(&copy, newest).unwrap();
        whole += 1;
    }
    // SAFETY: the held push buffer stays mapped while the subscriber lives.
    let held = unsafe { std::slice::from_raw_parts(held_addr as *const u8, len) };
    testpattern::verify(held, held_seq).unwrap();
    // The publisher rewrites a borrowed (not held) buffer two frames on,
    // and the release says so.
    publish(&mut p);
    let b = s.borrow(Duration::from_secs(1)).unwrap();
    let seq = b.seq();
    publish(&mut p);
    publish(&mut p);
    assert!(matches!(b.release(), Err(Error::Overrun { seq: s2 }) if s2 == seq));
    testpattern::verify(held, held_seq).unwrap();
    let st = s.stats();
    assert_eq!(st.pushed, 1 + whole);
    assert_eq!(st.overruns, 1);
    // `next` moves the hold to the newest frame as before.
    let g = s.next(Duration::from_secs(1)).unwrap();
    assert_eq!(g.seq(), p.next_seq() - 1);
    testpattern::verify(g.host_bytes().unwrap(), g.seq()).unwrap();
}

#[test]
fn subscribers_connect_while_the_producer_publishes_flat_out() {
    let path = sock("flat-out");
    let mut p = Publisher::create(&path, host(Format::Gray8, 64, 64).slots(8)).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|i| {
            let path = path.to_path_buf();
            std::thread::spawn(move || {
                let mut s = Subscriber::connect(&path, SubscriberOptions::default().push(i % 2 == 0)).unwrap();
                for _ in 0..50 {
                    let f = s.next(Duration::from_secs(5)).unwrap();
                    testpattern::verify(f.host_bytes().unwrap(), f.seq()).unwrap();
                }
            })
        })
        .collect();
    let s2 = stop.clone();
    let mut published = 0u64;
    while !readers.iter().all(|r| r.is_finished()) && !s2.load(std::sync::atomic::Ordering::Relaxed) {
        let mut slot = p.loan(Duration::from_millis(10)).unwrap();
        let seq = slot.seq();
        testpattern::fill(slot.bytes_mut().unwrap(), seq);
        slot.publish(FrameMeta::pts(0)).unwrap();
        published += 1;
        assert!(published < 50_000_000);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
}

#[test]
fn a_stalled_lossless_reader_is_evicted_after_its_lease_and_told_so() {
    let path = sock("evict");
    // A lease far longer than the short loan below: only a 2 s stall of
    // this thread inside that loan could make it evict instead of failing.
    let lease = Duration::from_secs(2);
    let cfg = host(Format::Gray8, 32, 8)
        .slots(2)
        .policy(Policy::Lossless)
        .lossless_lease(lease);
    let mut p = Publisher::create(&path, cfg).unwrap();
    let mut stalled = Subscriber::connect(&path, SubscriberOptions::default().lossless(true).name("stalled")).unwrap();
    // Two frames fill the ring; the third needs the stalled reader's slot.
    for _ in 0..2 {
        p.loan(Duration::from_millis(10))
            .unwrap()
            .publish(FrameMeta::pts(0))
            .unwrap();
    }
    // A loan shorter than the lease fails with a typed error naming the
    // reader (the lease is measured from this loan's wait on)...
    let t = std::time::Instant::now();
    match p.loan(Duration::from_millis(50)) {
        Err(Error::LosslessBlocked { name, held_seq, .. }) => assert_eq!((name.as_str(), held_seq), ("stalled", 1)),
        other => panic!("expected LosslessBlocked, got {other:?}"),
    }
    // ...and one that outlasts the lease evicts it and goes on, not before
    // the lease.
    p.loan(Duration::from_secs(10))
        .unwrap()
        .publish(FrameMeta::pts(0))
        .unwrap();
    assert!(t.elapsed() >= lease, "evicted after {:?}", t.elapsed());
    assert_eq!(p.stats().evictions, 1);
    match stalled.next(Duration::from_secs(10)) {
        Err(Error::Evicted { reason }) => assert!(reason.contains("lease"), "{reason}"),
        other => panic!("expected Evicted, got {other:?}"),
    }
    // The producer no longer waits for it.
    for _ in 0..10 {
        p.loan(Duration::from_millis(10))
            .unwrap()
            .publish(FrameMeta::pts(0))
            .unwrap();
    }
}

#[test]
fn frames_committed_before_a_close_are_delivered_before_producer_gone() {
    let path = sock("drain");
    let mut p = Publisher::create(&path, host(Format::Gray8, 64, 32).slots(8)).unwrap();
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().mode(Mode::Sequential)).unwrap();
    for _ in 0..5 {
        let mut slot = p.loan(Duration::from_millis(10)).unwrap();
        let seq = slot.seq();
        testpattern::fill(slot.bytes_mut().unwrap(), seq);
        slot.publish(FrameMeta::pts(seq as i64)).unwrap();
    }
    p.close().unwrap();
    // Let the service free our entry and say Bye before we read anything:
    // the frames are still in the ring and must come first.
    std::thread::sleep(Duration::from_millis(100));
    for want in 1..=5u64 {
        let f = s.next(Duration::from_secs(1)).unwrap();
        assert_eq!(f.seq(), want);
        testpattern::verify(f.host_bytes().unwrap(), want).unwrap();
    }
    assert!(matches!(
        s.next(Duration::from_secs(1)),
        Err(Error::ProducerGone { .. })
    ));
    // And on every later call, borrow included.
    assert!(matches!(
        s.borrow(Duration::from_millis(10)),
        Err(Error::ProducerGone { .. })
    ));
}

/// With nobody connected the socket service polls for its idle tick,
/// stretched here to an hour. `close` joins the service for a bounded
/// time, then leaves it running (and logs so): the service must have been
/// joined, which it can only be if the close woke it.
#[test]
fn close_stops_the_socket_service_at_once_not_at_its_next_tick() {
    let path = sock("close-fast");
    let tick = Duration::from_secs(3600);
    let p = vramring::seam::publisher_with_idle_tick(&path, host(Format::Gray8, 16, 16), tick).unwrap();
    // Let the service settle into its idle poll.
    std::thread::sleep(Duration::from_millis(50));
    vramring_testkit::events::close_joining_the_service(p);
}

/// Reads from a 2-slot ring whose publisher overwrites slots during the
/// reader's copies, until the reader has lost frames to overruns; returns
/// the sum of the delivered frames' `skipped` and the reader's stats.
fn read_through_overruns(mode: Mode, name: &str) -> (u64, vramring::SubscriberStats) {
    let path = sock(name);
    let mut p = Publisher::create(&path, host(Format::Gray8, 2048, 2048).slots(2)).unwrap();
    let reader = {
        let path = path.to_path_buf();
        std::thread::spawn(move || {
            let mut s = Subscriber::connect(&path, SubscriberOptions::default().mode(mode)).unwrap();
            let t = std::time::Instant::now();
            let mut skipped = 0;
            let mut delivered = 0;
            while t.elapsed() < Duration::from_secs(20) {
                skipped += s.next(Duration::from_secs(5)).unwrap().skipped();
                delivered += 1;
                if s.stats().overruns >= 3 && delivered >= 20 {
                    break;
                }
            }
            (skipped, s.stats())
        })
    };
    // Bounded: past 30 s the publisher stops, and the reader's next read
    // fails (a timeout), which fails the test instead of hanging it.
    let t = std::time::Instant::now();
    let mut n = 0u64;
    while !reader.is_finished() && t.elapsed() < Duration::from_secs(30) {
        let slot = p.loan(Duration::from_millis(10)).unwrap();
        slot.publish(FrameMeta::pts(0)).unwrap();
        n += 1;
        // Mostly faster than a copy, with a pause now and then in which a
        // copy can finish whole.
        std::thread::sleep(Duration::from_micros(if n % 8 == 0 { 3_000 } else { 150 }));
    }
    reader.join().expect("the reader failed")
}

#[test]
fn a_frames_skipped_counts_every_frame_lost_since_the_previous_one_overruns_included() {
    for (mode, name) in [(Mode::Latest, "skip-latest"), (Mode::Sequential, "skip-seq")] {
        let (skipped, stats) = read_through_overruns(mode, name);
        assert!(
            stats.overruns >= 3,
            "{mode:?}: the publisher never overwrote a slot during a copy in 20 s: {stats:?}"
        );
        // The loop ends on a delivered frame, so every loss is reported.
        assert_eq!(
            skipped, stats.dropped,
            "{mode:?}: the frames' skipped do not add up to the frames lost: {stats:?}"
        );
    }
}

#[test]
fn frames_a_borrow_reported_are_reported_again_when_the_borrow_is_overrun() {
    let path = sock("borrow-overrun");
    let mut p = Publisher::create(&path, host(Format::Gray8, 64, 16).slots(2)).unwrap();
    let mut s = Subscriber::connect(&path, SubscriberOptions::default()).unwrap();
    let publish = |p: &mut Publisher| {
        let mut slot = p.loan(Duration::from_millis(10)).unwrap();
        let seq = slot.seq();
        testpattern::fill(slot.bytes_mut().unwrap(), seq);
        slot.publish(FrameMeta::pts(seq as i64)).unwrap();
    };
    for _ in 0..3 {
        publish(&mut p);
    }
    let b = s.borrow(Duration::from_secs(1)).unwrap();
    assert_eq!((b.seq(), b.skipped()), (3, 2));
    // Frames 4 and 5 overwrite both slots, the borrowed one included.
    publish(&mut p);
    publish(&mut p);
    assert!(matches!(b.release(), Err(Error::Overrun { seq: 3 })));
    let f = s.next(Duration::from_secs(1)).unwrap();
    // Frame 5 reports 1, 2 (which the borrow reported, then lost), 3 (the
    // borrowed frame) and 4: every frame since the last delivered one.
    assert_eq!((f.seq(), f.skipped()), (5, 4));
    let st = s.stats();
    assert_eq!((st.delivered, st.dropped, st.overruns), (1, 4, 1));
}

/// Publishes a 64×16 gray frame on `p`.
fn publish_one(p: &mut Publisher) {
    let slot = p.loan(Duration::from_millis(50)).unwrap();
    slot.publish(FrameMeta::pts(0)).unwrap();
}

#[test]
fn push_attaches_past_the_attach_rate_wait_for_a_token_in_order_of_arrival() {
    let path = sock("attach-rate");
    let mut p = Publisher::create(&path, host(Format::Gray8, 64, 16).slots(4).attach_rate(2, 1)).unwrap();
    let push = SubscriberOptions::default().push(true);
    // Before the first Attach: the first token is taken after this, the
    // second comes 500 ms after that, the third 500 ms later still.
    let t0 = std::time::Instant::now();
    let subs: Vec<Subscriber> = (0..3)
        .map(|_| Subscriber::connect(&path, push.clone()).unwrap())
        .collect();
    let connected = t0.elapsed();
    // Publish until every subscriber's buffers are mapped; note when each
    // was first seen mapped.
    let mut active: Vec<Option<Duration>> = vec![None; subs.len()];
    while active.iter().any(Option::is_none) {
        assert!(t0.elapsed() < HANG, "push never became active: {active:?}");
        publish_one(&mut p);
        for (k, s) in subs.iter().enumerate() {
            if active[k].is_none() && s.push_active() {
                active[k] = Some(t0.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let at: Vec<Duration> = active.into_iter().flatten().collect();
    // One token at once, then one every 500 ms, in order of arrival.
    assert!(at[0] < at[1] && at[1] < at[2], "not served in order of arrival: {at:?}");
    assert!(
        at[1] >= Duration::from_millis(500),
        "the second attach did not wait for a token: {at:?}"
    );
    assert!(
        at[2] >= Duration::from_millis(1000),
        "the third attach did not wait for a token: {at:?}"
    );
    let st = p.stats();
    // Both later Attaches wait for a token if they came within one interval
    // of the first; one at least within two (this thread may stall between
    // its connects).
    let deferred = match connected.as_millis() {
        0..500 => 2,
        500..1000 => 1,
        _ => 0,
    };
    assert_eq!(st.attaches, 3, "{st:?}");
    assert!(
        (deferred..=2).contains(&st.attaches_deferred),
        "connected in {connected:?}: {st:?}"
    );
}

/// The order is read from the socket service's own events (which Attach
/// waited, which was served, in the order it did so), not from when this
/// thread happened to notice a mapping: a stalled test thread cannot
/// change it.
#[test]
fn a_push_peer_reconnecting_in_a_loop_gets_only_the_attach_rate_and_a_newcomer_still_gets_its_turn() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use vramring_testkit::events::Events;
    let path = sock("attach-churn");
    // One token at a time, one every 500 ms.
    let (rate, burst) = (2, 1);
    // The publisher's service logs to this thread's events.
    let (events, _events) = Events::on_this_thread();
    let mut p = Publisher::create(&path, host(Format::Gray8, 64, 16).slots(4).attach_rate(rate, burst)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (connects, served) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    // Before the churner's first Attach: no token is taken before it.
    let t0 = std::time::Instant::now();
    // The churner: connect as a push subscriber, give the publisher 20 ms
    // to map its buffers, leave, and again.
    let churner = {
        let (path, stop, connects, served) = (path.to_path_buf(), stop.clone(), connects.clone(), served.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let s = Subscriber::connect(&path, SubscriberOptions::default().push(true).name("churner")).unwrap();
                connects.fetch_add(1, Ordering::Relaxed);
                let t = std::time::Instant::now();
                while !s.push_active() && t.elapsed() < Duration::from_millis(20) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if s.push_active() {
                    served.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    // Newcomers, one at a time, until one came while the churner waited
    // ahead of it (one that found a token free was served at once, which
    // says nothing of the order). For it: the Attaches the service served
    // from its arrival to its own.
    let mut served_meanwhile = None;
    let mut newcomers = 0;
    while served_meanwhile.is_none() || t0.elapsed() < Duration::from_secs(3) {
        assert!(t0.elapsed() < HANG, "no newcomer ever waited behind the churner");
        publish_one(&mut p);
        if served_meanwhile.is_some() {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let s = Subscriber::connect(&path, SubscriberOptions::default().push(true).name("newcomer")).unwrap();
        newcomers += 1;
        let me = s
            .ring_status()
            .subscribers
            .into_iter()
            .find(|r| r.is_self)
            .expect("its own row");
        let tag = format!(" index={} generation={}", me.index, me.generation);
        while !s.push_active() {
            assert!(t0.elapsed() < HANG, "the newcomer never got its buffers mapped");
            publish_one(&mut p);
            std::thread::sleep(Duration::from_millis(2));
        }
        let log = events.take();
        let waited = log
            .iter()
            .position(|e| e.starts_with("a push Attach waits") && e.ends_with(&tag));
        let own = log
            .iter()
            .position(|e| e.starts_with("serving a push Attach") && e.ends_with(&tag));
        let own = own.unwrap_or_else(|| panic!("no event served the newcomer{tag}: {log:?}"));
        if let Some(w) = waited {
            served_meanwhile = Some(
                log[w..own]
                    .iter()
                    .filter(|e| e.starts_with("serving a push Attach"))
                    .count(),
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    churner.join().unwrap();
    let elapsed = t0.elapsed().as_secs_f64();
    let st = p.stats();
    let (connects, served) = (connects.load(Ordering::Relaxed), served.load(Ordering::Relaxed));
    eprintln!(
        "churner: {connects} connections, {served} mapped; publisher: {} attaches served, {} deferred, in {elapsed:.1} s; \
         {newcomers} newcomers; {served_meanwhile:?} served while the one that waited waited",
        st.attaches, st.attaches_deferred
    );
    // The bucket: `burst` at once, then `rate` a second (two more: a token
    // may come between the clock read and the stats, and one as the
    // churner stops). Load only lowers the count.
    let most = u64::from(burst) + (f64::from(rate) * elapsed).ceil() as u64 + 2;
    assert!(
        st.attaches <= most,
        "{} attaches served in {elapsed:.1} s, more than {most}",
        st.attaches
    );
    assert!(
        connects > st.attaches,
        "the churner connected {connects} times, never faster than the rate; the test proves nothing"
    );
    assert!(st.attaches_deferred > 0, "{st:?}");
    // First come, first served: the newcomer waits behind at most the
    // churner's one connection that was waiting before it.
    let meanwhile = served_meanwhile.unwrap();
    assert!(
        meanwhile <= 1,
        "{meanwhile} other attaches were served while the newcomer waited for its turn"
    );
}

#[test]
fn an_attach_that_does_not_fit_is_refused_at_once_and_spends_no_attach_token() {
    use std::os::fd::AsFd;
    use vramring::seam::socket::msg::{self, Attach, Hello, Msg};
    use vramring::seam::socket::transport;
    let path = sock("attach-misfit");
    // One token, then one a second: a misfit that spent the token would
    // make the honest subscriber below wait (deferred) for the next.
    let mut p = Publisher::create(&path, host(Format::Gray8, 64, 16).slots(4).attach_rate(1, 1)).unwrap();
    let conn = transport::connect(&path).unwrap();
    let hello = Msg::Hello(Hello {
        flags: msg::HELLO_PUSH,
        backends: 1 << vramring::seam::layout::BACKEND_HOST,
        name: "misfit".into(),
        device_uuid: [0; 16],
    });
    transport::send(conn.as_fd(), &hello.encode(), &[]).unwrap();
    let welcome = transport::recv(conn.as_fd(), Duration::from_secs(5)).unwrap().unwrap();
    assert!(matches!(Msg::decode(&welcome.bytes), Ok(Msg::Welcome(_))));
    // Two buffers where three are due.
    let fd = rustix::fs::memfd_create("misfit", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let attach = Msg::Attach(Attach {
        count: 2,
        stride: 64 * 1024,
        bytes: 128 * 1024,
    });
    transport::send(conn.as_fd(), &attach.encode(), &[fd.as_fd()]).unwrap();
    let notice = transport::recv(conn.as_fd(), Duration::from_secs(5)).unwrap().unwrap();
    assert!(
        matches!(Msg::decode(&notice.bytes), Ok(Msg::Evicted(_))),
        "the misfit was not evicted at once"
    );
    // The honest push subscriber gets the one token.
    let t0 = std::time::Instant::now();
    let s = Subscriber::connect(&path, SubscriberOptions::default().push(true)).unwrap();
    while !s.push_active() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the honest push subscriber waited for a token the misfit spent"
        );
        publish_one(&mut p);
        std::thread::sleep(Duration::from_millis(2));
    }
    let st = p.stats();
    assert_eq!((st.attaches, st.attaches_deferred, st.evictions), (1, 0, 1), "{st:?}");
}

/// On a host ring the typed views say where the bytes are: a loaned slot
/// has no device memory (a typed error naming the backend), a frame and a
/// borrow have none either, and a borrow hands out the slot's host mapping
/// only as a raw pointer, whose bytes are the frame it validated.
#[test]
fn a_host_ring_hands_out_host_memory_and_refuses_device_views() {
    let path = sock("views");
    let mut p = Publisher::create(&path, host(Format::Gray8, 64, 16)).unwrap();
    let mut s = Subscriber::connect(&path, SubscriberOptions::default()).unwrap();
    let mut slot = p.loan(Duration::from_millis(100)).unwrap();
    match slot.device_mut() {
        Err(vramring::Error::WrongBackend { backend, .. }) => assert_eq!(backend, "host"),
        other => panic!("a host slot gave device memory: {other:?}"),
    }
    assert!(matches!(
        slot.plane_device_mut(0),
        Err(vramring::Error::WrongBackend { .. })
    ));
    let seq = slot.seq();
    testpattern::fill(slot.bytes_mut().unwrap(), seq);
    slot.publish(FrameMeta::pts(seq as i64)).unwrap();
    {
        let f = s.next(Duration::from_secs(1)).unwrap();
        assert!(f.device().is_none(), "a host frame has no device view");
        testpattern::verify(f.host_bytes().unwrap(), seq).unwrap();
    }
    let mut slot = p.loan(Duration::from_millis(100)).unwrap();
    let seq = slot.seq();
    testpattern::fill(slot.bytes_mut().unwrap(), seq);
    slot.publish(FrameMeta::pts(seq as i64)).unwrap();
    let b = s.borrow(Duration::from_secs(1)).unwrap();
    assert_eq!(b.seq(), seq);
    assert!(b.device().is_none(), "a host borrow has no device view");
    let ptr = b.host_ptr().expect("a host borrow's mapping");
    let len = b.len() as usize;
    let mut copy = vec![0u8; len];
    // SAFETY: `ptr` is the borrowed slot in this process's read-only
    // mapping, `len` bytes, mapped while `b` lives; bytes the publisher
    // rewrites meanwhile are caught by `release` below.
    unsafe { std::ptr::copy_nonoverlapping(ptr, copy.as_mut_ptr(), len) };
    b.release().expect("the slot was not overwritten");
    testpattern::verify(&copy, seq).unwrap();
}
