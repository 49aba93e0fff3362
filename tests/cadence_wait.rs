//! The default (cadence) wait against a real publisher thread on the host
//! backend: it locks onto a steady source from the commit timestamps and
//! plans spin windows without losing a frame, it never locks onto an
//! irregular one, and a paused stream gets no window past the one it
//! expected.
//!
//! Nothing here depends on how busy the machine is: how often a window
//! catches its frame spinning, and the CPU the wait spends, are what a
//! loaded machine changes, and `benches/wake.rs` measures them (windows,
//! hits and CPU per cadence); the estimator's own behaviour under late
//! timers and late deliveries is replayed on synthetic timestamps in
//! `src/ring/cadence.rs`.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use vramring::seam::ring::cadence::CadenceState;
use vramring::{BackendChoice, Error, Format, FrameMeta, Mode, Publisher, RingConfig, Subscriber, SubscriberOptions};
use vramring_testkit::hang::ends;

/// The tests of this file run one at a time: each has a publisher and a
/// subscriber thread that spin in their windows, and they need not load
/// the machine for each other.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A socket path in a temp dir of its own (removed with its lock file).
fn sock(name: &str) -> vramring_testkit::procs::SocketPath {
    vramring_testkit::procs::SocketPath::new(&format!("cadence-{name}"))
}

/// A publisher thread and what it waits for: `start` (the subscriber's
/// `connect` has returned, so its start is set before the first frame) and
/// `done` (the test has read what it needs; it closes then).
struct Publishing {
    start: mpsc::Sender<()>,
    done: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Publishing {
    /// Joins the thread, letting it close first.
    fn close(self) {
        let _ = self.done.send(());
        self.thread.join().unwrap();
    }
}

/// Waits for the go of a [`Publishing`]; panics after 10 s.
fn wait_for_go(go: &mpsc::Receiver<()>) {
    go.recv_timeout(Duration::from_secs(10))
        .expect("the subscriber connected");
}

/// Publishes one small frame at each offset (from the first publish) in
/// `offsets`, on its own thread, once told to start; the publisher stays
/// open until told it is done. 64 slots: a reader held off the CPU for a
/// while still loses no frame.
fn publish_at(path: &std::path::Path, offsets: Vec<Duration>) -> Publishing {
    let cfg = RingConfig::new(Format::Gray8, 64, 32)
        .slots(64)
        .backend(BackendChoice::Host);
    let mut p = Publisher::create(path, cfg).expect("publisher");
    let (start, go) = mpsc::channel();
    let (done, hold) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        wait_for_go(&go);
        let start = Instant::now();
        for (k, at) in offsets.into_iter().enumerate() {
            if let Some(d) = (start + at).checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
            let slot = p.loan(Duration::from_secs(1)).expect("loan");
            slot.publish(FrameMeta::pts(k as i64)).expect("publish");
        }
        let _ = hold.recv();
        p.close().expect("close");
    });
    Publishing { start, done, thread }
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

/// Checks, after a session, what holds however the windows fared: the
/// wait locked at some point (`locked`), planned at least one window, and
/// judged each window at most once (a hit or a miss, and a hit or an
/// early frame).
fn assert_locked_and_planned(what: &str, locked: bool, st: CadenceState) {
    assert!(locked, "{what}: the wait never locked onto a steady source: {st:?}");
    assert!(st.windows >= 1, "{what}: locked, but no window was planned: {st:?}");
    assert!(st.hits + st.misses <= st.windows, "{what}: {st:?}");
    assert!(st.hits + st.early <= st.windows, "{what}: {st:?}");
}

/// The interval a wait locked on, from the publisher's commit timestamps:
/// one every 40 ms, within what the publisher's sleeps jitter.
fn assert_interval(iv: u64) {
    assert!((36_000_000..=44_000_000).contains(&iv), "interval {iv} ns");
}

#[test]
fn the_default_wait_locks_onto_a_steady_publisher_and_plans_windows_without_losing_a_frame() {
    let _serial = one_at_a_time();
    let path = sock("steady");
    let offsets = (0..50).map(|k| Duration::from_millis(40 * k)).collect();
    let publishing = publish_at(&path, offsets);
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().mode(Mode::Sequential)).unwrap();
    publishing.start.send(()).unwrap();
    let mut locked = false;
    for _ in 0..50 {
        s.next(Duration::from_secs(5)).expect("a frame");
        if let Some(iv) = s.cadence().interval_ns {
            locked = true;
            assert_interval(iv);
        }
    }
    publishing.done.send(()).unwrap();
    read_all(&mut s);
    publishing.close();
    // Whatever the windows caught or missed, no frame was lost.
    assert_eq!((s.stats().delivered, s.stats().dropped), (50, 0));
    assert_locked_and_planned("frames", locked, s.cadence());
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
    let publishing = publish_at(&path, offsets);
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().mode(Mode::Sequential)).unwrap();
    publishing.start.send(()).unwrap();
    for _ in 0..40 {
        s.next(Duration::from_secs(5)).expect("a frame");
    }
    publishing.done.send(()).unwrap();
    read_all(&mut s);
    publishing.close();
    let st = s.cadence();
    assert_eq!(st.interval_ns, None, "{st:?}");
    assert_eq!(st.windows, 0, "{st:?}");
    assert_eq!((s.stats().delivered, s.stats().dropped), (40, 0));
}

/// A stream that pauses: the first wait plans the one window of the frame
/// it expects (if any), then parks; later waits find that frame overdue and
/// plan none. What a parked wait costs in CPU is measured by
/// `benches/wake.rs`.
#[test]
fn a_paused_stream_gets_at_most_one_spin_window_from_the_default_wait() {
    let _serial = one_at_a_time();
    let path = sock("paused");
    let offsets = (0..20).map(|k| Duration::from_millis(40 * k)).collect();
    // The publisher stays open but silent after its last frame until the
    // pause below is over.
    let publishing = publish_at(&path, offsets);
    let mut s = Subscriber::connect(&path, SubscriberOptions::default().mode(Mode::Sequential)).unwrap();
    publishing.start.send(()).unwrap();
    for _ in 0..20 {
        s.next(Duration::from_secs(5)).unwrap();
    }
    let (t, before) = (Instant::now(), s.cadence());
    for _ in 0..3 {
        assert!(matches!(s.next(Duration::from_millis(700)), Err(Error::Timeout(..))));
    }
    let (wall, after) = (t.elapsed(), s.cadence());
    publishing.close();
    assert!(wall >= Duration::from_millis(2100), "{wall:?}");
    assert!(
        after.windows <= before.windows + 1,
        "{} windows planned through the pause: {after:?}",
        after.windows - before.windows
    );
    assert_eq!(after.hits, before.hits, "{after:?}");
    assert_eq!(s.stats().delivered, 20);
}

/// `park_until_due` reads nothing, returns at once while the cadence is
/// unknown, and, before a publisher that falls silent, never waits for its
/// (endless) timeout: locked, it ends when the next frame was due;
/// unlocked, at once. Whether it locks depends on the machine's load and
/// is not asserted; when it parks is replayed on synthetic timestamps in
/// the estimator's tests (`prepare_at`).
#[test]
fn parking_until_the_next_frame_is_due_reads_nothing_and_never_waits_for_its_timeout() {
    let _serial = one_at_a_time();
    let path = sock("due");
    let frames = 40;
    let offsets = (0..frames).map(|k| Duration::from_millis(40 * k)).collect();
    let publishing = publish_at(&path, offsets);
    let s = Subscriber::connect(&path, SubscriberOptions::default().mode(Mode::Sequential)).unwrap();
    let mut s = ends("a park with no cadence known", move || {
        let mut s = s;
        s.park_until_due(Duration::ZERO, Duration::MAX);
        s
    });
    publishing.start.send(()).unwrap();
    for seq in 1..=frames {
        s.park_until_due(Duration::from_millis(5), Duration::from_secs(5));
        let f = s.next(Duration::from_secs(5)).expect("a frame");
        assert_eq!(f.seq(), seq, "the park read a frame, or one was lost");
    }
    // The publisher stays open and silent from here.
    let s = ends("a park for a frame that never comes", move || {
        let mut s = s;
        s.park_until_due(Duration::ZERO, Duration::MAX);
        s
    });
    assert_eq!((s.stats().delivered, s.stats().dropped), (frames, 0));
    publishing.close();
}

#[test]
fn the_packet_subscribers_default_wait_locks_onto_a_steady_writer() {
    use vramring::packet::{
        PacketMeta, PacketPublisher, PacketPublisherConfig, PacketRingConfig, PacketSubscriber,
        PacketSubscriberOptions, PACKET_KEY,
    };
    let _serial = one_at_a_time();
    let path = sock("packets");
    // 64 records: the 50 packets fit, so none is lost however late the
    // reader runs.
    let cfg = PacketPublisherConfig::new(PacketRingConfig::new(1 << 16, 64, 4096));
    let mut p = PacketPublisher::create(&path, cfg).expect("packet publisher");
    let (start, go) = mpsc::channel();
    let (done, hold) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        wait_for_go(&go);
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
        let _ = hold.recv();
        drop(p);
    });
    let publishing = Publishing { start, done, thread };
    let mut s = PacketSubscriber::connect(&path, PacketSubscriberOptions::new()).unwrap();
    publishing.start.send(()).unwrap();
    let mut buf = Vec::new();
    let mut locked = false;
    for k in 0..50u32 {
        let pk = s.next_copy(&mut buf, Duration::from_secs(5)).expect("a packet");
        assert_eq!((pk.seq, buf.as_slice()), (u64::from(k) + 1, &[k as u8; 200][..]));
        if let Some(iv) = s.cadence().interval_ns {
            locked = true;
            assert_interval(iv);
        }
    }
    publishing.done.send(()).unwrap();
    assert!(matches!(
        s.next_copy(&mut buf, Duration::from_secs(5)),
        Err(Error::ProducerGone { .. })
    ));
    publishing.close();
    assert_locked_and_planned("packets", locked, s.cadence());
}
