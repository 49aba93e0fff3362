//! A `PacketSubscriber` facing a hostile packet publisher: every malformed
//! Welcome, descriptor, seal, header field or record gives a typed error,
//! never a panic or an out-of-bounds read; randomly corrupted rings give
//! typed errors or work.
//!
//! The fake publisher replays a real one: the test connects to a real
//! `PacketPublisher` by hand, copies its Welcome, ring and subscriber table,
//! edits the copies, and serves them from a listener of its own.

use vramring::ClientOptions;
use vramring_testkit::hang::{ends, HANG};
use vramring_testkit::procs as common;

use std::fs::File;
use std::mem::offset_of;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use vramring::ServeOptions;

use proptest::prelude::*;
use rustix::fs::{MemfdFlags, SealFlags};
use vramring::packet::{
    PacketMeta, PacketPublisher, PacketPublisherConfig, PacketRingConfig, PacketSubscriber, PacketSubscriberOptions,
    PACKET_KEY,
};
use vramring::seam::layout::{ClientLine, SubEntry, SubsHeader, CLIENT_BYTES};
use vramring::seam::packet_layout::{PacketHeader, PacketInfo, PacketRecord};
use vramring::seam::socket::msg::{self, Hello, Msg, Welcome};
use vramring::seam::socket::transport::{self, Listener};
use vramring::Error;

use common::TempDir;

const READ_ONLY: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::FUTURE_WRITE)
    .union(SealFlags::SEAL);
const FIXED_SIZE: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW).union(SealFlags::SEAL);
const RECORDS: u32 = 16;
const PACKETS: u64 = 20;

/// A copy of a real packet publisher's answer, to edit.
#[derive(Clone)]
struct Served {
    welcome: Welcome,
    ring: Vec<u8>,
    subs: Vec<u8>,
    ring_seals: SealFlags,
    subs_seals: SealFlags,
    fds: usize,
}

fn read_all(fd: &OwnedFd, len: u64) -> Vec<u8> {
    let file = File::from(fd.try_clone().expect("dup"));
    let mut b = vec![0u8; len as usize];
    file.read_exact_at(&mut b, 0).expect("read a served memfd");
    b
}

/// Runs a real packet publisher with `PACKETS` packets (keyframes every 5)
/// and captures what it serves.
fn capture() -> Served {
    let dir = TempDir::new(&format!("pk-bad-capture-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
    let path = dir.join("real.sock");
    let cfg = PacketPublisherConfig::new(PacketRingConfig::new(1 << 14, RECORDS, 4096));
    let mut p = PacketPublisher::create(&path, cfg).expect("real publisher");
    p.set_codec_params(b"sps pps").unwrap();
    for i in 1..=PACKETS {
        let flags = if i % 5 == 1 { PACKET_KEY } else { 0 };
        p.write(
            &vec![i as u8; 100 + i as usize * 37],
            PacketMeta {
                flags,
                ..Default::default()
            },
        )
        .unwrap();
    }
    let sock = transport::connect(&path).unwrap();
    let hello = Hello {
        flags: msg::HELLO_PACKETS,
        backends: 1,
        name: "capture".into(),
        device_uuid: [0; 16],
    };
    transport::send(sock.as_fd(), &Msg::Hello(hello).encode(), &[]).unwrap();
    let got = transport::recv(sock.as_fd(), Duration::from_secs(5))
        .unwrap()
        .expect("a Welcome");
    let Ok(Msg::Welcome(welcome)) = Msg::decode(&got.bytes) else {
        panic!("not a Welcome")
    };
    assert_eq!(got.fds.len(), 3, "ring, table, client region");
    Served {
        ring: read_all(&got.fds[0], welcome.control_bytes),
        subs: read_all(&got.fds[1], welcome.subs_bytes),
        welcome,
        ring_seals: READ_ONLY,
        subs_seals: READ_ONLY,
        fds: 3,
    }
}

fn memfd(name: &str, bytes: &[u8], seals: SealFlags) -> OwnedFd {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).expect("memfd_create");
    let file = File::from(fd);
    file.set_len(bytes.len() as u64).expect("ftruncate");
    file.write_all_at(bytes, 0).expect("write");
    let fd = OwnedFd::from(file);
    if !seals.is_empty() {
        rustix::fs::fcntl_add_seals(&fd, seals).expect("seals");
    }
    fd
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// Serves `s` once from a fake listener and connects a subscriber to it.
fn connect_to(
    s: &Served,
    lossless: bool,
) -> (vramring::Result<PacketSubscriber>, std::thread::JoinHandle<()>, TempDir) {
    connect_to_fake(s, lossless, Duration::from_secs(5))
}

/// As [`connect_to`]; the fake hangs up `hold` after its Welcome (or when
/// the subscriber says something).
fn connect_to_fake(
    s: &Served,
    lossless: bool,
    hold: Duration,
) -> (vramring::Result<PacketSubscriber>, std::thread::JoinHandle<()>, TempDir) {
    let dir = TempDir::new(&format!("pk-bad-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
    let path: PathBuf = dir.join("fake.sock");
    let listener = Listener::bind(&path, 0o600).expect("bind the fake");
    let ring = memfd("fake-ring", &s.ring, s.ring_seals);
    let subs = memfd("fake-subs", &s.subs, s.subs_seals);
    let client = memfd("fake-client", &[0u8; CLIENT_BYTES as usize], FIXED_SIZE);
    let extra = memfd("fake-extra", &[0u8; 64], FIXED_SIZE);
    let bytes = Msg::Welcome(s.welcome).encode();
    let nfds = s.fds;
    let fake = std::thread::spawn(move || {
        let Ok(Some(conn)) = listener.accept(Duration::from_secs(5)) else {
            return;
        };
        let _hello = transport::recv(conn.as_fd(), Duration::from_secs(5));
        let all: [BorrowedFd<'_>; 4] = [ring.as_fd(), subs.as_fd(), client.as_fd(), extra.as_fd()];
        let _ = transport::send(conn.as_fd(), &bytes, &all[..nfds]);
        let _ = transport::readable(conn.as_fd(), hold);
    });
    let mut opts = PacketSubscriberOptions::new().lossless(lossless).name("victim");
    // Long enough for the fake's thread to be scheduled on a busy machine.
    opts.client.connect_timeout = Duration::from_secs(5);
    (PacketSubscriber::connect(&path, opts), fake, dir)
}

/// Connects to `s` and reads whatever it can; returns the first error, or
/// the packets read.
fn connect_and_read(s: &Served) -> Result<u64, Error> {
    let (sub, fake, _dir) = connect_to(s, false);
    let result = sub.and_then(|mut sub| {
        let mut buf = Vec::new();
        let mut n = 0;
        for _ in 0..(2 * PACKETS) {
            match sub.try_next_copy(&mut buf) {
                Ok(Some(_)) => n += 1,
                Ok(None) => break,
                Err(Error::PacketOverrun { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let mut params = Vec::new();
        sub.codec_params(&mut params)?;
        Ok(n)
    });
    fake.join().expect("fake thread");
    result
}

fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

fn info(field: usize) -> usize {
    offset_of!(PacketHeader, info) + field
}

fn record(seq: u64) -> usize {
    std::mem::size_of::<PacketHeader>() + (seq % u64::from(RECORDS)) as usize * std::mem::size_of::<PacketRecord>()
}

fn entry(s: &Served) -> usize {
    std::mem::size_of::<SubsHeader>() + s.welcome.index as usize * std::mem::size_of::<SubEntry>()
}

#[test]
fn the_replayed_publisher_is_faithful() {
    let s = capture();
    // Joins at the newest keyframe (16) and reads 16..=20.
    assert_eq!(connect_and_read(&s).expect("a faithful replay works"), 5);
}

#[test]
fn every_malformed_answer_gives_a_typed_error() {
    type Edit = fn(&mut Served);
    type Expect = fn(&Error) -> bool;
    let base = capture();
    let cases: Vec<(&str, Edit, Expect)> = vec![
        ("no descriptors", |s| s.fds = 0, |e| matches!(e, Error::BadMessage(_))),
        ("one descriptor", |s| s.fds = 1, |e| matches!(e, Error::BadMessage(_))),
        ("two descriptors", |s| s.fds = 2, |e| matches!(e, Error::BadMessage(_))),
        ("four descriptors", |s| s.fds = 4, |e| matches!(e, Error::BadMessage(_))),
        (
            "packets not granted",
            |s| s.welcome.granted = 0,
            |e| matches!(e, Error::BadMessage(_)),
        ),
        (
            "unsealed ring",
            |s| s.ring_seals = SealFlags::empty(),
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "ring writable by readers",
            |s| s.ring_seals = FIXED_SIZE,
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "unsealed subscriber table",
            |s| s.subs_seals = SealFlags::empty(),
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "subscriber table writable by readers",
            |s| s.subs_seals = FIXED_SIZE,
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "client region of the wrong size",
            |s| s.welcome.client_bytes = 64,
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "wrong magic",
            |s| put64(&mut s.ring, info(offset_of!(PacketInfo, magic)), 7),
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "layout version 2",
            |s| put32(&mut s.ring, info(offset_of!(PacketInfo, layout_version)), 2),
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "3 records",
            |s| put32(&mut s.ring, info(offset_of!(PacketInfo, record_count)), 3),
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "2^30 records",
            |s| put32(&mut s.ring, info(offset_of!(PacketInfo, record_count)), 1 << 30),
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "data area not a power of two",
            |s| put64(&mut s.ring, info(offset_of!(PacketInfo, data_bytes)), 12345),
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "data area past the memfd",
            |s| put64(&mut s.ring, info(offset_of!(PacketInfo, data_bytes)), 1 << 32),
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "max packet over half the data area",
            |s| put32(&mut s.ring, info(offset_of!(PacketInfo, max_packet)), 1 << 14),
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "data offset",
            |s| put64(&mut s.ring, info(offset_of!(PacketInfo, data_offset)), u64::MAX - 7),
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "ring shorter than its header",
            |s| {
                s.ring.truncate(64);
                s.welcome.control_bytes = 64;
            },
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "welcome epoch disagrees",
            |s| s.welcome.epoch ^= 1,
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "welcome ring size disagrees",
            |s| s.welcome.control_bytes -= 4096,
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "subscriber table smaller than its header",
            |s| {
                s.subs.truncate(64);
                s.welcome.subs_bytes = 64;
            },
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "subscriber table of another epoch",
            |s| put64(&mut s.subs, offset_of!(SubsHeader, epoch), 1),
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "index out of range",
            |s| s.welcome.index = 1 << 20,
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "our entry has another generation",
            |s| {
                let off = entry(s) + offset_of!(SubEntry, generation);
                let g = s.welcome.generation + 1;
                put32(&mut s.subs, off, g);
            },
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "a record longer than the max packet",
            |s| {
                let off = record(PACKETS) + offset_of!(PacketRecord, len);
                put32(&mut s.ring, off, 4097);
            },
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "a record running past the data area",
            |s| {
                let off = record(PACKETS) + offset_of!(PacketRecord, offset);
                put64(&mut s.ring, off, (1 << 14) - 10);
            },
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "keyframe seq with the writing bit",
            |s| {
                let off = offset_of!(PacketHeader, tail) + 16;
                put64(&mut s.ring, off, u64::MAX);
            },
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "write seq with the writing bit",
            |s| {
                let off = offset_of!(PacketHeader, seq);
                put64(&mut s.ring, off, u64::MAX);
            },
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
        (
            "codec parameters longer than their area",
            |s| {
                let off = offset_of!(PacketHeader, params) + 8;
                put32(&mut s.ring, off, 1 << 20);
            },
            |e| matches!(e, Error::LayoutMismatch(_)),
        ),
    ];
    for (name, edit, expected) in cases {
        let mut s = base.clone();
        edit(&mut s);
        match connect_and_read(&s) {
            Ok(n) => panic!("{name}: accepted ({n} packets read)"),
            Err(e) => assert!(expected(&e), "{name}: unexpected error {e:?}"),
        }
    }
}

#[test]
fn lossless_not_granted_is_refused() {
    let s = capture();
    let (r, fake, _dir) = connect_to(&s, true);
    fake.join().unwrap();
    match r {
        Err(Error::Refused { code, .. }) => assert_eq!(code, msg::REJECT_POLICY),
        other => panic!("expected Refused, got {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random bytes anywhere in the ring's header and records (the data
    /// area is only bytes): typed errors or a working ring, never a panic.
    #[test]
    fn randomly_corrupted_rings_give_typed_errors_or_work(
        edits in proptest::collection::vec((0usize..(std::mem::size_of::<PacketHeader>() + RECORDS as usize * 64), any::<u8>()), 1..16)
    ) {
        let mut s = capture();
        for (pos, v) in edits {
            s.ring[pos] = v;
        }
        match connect_and_read(&s) {
            Ok(_) | Err(Error::LayoutMismatch(_)) | Err(Error::Timeout(..)) => {}
            Err(e) => prop_assert!(false, "unexpected error {e:?}"),
        }
    }
}

#[test]
fn a_blocking_read_keeps_its_timeout_when_write_seq_runs_ahead_of_the_records() {
    let mut s = capture();
    // `write_seq` says 3 more packets than any record holds.
    put64(&mut s.ring, offset_of!(PacketHeader, seq), PACKETS + 3);
    let (sub, fake, _dir) = connect_to(&s, false);
    let mut sub = sub.expect("connects");
    let mut buf = Vec::new();
    for want in 16..=PACKETS {
        assert_eq!(sub.next_copy(&mut buf, Duration::from_secs(1)).unwrap().seq, want);
    }
    // The read ends (the guard: records that never come must not make it
    // spin for ever) and says it timed out.
    let (sub, got) = ends("a 200 ms read", move || {
        let got = sub.next_copy(&mut buf, Duration::from_millis(200)).map(|p| p.seq);
        (sub, got)
    });
    match got {
        Err(Error::Timeout(d, _)) if d == Duration::from_millis(200) => {}
        other => panic!("expected a 200 ms Timeout, got {other:?}"),
    }
    drop(sub);
    fake.join().unwrap();
}

#[test]
fn non_blocking_reads_report_a_crashed_publisher_once_the_ring_is_drained() {
    let s = capture();
    // The fake hangs up right after its Welcome, as a killed publisher's
    // socket would; nothing frees our entry.
    let (sub, fake, _dir) = connect_to_fake(&s, false, Duration::ZERO);
    let mut sub = sub.expect("connects");
    fake.join().unwrap();
    let mut buf = Vec::new();
    let mut got = 0;
    let t = std::time::Instant::now();
    loop {
        match sub.try_next_copy(&mut buf) {
            Ok(Some(_)) => got += 1,
            Ok(None) => {
                assert!(t.elapsed() < HANG, "no ProducerGone after {:?}", t.elapsed());
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(Error::ProducerGone { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(got, 5, "the packets left in the ring come first");
    assert!(matches!(sub.try_borrow(), Err(Error::ProducerGone { .. })));
}

#[test]
fn a_lossless_reader_cannot_dodge_its_lease_by_moving_its_cursor() {
    let dir = TempDir::new(&format!("pk-dodge-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
    let path = dir.join("p.sock");
    let cfg = PacketPublisherConfig::new(PacketRingConfig::new(1 << 14, 8, 4096))
        .write_timeout(Duration::from_millis(100))
        .lossless_lease(Duration::from_millis(300));
    let mut p = PacketPublisher::create(&path, cfg).unwrap();
    // A hand-made lossless client that maps its entry and flips its cursor
    // between 0 and 1 every 20 ms.
    let sock = transport::connect(&path).unwrap();
    let hello = Hello {
        flags: msg::HELLO_PACKETS | msg::HELLO_LOSSLESS,
        backends: 1,
        name: "dodger".into(),
        device_uuid: [0; 16],
    };
    transport::send(sock.as_fd(), &Msg::Hello(hello).encode(), &[]).unwrap();
    let got = transport::recv(sock.as_fd(), Duration::from_secs(5))
        .unwrap()
        .expect("a Welcome");
    let Ok(Msg::Welcome(w)) = Msg::decode(&got.bytes) else {
        panic!("not a Welcome")
    };
    // The cursor lives in the client's own region (the third descriptor).
    let _ = w;
    let file = File::from(got.fds[2].try_clone().unwrap());
    let off = offset_of!(ClientLine, released_seq);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipper = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut v = 0u64;
            while !stop.load(Ordering::Relaxed) {
                file.write_all_at(&v.to_le_bytes(), off as u64).unwrap();
                v ^= 1;
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let t = std::time::Instant::now();
    let mut i = 0u64;
    while p.stats().evictions == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "never evicted");
        i += 1;
        let flags = if i == 1 { PACKET_KEY } else { 0 };
        match p.write(
            &[i as u8; 3000],
            PacketMeta {
                flags,
                ..Default::default()
            },
        ) {
            Ok(_) | Err(Error::LosslessBlocked { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    assert_eq!(p.stats().evictions, 1);
    drop(sock);
}
