//! NVDEC producer throughput on the GPU (feature `nvdec`), on the 1080p
//! clip (`tests/data/clip1080.h264`, H.264 High, 90 frames, looped):
//!
//! 1. `decode`: decode rate alone (each picture mapped and unmapped, no
//!    copy), 1 and N streams in one process, one thread and one decoder
//!    per stream, as fast as they go.
//! 2. `ring`: the same with each picture copied into a loaned CUDA ring
//!    slot and published (`copy_to_slot` + `publish_cuda`), no subscribers:
//!    the per-frame cost the ring adds, as the difference of the per-frame
//!    times and as the measured sink time (p50/p99).
//! 3. `capacity`: N streams paced at 25 fps, each into its own ring with 4
//!    pull subscribers (`Sequential`, threads of this process): a stream
//!    passes when its subscribers skipped no frame and the producer was
//!    never a frame period behind its schedule.
//!
//! ```text
//! cargo bench --features nvdec --bench nvdec -- [--secs 3] [--streams 1,4,8,16,32] \
//!     [--capacity 1,16,64,128,192] [--capacity-secs 4]
//! ```
//! Prints one line per measurement and a JSON line (`"bench":"nvdec"`) each.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use vramring::nvdec::{Codec, DecodedFrame, Decoder, DecoderOptions};
use vramring::ClientOptions;
use vramring::{BackendChoice, Error, Format, FrameMeta, Mode, Publisher, RingConfig, Subscriber, SubscriberOptions};

use vramring::packet::annexb;

use common::{output, pct};
use vramring_benches as common;

const PERIOD_25FPS: Duration = Duration::from_millis(40);
const USAGE: &str =
    "nvdec bench: [--secs 3] [--streams 1,4,8,16,32] [--capacity 1,16,64,128,192] [--capacity-secs 4]; \
needs NVDEC (feature nvdec)";

struct Args {
    secs: f64,
    streams: Vec<usize>,
    capacity: Vec<usize>,
    capacity_secs: f64,
}

fn parse_list(s: &str) -> Vec<usize> {
    s.split(',').filter_map(|v| v.trim().parse().ok()).collect()
}

fn args() -> Args {
    let mut a = Args {
        secs: 3.0,
        streams: vec![1, 4, 8, 16, 32],
        capacity: vec![1, 16, 64, 128, 192],
        capacity_secs: 4.0,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < v.len() {
        let next = v.get(i + 1).cloned().unwrap_or_default();
        match v[i].as_str() {
            "--secs" => a.secs = next.parse().expect("--secs N"),
            "--streams" => a.streams = parse_list(&next),
            "--capacity" => a.capacity = parse_list(&next),
            "--capacity-secs" => a.capacity_secs = next.parse().expect("--capacity-secs N"),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

fn clip() -> Vec<u8> {
    // `VRAMRING_TEST_DATA` overrides `tests/data` (staged binaries).
    let p = vramring_testkit::data::path("clip1080.h264");
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// Decodes the clip in a loop for `secs`, calling `sink` per picture;
/// returns pictures out and the elapsed time.
///
/// Warm-up first: the first access unit (its sequence header makes the
/// hardware decoder, which takes tens of ms and serialises across
/// decoders) is decoded and flushed into a no-op sink; then every stream
/// waits at `ready`, sleeps `stagger`, and the measured run starts.
fn run_stream(
    stream: &[u8],
    secs: f64,
    mut sink: impl FnMut(&DecodedFrame<'_>) -> vramring::Result<()>,
    pace: Option<Duration>,
    stop: &AtomicBool,
    ready: &Barrier,
    stagger: Duration,
) -> (u64, Duration) {
    let units = annexb::access_units(stream);
    let mut dec = Decoder::new(DecoderOptions::new(Codec::H264)).expect("an NVDEC decoder");
    dec.decode(units[0].bytes, Some(0), &mut |_| Ok(()))
        .expect("warm-up decode");
    dec.flush(&mut |_| Ok(())).expect("warm-up flush");
    let warm = dec.output_count();
    ready.wait();
    std::thread::sleep(stagger);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut next = start;
    'outer: loop {
        for (k, au) in units.iter().enumerate() {
            if Instant::now() >= end || stop.load(Ordering::Relaxed) {
                break 'outer;
            }
            if let Some(p) = pace {
                let now = Instant::now();
                if next > now {
                    std::thread::sleep(next - now);
                }
                next += p;
            }
            dec.decode(au.bytes, Some(k as i64), &mut sink).expect("decode");
        }
        dec.flush(&mut sink).expect("flush");
    }
    let n = dec.output_count() - warm;
    let el = start.elapsed();
    dec.close().expect("close");
    (n, el)
}

fn json(fields: &[(&str, String)]) -> String {
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    format!("{{\"bench\":\"nvdec\",{}}}", body.join(","))
}

fn decode_only(stream: &Arc<Vec<u8>>, n: usize, secs: f64) -> f64 {
    let barrier = Arc::new(Barrier::new(n));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (s, b, st) = (Arc::clone(stream), Arc::clone(&barrier), Arc::clone(&stop));
            std::thread::spawn(move || run_stream(&s, secs, |_f| Ok(()), None, &st, &b, Duration::ZERO))
        })
        .collect();
    let res: Vec<(u64, Duration)> = handles.into_iter().map(|h| h.join().expect("thread")).collect();
    let frames: u64 = res.iter().map(|r| r.0).sum();
    let el = res.iter().map(|r| r.1).max().unwrap_or_default().as_secs_f64();
    let fps = frames as f64 / el;
    println!(
        "decode  streams {n:3}: {frames} frames in {el:.2} s = {fps:.0} fps total, {:.0} per stream",
        fps / n as f64
    );
    println!(
        "{}",
        json(&[
            ("section", "\"decode\"".into()),
            ("streams", n.to_string()),
            ("frames", frames.to_string()),
            ("fps", format!("{fps:.1}")),
        ])
    );
    fps
}

fn sock_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("vramring-nvdec-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("socket dir");
    d
}

/// Decode into a ring (no subscribers): fps and the sink's time.
fn decode_ring(stream: &Arc<Vec<u8>>, n: usize, secs: f64, dir: &Path) -> (f64, u64, u64) {
    let barrier = Arc::new(Barrier::new(n));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..n)
        .map(|k| {
            let (s, b, st) = (Arc::clone(stream), Arc::clone(&barrier), Arc::clone(&stop));
            let path = dir.join(format!("ring-{n}-{k}.sock"));
            std::thread::spawn(move || {
                let cfg = RingConfig::new(Format::Nv12, 1920, 1080)
                    .slots(8)
                    .backend(BackendChoice::Cuda(0))
                    .commit_graph(common::commit_graph_from_env());
                let mut p = Publisher::create(&path, cfg).expect("publisher");
                let mut times = Vec::new();
                let r = run_stream(
                    &s,
                    secs,
                    |f| {
                        let t = Instant::now();
                        let mut slot = p.loan(Duration::from_millis(100))?;
                        f.copy_to_slot(&mut slot)?;
                        // SAFETY: the decoder's stream is of the ring's device's
                        // primary context.
                        unsafe { slot.publish_cuda(FrameMeta::pts(f.timestamp()), f.stream()) }?;
                        times.push(t.elapsed().as_nanos() as u64);
                        Ok(())
                    },
                    None,
                    &st,
                    &b,
                    Duration::ZERO,
                );
                p.close().expect("close");
                (r, times)
            })
        })
        .collect();
    let mut frames = 0;
    let mut el = Duration::ZERO;
    let mut times = Vec::new();
    for h in handles {
        let ((f, e), t) = h.join().expect("thread");
        frames += f;
        el = el.max(e);
        times.extend(t);
    }
    let fps = frames as f64 / el.as_secs_f64();
    times.sort_unstable();
    let (p50, p99) = (pct(&times, 0.5), pct(&times, 0.99));
    println!(
        "ring    streams {n:3}: {frames} frames in {:.2} s = {fps:.0} fps total, {:.0} per stream; copy+publish p50 {:.1} us p99 {:.1} us",
        el.as_secs_f64(),
        fps / n as f64,
        p50 as f64 / 1e3,
        p99 as f64 / 1e3
    );
    println!(
        "{}",
        json(&[
            ("section", "\"ring\"".into()),
            ("streams", n.to_string()),
            ("frames", frames.to_string()),
            ("fps", format!("{fps:.1}")),
            ("copy_publish_p50_ns", p50.to_string()),
            ("copy_publish_p99_ns", p99.to_string()),
        ])
    );
    (fps, p50, p99)
}

/// N paced streams, 4 subscribers each. Returns whether all streams passed.
fn capacity(stream: &Arc<Vec<u8>>, n: usize, secs: f64, dir: &Path) -> bool {
    let stop = Arc::new(AtomicBool::new(false));
    let late = Arc::new(AtomicU64::new(0));
    let max_late_us = Arc::new(AtomicU64::new(0));
    let published = Arc::new(AtomicU64::new(0));
    let received = Arc::new(AtomicU64::new(0));
    let skipped = Arc::new(AtomicU64::new(0));
    let sub_errors = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(Barrier::new(n));
    let mut handles = Vec::new();
    for k in 0..n {
        let s = Arc::clone(stream);
        let (st, lt, ml, pb) = (
            Arc::clone(&stop),
            Arc::clone(&late),
            Arc::clone(&max_late_us),
            Arc::clone(&published),
        );
        let (rc, sk, se, rd) = (
            Arc::clone(&received),
            Arc::clone(&skipped),
            Arc::clone(&sub_errors),
            Arc::clone(&ready),
        );
        let path = dir.join(format!("cap-{n}-{k}.sock"));
        handles.push(std::thread::spawn(move || {
            let cfg = RingConfig::new(Format::Nv12, 1920, 1080)
                .slots(8)
                .backend(BackendChoice::Cuda(0))
                .commit_graph(common::commit_graph_from_env());
            let mut p = Publisher::create(&path, cfg).expect("publisher");
            let subs: Vec<_> = (0..4)
                .map(|j| {
                    let opts = SubscriberOptions::default()
                        .mode(Mode::Sequential)
                        .name(format!("bench-{k}-{j}"));
                    let mut sub = Subscriber::connect(&path, opts).expect("subscriber");
                    let (rc, sk, se) = (Arc::clone(&rc), Arc::clone(&sk), Arc::clone(&se));
                    // A long timeout: the first frame comes only after every
                    // stream's warm-up (hardware decoders are made one after
                    // another, ~70 ms each); the end is ProducerGone.
                    std::thread::spawn(move || loop {
                        match sub.next(Duration::from_secs(60)) {
                            Ok(f) => {
                                sk.fetch_add(f.skipped(), Ordering::Relaxed);
                                rc.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(Error::ProducerGone { .. }) => break,
                            Err(e) => {
                                eprintln!("subscriber bench-{k}-{j}: {e}");
                                se.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                        }
                    })
                })
                .collect();
            // The schedule starts at the stream's first output picture: the
            // parser's display delay and the B-frame reorder depth hold the
            // first pictures back by a constant number of access units, and
            // making the decoder is not part of keeping 25 fps.
            let mut due: Option<Instant> = None;
            run_stream(
                &s,
                secs,
                |f| {
                    let now = Instant::now();
                    let d = *due.get_or_insert(now);
                    if now > d + PERIOD_25FPS {
                        lt.fetch_add(1, Ordering::Relaxed);
                    }
                    ml.fetch_max(now.saturating_duration_since(d).as_micros() as u64, Ordering::Relaxed);
                    due = Some(d + PERIOD_25FPS);
                    let mut slot = p.loan(Duration::from_millis(100))?;
                    f.copy_to_slot(&mut slot)?;
                    // SAFETY: the decoder's stream is of the ring's device's
                    // primary context.
                    unsafe { slot.publish_cuda(FrameMeta::pts(f.timestamp()), f.stream()) }?;
                    pb.fetch_add(1, Ordering::Relaxed);
                    Ok(())
                },
                Some(PERIOD_25FPS),
                &st,
                &rd,
                // Stagger the streams over one frame period.
                PERIOD_25FPS * k as u32 / n as u32,
            );
            // Let the subscribers read the last frames before the ring closes.
            std::thread::sleep(Duration::from_millis(200));
            p.close().expect("close");
            for s in subs {
                s.join().expect("subscriber thread");
            }
        }));
    }
    for h in handles {
        h.join().expect("stream thread");
    }
    stop.store(true, Ordering::Relaxed);
    let (pb, rc, sk, lt, se) = (
        published.load(Ordering::Relaxed),
        received.load(Ordering::Relaxed),
        skipped.load(Ordering::Relaxed),
        late.load(Ordering::Relaxed),
        sub_errors.load(Ordering::Relaxed),
    );
    let ml = max_late_us.load(Ordering::Relaxed);
    let expected = (n as f64 * 25.0 * secs) as u64;
    // Published may fall short of the schedule by the display lag (a few
    // pictures per stream): those are still in the decoder when time is up.
    let pass = sk == 0 && lt == 0 && se == 0 && rc == 4 * pb && pb + 4 * n as u64 >= expected;
    println!(
        "capacity streams {n:3} @25fps x4 subs: published {pb} (schedule {expected}), received {rc} (4x = {}), skipped {sk}, late {lt}, max lateness {:.1} ms, subscriber errors {se}: {}",
        4 * pb,
        ml as f64 / 1e3,
        if pass { "PASS" } else { "FAIL" }
    );
    println!(
        "{}",
        json(&[
            ("section", "\"capacity\"".into()),
            ("streams", n.to_string()),
            ("published", pb.to_string()),
            ("scheduled", expected.to_string()),
            ("received", rc.to_string()),
            ("skipped", sk.to_string()),
            ("late", lt.to_string()),
            ("max_lateness_us", ml.to_string()),
            ("pass", pass.to_string()),
        ])
    );
    pass
}

fn main() {
    if output::help(&output::args(), USAGE) {
        return;
    }
    let a = args();
    if let Ok(lib) = std::env::var("VRAMRING_NVCUVID") {
        if let Err(e) = vramring::nvdec::use_library(lib) {
            eprintln!("nvdec bench: {e}");
            std::process::exit(3);
        }
    }
    if !vramring::nvdec::available() {
        eprintln!("nvdec bench: NVDEC or the CUDA driver is not available here");
        std::process::exit(3);
    }
    let stream = Arc::new(clip());
    let dir = sock_dir();
    let mut one = (0.0, 0.0);
    for &n in &a.streams {
        let d = decode_only(&stream, n, a.secs);
        let (r, p50, p99) = decode_ring(&stream, n, a.secs, &dir);
        if n == 1 {
            one = (d, r);
        }
        println!(
            "ring cost streams {n:3}: {:.1} us per frame ({:.0} -> {:.0} fps per stream), sink p50 {:.1} us p99 {:.1} us",
            (1e6 / r - 1e6 / d) * n as f64,
            d / n as f64,
            r / n as f64,
            p50 as f64 / 1e3,
            p99 as f64 / 1e3
        );
    }
    let _ = one;
    for &n in &a.capacity {
        capacity(&stream, n, a.capacity_secs, &dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
