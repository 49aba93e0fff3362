//! Peers are not trusted. Two sides of that:
//!
//! * a live publisher fed random and mutated socket messages on raw
//!   `SOCK_SEQPACKET` connections keeps serving a real subscriber process
//!   (every frame verified), never panics, and frees every lease the
//!   attacker opened; a first datagram too long to read is refused with
//!   `REJECT_BAD_HELLO`, and an Attach on a pull connection is evicted with
//!   a notice that says push delivery was not granted; a subscriber name
//!   with a control character is refused with `REJECT_BAD_HELLO`;
//! * a hostile fake publisher (this test binds its own socket and builds its
//!   own memfds) answering a Hello with rejects, garbage, too few or too many
//!   descriptors, a Welcome without a flag asked for, and control regions
//!   with a wrong magic, version, slot count, plane layout, pool size, or
//!   missing seals, makes `Subscriber::connect` return a typed error, never
//!   panic; random
//!   corruption of an otherwise valid ring (before and after connecting)
//!   gives a typed error or a working subscriber, never a panic.

use vramring::ClientOptions;
use vramring_testkit::hang::{ends, HANG};
use vramring_testkit::procs as common;

use std::fs::File;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memmap2::MmapMut;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use rustix::fs::{MemfdFlags, SealFlags};

use common::{SubResult, SubSpec, TempDir};
use vramring::monotonic_ns;
use vramring::seam::layout::{self, ProducerLine, RingHeader, SeqLine, SharedRingInfo, SlotDesc, SubEntry, SubsHeader};
use vramring::seam::socket::msg::{self, Hello, Msg, Notice, Welcome};
use vramring::seam::socket::transport::{self, Listener};
use vramring::BackendChoice;
use vramring::{
    Error, Format, FrameMeta, Geometry, Mode, Publisher, Refusal, RingConfig, Subscriber, SubscriberOptions,
};
use vramring_testkit::pattern as testpattern;

#[test]
fn child_process_entry() {
    common::run_child_role();
}

// ---------------------------------------------------------------------------
// A live publisher under attack
// ---------------------------------------------------------------------------

/// One attacker connection.
#[derive(Debug, Clone)]
enum Attack {
    /// Any bytes, including empty and longer than the largest message.
    Random(Vec<u8>),
    /// A valid Hello with some bytes replaced, then cut or extended.
    MutatedHello {
        edits: Vec<(usize, u8)>,
        cut: Option<usize>,
        extra: Vec<u8>,
    },
    /// A valid header (magic, any version, kind and length) and a random body.
    Framed { version: u32, kind: u32, body: Vec<u8> },
    /// A valid Hello (any flags), then random bytes on the granted lease.
    AfterWelcome { flags: u32, then: Vec<u8> },
    /// Descriptors attached to a valid Hello (`hello`) or to random bytes.
    WithFds { hello: bool, bytes: Vec<u8>, fds: usize },
    /// Connect and hang up without a word.
    Silent,
}

fn valid_hello(flags: u32) -> Vec<u8> {
    Msg::Hello(Hello {
        flags,
        backends: 1 << layout::BACKEND_HOST,
        name: "attacker".into(),
        device_uuid: [0; 16],
    })
    .encode()
}

fn attack_strategy() -> impl Strategy<Value = Attack> {
    let bytes = proptest::collection::vec(any::<u8>(), 0..300);
    prop_oneof![
        bytes.clone().prop_map(Attack::Random),
        (
            proptest::collection::vec((0usize..112, any::<u8>()), 1..6),
            proptest::option::of(0usize..112),
            proptest::collection::vec(any::<u8>(), 0..8)
        )
            .prop_map(|(edits, cut, extra)| Attack::MutatedHello { edits, cut, extra }),
        (0u32..4, 0u32..8, proptest::collection::vec(any::<u8>(), 0..140))
            .prop_map(|(version, kind, body)| Attack::Framed { version, kind, body }),
        (0u32..8, bytes.clone()).prop_map(|(flags, then)| Attack::AfterWelcome { flags, then }),
        (any::<bool>(), bytes, 1usize..=4).prop_map(|(hello, bytes, fds)| Attack::WithFds { hello, bytes, fds }),
        Just(Attack::Silent),
    ]
}

/// Runs one attack; returns an error text if the publisher answered with
/// something that is not a well-formed Welcome or Reject.
fn run_attack(socket: &Path, attack: &Attack) -> Result<(), String> {
    let conn = transport::connect(socket).map_err(|e| format!("the publisher stopped accepting: {e}"))?;
    let fd = conn.as_fd();
    let send = |bytes: &[u8], fds: &[BorrowedFd<'_>]| {
        // The publisher may already have hung up on us: not a failure.
        let _ = transport::send(fd, bytes, fds);
    };
    match attack {
        Attack::Random(b) => send(b, &[]),
        Attack::MutatedHello { edits, cut, extra } => {
            let mut b = valid_hello(0);
            for &(pos, v) in edits {
                let n = b.len();
                b[pos % n] = v;
            }
            if let Some(c) = cut {
                b.truncate(*c);
            }
            b.extend_from_slice(extra);
            send(&b, &[]);
        }
        Attack::Framed { version, kind, body } => {
            let mut b = Vec::new();
            for v in [msg::MSG_MAGIC, *version, *kind, body.len() as u32] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.extend_from_slice(body);
            send(&b, &[]);
        }
        Attack::AfterWelcome { flags, .. } => send(&valid_hello(*flags), &[]),
        Attack::WithFds { hello, bytes, fds } => {
            let (r, w) = rustix::pipe::pipe().map_err(|e| e.to_string())?;
            let all = [r.as_fd(), w.as_fd(), r.as_fd(), w.as_fd()];
            let b = if *hello { valid_hello(0) } else { bytes.clone() };
            send(&b, &all[..*fds]);
        }
        Attack::Silent => return Ok(()),
    }
    match transport::recv(fd, Duration::from_secs(2)) {
        Ok(Some(answer)) => match Msg::decode(&answer.bytes) {
            // A pull Welcome: control, table, client region, pool; a push
            // Welcome has no pool (a mutated Hello may ask for push, and
            // flag bits the publisher does not know are ignored).
            Ok(Msg::Welcome(w)) if answer.fds.len() == if w.granted & msg::HELLO_PUSH != 0 { 3 } else { 4 } => {
                if let Attack::AfterWelcome { then, .. } = attack {
                    send(then, &[]);
                }
                Ok(())
            }
            Ok(Msg::Reject(_)) => Ok(()),
            other => Err(format!(
                "the publisher answered {other:?} with {} descriptors",
                answer.fds.len()
            )),
        },
        // No answer in time, or it hung up on us: both fine.
        Ok(None) | Err(_) => Ok(()),
    }
}

/// A live publisher fed random bytes, mutated Hellos, badly framed messages,
/// garbage on granted leases and stray descriptors keeps serving: a real
/// subscriber process verifies every frame throughout, a fresh subscriber
/// connects afterwards, and every lease the attacker opened is freed.
#[test]
fn a_publisher_under_random_socket_input_keeps_serving_a_real_subscriber() {
    let dir = TempDir::new("fuzz-live");
    let socket = dir.join("ring.sock");
    let cfg = RingConfig::new(Format::Gray8, 256, 16)
        .slots(8)
        .backend(BackendChoice::Host);
    let mut p = Publisher::create(&socket, cfg).expect("publisher");
    let result = dir.join("victim.result");
    let spec = SubSpec::new("victim", "sequential", 0, 0);
    let mut child = common::spawn(
        &dir,
        "victim",
        common::self_command(&[], "subscriber", &spec.env(&socket, &result)),
    );
    // Until its `connect` has returned (its start cursor set), not only
    // until its entry is active: its gaps are counted from the first frame.
    common::wait_connected(
        std::slice::from_mut(&mut child),
        std::slice::from_ref(&result),
        Duration::from_secs(30),
    );

    let attack_from = p.next_seq();
    let attacker = {
        let socket = socket.clone();
        std::thread::spawn(move || {
            // Found by the runner below: a Hello whose flags became PUSH plus
            // bits nobody knows is a valid push Hello, answered without a
            // pool; its lease must end like any other.
            let push_hello = Attack::MutatedHello {
                edits: vec![(16, 232)],
                cut: None,
                extra: Vec::new(),
            };
            run_attack(&socket, &push_hello)?;
            let mut runner = TestRunner::new(Config {
                cases: 1000,
                failure_persistence: None,
                ..Config::default()
            });
            let outcome = runner.run(&attack_strategy(), |attack| {
                run_attack(&socket, &attack).map_err(TestCaseError::fail)?;
                Ok(())
            });
            outcome.map_err(|e| e.to_string())
        })
    };
    while !attacker.is_finished() {
        let mut slot = p.loan(Duration::from_millis(100)).expect("loan");
        let seq = slot.seq();
        testpattern::fill(slot.bytes_mut().expect("host"), seq);
        slot.publish(FrameMeta::pts(seq as i64)).expect("publish");
        std::thread::sleep(Duration::from_micros(500));
        assert!(
            child.try_wait().is_none(),
            "the real subscriber died during the attack:\n{}",
            child.output()
        );
    }
    attacker
        .join()
        .expect("attacker thread")
        .expect("every answer of the publisher was well-formed");
    let attack_until = p.next_seq() - 1;

    // Every attacker lease ends; only the real subscriber remains.
    assert!(
        common::wait_until(Duration::from_secs(10), || p.stats().subscribers == 1),
        "attacker leases were not freed: {:?}",
        p.stats()
    );
    // A new subscriber still gets a correct frame.
    let mut fresh = Subscriber::connect(&socket, SubscriberOptions::default()).expect("the publisher still accepts");
    let mut slot = p.loan(Duration::from_millis(100)).expect("loan");
    let seq = slot.seq();
    testpattern::fill(slot.bytes_mut().expect("host"), seq);
    let published = slot.publish(FrameMeta::pts(0)).expect("publish");
    let f = fresh.next(Duration::from_secs(5)).expect("a frame after the attack");
    testpattern::verify(f.host_bytes().expect("host"), f.seq()).expect("an intact frame");
    drop(fresh);
    let stats = p.stats();
    p.close().expect("close");
    child.wait_success(Instant::now() + Duration::from_secs(30));
    let r = SubResult::read(&result);
    eprintln!(
        "under attack: {} connections served, {published} frames published, the real subscriber verified {} (dropped {}, torn {})",
        stats.connects,
        r.num("delivered"),
        r.num("dropped"),
        r.num("torn")
    );
    assert_eq!(r.get("end"), "producer-gone");
    assert_eq!(r.num("torn"), 0, "torn: {}", r.get("torn_detail"));
    assert_eq!(
        r.seqs.last(),
        Some(&published),
        "the real subscriber read up to the last frame"
    );
    r.assert_gaps_exactly_counted();
    // How many it read depends on the machine; that it read while the
    // attack went on does not.
    let during = r
        .seqs
        .iter()
        .filter(|&&s| (attack_from..=attack_until).contains(&s))
        .count();
    assert!(
        during >= 1,
        "the real subscriber received none of frames {attack_from}..={attack_until}, published during the attack"
    );
}

/// A first datagram longer than any message gets Reject `REJECT_BAD_HELLO`
/// like every other malformed first message, both when it is one byte too
/// long (received whole into the 257-byte buffer) and when the kernel cuts
/// it (`MSG_TRUNC`).
#[test]
fn an_oversized_first_datagram_is_refused_as_a_bad_hello() {
    let dir = TempDir::new("oversized-hello");
    let socket = dir.join("ring.sock");
    let cfg = RingConfig::new(Format::Gray8, 64, 16)
        .slots(4)
        .backend(BackendChoice::Host);
    let p = Publisher::create(&socket, cfg).expect("publisher");
    for len in [msg::MAX_MSG_BYTES + 1, 1000] {
        let conn = transport::connect(&socket).expect("connect");
        // A Hello padded to `len`, its header's body length saying so.
        let mut b = valid_hello(0);
        b.resize(len, 0);
        b[12..16].copy_from_slice(&(len as u32 - 16).to_le_bytes());
        transport::send(conn.as_fd(), &b, &[]).expect("send");
        let answer = transport::recv(conn.as_fd(), Duration::from_secs(5))
            .expect("an answer, not a hang-up")
            .expect("an answer in time");
        match Msg::decode(&answer.bytes) {
            Ok(Msg::Reject(n)) => assert_eq!(n.code, msg::REJECT_BAD_HELLO, "{len} bytes: {n:?}"),
            other => panic!("{len} bytes: the publisher answered {other:?}"),
        }
    }
    // The service counts a refusal after it has sent it.
    common::wait_until(Duration::from_secs(10), || p.stats().refused >= 2);
    let st = p.stats();
    assert_eq!((st.subscribers, st.refused), (0, 2), "{st:?}");
}

/// An Attach on a pull connection (push not granted) is evicted with
/// `EVICT_PROTOCOL`, and the notice says that push delivery was not
/// granted, not that the buffers do not fit.
#[test]
fn an_attach_without_a_push_grant_is_evicted_for_that_reason() {
    let dir = TempDir::new("attach-pull");
    let socket = dir.join("ring.sock");
    let cfg = RingConfig::new(Format::Gray8, 64, 16)
        .slots(4)
        .backend(BackendChoice::Host);
    let p = Publisher::create(&socket, cfg).expect("publisher");
    let conn = transport::connect(&socket).expect("connect");
    transport::send(conn.as_fd(), &valid_hello(0), &[]).expect("send the Hello");
    let welcome = transport::recv(conn.as_fd(), Duration::from_secs(5))
        .expect("a Welcome")
        .expect("a Welcome in time");
    assert!(matches!(Msg::decode(&welcome.bytes), Ok(Msg::Welcome(w)) if w.granted & msg::HELLO_PUSH == 0));
    // Buffers that would fit a push subscriber of this ring.
    let stride = Geometry::new(Format::Gray8, 64, 16).expect("geometry").slot_stride;
    let bytes = stride * layout::PUSH_BUFFERS as u64;
    let (fd, _map) = memfd("pull-attach", &vec![0u8; bytes as usize], FIXED_SIZE);
    let attach = Msg::Attach(msg::Attach {
        count: layout::PUSH_BUFFERS as u32,
        stride,
        bytes,
    });
    transport::send(conn.as_fd(), &attach.encode(), &[fd.as_fd()]).expect("send the Attach");
    let notice = transport::recv(conn.as_fd(), Duration::from_secs(5))
        .expect("a notice")
        .expect("a notice in time");
    match Msg::decode(&notice.bytes) {
        Ok(Msg::Evicted(n)) => {
            assert_eq!(n.code, msg::EVICT_PROTOCOL, "{n:?}");
            assert!(n.reason.contains("push delivery was not granted"), "{n:?}");
        }
        other => panic!("the publisher answered the Attach with {other:?}"),
    }
    // The notice may come before the service has counted the eviction.
    common::wait_until(Duration::from_secs(10), || p.stats().evictions >= 1);
    assert_eq!(p.stats().evictions, 1);
}

/// A subscriber name with a control character (a newline, an escape that
/// would drive the terminal of whoever runs `vramring ls`) is refused at
/// the handshake with `REJECT_BAD_HELLO`, naming the character and where it
/// is; nothing of it reaches the table.
#[test]
fn a_subscriber_name_with_a_control_character_is_refused_as_a_bad_hello() {
    let dir = TempDir::new("control-name");
    let socket = dir.join("ring.sock");
    let cfg = RingConfig::new(Format::Gray8, 64, 16)
        .slots(4)
        .backend(BackendChoice::Host);
    let p = Publisher::create(&socket, cfg).expect("publisher");
    for (name, what) in [
        ("cam\nforged line", "U+000A at byte 3"),
        ("ok\x1b[2J", "U+001B at byte 2"),
    ] {
        match Subscriber::connect(&socket, SubscriberOptions::default().name(name)) {
            Ok(_) => panic!("{name:?} was accepted"),
            Err(e) => {
                assert_eq!(e.refusal(), Some(Refusal::BadHello), "{name:?}: {e:?}");
                assert!(e.to_string().contains(what), "{name:?}: {e}");
            }
        }
    }
    // The service counts a refusal after it has sent it.
    common::wait_until(Duration::from_secs(10), || p.stats().refused >= 2);
    let st = p.stats();
    assert_eq!((st.subscribers, st.connects, st.refused), (0, 0, 2), "{st:?}");
    // A printable name, non-ASCII included, is welcome.
    let _sub =
        Subscriber::connect(&socket, SubscriberOptions::default().name("café-1 ▶")).expect("a printable name connects");
}

// ---------------------------------------------------------------------------
// A hostile publisher
// ---------------------------------------------------------------------------

const WIDTH: u32 = 64;
const HEIGHT: u32 = 32;
const SLOTS: u32 = 4;
const MAX_SUBS: u32 = 4;
const INDEX: u32 = 1;
const GENERATION: u32 = 7;
const EPOCH: u64 = 0x5eed_f00d_0000_0001;

macro_rules! info {
    ($field:ident) => {
        offset_of!(RingHeader, info) + offset_of!(SharedRingInfo, $field)
    };
}

fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

fn slot_off(k: u32) -> usize {
    size_of::<RingHeader>() + k as usize * size_of::<SlotDesc>()
}

fn entry_off(k: u32) -> usize {
    size_of::<SubsHeader>() + k as usize * size_of::<SubEntry>()
}

const SEALED: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::FUTURE_WRITE)
    .union(SealFlags::SEAL);
const FIXED_SIZE: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW).union(SealFlags::SEAL);

/// Everything a fake publisher serves: the three regions as bytes, their
/// seals, and the Welcome.
#[derive(Clone)]
struct Ring {
    control: Vec<u8>,
    subs: Vec<u8>,
    client: Vec<u8>,
    pool: Vec<u8>,
    control_seals: SealFlags,
    subs_seals: SealFlags,
    client_seals: SealFlags,
    pool_seals: SealFlags,
    welcome: Welcome,
}

impl Ring {
    /// A valid ring of NV12 64x32 frames in 4 slots, as a real publisher
    /// would build it, with frame 1 committed in slot 1.
    fn valid() -> Ring {
        let g = Geometry::new(Format::Nv12, WIDTH, HEIGHT).expect("geometry");
        let control_len = layout::control_bytes(SLOTS);
        let subs_len = layout::subs_bytes(MAX_SUBS);
        let pool_len = g.slot_stride * u64::from(SLOTS);
        let mut c = vec![0u8; control_len as usize];
        put64(&mut c, info!(magic), layout::RING_MAGIC);
        put32(&mut c, info!(layout_version), layout::LAYOUT_VERSION);
        put32(&mut c, info!(header_bytes), size_of::<RingHeader>() as u32);
        put64(&mut c, info!(control_bytes), control_len);
        put64(&mut c, info!(epoch), EPOCH);
        put32(&mut c, info!(slot_count), SLOTS);
        put32(&mut c, info!(slot_desc_bytes), size_of::<SlotDesc>() as u32);
        put64(&mut c, info!(slots_offset), size_of::<RingHeader>() as u64);
        put32(&mut c, info!(backend), layout::BACKEND_HOST);
        put32(&mut c, info!(format), Format::Nv12.code());
        put32(&mut c, info!(width), WIDTH);
        put32(&mut c, info!(height), HEIGHT);
        put32(&mut c, info!(plane_count), g.plane_count as u32);
        put32(&mut c, info!(policy), layout::POLICY_OVERWRITE);
        for (k, p) in g.planes().iter().enumerate() {
            put64(&mut c, info!(plane_offset) + 8 * k, p.offset);
            put64(&mut c, info!(plane_pitch) + 8 * k, p.pitch);
            put64(&mut c, info!(plane_rows) + 8 * k, p.rows);
            put64(&mut c, info!(plane_row_bytes) + 8 * k, p.row_bytes);
        }
        put64(&mut c, info!(frame_bytes), g.frame_bytes);
        put64(&mut c, info!(slot_stride), g.slot_stride);
        put64(&mut c, info!(pool_bytes), pool_len);
        put32(&mut c, info!(max_subscribers), MAX_SUBS);
        put32(
            &mut c,
            offset_of!(RingHeader, producer) + offset_of!(ProducerLine, state),
            layout::PRODUCER_LIVE,
        );
        put64(&mut c, offset_of!(RingHeader, seq) + offset_of!(SeqLine, global_seq), 1);
        put64(&mut c, slot_off(1) + offset_of!(SlotDesc, seq), 1);
        put64(&mut c, slot_off(1) + offset_of!(SlotDesc, commit_ns), monotonic_ns());

        let mut s = vec![0u8; subs_len as usize];
        put64(&mut s, offset_of!(SubsHeader, magic), layout::SUBS_MAGIC);
        put32(&mut s, offset_of!(SubsHeader, layout_version), layout::LAYOUT_VERSION);
        put32(&mut s, offset_of!(SubsHeader, max_subscribers), MAX_SUBS);
        put64(&mut s, offset_of!(SubsHeader, epoch), EPOCH);
        put32(
            &mut s,
            offset_of!(SubsHeader, entry_bytes),
            size_of::<SubEntry>() as u32,
        );
        put32(
            &mut s,
            offset_of!(SubsHeader, entries_offset),
            size_of::<SubsHeader>() as u32,
        );
        put32(
            &mut s,
            entry_off(INDEX) + offset_of!(SubEntry, state),
            layout::SUB_ACTIVE,
        );
        put32(&mut s, entry_off(INDEX) + offset_of!(SubEntry, generation), GENERATION);

        let mut pool = vec![0u8; pool_len as usize];
        let stride = g.slot_stride as usize;
        testpattern::fill(&mut pool[stride..stride + g.frame_bytes as usize], 1);

        let welcome = Welcome {
            index: INDEX,
            generation: GENERATION,
            epoch: EPOCH,
            backend: layout::BACKEND_HOST,
            granted: msg::HELLO_SEQUENTIAL,
            control_bytes: control_len,
            subs_bytes: subs_len,
            pool_bytes: pool_len,
            device_uuid: [0; 16],
            client_bytes: layout::CLIENT_BYTES,
        };
        Ring {
            control: c,
            subs: s,
            client: vec![0u8; layout::CLIENT_BYTES as usize],
            pool,
            control_seals: SEALED,
            subs_seals: SEALED,
            client_seals: FIXED_SIZE,
            pool_seals: FIXED_SIZE,
            welcome,
        }
    }

    /// The Welcome and its four descriptors; also a writable mapping of
    /// the control region that outlives its seals (a publisher keeps one).
    fn served(&self) -> (Vec<u8>, Vec<OwnedFd>, MmapMut) {
        let (control, map) = memfd("fake-control", &self.control, self.control_seals);
        let (subs, _) = memfd("fake-subs", &self.subs, self.subs_seals);
        let (client, _) = memfd("fake-client", &self.client, self.client_seals);
        let (pool, _) = memfd("fake-pool", &self.pool, self.pool_seals);
        (
            Msg::Welcome(self.welcome).encode(),
            vec![control, subs, client, pool],
            map,
        )
    }
}

/// A memfd holding `bytes`, mapped read-write (the mapping is returned),
/// then sealed with `seals`.
fn memfd(name: &str, bytes: &[u8], seals: SealFlags) -> (OwnedFd, MmapMut) {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).expect("memfd_create");
    let file = File::from(fd);
    file.set_len(bytes.len() as u64).expect("ftruncate");
    file.write_all_at(bytes, 0).expect("write");
    // SAFETY: the memfd is ours and sized to `bytes.len()`; the seals added
    // below forbid shrinking it, so the mapping never faults.
    let map = unsafe { MmapMut::map_mut(&file) }.expect("mmap");
    let fd = OwnedFd::from(file);
    if !seals.is_empty() {
        rustix::fs::fcntl_add_seals(&fd, seals).expect("seals");
    }
    (fd, map)
}

/// What the fake publisher does after reading the Hello.
enum Reply {
    /// Sends this datagram with these descriptors.
    Send(Vec<u8>, Vec<OwnedFd>),
    /// Closes the connection without a word.
    Hangup,
    /// Says nothing and keeps the connection open.
    Silent,
}

static NEXT_SOCKET: AtomicU64 = AtomicU64::new(0);

/// Starts a fake publisher in `dir` that serves one connection with `reply`.
fn fake_publisher(dir: &TempDir, reply: Reply) -> (PathBuf, JoinHandle<()>) {
    let path = dir.join(&format!("fake-{}.sock", NEXT_SOCKET.fetch_add(1, Ordering::Relaxed)));
    let listener = Listener::bind(&path, 0o600).expect("bind the fake publisher");
    let handle = std::thread::spawn(move || {
        let Ok(Some(conn)) = listener.accept(Duration::from_secs(5)) else {
            return;
        };
        let _hello = transport::recv(conn.as_fd(), Duration::from_secs(5));
        match reply {
            Reply::Send(bytes, fds) => {
                let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
                let _ = transport::send(conn.as_fd(), &bytes, &borrowed);
            }
            Reply::Hangup => return,
            Reply::Silent => {}
        }
        // Hold the connection until the subscriber is done with it.
        let _ = transport::readable(conn.as_fd(), Duration::from_secs(5));
    });
    (path, handle)
}

/// The victim's options: a connect timeout long enough for the fake's
/// thread to be scheduled on a busy machine ([`SILENCE`] is the one case
/// that waits it out).
fn victim_options() -> SubscriberOptions {
    let mut opts = SubscriberOptions::default().mode(Mode::Sequential).name("victim");
    opts.client.connect_timeout = 5 * SILENCE;
    opts
}

/// The connect timeout given to a victim of a publisher that never answers.
const SILENCE: Duration = Duration::from_millis(500);

/// Connects to a fake publisher answering `reply`, hands the outcome to
/// `then`, and waits for the fake to finish.
fn against<R>(reply: Reply, then: impl FnOnce(vramring::Result<Subscriber>) -> R) -> R {
    against_as(victim_options(), reply, then)
}

/// [`against`], with the subscriber's options `opts`.
fn against_as<R>(opts: SubscriberOptions, reply: Reply, then: impl FnOnce(vramring::Result<Subscriber>) -> R) -> R {
    let dir = TempDir::new(&format!("fake-{}", NEXT_SOCKET.fetch_add(1, Ordering::Relaxed)));
    let (path, fake) = fake_publisher(&dir, reply);
    let out = then(Subscriber::connect(&path, opts));
    fake.join().expect("fake publisher thread");
    out
}

fn welcome_with(ring: &Ring) -> Reply {
    let (bytes, fds, _map) = ring.served();
    Reply::Send(bytes, fds)
}

/// Connects to a fake publisher answering `reply` and checks that it fails
/// with an error `expected` accepts.
#[track_caller]
fn assert_refused(case: &str, reply: Reply, expected: fn(&Error) -> bool) {
    against(reply, |r| match r {
        Ok(_) => panic!("{case}: the subscriber accepted it"),
        Err(e) => assert!(expected(&e), "{case}: unexpected error {e:?}"),
    })
}

fn layout_mismatch(e: &Error) -> bool {
    matches!(e, Error::LayoutMismatch(_))
}

fn bad_message(e: &Error) -> bool {
    matches!(e, Error::BadMessage(_))
}

fn version_mismatch(e: &Error) -> bool {
    matches!(
        e,
        Error::VersionMismatch {
            peer_role: "publisher",
            ..
        }
    )
}

#[test]
fn the_fake_publisher_is_faithful_a_valid_ring_connects_and_delivers_its_frame() {
    against(welcome_with(&Ring::valid()), |r| {
        let mut sub = r.expect("a valid ring connects");
        let f = sub.next(Duration::from_secs(1)).expect("frame 1");
        assert_eq!(f.seq(), 1);
        testpattern::verify(f.host_bytes().expect("host"), 1).expect("pattern of frame 1");
    });
}

#[test]
fn a_reject_from_another_protocol_version_is_a_version_mismatch() {
    let mut b = Msg::Reject(Notice {
        code: msg::REJECT_VERSION,
        reason: "speaks 9".into(),
    })
    .encode();
    b[4..8].copy_from_slice(&9u32.to_le_bytes());
    assert_refused("reject v9", Reply::Send(b, vec![]), |e| {
        matches!(e, Error::VersionMismatch { peer: 9, .. })
    });
    let b = Msg::Reject(Notice {
        code: msg::REJECT_VERSION,
        reason: "too old".into(),
    })
    .encode();
    assert_refused("reject code VERSION", Reply::Send(b, vec![]), version_mismatch);
}

#[test]
fn a_welcome_from_another_protocol_version_is_a_version_mismatch() {
    // A v1 publisher (and any other version) is refused with a typed error.
    for v in [1u32, msg::PROTOCOL_VERSION + 1] {
        let (mut b, fds, _map) = Ring::valid().served();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        assert_refused(
            &format!("welcome v{v}"),
            Reply::Send(b, fds),
            |e| matches!(e, Error::VersionMismatch { peer, .. } if *peer != msg::PROTOCOL_VERSION),
        );
    }
}

#[test]
fn an_ordinary_reject_is_refused_with_its_code_and_reason() {
    let b = Msg::Reject(Notice {
        code: msg::REJECT_FULL,
        reason: "full".into(),
    })
    .encode();
    assert_refused(
        "reject FULL",
        Reply::Send(b, vec![]),
        |e| matches!(e, Error::Refused { code: msg::REJECT_FULL, reason } if reason == "full"),
    );
}

#[test]
fn a_welcome_that_leaves_out_the_lossless_asked_for_is_refused() {
    // A publisher leaves out of `granted` the flags it does not know
    // (PROTOCOL.md §3.2); the fake grants only SEQUENTIAL.
    against_as(
        victim_options().lossless(true),
        welcome_with(&Ring::valid()),
        |r| match r {
            Ok(_) => panic!("a lossless subscriber accepted a Welcome without lossless"),
            Err(e) => assert_eq!(e.refusal(), Some(Refusal::Policy), "unexpected error {e:?}"),
        },
    );
}

#[test]
fn garbage_answers_are_bad_messages() {
    assert_refused(
        "text",
        Reply::Send(b"HTTP/1.1 400 Bad Request\r\n".to_vec(), vec![]),
        bad_message,
    );
    let mut short = Msg::Welcome(Ring::valid().welcome).encode();
    short.truncate(40);
    assert_refused("truncated welcome", Reply::Send(short, vec![]), bad_message);
    let mut lying = Msg::Bye.encode();
    lying[12..16].copy_from_slice(&64u32.to_le_bytes());
    assert_refused("body length lies", Reply::Send(lying, vec![]), bad_message);
    assert_refused("a Hello back", Reply::Send(valid_hello(0), vec![]), bad_message);
    assert_refused("a Bye", Reply::Send(Msg::Bye.encode(), vec![]), bad_message);
    assert_refused(
        "200 random bytes",
        Reply::Send((0..200u8).map(|i| i.wrapping_mul(37)).collect(), vec![]),
        bad_message,
    );
}

#[test]
fn a_welcome_with_the_wrong_number_of_descriptors_is_a_bad_message() {
    // (Five or more descriptors are cut by MSG_CTRUNC: see `transport`.)
    for keep in [0usize, 1, 2, 3] {
        let (b, mut fds, _map) = Ring::valid().served();
        fds.truncate(keep);
        assert_refused(&format!("{keep} descriptors"), Reply::Send(b, fds), bad_message);
    }
}

#[test]
fn a_control_region_with_a_wrong_field_is_a_layout_mismatch() {
    type Edit = fn(&mut Ring);
    let g = Geometry::new(Format::Nv12, WIDTH, HEIGHT).expect("geometry");
    let stride = g.slot_stride;
    let cases: Vec<(&str, Edit)> = vec![
        ("wrong magic", |r| {
            put64(&mut r.control, info!(magic), u64::from_le_bytes(*b"NOTARING"))
        }),
        ("layout version 1", |r| put32(&mut r.control, info!(layout_version), 1)),
        ("layout version 2", |r| put32(&mut r.control, info!(layout_version), 2)),
        ("layout version 3", |r| put32(&mut r.control, info!(layout_version), 3)),
        ("layout version 4", |r| put32(&mut r.control, info!(layout_version), 4)),
        ("layout version 6", |r| put32(&mut r.control, info!(layout_version), 6)),
        ("unknown ring flags", |r| put32(&mut r.control, info!(ring_flags), 2)),
        ("a gate line on a host pool", |r| {
            put32(&mut r.control, info!(ring_flags), layout::RING_GATE)
        }),
        ("a CUDA pool with no room for its gate line", |r| {
            // The pool holds the slots exactly; the gate needs 64 more bytes.
            put32(&mut r.control, info!(backend), layout::BACKEND_CUDA);
            put32(&mut r.control, info!(ring_flags), layout::RING_GATE)
        }),
        ("layout version 0 (not ready)", |r| {
            put32(&mut r.control, info!(layout_version), 0)
        }),
        ("header size", |r| put32(&mut r.control, info!(header_bytes), 512)),
        ("slot count 3", |r| put32(&mut r.control, info!(slot_count), 3)),
        ("slot count 0", |r| put32(&mut r.control, info!(slot_count), 0)),
        ("slot count 8 in a 4-slot region", |r| {
            put32(&mut r.control, info!(slot_count), 8)
        }),
        ("slot count 2^31", |r| put32(&mut r.control, info!(slot_count), 1 << 31)),
        ("slot descriptor size", |r| {
            put32(&mut r.control, info!(slot_desc_bytes), 64)
        }),
        ("slots offset", |r| put64(&mut r.control, info!(slots_offset), 1 << 40)),
        ("control bytes", |r| {
            put64(&mut r.control, info!(control_bytes), u64::MAX)
        }),
        ("backend 9", |r| put32(&mut r.control, info!(backend), 9)),
        ("policy 7", |r| put32(&mut r.control, info!(policy), 7)),
        ("format 99", |r| put32(&mut r.control, info!(format), 99)),
        ("width 0", |r| put32(&mut r.control, info!(width), 0)),
        ("height 2^31", |r| put32(&mut r.control, info!(height), 1 << 31)),
        ("plane count 4", |r| put32(&mut r.control, info!(plane_count), 4)),
        ("chroma plane starts past the frame", |r| {
            let end = u64::from_le_bytes(
                r.control[info!(frame_bytes)..info!(frame_bytes) + 8]
                    .try_into()
                    .unwrap(),
            );
            put64(&mut r.control, info!(plane_offset) + 8, end);
        }),
        ("plane offset near u64::MAX", |r| {
            put64(&mut r.control, info!(plane_offset) + 8, u64::MAX - 4095)
        }),
        ("pitch below the row", |r| put64(&mut r.control, info!(plane_pitch), 32)),
        ("pitch overflows", |r| {
            put64(&mut r.control, info!(plane_pitch), 1 << 62)
        }),
        ("rows", |r| put64(&mut r.control, info!(plane_rows), 1_000_000)),
        ("frame larger than the stride", |r| {
            put64(&mut r.control, info!(frame_bytes), 1 << 40)
        }),
        ("stride 0", |r| put64(&mut r.control, info!(slot_stride), 0)),
        ("max subscribers 0", |r| {
            put32(&mut r.control, info!(max_subscribers), 0)
        }),
        ("max subscribers 2^20", |r| {
            put32(&mut r.control, info!(max_subscribers), 1 << 20)
        }),
        ("subscriber table magic", |r| {
            put64(&mut r.subs, offset_of!(SubsHeader, magic), 0)
        }),
        ("subscriber table of another epoch", |r| {
            put64(&mut r.subs, offset_of!(SubsHeader, epoch), 1)
        }),
        ("our entry is not active", |r| {
            put32(&mut r.subs, entry_off(INDEX) + offset_of!(SubEntry, state), 0)
        }),
        ("our entry has another generation", |r| {
            put32(
                &mut r.subs,
                entry_off(INDEX) + offset_of!(SubEntry, generation),
                GENERATION + 1,
            )
        }),
        ("welcome index out of range", |r| r.welcome.index = MAX_SUBS),
        ("welcome epoch disagrees", |r| r.welcome.epoch ^= 1),
        ("welcome backend disagrees", |r| {
            r.welcome.backend = layout::BACKEND_CUDA
        }),
        ("welcome control bytes past the memfd", |r| {
            r.welcome.control_bytes = 1 << 30
        }),
        ("welcome control bytes smaller than a header", |r| {
            r.welcome.control_bytes = 64;
            r.control.truncate(64);
        }),
        ("welcome subscriber table smaller than its header", |r| {
            r.welcome.subs_bytes = 64;
            r.subs.truncate(64);
        }),
        ("unsealed control memfd", |r| r.control_seals = SealFlags::empty()),
        ("control memfd writable by us", |r| r.control_seals = FIXED_SIZE),
        ("unsealed subscriber table", |r| r.subs_seals = SealFlags::empty()),
        ("subscriber table open to writes", |r| r.subs_seals = FIXED_SIZE),
        ("resizable client region", |r| r.client_seals = SealFlags::empty()),
        ("short client region", |r| r.client.truncate(64)),
        ("unsealed pool", |r| r.pool_seals = SealFlags::empty()),
    ];
    for (name, edit) in cases {
        let mut ring = Ring::valid();
        edit(&mut ring);
        assert_refused(name, welcome_with(&ring), layout_mismatch);
    }
    // The pool: too small for its slots (in the header and the Welcome
    // alike), or a memfd shorter than it claims.
    let mut ring = Ring::valid();
    let small = stride * u64::from(SLOTS) - 4096;
    put64(&mut ring.control, info!(pool_bytes), small);
    ring.welcome.pool_bytes = small;
    assert_refused("pool too small for its slots", welcome_with(&ring), layout_mismatch);
    let mut ring = Ring::valid();
    ring.pool.truncate(4096);
    assert_refused(
        "pool memfd shorter than pool_bytes",
        welcome_with(&ring),
        layout_mismatch,
    );
}

#[test]
fn descriptors_that_are_not_memfds_give_typed_errors() {
    let (b, mut fds, _map) = Ring::valid().served();
    let (r, _w) = rustix::pipe::pipe().expect("pipe");
    fds[0] = r;
    assert_refused("a pipe as the control region", Reply::Send(b, fds), |e| {
        matches!(e, Error::Io { .. } | Error::LayoutMismatch(_))
    });
    let (b, mut fds, _map) = Ring::valid().served();
    fds[3] = File::open("/dev/null").expect("/dev/null").into();
    assert_refused("/dev/null as the pool", Reply::Send(b, fds), |e| {
        matches!(e, Error::Io { .. } | Error::LayoutMismatch(_))
    });
}

#[test]
fn a_publisher_that_hangs_up_or_stays_silent_gives_io_or_timeout() {
    assert_refused("hang-up", Reply::Hangup, |e| matches!(e, Error::Io { .. }));
    // The wait given up is the victim's `connect_timeout`, not the default.
    let mut opts = victim_options();
    opts.client.connect_timeout = SILENCE;
    against_as(opts, Reply::Silent, |r| match r {
        Err(Error::Timeout(d, _)) if d == SILENCE => {}
        other => panic!("silence: expected a {SILENCE:?} Timeout, got {:?}", other.err()),
    });
}

/// Random corruption of a valid ring (its control region, subscriber table
/// and Welcome before connecting, and the live slot descriptors and seqs
/// after) gives a typed error or a subscriber that works, never a panic or
/// an access out of bounds.
#[test]
fn randomly_corrupted_rings_give_typed_errors_or_work_never_panics() {
    let valid = Ring::valid();
    let control_len = valid.control.len();
    let subs_len = valid.subs.len();
    let welcome_len = Msg::Welcome(valid.welcome).encode().len();
    let strategy = (
        proptest::collection::vec((0..control_len, any::<u8>()), 0..12),
        proptest::collection::vec((0..subs_len, any::<u8>()), 0..4),
        proptest::collection::vec((0..welcome_len, any::<u8>()), 0..3),
        proptest::collection::vec((size_of::<SharedRingInfo>()..control_len, any::<u8>()), 0..24),
    );
    let mut runner = TestRunner::new(Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    });
    let outcomes = std::cell::RefCell::new(std::collections::BTreeMap::<String, u32>::new());
    runner
        .run(&strategy, |(control_edits, subs_edits, welcome_edits, live_edits)| {
            let mut ring = valid.clone();
            for (at, v) in control_edits {
                ring.control[at] = v;
            }
            for (at, v) in subs_edits {
                ring.subs[at] = v;
            }
            let (mut bytes, fds, mut live) = ring.served();
            for (at, v) in welcome_edits {
                bytes[at] = v;
            }
            let outcome = against(Reply::Send(bytes, fds), |r| match r {
                Ok(mut sub) => {
                    // The publisher keeps writing its ring: scribble on the
                    // live seqs and slot descriptors, then read.
                    for (at, v) in live_edits {
                        live[at] = v;
                    }
                    match sub.next(Duration::from_millis(20)) {
                        Ok(f) => {
                            let n = f.host_bytes().map_or(0, <[u8]>::len);
                            assert_eq!(n as u64, f.len(), "a delivered frame is exactly frame_bytes long");
                            "connected, frame".to_owned()
                        }
                        Err(e) => format!("connected, then {}", variant(&e)),
                    }
                }
                Err(e) => variant(&e),
            });
            *outcomes.borrow_mut().entry(outcome).or_default() += 1;
            Ok(())
        })
        .expect("no panic on corrupted input");
    eprintln!("outcomes of 256 corrupted rings: {:?}", outcomes.borrow());
}

fn variant(e: &Error) -> String {
    let s = format!("{e:?}");
    s.split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A loopback TCP socket whose close blocks: its peer never reads, its send
/// queue is full, and it lingers `secs` on close (`SO_LINGER`). Whoever
/// closes the last copy waits for the linger.
fn lingering_tcp_socket(secs: i32) -> (OwnedFd, std::net::TcpListener) {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("loopback listener");
    let mut s = std::net::TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
    s.set_nonblocking(true).unwrap();
    let chunk = vec![0u8; 1 << 16];
    let mut sent = 0usize;
    while let Ok(n) = s.write(&chunk) {
        sent += n;
        assert!(sent < 1 << 30, "the loopback peer keeps taking data");
    }
    rustix::net::sockopt::set_socket_linger(&s, Some(Duration::from_secs(secs as u64))).expect("SO_LINGER");
    (OwnedFd::from(s), listener)
}

/// A subscriber can hand the publisher a descriptor whose last close blocks
/// (a TCP socket that lingers with unsent data, closed here, so the
/// publisher holds the last copy): the publisher must not close it on a
/// thread that serves the others. A second subscriber still connects, and
/// `close` returns: both would wait out a linger of ten times [`HANG`].
#[test]
fn a_descriptor_whose_close_lingers_does_not_stall_the_publisher() {
    let dir = TempDir::new("linger");
    let socket = dir.join("ring.sock");
    let cfg = RingConfig::new(Format::Gray8, 16, 16)
        .backend(BackendChoice::Host)
        .slots(4);
    let p = Publisher::create(&socket, cfg).expect("publisher");
    let (tcp, _listener) = lingering_tcp_socket(10 * HANG.as_secs() as i32);
    let conn = transport::connect(&socket).expect("connect");
    // Garbage with a descriptor, then hang up: the publisher drops both.
    transport::send(conn.as_fd(), &[0xAB; 16], &[tcp.as_fd()]).expect("send");
    drop(tcp);
    drop(conn);
    std::thread::sleep(Duration::from_millis(200));
    // Ten times HANG: a publisher stalled by the linger misses it.
    let opts = SubscriberOptions::default().connect_timeout(10 * HANG);
    let sub = ends("a second subscriber's connect", move || {
        Subscriber::connect(&socket, opts).map(drop)
    });
    assert!(sub.is_ok(), "a second subscriber could not connect: {:?}", sub.err());
    vramring_testkit::events::close_joining_the_service(p);
}

/// A publisher killed between a push word and `global_seq` (the word says
/// frame 2, `global_seq` stays at 1, and the socket hangs up): the push
/// reader's wait keeps ending on that word, and the reader still learns
/// "producer gone" from the socket, instead of spinning until its timeout.
#[test]
fn a_push_reader_whose_publisher_died_between_a_push_word_and_global_seq_reports_producer_gone() {
    let mut ring = Ring::valid();
    let entry = entry_off(INDEX);
    put32(&mut ring.subs, entry + offset_of!(SubEntry, flags), layout::SUBF_PUSH);
    put32(
        &mut ring.subs,
        entry + offset_of!(SubEntry, push_count),
        layout::PUSH_BUFFERS as u32,
    );
    put64(&mut ring.subs, entry + offset_of!(SubEntry, push_seq), 2);
    ring.welcome.granted = msg::HELLO_PUSH;
    let (bytes, mut fds, _map) = ring.served();
    fds.truncate(3);
    let mut opts = SubscriberOptions::default().push(true).name("victim");
    opts.client.connect_timeout = 5 * SILENCE;
    // The fake hangs up once the Attach arrives: a publisher killed there.
    against_as(opts, Reply::Send(bytes, fds), |r| {
        let mut sub = r.expect("a push Welcome is accepted");
        match sub.next(Duration::from_secs(10)) {
            Err(Error::ProducerGone { .. }) => {}
            other => panic!("expected ProducerGone, got {:?}", other.map(|f| f.seq())),
        }
    });
}
