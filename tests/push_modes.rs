//! Push delivery for every read mode (PROTOCOL.md §16.8): a sequential
//! push reader takes every pushed frame in order from its own queue, a full
//! queue is a counted gap; a lossless push reader holds the producer (never
//! a gap); a default subscriber refused pull is served by push. Host
//! backend, in process: the publisher and its readers take turns, so every
//! count is exact.

use std::time::Duration;

use vramring::{
    BackendChoice, ClientOptions, Delivery, Error, Format, FrameMeta, Mode, Policy, Publisher, PullAccess, Refusal,
    RingConfig, ServeOptions, Subscriber, SubscriberOptions,
};
use vramring_testkit::pattern as testpattern;

/// A socket path in a temp dir of its own (removed with its lock file).
fn sock(name: &str) -> vramring_testkit::procs::SocketPath {
    vramring_testkit::procs::SocketPath::new(&format!("push-modes-{name}"))
}

fn host(slots: u32) -> RingConfig {
    RingConfig::new(Format::Gray8, 256, 64)
        .backend(BackendChoice::Host)
        .slots(slots)
}

/// Publishes one frame filled with the test pattern of its seq.
fn publish(p: &mut Publisher) -> u64 {
    let mut slot = p.loan(Duration::from_millis(200)).unwrap();
    let seq = slot.seq();
    testpattern::fill(slot.bytes_mut().unwrap(), seq);
    slot.publish(FrameMeta::pts(seq as i64)).unwrap();
    seq
}

/// Publishes until the publisher has mapped `s`'s push buffers, which it
/// does at the start of a publish: that frame, `start + 1`, is the first
/// pushed. Returns `start`.
fn until_push_active(p: &mut Publisher, s: &Subscriber) -> u64 {
    let t = std::time::Instant::now();
    while !s.push_active() {
        assert!(
            t.elapsed() < vramring_testkit::hang::HANG,
            "push buffers never attached"
        );
        publish(p);
        std::thread::sleep(Duration::from_millis(2));
    }
    p.next_seq() - 2
}

/// A lossless host ring (16 slots, a long lease) and a lossless push reader
/// with 4 buffers, pushed to from `start + 1` on; the socket's path (its
/// directory goes when it is dropped: keep it as long as the ring).
fn lossless_push_reader(name: &str) -> (vramring_testkit::procs::SocketPath, Publisher, Subscriber, u64) {
    let path = sock(name);
    let cfg = host(16)
        .policy(Policy::Lossless)
        .lossless_lease(Duration::from_secs(30));
    let mut p = Publisher::create(&path, cfg).unwrap();
    let opts = SubscriberOptions::default().lossless(true).push(true).push_buffers(4);
    let s = Subscriber::connect(&path, opts).unwrap();
    let start = until_push_active(&mut p, &s);
    (path, p, s, start)
}

#[test]
fn a_sequential_push_reader_gets_every_queued_frame_in_order_and_counts_a_full_queue_as_a_gap() {
    let path = sock("seq");
    let mut p = Publisher::create(&path, host(32)).unwrap();
    let opts = SubscriberOptions::default()
        .mode(Mode::Sequential)
        .push(true)
        .push_buffers(8)
        .name("seq-push");
    let mut s = Subscriber::connect(&path, opts).unwrap();
    assert_eq!(s.delivery(), Delivery::Push);
    let start = until_push_active(&mut p, &s);
    // 20 frames while the reader reads none: its 8 buffers take the first
    // 8, the other 12 find no buffer it is done with.
    for _ in 1..20 {
        publish(&mut p);
    }
    for want in start + 1..=start + 8 {
        let f = s.next(Duration::from_secs(1)).unwrap();
        assert_eq!(f.seq(), want, "queued frames come oldest first");
        assert!(f.pushed());
        assert_eq!(f.pts(), want as i64);
        testpattern::verify(f.host_bytes().unwrap(), want).unwrap();
    }
    assert!(matches!(s.next(Duration::from_millis(50)), Err(Error::Timeout(..))));
    let later = publish(&mut p);
    let f = s.next(Duration::from_secs(1)).unwrap();
    assert_eq!(f.seq(), later);
    assert_eq!(f.skipped(), 12, "the frames that found the queue full, reported once");
    testpattern::verify(f.host_bytes().unwrap(), later).unwrap();
    let st = s.stats();
    assert_eq!((st.delivered, st.dropped, st.pushed), (9, 12, 9));
    // Keeping up, nothing is lost.
    for _ in 0..50 {
        let seq = publish(&mut p);
        let f = s.next(Duration::from_secs(1)).unwrap();
        assert_eq!((f.seq(), f.skipped()), (seq, 0));
        testpattern::verify(f.host_bytes().unwrap(), seq).unwrap();
    }
    assert_eq!(s.stats().dropped, 12);
}

#[test]
fn a_sequential_push_reader_a_ring_behind_loses_the_frames_whose_meta_is_gone_and_counts_them() {
    // 4 slots, 5 buffers: frames queued but published more than a ring ago
    // lost their slot's meta, as a pull reader would lose them.
    let path = sock("seq-behind");
    let mut p = Publisher::create(&path, host(4)).unwrap();
    let opts = SubscriberOptions::default()
        .mode(Mode::Sequential)
        .push(true)
        .push_buffers(16);
    let mut s = Subscriber::connect(&path, opts).unwrap();
    let start = until_push_active(&mut p, &s);
    for _ in 1..7 {
        publish(&mut p);
    }
    // Buffers hold start+1..=start+5; slots hold start+4..=start+7.
    let f = s.next(Duration::from_secs(1)).unwrap();
    assert_eq!(f.seq(), start + 4);
    assert_eq!(f.skipped(), 3);
    testpattern::verify(f.host_bytes().unwrap(), start + 4).unwrap();

    let f = s.next(Duration::from_secs(1)).unwrap();
    assert_eq!((f.seq(), f.skipped()), (start + 5, 0));

    let seq = publish(&mut p);
    let f = s.next(Duration::from_secs(1)).unwrap();
    assert_eq!(
        (f.seq(), f.skipped()),
        (seq, 2),
        "start+6 and start+7 found the queue full"
    );
    assert_eq!(s.stats().dropped, 5);
}

#[test]
fn a_lossless_push_reader_holds_the_producer_at_its_queue_and_never_misses_a_frame() {
    let (_path, mut p, mut s, start) = lossless_push_reader("lossless");
    // 4 buffers: 3 frames go ahead of a reader that took nothing yet; the
    // 4th waits for it.
    for _ in 1..3 {
        publish(&mut p);
    }
    match p.loan(Duration::from_millis(20)) {
        Err(Error::LosslessBlocked { held_seq, .. }) => assert_eq!(held_seq, start + 1),
        other => panic!(
            "the fourth frame must wait for the reader: {:?}",
            other.map(|s| s.seq())
        ),
    }
    assert_eq!(p.stats().evictions, 0);
    // A reader in another thread takes its time; the producer waits for
    // it, and every frame reaches it whole.
    let reader = std::thread::spawn(move || {
        let mut next = start + 1;
        while next <= start + 200 {
            let f = s.next(Duration::from_secs(10)).unwrap();
            assert_eq!((f.seq(), f.skipped()), (next, 0));
            assert!(f.pushed());
            testpattern::verify(f.host_bytes().unwrap(), next).unwrap();
            next += 1;
            if next % 16 == 0 {
                std::thread::sleep(Duration::from_millis(3));
            }
        }
        s.stats()
    });
    while p.next_seq() <= start + 200 {
        let mut slot = p.loan(Duration::from_secs(10)).unwrap();
        let seq = slot.seq();
        testpattern::fill(slot.bytes_mut().unwrap(), seq);
        slot.publish(FrameMeta::pts(seq as i64)).unwrap();
    }
    let st = reader.join().unwrap();
    assert_eq!((st.delivered, st.dropped, st.pushed), (200, 0, 200));
    assert_eq!(p.stats().evictions, 0);
}

#[test]
fn a_default_subscriber_refused_pull_is_served_by_push_in_its_own_mode() {
    let path = sock("auto");
    let mut p = Publisher::create(&path, host(16).pull(PullAccess::Nobody)).unwrap();
    // Asking for pull only is refused, with the code that says so.
    let pull = SubscriberOptions::default().delivery(Delivery::Pull);
    let e = Subscriber::connect(&path, pull).unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::PullDenied), "{e}");
    // The default (automatic) choice gets push, in the mode it asked for.
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().mode(Mode::Sequential)).unwrap();
    assert_eq!(s.delivery(), Delivery::Push);
    assert_eq!(s.stats().delivery, Delivery::Push);
    let start = until_push_active(&mut p, &s);
    for _ in 1..5 {
        publish(&mut p);
    }
    for want in start + 1..=start + 5 {
        let f = s.next(Duration::from_secs(1)).unwrap();
        assert_eq!(f.seq(), want);
        testpattern::verify(f.host_bytes().unwrap(), want).unwrap();
    }
    // A host ring's default pull access hands the read-only pool to anyone.
    let path = sock("auto-host");
    let _p = Publisher::create(&path, host(4)).unwrap();
    let s = Subscriber::connect(&path, SubscriberOptions::default()).unwrap();
    assert_eq!(s.delivery(), Delivery::Pull);
}

#[test]
fn the_default_pull_access_hands_a_cuda_pool_only_to_the_publishers_own_uid() {
    use vramring::BackendKind::{Cuda, Host};
    let me = rustix::process::geteuid().as_raw();
    let other = me.wrapping_add(1);
    let auto = PullAccess::default();
    assert_eq!(auto, PullAccess::Auto);
    assert!(auto.allows(me, Cuda));
    assert!(
        !auto.allows(other, Cuda),
        "another uid could write every reader's frames"
    );
    assert!(auto.allows(other, Host), "a host pool is handed out read-only");
    assert!(PullAccess::Anyone.allows(other, Cuda));
    assert!(!PullAccess::Nobody.allows(me, Host));
    assert!(PullAccess::Uids(vec![other]).allows(other, Cuda));
}

#[test]
fn push_with_write_access_is_refused_before_anything_is_sent() {
    let opts = SubscriberOptions::default().write(true).push(true);
    let e = Subscriber::connect(sock("never-bound"), opts).unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e}");
}

/// Reads the next frame, checks it is `want` and whole, and keeps it.
fn read_and_hold(s: &mut Subscriber, want: u64) -> vramring::FrameHold {
    let f = s.next(Duration::from_secs(1)).unwrap();
    assert_eq!(f.seq(), want);
    f.hold().expect("a queued push reader's frame can be kept")
}

#[test]
fn a_held_frame_stays_whole_while_the_reader_reads_on_and_its_queue_is_the_limit() {
    let path = sock("hold");
    let mut p = Publisher::create(&path, host(32)).unwrap();
    let opts = SubscriberOptions::default()
        .mode(Mode::Sequential)
        .push(true)
        .push_buffers(4);
    let mut s = Subscriber::connect(&path, opts).unwrap();
    let start = until_push_active(&mut p, &s);
    let kept = read_and_hold(&mut s, start + 1);
    // The other 3 buffers keep serving the reader, in place.
    for _ in 0..3 {
        let seq = publish(&mut p);
        let f = s.next(Duration::from_secs(1)).unwrap();
        assert_eq!((f.seq(), f.skipped()), (seq, 0));
        testpattern::verify(f.host_bytes().unwrap(), seq).unwrap();
    }
    // Then every buffer has a frame newer than the kept one: nothing more
    // is pushed, and the kept frame is still whole.
    for _ in 0..5 {
        publish(&mut p);
    }
    assert!(matches!(s.next(Duration::from_millis(30)), Err(Error::Timeout(..))));
    testpattern::verify(kept.host_bytes().unwrap(), start + 1).unwrap();
    assert_eq!((kept.seq(), kept.pts()), (start + 1, (start + 1) as i64));
    // Let go: at the reader's next read the queue moves again, and the 5
    // frames are a counted gap.
    drop(kept);
    assert!(matches!(s.next(Duration::from_millis(10)), Err(Error::Timeout(..))));
    let seq = publish(&mut p);
    let f = s.next(Duration::from_secs(1)).unwrap();
    assert_eq!((f.seq(), f.skipped()), (seq, 5));
    // Keeping every other frame for a while, nothing is lost.
    let mut held = std::collections::VecDeque::new();
    for _ in 0..60 {
        let seq = publish(&mut p);
        let f = s.next(Duration::from_secs(1)).unwrap();
        assert_eq!((f.seq(), f.skipped()), (seq, 0));
        if seq % 2 == 0 {
            held.push_back(f.hold().unwrap());
        }
        if held.len() > 1 {
            let h = held.pop_front().unwrap();
            testpattern::verify(h.host_bytes().unwrap(), h.seq()).unwrap();
        }
    }
    assert_eq!(s.stats().dropped, 5);
}

#[test]
fn a_lossless_reader_that_keeps_a_frame_holds_the_producer_and_loses_nothing() {
    let (_path, mut p, mut s, start) = lossless_push_reader("hold-lossless");
    let kept = read_and_hold(&mut s, start + 1);
    for want in start + 2..=start + 4 {
        publish(&mut p);
        let f = s.next(Duration::from_secs(1)).unwrap();
        assert_eq!((f.seq(), f.skipped()), (want, 0));
    }
    // Its cursor stays at the kept frame: the window of 3 is used up.
    assert!(
        matches!(p.loan(Duration::from_millis(20)), Err(Error::LosslessBlocked { .. })),
        "the producer must wait for the kept buffer"
    );
    testpattern::verify(kept.host_bytes().unwrap(), start + 1).unwrap();
    drop(kept);
    // The next read releases the cursor; the producer goes on.
    assert!(matches!(s.next(Duration::from_millis(10)), Err(Error::Timeout(..))));
    for _ in 0..20 {
        let seq = publish(&mut p);
        let f = s.next(Duration::from_secs(1)).unwrap();
        assert_eq!((f.seq(), f.skipped()), (seq, 0));
        testpattern::verify(f.host_bytes().unwrap(), seq).unwrap();
    }
    assert_eq!((s.stats().dropped, p.stats().evictions), (0, 0));
}

#[test]
fn a_held_frame_outlives_its_subscriber_and_a_latest_push_frame_cannot_be_held() {
    let path = sock("hold-close");
    let mut p = Publisher::create(&path, host(8)).unwrap();
    let opts = SubscriberOptions::default().mode(Mode::Sequential).push(true);
    let mut s = Subscriber::connect(&path, opts).unwrap();
    let start = until_push_active(&mut p, &s);
    let kept = read_and_hold(&mut s, start + 1);
    drop(s);
    for _ in 0..20 {
        publish(&mut p);
    }
    testpattern::verify(kept.host_bytes().unwrap(), start + 1).unwrap();
    drop(kept);

    let mut latest = Subscriber::connect(&path, SubscriberOptions::default().push(true)).unwrap();
    until_push_active(&mut p, &latest);
    publish(&mut p);
    let f = latest.next(Duration::from_secs(1)).unwrap();
    assert!(f.pushed());
    assert!(f.hold().is_none(), "three latest buffers cannot spare one");
}

#[test]
fn a_kept_frame_let_go_on_another_thread_frees_a_waiting_lossless_publisher_at_once() {
    let (_path, mut p, mut s, start) = lossless_push_reader("hold-elsewhere");
    let kept = read_and_hold(&mut s, start + 1);
    for _ in 0..3 {
        publish(&mut p);
        s.next(Duration::from_secs(1)).unwrap();
    }
    // The window is used up: the publisher waits for the kept buffer, in
    // its own thread.
    let publisher = std::thread::spawn(move || {
        let mut slot = p.loan(Duration::from_secs(30)).unwrap();
        let seq = slot.seq();
        testpattern::fill(slot.bytes_mut().unwrap(), seq);
        slot.publish(FrameMeta::pts(seq as i64)).unwrap();
        (p, seq)
    });
    // The frame is let go elsewhere while the reader waits for the next
    // one: the release wakes the reader, whose cursor then lets the
    // publisher go on within this wait (before: it waited until the
    // reader's call timed out, or evicted it at its lease).
    let dropper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        drop(kept);
    });
    let f = s
        .next(Duration::from_secs(5))
        .expect("the frame the publisher was waiting to push");
    assert_eq!((f.seq(), f.skipped()), (start + 5, 0));
    dropper.join().unwrap();
    let (p, seq) = publisher.join().unwrap();
    assert_eq!(seq, start + 5);
    assert_eq!(p.stats().evictions, 0);
}
