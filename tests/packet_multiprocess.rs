//! The packet ring between processes, with the real H.264 clip the tests
//! ship (`tests/data/clip.h264`: 300 access units, an IDR every 30) played
//! by `examples/packet_producer.rs` and recorded by `examples/recorder.rs`:
//!
//! * a lossless recorder's file is byte-identical to the clip, through many
//!   wraps of a small ring, while a slow plain reader beside it is overrun
//!   and resumes on keyframes only;
//! * a late joiner's first packet is a keyframe and what follows is the
//!   clip from there on;
//! * a recorder whose producer is SIGKILLed keeps what it got (a prefix of
//!   the stream) and ends with `ProducerGone` promptly.
//!
//! When to join or kill is decided by what the ring shows (an inspector's
//! view of what was written and read), never by a sleep.
//!
//! The examples are the binaries `cargo test` builds next to this test.

use vramring_testkit::procs as common;

use vramring::packet::annexb;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{example, ChildProc, TempDir};
use vramring::inspect::{InspectOptions, Inspector, RingStatus};
use vramring_testkit::json::JsonLine;

const CLIP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/clip.h264");

fn clip() -> Vec<u8> {
    std::fs::read(CLIP).expect("the committed clip")
}

fn final_json(c: &ChildProc) -> JsonLine {
    let out = c.output();
    out.lines()
        .rev()
        .filter_map(JsonLine::parse)
        .find(|j| j.get("event") == Some("final"))
        .unwrap_or_else(|| panic!("{}: no final JSON line in:\n{out}", c.name))
}

fn producer(dir: &TempDir, socket: &str, extra: &[&str]) -> ChildProc {
    let mut c = Command::new(example("packet_producer"));
    c.args(["--socket", socket, "--input", CLIP, "--json"]);
    c.args(extra);
    common::spawn(dir, "packet_producer", c)
}

/// Waits (30 s at most) until the ring at `socket` shows `cond`, through an
/// inspector (which holds no writer back); `p` must stay alive meanwhile.
fn wait_for_ring(socket: &str, p: &mut ChildProc, what: &str, mut cond: impl FnMut(&RingStatus) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ins = None;
    loop {
        assert!(p.try_wait().is_none(), "{} exited:\n{}", p.name, p.output());
        assert!(Instant::now() < deadline, "{what}: not within 30 s");
        if ins.is_none() {
            ins = Inspector::connect(socket, InspectOptions::default()).ok();
        }
        if let Some(i) = ins.as_mut() {
            if i.status().is_ok_and(|st| cond(&st)) {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn recorder(dir: &TempDir, socket: &str, name: &str, extra: &[&str]) -> (ChildProc, std::path::PathBuf) {
    let out = dir.join(&format!("{name}.h264"));
    let mut c = Command::new(example("recorder"));
    c.args(["--socket", socket, "--name", name, "--json", "--idle-ms", "20000"]);
    c.arg("--output").arg(&out);
    c.args(extra);
    (common::spawn(dir, name, c), out)
}

/// Maps each access unit of `recorded` to its index in `clip`, checking
/// that the recording starts on a keyframe and that every jump lands on a
/// keyframe. Returns the indices.
fn match_access_units(clip: &[annexb::AccessUnit<'_>], recorded: &[u8]) -> Vec<usize> {
    let mut idx = Vec::new();
    for au in annexb::access_units(recorded) {
        let next = idx.last().map_or(0, |&i: &usize| i + 1);
        let k = if clip.get(next).is_some_and(|c| c.bytes == au.bytes) {
            next
        } else {
            clip.iter()
                .position(|c| c.key && c.bytes == au.bytes)
                .unwrap_or_else(|| {
                    panic!(
                        "recorded access unit {} matches no keyframe of the clip after {next}",
                        idx.len()
                    )
                })
        };
        idx.push(k);
    }
    assert!(!idx.is_empty(), "nothing recorded");
    assert!(
        clip[idx[0]].key,
        "the recording starts at access unit {}, not a keyframe",
        idx[0]
    );
    idx
}

#[test]
fn a_lossless_recorder_is_byte_identical_to_the_clip_and_a_slow_reader_resyncs_on_keyframes() {
    let dir = TempDir::new("pk-record");
    let socket = dir.join("cam.packets.sock").display().to_string();
    // A 64 KiB ring for a 279 KiB clip: more than four wraps, so the
    // lossless recorder must hold the writer back.
    let mut p = producer(
        &dir,
        &socket,
        &[
            "--fps",
            "0",
            "--ring-bytes",
            "65536",
            "--records",
            "16",
            "--max-packet",
            "32768",
            "--wait-subscribers",
            "2",
            // A lossless recorder left unscheduled for a second on a busy
            // machine is not the eviction this test is about.
            "--lease-ms",
            "30000",
        ],
    );
    let (mut lossless, lossless_out) = recorder(&dir, &socket, "lossless", &["--delay-us", "200"]);
    let (mut plain, plain_out) = recorder(&dir, &socket, "plain-slow", &["--no-lossless", "--delay-us", "3000"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    p.wait_success(deadline);
    lossless.wait_success(deadline);
    plain.wait_success(deadline);

    let pj = final_json(&p);
    eprintln!("producer: {:?}", pj.0);
    assert_eq!(pj.u64("packets"), Some(300));
    assert!(pj.u64("lossless_waits").is_some_and(|n| n > 0), "the ring never filled");

    let lj = final_json(&lossless);
    eprintln!("lossless: {:?}", lj.0);
    assert_eq!(lj.get("end"), Some("producer_gone"));
    assert_eq!(
        (lj.u64("packets"), lj.u64("skipped"), lj.u64("overruns")),
        (Some(300), Some(0), Some(0))
    );
    assert!(lj.u64("params_bytes").is_some_and(|n| n > 0), "no codec parameters");
    let recorded = std::fs::read(&lossless_out).unwrap();
    assert!(recorded == clip(), "the lossless recording differs from the clip");

    let sj = final_json(&plain);
    eprintln!("plain-slow: {:?}", sj.0);
    assert_eq!(sj.get("end"), Some("producer_gone"));
    let data = clip();
    let units = annexb::access_units(&data);
    let idx = match_access_units(&units, &std::fs::read(&plain_out).unwrap());
    let jumps = idx.windows(2).filter(|w| w[1] != w[0] + 1).count();
    assert!(
        sj.u64("overruns").is_some_and(|n| n > 0) && jumps > 0,
        "the slow reader was never overrun: {} jumps",
        jumps
    );
    assert_eq!(sj.u64("packets"), Some(idx.len() as u64));
}

#[test]
fn a_late_joiner_starts_on_a_keyframe_and_then_gets_the_clip_from_there() {
    const RECORD: u64 = 200;
    let dir = TempDir::new("pk-late");
    let socket = dir.join("cam.packets.sock").display().to_string();
    // The clip, looped at 300 fps; a 30 s lease, so that the lossless late
    // joiner is never evicted for being slow.
    let mut p = producer(&dir, &socket, &["--fps", "300", "--loops", "0", "--lease-ms", "30000"]);
    // Join once the ring holds a hundred packets: past several IDRs.
    wait_for_ring(&socket, &mut p, "100 packets written", |st| {
        st.producer.published >= 100
    });
    let (mut late, out) = recorder(&dir, &socket, "late", &["--max-packets", &RECORD.to_string()]);
    late.wait_success(Instant::now() + Duration::from_secs(30));
    p.interrupt();
    p.wait_success(Instant::now() + Duration::from_secs(10));
    let j = final_json(&late);
    eprintln!("late: {:?}", j.0);
    assert_eq!(j.get("end"), Some("max_packets"));
    assert_eq!(j.u64("packets"), Some(RECORD));
    let first = j.u64("first_seq").unwrap();
    assert_eq!(j.u64("first_key"), Some(1));
    assert!(first > 1, "joined at the start: the test proves nothing");
    assert_eq!((first - 1) % 30, 0, "seq {first} is not one of the clip's IDRs");
    let data = clip();
    let units = annexb::access_units(&data);
    let from = ((first - 1) % units.len() as u64) as usize;
    let tail: Vec<u8> = units
        .iter()
        .cycle()
        .skip(from)
        .take(RECORD as usize)
        .flat_map(|u| u.bytes.iter().copied())
        .collect();
    assert!(
        std::fs::read(&out).unwrap() == tail,
        "the late recording is not the clip from its IDR on"
    );
}

#[test]
fn a_recorder_keeps_what_it_got_and_sees_producer_gone_when_the_producer_is_killed() {
    let dir = TempDir::new("pk-kill");
    let socket = dir.join("cam.packets.sock").display().to_string();
    // The first packet waits for the recorder and the inspector below, so
    // the recording starts at the stream's start.
    let mut p = producer(
        &dir,
        &socket,
        &[
            "--fps",
            "500",
            "--loops",
            "0",
            "--wait-subscribers",
            "2",
            "--lease-ms",
            "30000",
        ],
    );
    let (mut rec, out) = recorder(&dir, &socket, "survivor", &[]);
    // Kill once the recorder has read 60 packets.
    wait_for_ring(&socket, &mut p, "the recorder reads 60 packets", |st| {
        st.subscribers.iter().any(|r| r.name == "survivor" && r.delivered >= 60)
    });
    let status = p.kill9();
    assert!(!status.success(), "the producer exited by itself: {status}");
    let killed = Instant::now();
    rec.wait_success(Instant::now() + vramring_testkit::hang::HANG);
    let after = killed.elapsed();
    let j = final_json(&rec);
    eprintln!("survivor: {:?} {after:?} after the kill", j.0);
    // Told, not timed out: a recorder that missed the kill would end at its
    // 20 s idle timeout, saying so.
    assert_eq!(j.get("end"), Some("producer_gone"));
    // What it wrote is the looped clip from the start, cut anywhere, and
    // holds at least the 60 packets it had read.
    let recorded = std::fs::read(&out).unwrap();
    let data = clip();
    let sixty: usize = annexb::access_units(&data)[..60].iter().map(|u| u.bytes.len()).sum();
    assert!(
        recorded.len() >= sixty,
        "only {} bytes recorded, fewer than the 60 packets read ({sixty})",
        recorded.len()
    );
    let looped: Vec<u8> = data.iter().copied().cycle().take(recorded.len()).collect();
    assert!(recorded == looped, "the recording is not a prefix of the looped clip");
}
