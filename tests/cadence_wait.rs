//! The default (cadence) wait against a real publisher thread on the host
//! backend: it locks onto a steady source and catches frames spinning in
//! its window, it never locks onto an irregular one, and a paused stream
//! costs it no CPU. Bounds are loose: CI runs on 2 shared cores.

use std::time::{Duration, Instant};

use vramring::{BackendChoice, Error, Format, FrameMeta, Mode, Publisher, RingConfig, Subscriber, SubscriberOptions};

/// The tests of this file run one at a time: each has a publisher and a
/// subscriber thread that spin in their windows, and four of them at once
/// on CI's 2 shared cores measured timer overshoots of 0.6 ms (more than
/// the 25 fps budget lets a window cover), which is the load of the test
/// run, not the behaviour under test.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn sock(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("vramring-cadence-{}-{name}.sock", std::process::id()))
}

fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Publishes one small frame at each offset (from the first publish) in
/// `offsets`, on its own thread; the publisher stays open until `hold`
/// after the last.
fn publish_at(path: &std::path::Path, offsets: Vec<Duration>, hold: Duration) -> std::thread::JoinHandle<()> {
    let cfg = RingConfig::new(Format::Gray8, 64, 32)
        .slots(4)
        .backend(BackendChoice::Host);
    let mut p = Publisher::create(path, cfg).expect("publisher");
    std::thread::spawn(move || {
        // Give the subscriber time to connect.
        std::thread::sleep(Duration::from_millis(100));
        let start = Instant::now();
        for (k, at) in offsets.into_iter().enumerate() {
            if let Some(d) = (start + at).checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
            let slot = p.loan(Duration::from_secs(1)).expect("loan");
            slot.publish(FrameMeta::pts(k as i64)).expect("publish");
        }
        std::thread::sleep(hold);
        p.close().expect("close");
    })
}

fn read_all(s: &mut Subscriber) {
    loop {
        match s.next(Duration::from_secs(5)) {
            Ok(_) => {}
            Err(Error::ProducerGone { .. }) => return,
            Err(e) => panic!("next: {e}"),
        }
    }
}

/// One steady publisher (50 frames, one every 40 ms) read with the default
/// wait: whether the wait locked at some point, and its final state.
fn steady_session(k: usize) -> (bool, vramring::seam::ring::cadence::CadenceState) {
    let path = sock(&format!("steady{k}"));
    let offsets = (0..50).map(|k| Duration::from_millis(40 * k)).collect();
    let h = publish_at(&path, offsets, Duration::from_millis(10));
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().mode(Mode::Sequential)).unwrap();
    let mut locked_at_some_point = false;
    loop {
        match s.next(Duration::from_secs(5)) {
            Ok(_) => {}
            Err(Error::ProducerGone { .. }) => break,
            Err(e) => panic!("next: {e}"),
        }
        if let Some(iv) = s.cadence().interval_ns {
            locked_at_some_point = true;
            // The publisher's interval, within what thread sleeps jitter.
            assert!((36_000_000..=44_000_000).contains(&iv), "interval {iv} ns");
        }
    }
    h.join().unwrap();
    // Whatever the windows caught or missed, no frame was lost.
    assert_eq!(s.stats().dropped, 0);
    (locked_at_some_point, s.cadence())
}

/// A loaded 2-core machine wakes the threads late and their windows miss
/// (the frames still come, by the doorbell; three misses in a row drop the
/// lock): up to three sessions, one of which must have planned at least 10
/// windows and caught 5 frames spinning inside them (most of them on an
/// idle machine; a few suffice to prove the path). `session(k)` runs
/// session `k`, checks what must hold in every one, and says whether the
/// wait locked.
fn one_of_three_catches_five(
    what: &str,
    session: impl Fn(usize) -> (bool, vramring::seam::ring::cadence::CadenceState),
) {
    let mut last = None;
    for k in 0..3 {
        let (locked, st) = session(k);
        if locked && st.windows >= 10 && st.hits >= 5 {
            return;
        }
        last = Some(st);
    }
    panic!("no session locked and caught 5 {what} in 10 windows or more: {last:?}");
}

#[test]
fn the_default_wait_locks_onto_a_steady_publisher_and_spins_only_in_its_window() {
    let _serial = one_at_a_time();
    one_of_three_catches_five("frames", steady_session);
}

#[test]
fn an_irregular_publisher_gets_no_spin_window() {
    let _serial = one_at_a_time();
    let path = sock("irregular");
    // 1–60 ms, a fixed pseudo-random sequence.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut at = Duration::ZERO;
    let offsets = (0..40)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            at += Duration::from_micros(1_000 + x % 59_000);
            at
        })
        .collect();
    let h = publish_at(&path, offsets, Duration::from_millis(10));
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().mode(Mode::Sequential)).unwrap();
    read_all(&mut s);
    h.join().unwrap();
    let st = s.cadence();
    assert_eq!(st.interval_ns, None, "{st:?}");
    assert_eq!(st.windows, 0, "{st:?}");
    assert_eq!(s.stats().delivered, 40);
}

#[test]
fn a_paused_stream_costs_the_default_wait_no_cpu() {
    let _serial = one_at_a_time();
    let path = sock("paused");
    let offsets = (0..20).map(|k| Duration::from_millis(40 * k)).collect();
    // The publisher stays open but silent for 3 s after its last frame.
    let h = publish_at(&path, offsets, Duration::from_secs(3));
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().mode(Mode::Sequential)).unwrap();
    for _ in 0..20 {
        s.next(Duration::from_secs(5)).unwrap();
    }
    let (t, cpu) = (Instant::now(), thread_cpu());
    // First call: the one frame it expects does not come (one window, then
    // parked); second call: overdue, parked throughout.
    for _ in 0..2 {
        assert!(matches!(s.next(Duration::from_millis(700)), Err(Error::Timeout(..))));
    }
    let (wall, cpu) = (t.elapsed(), thread_cpu() - cpu);
    assert!(
        wall >= Duration::from_millis(1400) && wall < Duration::from_secs(3),
        "{wall:?}"
    );
    // A spinning wait would burn ~1.4 s; parked, a few ms of wakeups.
    assert!(cpu < Duration::from_millis(150), "{cpu:?} of CPU while paused");
    h.join().unwrap();
}

/// One session of 50 packets every 40 ms; the packets read and the
/// subscriber's cadence state at the end.
fn packet_session() -> (u32, vramring::seam::ring::cadence::CadenceState) {
    use vramring::packet::{
        PacketMeta, PacketPublisher, PacketPublisherConfig, PacketRingConfig, PacketSubscriber,
        PacketSubscriberOptions, PACKET_KEY,
    };
    let path = sock("packets");
    let cfg = PacketPublisherConfig::new(PacketRingConfig::new(1 << 16, 64, 4096));
    let mut p = PacketPublisher::create(&path, cfg).expect("packet publisher");
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let start = Instant::now();
        for k in 0..50u32 {
            let at = start + Duration::from_millis(40 * u64::from(k));
            if let Some(d) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
            let meta = PacketMeta {
                pts: i64::from(k),
                dts: i64::from(k),
                flags: PACKET_KEY,
                codec: 0,
            };
            p.write(&[k as u8; 200], meta).expect("write");
        }
        std::thread::sleep(Duration::from_millis(10));
        drop(p);
    });
    let mut s = PacketSubscriber::connect(&path, PacketSubscriberOptions::new()).unwrap();
    let mut buf = Vec::new();
    let mut got = 0;
    loop {
        match s.next_copy(&mut buf, Duration::from_secs(5)) {
            Ok(_) => got += 1,
            Err(Error::ProducerGone { .. }) => break,
            Err(e) => panic!("next_copy: {e}"),
        }
    }
    h.join().unwrap();
    (got, s.cadence())
}

#[test]
fn the_packet_subscribers_default_wait_locks_onto_a_steady_writer() {
    let _serial = one_at_a_time();
    one_of_three_catches_five("packets", |_| {
        let (got, st) = packet_session();
        assert!(got >= 45, "{got} packets");
        // The packet subscriber keeps no lock flag here: windows and hits
        // say whether it locked.
        (true, st)
    });
}
