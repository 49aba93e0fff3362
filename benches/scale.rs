//! Scale bench: many 1080p cameras at 25 fps on one GPU, in the two shapes
//! NVRs use, each ring read by subscribers of mixed modes.
//!
//! * `one-process`: one decoder process publishes N rings (one thread each).
//! * `per-camera`: N producer processes publish one ring each (Frigate runs
//!   a decoder per camera).
//!
//! Subscribers are a few processes, one per subscriber index of
//! `--mix` (e.g. `push,push,pull,sequential`: 4 processes), each with one
//! thread per ring, so 64 cameras × 4 subscribers cost 4 subscriber
//! contexts, not 256 (a CUDA context costs ~500 MB of GPU memory).
//!
//! Each frame is written on the producer's stream with the crate's test
//! pattern kernel (`GpuTestPattern::fill`, host: `testpattern::fill`) and
//! committed with `SlotMut::publish_cuda` (host: `publish`), paced at
//! `--fps` with the cameras' phases spread over one frame period. Its user
//! meta carries the producer's `CLOCK_MONOTONIC` time taken just before the
//! publish call, the frame's index and the camera. A subscriber measures
//! publish → frame in hand (`next()` returned) against that time, counts
//! frames it never got in the measured window (drops), and checks one frame
//! in `--verify-every` against the pattern of its seq on the GPU (torn);
//! with `--verify-warmup` it checks every frame of the warm-up's first half
//! and none after instead (without MPS a check is a GPU context switch that
//! delays the other rings' frames, and a backlog of them spills over). A
//! run in which no frame was checked never reports the goal met.
//! Producer and subscriber CPU per frame are process CPU time
//! (`CLOCK_PROCESS_CPUTIME_ID`) over the measured window divided by the
//! frames published or received in it. Beside them, the whole machine over
//! the same window (`common/host.rs`: CPUs busy, stolen by the hypervisor,
//! threads runnable), which tells a tail the lent VM's host made from one
//! the ring made.
//!
//! Only the public API is used (`Publisher`, `SlotMut::publish_cuda`,
//! `Subscriber`, `SubscriberOptions`, with the library's default wait unless
//! `--spin-us` is given).
//!
//! ```text
//! cargo bench --bench scale -- --quick [--mps [off|on|both]] [--out DIR]
//! cargo bench --bench scale -- --backend host --cameras 4 --seconds 3     # CPU smoke test
//! bash .device/run.sh bench scale --quick --mps both --out $OUT           # staged, on the GPU
//! ```
//!
//! Every child dies with the orchestrator (`PR_SET_PDEATHSIG`), every wait
//! is bounded, and `--timeout-s` (default 570 s) bounds the whole run; the
//! MPS daemon of `--mps` is quit at the end, on errors and on SIGINT/SIGTERM.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use vramring::ClientOptions;
use vramring::{
    BackendChoice, BackendKind, Delivery, Error as RingError, Format, FrameMeta, Mode, Policy, Publisher, RingConfig,
    Subscriber, SubscriberOptions,
};
use vramring_testkit::gpu::GpuTestPattern;

use common::{host, output, procs};
use common::{median, now_ns, pct, process_cpu_ns, sleep_until_ns, thread_cpu_ns, R};
use procs::{Children, MpsChoice, MpsDaemon};
use vramring_benches as common;

// ------------------------------------------------------------------ options

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ShapeArg {
    /// One decoder process with N rings.
    OneProcess,
    /// N producer processes with one ring each.
    PerCamera,
    /// Both, one after the other.
    Both,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Cuda,
    Host,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    Producer,
    Subscriber,
}

/// A subscriber's mode in `--mix`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SubMode {
    /// Latest frame, push delivery.
    Push,
    /// Latest frame, pulled (copied in the subscriber's context).
    Pull,
    /// Every frame in order, pulled.
    Sequential,
    /// Every frame in order, pushed into the reader's own queue.
    SequentialPush,
}

impl SubMode {
    fn parse(s: &str) -> Result<SubMode, String> {
        match s.trim() {
            "push" => Ok(SubMode::Push),
            "pull" | "latest" => Ok(SubMode::Pull),
            "sequential" | "seq" => Ok(SubMode::Sequential),
            "seqpush" => Ok(SubMode::SequentialPush),
            other => Err(format!(
                "--mix: unknown mode {other:?} (push, pull, sequential, seqpush)"
            )),
        }
    }
    fn name(self) -> &'static str {
        match self {
            SubMode::Push => "push",
            SubMode::Pull => "pull",
            SubMode::Sequential => "sequential",
            SubMode::SequentialPush => "seqpush",
        }
    }
}

/// Many cameras on one GPU: latency, drops and CPU per frame.
#[derive(Debug, Clone, Parser)]
#[command(name = "scale")]
struct Cli {
    /// The preset: both shapes, 64 cameras × 4 subscribers, 15 s each
    /// (flags given explicitly still win).
    #[arg(long)]
    quick: bool,
    /// one-process (one decoder, N rings), per-camera (N producers), or both.
    #[arg(long, value_enum)]
    shape: Option<ShapeArg>,
    /// Cameras (rings).
    #[arg(long)]
    cameras: Option<usize>,
    /// Subscribers per ring; their modes cycle through --mix.
    #[arg(long, default_value_t = 4)]
    subs_per_ring: usize,
    /// Frames per second per camera.
    #[arg(long, default_value_t = 25.0)]
    fps: f64,
    /// Measured seconds per shape (after the warm-up).
    #[arg(long)]
    seconds: Option<f64>,
    /// Warm-up seconds before the measured window (push buffers get mapped).
    #[arg(long, default_value_t = 1.0)]
    warmup_seconds: f64,
    /// Modes of the subscribers of each ring, by subscriber index.
    #[arg(long, default_value = "push,push,pull,sequential")]
    mix: String,
    /// Without MPS (off), under a private MPS daemon (on), or both in turn.
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "on", default_value = "off")]
    mps: MpsChoice,
    /// Directory for scale.md (the report) and scale.jsonl (every line).
    #[arg(long)]
    out: Option<PathBuf>,
    /// cuda (1080p NV12 by default) or host (small frames; a CPU smoke test).
    #[arg(long, value_enum, default_value = "cuda")]
    backend: BackendArg,
    /// Frame width (default 1920 on CUDA, 320 on host).
    #[arg(long)]
    width: Option<u32>,
    /// Frame height (default 1080 on CUDA, 240 on host).
    #[arg(long)]
    height: Option<u32>,
    /// Slots per ring.
    #[arg(long, default_value_t = 8)]
    slots: u32,
    /// Check one frame in this many against the pattern (0: none; default
    /// 250 on CUDA, 1 on host). Without MPS each check costs the GPU a
    /// switch to the subscriber's context, which delays other rings' frames:
    /// the default keeps that well below 1 % of frames at 64 × 4.
    #[arg(long)]
    verify_every: Option<u64>,
    /// Check every frame of the first half of the warm-up instead, and none
    /// after, so that no check's GPU work delays a measured frame: without
    /// MPS each check is a switch to the subscriber's context that stalls
    /// the other rings' commits, and 256 readers' checks take a while to
    /// drain (PERF.md, "Scale"; use it with `--warmup-seconds 3` or more).
    #[arg(long)]
    verify_warmup: bool,
    /// Subscriber spin before parking, µs (default: the library's default).
    #[arg(long)]
    spin_us: Option<u64>,
    /// Bound on the whole run, seconds; children are killed past it.
    #[arg(long, default_value_t = 570)]
    timeout_s: u64,
    // Set by the orchestrator for its children.
    #[arg(long, hide = true, value_enum)]
    role: Option<Role>,
    #[arg(long, hide = true)]
    run_dir: Option<PathBuf>,
    #[arg(long, hide = true, default_value_t = 0)]
    first: usize,
    #[arg(long, hide = true, default_value_t = 1)]
    count: usize,
    #[arg(long, hide = true, default_value_t = 0)]
    index: usize,
}

/// The resolved parameters of a run (what every child needs).
#[derive(Debug, Clone)]
struct Params {
    cameras: usize,
    subs_per_ring: usize,
    fps: f64,
    seconds: f64,
    warmup_seconds: f64,
    mix: Vec<SubMode>,
    backend: BackendArg,
    width: u32,
    height: u32,
    slots: u32,
    verify_every: u64,
    verify_warmup: bool,
    spin_us: Option<u64>,
}

impl Params {
    fn from_cli(cli: &Cli) -> Result<Params, String> {
        let host = cli.backend == BackendArg::Host;
        let mix = cli.mix.split(',').map(SubMode::parse).collect::<Result<Vec<_>, _>>()?;
        if mix.is_empty() {
            return Err("--mix needs at least one mode".into());
        }
        let p = Params {
            cameras: cli.cameras.unwrap_or(64),
            subs_per_ring: cli.subs_per_ring,
            fps: cli.fps,
            seconds: cli.seconds.unwrap_or(if cli.quick { 15.0 } else { 30.0 }),
            warmup_seconds: cli.warmup_seconds,
            mix,
            backend: cli.backend,
            width: cli.width.unwrap_or(if host { 320 } else { 1920 }),
            height: cli.height.unwrap_or(if host { 240 } else { 1080 }),
            slots: cli.slots,
            verify_every: cli.verify_every.unwrap_or(if host { 1 } else { 250 }),
            verify_warmup: cli.verify_warmup,
            spin_us: cli.spin_us,
        };
        let positive = |x: f64| x.is_finite() && x > 0.0;
        if p.cameras == 0
            || p.subs_per_ring == 0
            || !positive(p.fps)
            || !positive(p.seconds)
            || !(positive(p.warmup_seconds) || p.warmup_seconds == 0.0)
        {
            return Err(
                "--cameras, --subs-per-ring, --fps and --seconds must be positive, --warmup-seconds not negative"
                    .into(),
            );
        }
        Ok(p)
    }

    /// The child's command-line arguments for these parameters.
    fn args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--cameras={}", self.cameras),
            format!("--subs-per-ring={}", self.subs_per_ring),
            format!("--fps={}", self.fps),
            format!("--seconds={}", self.seconds),
            format!("--warmup-seconds={}", self.warmup_seconds),
            format!(
                "--mix={}",
                self.mix.iter().map(|m| m.name()).collect::<Vec<_>>().join(",")
            ),
            format!(
                "--backend={}",
                if self.backend == BackendArg::Host {
                    "host"
                } else {
                    "cuda"
                }
            ),
            format!("--width={}", self.width),
            format!("--height={}", self.height),
            format!("--slots={}", self.slots),
            format!("--verify-every={}", self.verify_every),
        ];
        if let Some(s) = self.spin_us {
            a.push(format!("--spin-us={s}"));
        }
        if self.verify_warmup {
            a.push("--verify-warmup".into());
        }
        a
    }

    fn mode_of(&self, sub_index: usize) -> SubMode {
        self.mix[sub_index % self.mix.len()]
    }
    fn period_ns(&self) -> u64 {
        (1e9 / self.fps).round() as u64
    }
    fn warmup_frames(&self) -> u64 {
        (self.warmup_seconds * self.fps).round() as u64
    }
    fn measured_frames(&self) -> u64 {
        (self.seconds * self.fps).round() as u64
    }
    /// Whether frame `i` of `camera` is checked against its pattern.
    /// Cameras check different frames, so the checks spread over time.
    fn verifies(&self, camera: usize, i: u64) -> bool {
        if self.verify_warmup {
            i < self.warmup_frames() / 2
        } else {
            self.verify_every > 0 && i % self.verify_every == camera as u64 % self.verify_every
        }
    }
    /// The report's words for what is checked.
    fn verify_words(&self) -> String {
        if self.verify_warmup {
            "verify every frame of the warm-up's first half, none measured".into()
        } else {
            format!("verify 1 in {}", self.verify_every)
        }
    }
    fn sock(dir: &Path, camera: usize) -> PathBuf {
        dir.join(format!("cam{camera}.sock"))
    }
}

// ---------------------------------------------------------------- helpers

/// One result record: `key=value` words on one line.
#[derive(Debug, Default, Clone)]
struct Rec(Vec<(String, String)>);

impl Rec {
    fn kind(k: &str) -> Rec {
        Rec(vec![("kind".into(), k.into())])
    }
    fn set(mut self, k: &str, v: impl ToString) -> Rec {
        self.0.push((k.into(), v.to_string().replace(char::is_whitespace, "_")));
        self
    }
    fn line(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
    fn parse(line: &str) -> Rec {
        Rec(line
            .split_whitespace()
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }
    fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
    }
    /// `<prefix>p50_ns`, `<prefix>p99_ns` and `<prefix>max_ns` of `sorted`.
    fn pcts(self, prefix: &str, sorted: &[u64]) -> Rec {
        self.set(&format!("{prefix}p50_ns"), pct(sorted, 0.5))
            .set(&format!("{prefix}p99_ns"), pct(sorted, 0.99))
            .set(&format!("{prefix}max_ns"), pct(sorted, 1.0))
    }
    fn u(&self, k: &str) -> u64 {
        self.get(k).and_then(|v| v.parse().ok()).unwrap_or(0)
    }
    fn json(&self, extra: &[(&str, &str)]) -> String {
        let mut out = String::from("{\"bench\":\"scale\"");
        for (k, v) in extra
            .iter()
            .map(|(k, v)| (*k, *v))
            .chain(self.0.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        {
            let num = v.parse::<f64>().is_ok_and(f64::is_finite);
            if num {
                out.push_str(&format!(",\"{k}\":{v}"));
            } else {
                out.push_str(&format!(",\"{k}\":\"{}\"", v.replace(['"', '\\'], "'")));
            }
        }
        out.push('}');
        out
    }
}

/// Writes `text` to `path` atomically (write a temporary file, rename).
fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Waits for the orchestrator's `go` file and returns its start time
/// (`CLOCK_MONOTONIC` ns), or fails past `limit`.
fn wait_go(dir: &Path, limit: Duration) -> R<u64> {
    let deadline = Instant::now() + limit;
    let go = dir.join("go");
    loop {
        if let Ok(text) = std::fs::read_to_string(&go) {
            return Ok(text.trim().parse()?);
        }
        if Instant::now() > deadline {
            return Err(format!("no start signal ({}) within {} s", go.display(), limit.as_secs()).into());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// How long a child waits for the others to start (CUDA contexts of 64
/// processes on a shared machine take a while).
const STARTUP: Duration = Duration::from_secs(150);
/// Stack of the ring and subscriber threads: CUDA calls made on them (the
/// pattern kernels' PTX is compiled at load) get a main thread's stack.
const THREAD_STACK: usize = 8 << 20;
/// The orchestrator gives up when no further process became ready for this long.
const STALL: Duration = Duration::from_secs(40);

// --------------------------------------------------------------- producer

/// What one ring's thread measured.
#[derive(Debug, Default)]
struct RingStats {
    camera: usize,
    published: u64,
    measured: u64,
    publish_wall: Vec<u64>,
    frame_cpu: Vec<u64>,
    late: u64,
    max_late_ns: u64,
    subscribers_at_end: u32,
    /// The first frames (up to [`SLOW_LOG`]) whose publish call took more
    /// than [`SLOW_PUBLISH_NS`], as "index:µs".
    slow_publish_at: Vec<String>,
}

fn ring_thread(p: &Params, dir: &Path, camera: usize, ready: &AtomicUsize, go: &AtomicU64) -> R<RingStats> {
    let backend = match p.backend {
        BackendArg::Cuda => BackendChoice::Cuda(0),
        BackendArg::Host => BackendChoice::Host,
    };
    let cfg = RingConfig::new(Format::Nv12, p.width, p.height)
        .slots(p.slots)
        .backend(backend)
        .policy(Policy::Overwrite)
        .commit_graph(common::commit_graph_from_env());
    let path = Params::sock(dir, camera);
    let mut publisher = Publisher::create(&path, cfg).map_err(|e| format!("camera {camera}: publisher: {e}"))?;
    let mut gpu = match publisher.backend() {
        BackendKind::Host => None,
        _ => Some(
            GpuTestPattern::for_uuid(publisher.info().device_uuid())
                .map_err(|e| format!("camera {camera}: pattern kernels: {e}"))?,
        ),
    };
    // SYNC: ready — counts rings whose publisher is serving; the main thread
    // reads the count with Acquire before it reports the process ready.
    ready.fetch_add(1, Ordering::AcqRel);
    let go_ns = loop {
        // SYNC: go — Acquire, pairs with the main thread's Release store of
        // the start time (or of u64::MAX: stop).
        let g = go.load(Ordering::Acquire);
        if g == u64::MAX {
            return Err("stopped before the start".into());
        }
        if g != 0 {
            break g;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let period = p.period_ns();
    // Spread the cameras' phases over one frame period.
    let start = go_ns + period * camera as u64 / p.cameras as u64;
    let (warm, measured) = (p.warmup_frames(), p.measured_frames());
    let mut st = RingStats {
        camera,
        publish_wall: Vec::with_capacity(measured as usize),
        frame_cpu: Vec::with_capacity(measured as usize),
        ..Default::default()
    };
    for i in 0..warm + measured {
        let due = start + i * period;
        sleep_until_ns(due);
        let woke = now_ns();
        let in_window = i >= warm;
        if in_window {
            let late = woke.saturating_sub(due);
            st.max_late_ns = st.max_late_ns.max(late);
            if late > period / 2 {
                st.late += 1;
            }
        }
        let c0 = thread_cpu_ns();
        let mut slot = publisher
            .loan(Duration::from_millis(200))
            .map_err(|e| format!("camera {camera}: loan: {e}"))?;
        let seq = slot.seq();
        if let Some(g) = gpu.as_ref() {
            g.fill(&mut slot.device_mut()?, seq)
                .map_err(|e| format!("camera {camera}: fill: {e}"))?;
        } else {
            vramring_testkit::pattern::fill(slot.bytes_mut()?, seq);
        }
        let t0 = now_ns();
        let mut user = [0u8; 24];
        user[..8].copy_from_slice(&t0.to_le_bytes());
        user[8..16].copy_from_slice(&i.to_le_bytes());
        user[16..24].copy_from_slice(&(camera as u64).to_le_bytes());
        let meta = FrameMeta::pts(i as i64).with_user(&user)?;
        match gpu.as_ref() {
            Some(g) => {
                let stream = g.stream()?;
                // SAFETY: `stream` is the pattern kernels' live stream in the
                // device's primary context, the ring's context.
                unsafe { slot.publish_cuda(meta, stream) }
            }
            None => slot.publish(meta),
        }
        .map_err(|e| format!("camera {camera}: publish: {e}"))?;
        let t1 = now_ns();
        st.published += 1;
        if in_window {
            st.measured += 1;
            st.publish_wall.push(t1 - t0);
            if t1 - t0 > SLOW_PUBLISH_NS && st.slow_publish_at.len() < SLOW_LOG {
                st.slow_publish_at.push(format!("{i}:{}", (t1 - t0) / 1000));
            }
            st.frame_cpu.push(thread_cpu_ns() - c0);
        }
    }
    st.subscribers_at_end = publisher.stats().subscribers;
    // Let the subscribers take the last frame before the ring goes away.
    std::thread::sleep(Duration::from_millis(500));
    publisher.close().map_err(|e| format!("camera {camera}: close: {e}"))?;
    if let Some(g) = gpu.as_mut() {
        g.close()?;
    }
    Ok(st)
}

fn producer_main(p: &Params, dir: &Path, first: usize, count: usize) -> R<()> {
    let ready = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for camera in first..first + count {
        let (p, dir, ready, go, failed) = (
            p.clone(),
            dir.to_path_buf(),
            Arc::clone(&ready),
            Arc::clone(&go),
            Arc::clone(&failed),
        );
        let name = format!("cam{camera}");
        handles.push(
            std::thread::Builder::new()
                .name(name)
                .stack_size(THREAD_STACK)
                .spawn(move || {
                    let r = ring_thread(&p, &dir, camera, &ready, &go);
                    if r.is_err() {
                        // Relaxed: a flag the main thread polls; the error itself
                        // travels through the join handle.
                        failed.store(true, Ordering::Relaxed);
                    }
                    r
                })?,
        );
    }
    let tag = format!("producer-{first}");
    // SYNC: go — Release: u64::MAX tells the ring threads to give up.
    let stop_threads = |go: &AtomicU64| go.store(u64::MAX, Ordering::Release);
    let deadline = Instant::now() + STARTUP;
    // SYNC: ready — Acquire, pairs with the ring threads' increments.
    while ready.load(Ordering::Acquire) < count {
        if failed.load(Ordering::Relaxed) || Instant::now() > deadline {
            stop_threads(&go);
            return Err(join_errors(handles, &tag));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    write_atomic(&dir.join(format!("ready-{tag}")), "ready")?;
    let go_ns = match wait_go(dir, STARTUP) {
        Ok(g) => g,
        Err(e) => {
            stop_threads(&go);
            let _ = join_errors(handles, &tag);
            return Err(e);
        }
    };
    // SYNC: go — Release: the ring threads read the start time with Acquire.
    go.store(go_ns, Ordering::Release);
    let window = cpu_window(p, go_ns);
    let mut rings = Vec::new();
    let mut errors = Vec::new();
    for h in handles {
        match h.join() {
            Ok(Ok(st)) => rings.push(st),
            Ok(Err(e)) => errors.push(e.to_string()),
            Err(_) => errors.push("a ring thread panicked".into()),
        }
    }
    let measured: u64 = rings.iter().map(|r| r.measured).sum();
    let mut out = String::new();
    out.push_str(
        &Rec::kind("producer")
            .set("first", first)
            .set("count", count)
            .set("cpu_ns", window)
            .set("frames", measured)
            .set("errors", errors.len())
            .line(),
    );
    out.push('\n');
    for r in &mut rings {
        r.publish_wall.sort_unstable();
        r.frame_cpu.sort_unstable();
        out.push_str(
            &Rec::kind("ring")
                .set("camera", r.camera)
                .set("published", r.published)
                .set("measured", r.measured)
                .pcts("publish_", &r.publish_wall)
                .set("frame_cpu_p50_ns", pct(&r.frame_cpu, 0.5))
                .set("late", r.late)
                .set("max_late_ns", r.max_late_ns)
                .set("subscribers_at_end", r.subscribers_at_end)
                .set("slow_publish_at", joined(&r.slow_publish_at))
                .line(),
        );
        out.push('\n');
    }
    for e in &errors {
        out.push_str(&Rec::kind("error").set("who", &tag).set("what", e).line());
        out.push('\n');
    }
    write_atomic(&dir.join(format!("result-{tag}")), &out)?;
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; ").into())
    }
}

fn join_errors(
    handles: Vec<std::thread::JoinHandle<R<RingStats>>>,
    tag: &str,
) -> Box<dyn std::error::Error + Send + Sync> {
    let errs: Vec<String> = handles
        .into_iter()
        .filter_map(|h| match h.join() {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("a thread panicked".into()),
        })
        .collect();
    format!("{tag}: {}", errs.join("; ")).into()
}

/// Process CPU time over the measured window: sampled by the main thread at
/// the window's start and end (the threads run on their own schedule).
fn cpu_window(p: &Params, go_ns: u64) -> u64 {
    let start = go_ns + (p.warmup_seconds * 1e9) as u64;
    let end = start + (p.seconds * 1e9) as u64;
    sleep_until_ns(start);
    let c0 = process_cpu_ns();
    sleep_until_ns(end);
    process_cpu_ns().saturating_sub(c0)
}

// -------------------------------------------------------------- subscriber

/// What one subscriber (one ring, one subscriber index) measured.
#[derive(Debug, Default)]
struct SubStats {
    camera: usize,
    latency: Vec<u64>,
    received: u64,
    skipped: u64,
    verified: u64,
    torn: u64,
    bad_meta: u64,
    pushed: u64,
    overruns: u64,
    /// Pulled frames whose copy was queued on the GPU, and of those, queued
    /// at the loan (ADR 0010, ADR 0014); over the whole run.
    queued: u64,
    queued_at_loan: u64,
    /// Frames of the window that took more than [`SLOW_NS`], and of those,
    /// the ones that spent most of it before the publisher's commit stamp
    /// (`commit_ns`, taken inside the publish call before the commit is
    /// enqueued: the publish's own CPU work) rather than after it (the
    /// launch, the GPU, the wake).
    slow: u64,
    slow_before_stamp: u64,
    /// The first slow frames (up to [`SLOW_LOG`]) as
    /// "index:latency µs:µs before the commit stamp:wait outcome", the
    /// outcome being the cadence wait's for that frame: `h` caught in its
    /// window, `m` its window missed it, `e` it came before the window, `-`
    /// none counted. With the frames' indices, a report can tell a frame
    /// slow for every reader of its camera (the publish or the GPU) from one
    /// slow for one reader (its wake or copy), and slow frames that bunch
    /// in time across cameras (the machine) from ones that do not.
    slow_at: Vec<String>,
    /// The default wait's cadence counters at the end (see
    /// `vramring::ring::cadence::CadenceState`): frames caught in their
    /// spin window, windows that ended without their frame (it was then
    /// woken through the doorbell), frames that came before the window.
    cadence_hits: u64,
    cadence_misses: u64,
    cadence_early: u64,
    /// The cadence wait's window at the end, µs:
    /// "margin/tolerance/timer overshoot/early commits/late commits".
    cadence_window_us: String,
    /// Which frames of the window never arrived (their indices, the first
    /// few), and the seq of the last frame delivered: where a loss was.
    missing_at: Vec<u64>,
    last_seq: u64,
    /// The subscriber's own count of frames it skipped (its stats), over
    /// the whole run.
    dropped: u64,
    error: Option<String>,
}

/// A frame slower than this counts as slow (the goal's p99 bound).
const SLOW_NS: u64 = 100_000;
/// A publish call this long is logged by index (`slow_publish_at`).
const SLOW_PUBLISH_NS: u64 = 40_000;
/// How many slow frames or slow publish calls a reader or ring logs.
const SLOW_LOG: usize = 48;

/// `items` joined with `+`, or `-` when there are none.
fn joined<T: ToString>(items: &[T]) -> String {
    if items.is_empty() {
        return "-".to_string();
    }
    items.iter().map(|i| i.to_string()).collect::<Vec<_>>().join("+")
}

/// Readers slow at the same frame index at once, from this many up, make a
/// burst: the cameras' phases lie within one frame period, so one index is
/// one 40 ms stretch of wall time, and several readers slow in it point at
/// the machine (a stolen vCPU, a GPU stall) rather than at one reader.
const BURST_READERS: usize = 4;

/// One sentence on the logged slow frames of every reader (`slow_at`
/// fields, "index:µs:µs before the stamp:outcome" joined by `+`): how many
/// fell in bursts, and how each reader's wait had fared on them.
fn slow_frames_sentence<'a>(slow_at: impl Iterator<Item = &'a str>) -> String {
    let mut at: HashMap<u64, usize> = HashMap::new();
    let mut outcomes = [0usize; 4]; // h, e, m, -
    let mut logged = 0usize;
    for field in slow_at.filter(|f| *f != "-") {
        for entry in field.split('+') {
            let parts: Vec<&str> = entry.split(':').collect();
            let Some(index) = parts.first().and_then(|i| i.parse::<u64>().ok()) else {
                continue;
            };
            logged += 1;
            *at.entry(index).or_default() += 1;
            let k = match parts.get(3).copied() {
                Some("h") => 0,
                Some("e") => 1,
                Some("m") => 2,
                _ => 3,
            };
            outcomes[k] += 1;
        }
    }
    if logged == 0 {
        return "\nSlow frames logged (over 100 µs, the first 48 per reader): none.\n".into();
    }
    let in_bursts: usize = at.values().filter(|&&n| n >= BURST_READERS).sum();
    let bursts = at.values().filter(|&&n| n >= BURST_READERS).count();
    format!(
        "\nSlow frames logged (over 100 µs, the first {SLOW_LOG} per reader): {logged} at {} frame indices; {in_bursts} ({:.0} %) in {bursts} bursts of {BURST_READERS} or more readers slow at the same index (the machine); each reader's wait on them: {} caught in its spin window, {} before it (a doorbell wake), {} after it, {} not counted.\n",
        at.len(),
        100.0 * in_bursts as f64 / logged as f64,
        outcomes[0],
        outcomes[1],
        outcomes[2],
        outcomes[3]
    )
}

/// The GPU pattern checker of this process, made by the first thread that
/// needs it and shared (its result buffer is one, so checks take turns).
static VERIFIER: OnceLock<Result<Mutex<GpuTestPattern>, String>> = OnceLock::new();

fn verify_frame(frame: &vramring::Frame<'_>) -> R<bool> {
    if let Some(bytes) = frame.host_bytes() {
        return Ok(vramring_testkit::pattern::verify(bytes, frame.seq()).is_ok());
    }
    let uuid = frame.info().device_uuid();
    let v = VERIFIER.get_or_init(|| {
        GpuTestPattern::for_uuid(uuid)
            .map(Mutex::new)
            .map_err(|e| e.to_string())
    });
    let g = v.as_ref().map_err(|e| format!("pattern kernels: {e}"))?;
    let g = g.lock().map_err(|_| "pattern checker poisoned")?;
    let view = frame.device().ok_or("a host frame has no device memory to check")?;
    let c = g.verify(&view)?;
    Ok(c.is_intact(frame.seq()))
}

fn sub_loop(
    p: &Params,
    dir: &Path,
    index: usize,
    camera: usize,
    connected: &AtomicUsize,
    end_ns: &AtomicU64,
    st: &mut SubStats,
) -> R<()> {
    let mode = p.mode_of(index);
    let mut opts = SubscriberOptions::default().name(format!("scale-{}-{index}-cam{camera}", mode.name()));
    opts = match mode {
        SubMode::Push => opts.delivery(Delivery::Push),
        SubMode::Pull => opts.mode(Mode::Latest).delivery(Delivery::Pull),
        SubMode::Sequential => opts.mode(Mode::Sequential).delivery(Delivery::Pull),
        SubMode::SequentialPush => opts.mode(Mode::Sequential).delivery(Delivery::Push),
    };
    if let Some(us) = p.spin_us {
        opts = opts.spin(Duration::from_micros(us));
    }
    let path = Params::sock(dir, camera);
    let deadline = Instant::now() + STARTUP;
    let mut sub = loop {
        match Subscriber::connect(&path, opts.clone()) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => return Err(format!("camera {camera}: connect: {e}").into()),
            // The producer may not be up yet.
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    // SYNC: connected — counts connected subscribers; the main thread reads
    // it with Acquire before it reports the process ready.
    connected.fetch_add(1, Ordering::AcqRel);
    let (warm, measured) = (p.warmup_frames(), p.measured_frames());
    st.latency.reserve(measured as usize);
    let mut seen = vec![false; measured as usize];
    loop {
        let before = sub.cadence();
        let mut slow_entry = None;
        let frame = match sub.next(Duration::from_millis(500)) {
            Ok(f) => f,
            Err(RingError::ProducerGone { .. }) => break,
            Err(RingError::Timeout(..)) => {
                // SYNC: end — Acquire, pairs with the main thread's Release
                // store of the end time (0 until the start time is known).
                let end = end_ns.load(Ordering::Acquire);
                if end != 0 && now_ns() > end {
                    return Err(format!("camera {camera}: no frame for 500 ms after the end of the run").into());
                }
                continue;
            }
            Err(e) => return Err(format!("camera {camera}: next: {e}").into()),
        };
        let t1 = now_ns();
        let user = frame.user();
        if user.len() < 24 {
            st.bad_meta += 1;
            continue;
        }
        let word = |k: usize| u64::from_le_bytes(user[8 * k..8 * k + 8].try_into().unwrap_or([0; 8]));
        let (t0, i, cam) = (word(0), word(1), word(2));
        if cam != camera as u64 || frame.pts() != i as i64 {
            st.bad_meta += 1;
        }
        if (warm..warm + measured).contains(&i) {
            st.latency.push(t1.saturating_sub(t0));
            st.received += 1;
            seen[(i - warm) as usize] = true;
            if t1.saturating_sub(t0) > SLOW_NS {
                st.slow += 1;
                let stamp = frame.commit_ns();
                let before_stamp = stamp.saturating_sub(t0);
                if before_stamp > t1.saturating_sub(stamp) {
                    st.slow_before_stamp += 1;
                }
                if st.slow_at.len() < SLOW_LOG {
                    slow_entry = Some(format!("{i}:{}:{}", t1.saturating_sub(t0) / 1000, before_stamp / 1000));
                }
            }
            // Frames skipped before the window's first frame are not the window's.
            if i > warm {
                st.skipped += frame.skipped().min(i - warm);
            }
            if frame.pushed() {
                st.pushed += 1;
            }
        }
        if p.verifies(camera, i) {
            st.verified += 1;
            if !verify_frame(&frame)? {
                st.torn += 1;
                eprintln!("camera {camera} subscriber {index}: TORN frame seq {}", frame.seq());
            }
        }
        if let Some(entry) = slow_entry {
            // The wait's outcome for this frame, from its counters' change.
            let after = sub.cadence();
            let outcome = if after.hits > before.hits {
                'h'
            } else if after.misses > before.misses {
                'm'
            } else if after.early > before.early {
                'e'
            } else {
                '-'
            };
            st.slow_at.push(format!("{entry}:{outcome}"));
        }
    }
    st.missing_at = seen
        .iter()
        .enumerate()
        .filter(|(_, &s)| !s)
        .map(|(k, _)| warm + k as u64)
        .take(4)
        .collect();
    let stats = sub.stats();
    st.last_seq = stats.last_seq;
    st.dropped = stats.dropped;
    st.overruns = stats.overruns;
    st.queued = stats.queued;
    st.queued_at_loan = stats.queued_at_loan;
    let cad = sub.cadence();
    st.cadence_window_us = format!(
        "{}/{}/{}/{}/{}",
        cad.margin_ns / 1000,
        cad.tolerance_ns / 1000,
        cad.overshoot_ns / 1000,
        cad.early_ns / 1000,
        cad.late_ns / 1000
    );
    st.cadence_hits = cad.hits;
    st.cadence_misses = cad.misses;
    st.cadence_early = cad.early;
    sub.close()?;
    Ok(())
}

fn subscriber_main(p: &Params, dir: &Path, index: usize) -> R<()> {
    let connected = Arc::new(AtomicUsize::new(0));
    let end_ns = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for camera in 0..p.cameras {
        let (p, dir, connected, end_ns) = (
            p.clone(),
            dir.to_path_buf(),
            Arc::clone(&connected),
            Arc::clone(&end_ns),
        );
        let h = std::thread::Builder::new()
            .name(format!("sub{index}-cam{camera}"))
            .stack_size(THREAD_STACK)
            .spawn(move || {
                let mut st = SubStats {
                    camera,
                    ..Default::default()
                };
                if let Err(e) = sub_loop(&p, &dir, index, camera, &connected, &end_ns, &mut st) {
                    st.error = Some(e.to_string());
                }
                st
            })?;
        handles.push(h);
    }
    let tag = format!("sub-{index}");
    let deadline = Instant::now() + STARTUP;
    // SYNC: connected — Acquire, pairs with the threads' increments.
    while connected.load(Ordering::Acquire) < p.cameras {
        if handles.iter().any(|h| h.is_finished()) || Instant::now() > deadline {
            // A thread ended before the start: it failed to connect.
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let all = connected.load(Ordering::Acquire) == p.cameras;
    if !all {
        // End the connected threads' waits now (their next timeout), so this
        // process reports and exits instead of waiting to be killed.
        // SYNC: end — Release: an end time in the past.
        end_ns.store(1, Ordering::Release);
    }
    let window = if all {
        write_atomic(&dir.join(format!("ready-{tag}")), "ready")?;
        let go_ns = wait_go(dir, STARTUP)?;
        let end = go_ns + ((p.warmup_seconds + p.seconds) * 1e9) as u64 + 5_000_000_000;
        // SYNC: end — Release: read by the subscriber threads with Acquire.
        end_ns.store(end, Ordering::Release);
        cpu_window(p, go_ns)
    } else {
        0
    };
    let mode = p.mode_of(index);
    let mut out = String::new();
    let mut received = 0;
    let mut errors = Vec::new();
    let mut lines = Vec::new();
    for h in handles {
        let mut st = match h.join() {
            Ok(st) => st,
            Err(_) => {
                errors.push("a subscriber thread panicked".to_string());
                continue;
            }
        };
        st.latency.sort_unstable();
        received += st.received;
        if let Some(e) = &st.error {
            errors.push(e.clone());
        }
        let expected = p.measured_frames();
        lines.push(
            Rec::kind("sub")
                .set("index", index)
                .set("mode", mode.name())
                .set("camera", st.camera)
                .set("expected", expected)
                .set("received", st.received)
                .set("missing", expected.saturating_sub(st.received))
                .set("skipped", st.skipped)
                .pcts("", &st.latency)
                .set("verified", st.verified)
                .set("torn", st.torn)
                .set("bad_meta", st.bad_meta)
                .set("pushed", st.pushed)
                .set("overruns", st.overruns)
                .set("queued", st.queued)
                .set("queued_at_loan", st.queued_at_loan)
                .set("slow", st.slow)
                .set("slow_before_stamp", st.slow_before_stamp)
                .set("cadence_hits", st.cadence_hits)
                .set("cadence_misses", st.cadence_misses)
                .set("cadence_early", st.cadence_early)
                .set("cadence_window_us", &st.cadence_window_us)
                .set("dropped", st.dropped)
                .set("last_seq", st.last_seq)
                .set("missing_at", joined(&st.missing_at))
                .set("slow_at", joined(&st.slow_at))
                .set("error", st.error.as_deref().unwrap_or("-"))
                .line(),
        );
    }
    out.push_str(
        &Rec::kind("subproc")
            .set("index", index)
            .set("mode", mode.name())
            .set("cpu_ns", window)
            .set("frames", received)
            .set("errors", errors.len())
            .line(),
    );
    out.push('\n');
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
    write_atomic(&dir.join(format!("result-{tag}")), &out)?;
    if !all {
        return Err(format!("{tag}: not every ring connected: {}", errors.join("; ")).into());
    }
    Ok(())
}

// ------------------------------------------------------------ orchestrator

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    OneProcess,
    PerCamera,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::OneProcess => "one-process",
            Shape::PerCamera => "per-camera",
        }
    }
}

/// Runs one shape (with or without MPS) and returns its report section and
/// JSON lines.
fn run_shape(p: &Params, shape: Shape, mps: Option<&MpsDaemon>, root: &Path, deadline: Instant) -> (String, String) {
    let tag = if mps.is_some() { "on" } else { "off" };
    let dir = root.join(format!("mps-{tag}-{}", shape.name()));
    let title = format!(
        "\n### {} × {} subscribers ({}), shape {}, MPS {tag}\n\n",
        p.cameras,
        p.subs_per_ring,
        p.mix.iter().map(|m| m.name()).collect::<Vec<_>>().join(","),
        shape.name()
    );
    match run_shape_inner(p, shape, mps, &dir, deadline) {
        Ok(()) => {}
        Err(e) => {
            eprintln!("scale {} MPS {tag}: {e}", shape.name());
            let (mut md, js) = summarize(p, shape, tag, &dir);
            md = format!("{title}**run failed: {e}** (what came back is below)\n\n{md}");
            let _ = std::fs::remove_dir_all(&dir);
            return (md, js);
        }
    }
    let (md, js) = summarize(p, shape, tag, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    (format!("{title}{md}"), js)
}

fn run_shape_inner(p: &Params, shape: Shape, mps: Option<&MpsDaemon>, dir: &Path, deadline: Instant) -> R<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let mut children = Children::default();
    let base = |role: &str| -> R<std::process::Command> {
        let mut cmd = procs::self_command([format!("--role={role}"), format!("--run-dir={}", dir.display())])?;
        cmd.args(p.args());
        procs::set_child_env(&mut cmd, mps);
        Ok(cmd)
    };
    let producers: Vec<(usize, usize)> = match shape {
        Shape::OneProcess => vec![(0, p.cameras)],
        Shape::PerCamera => (0..p.cameras).map(|k| (k, 1)).collect(),
    };
    for &(first, count) in &producers {
        let mut cmd = base("producer")?;
        cmd.arg(format!("--first={first}")).arg(format!("--count={count}"));
        children.spawn(format!("producer-{first}"), &mut cmd)?;
    }
    for j in 0..p.subs_per_ring {
        let mut cmd = base("subscriber")?;
        cmd.arg(format!("--index={j}"));
        children.spawn(format!("sub-{j}"), &mut cmd)?;
    }
    // Every process up (publishers created, every subscriber connected)?
    let want = producers.len() + p.subs_per_ring;
    let startup_deadline = (Instant::now() + STARTUP).min(deadline);
    let t_start = Instant::now();
    let mut progress = (0, Instant::now());
    loop {
        let ready = std::fs::read_dir(dir)?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("ready-"))
            .count();
        if ready >= want {
            break;
        }
        if ready != progress.0 {
            progress = (ready, Instant::now());
        } else if progress.1.elapsed() > STALL {
            // E.g. clients past MPS's limit per GPU waiting for a place.
            children.kill_all();
            return Err(format!(
                "start-up stalled: {ready} of {want} processes ready, none more in {} s",
                STALL.as_secs()
            )
            .into());
        }
        let (_, failed) = children.poll()?;
        if !failed.is_empty() {
            // Give the others a moment to write what they saw, then stop.
            let _ = children.wait_all(Instant::now() + Duration::from_secs(3), Duration::ZERO);
            return Err(format!("a process failed while starting: {}", failed.join(", ")).into());
        }
        if procs::stop_requested() || Instant::now() > startup_deadline {
            children.kill_all();
            return Err(format!(
                "only {ready} of {want} processes ready after {:.0} s",
                t_start.elapsed().as_secs_f64()
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "scale {}: {want} processes ready in {:.1} s",
        shape.name(),
        t_start.elapsed().as_secs_f64()
    );
    if let Some(d) = mps {
        // Evidence that the clients run under MPS: its servers, now.
        match d.server_list() {
            Ok(pids) => eprintln!("scale {}: MPS servers running: {pids:?}", shape.name()),
            Err(e) => eprintln!("scale {}: MPS get_server_list: {e}", shape.name()),
        }
    }
    let go_ns = now_ns() + 500_000_000;
    write_atomic(&dir.join("go"), &go_ns.to_string())?;
    // The machine over the measured window (busy, stolen, runnable), beside
    // the processes' own figures: a tail the host made is told apart from
    // one the ring made.
    let window_start = go_ns + (p.warmup_seconds * 1e9) as u64;
    let window_ns = (p.seconds * 1e9) as u64;
    let host_file = dir.join("result-host");
    let sampler = std::thread::spawn(move || {
        sleep_until_ns(window_start);
        let until = Instant::now() + Duration::from_nanos(window_ns);
        if let Some(w) = host::HostWindow::sample_until(until, Duration::from_millis(20)) {
            let _ = write_atomic(&host_file, &format!("kind=host {}\n", w.fields()));
        }
    });
    let run = Duration::from_secs_f64(p.warmup_seconds + p.seconds + 0.5);
    let end = (Instant::now() + run + Duration::from_secs(60)).min(deadline);
    children.wait_all(end, Duration::from_secs(10))?;
    // Only a run that went to its end waits for the window's figures.
    let _ = sampler.join();
    Ok(())
}

/// Reads every result file of a shape's run and writes its summary.
fn summarize(p: &Params, shape: Shape, tag: &str, dir: &Path) -> (String, String) {
    let mut recs = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with("result-") {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                recs.extend(text.lines().map(Rec::parse));
            }
        }
    }
    let of = |k: &'static str| recs.iter().filter(move |r| r.get("kind") == Some(k));
    let extra = [("shape", shape.name()), ("mps", tag)];
    let mut js = String::new();
    for r in &recs {
        js.push_str(&r.json(&extra));
        js.push('\n');
    }
    let subs: Vec<&Rec> = of("sub").collect();
    let us = |ns: u64| ns as f64 / 1e3;
    // Per mode and overall: median p50, median p99, worst p99 (who), drops.
    let mut md = output::table_header("readers | subscribers | median p50 µs | median p99 µs | worst p99 µs (camera, index) | max µs | missing | skipped | torn / verified | pushed | queued (at the loan) | frames > 100 µs: all, mostly before the commit stamp (worst's) | cadence hits / misses / early (worst's) | subscriber CPU / frame µs");
    let mut modes: Vec<&str> = p.mix.iter().map(|m| m.name()).collect();
    modes.dedup();
    let mut uniq = Vec::new();
    for m in modes {
        if !uniq.contains(&m) {
            uniq.push(m);
        }
    }
    let mut summary = HashMap::new();
    for m in uniq.iter().copied().map(Some).chain([None]) {
        let sel: Vec<&&Rec> = subs
            .iter()
            .filter(|r| m.is_none_or(|m| r.get("mode") == Some(m)))
            .collect();
        let mut p50: Vec<f64> = sel.iter().map(|r| us(r.u("p50_ns"))).collect();
        let mut p99: Vec<f64> = sel.iter().map(|r| us(r.u("p99_ns"))).collect();
        let worst = sel.iter().max_by_key(|r| r.u("p99_ns"));
        let max = sel.iter().map(|r| r.u("max_ns")).max().unwrap_or(0);
        let sum = |k: &str| sel.iter().map(|r| r.u(k)).sum::<u64>();
        let procs_sel: Vec<&Rec> = of("subproc")
            .filter(|r| m.is_none_or(|m| r.get("mode") == Some(m)))
            .collect();
        let cpu: u64 = procs_sel.iter().map(|r| r.u("cpu_ns")).sum();
        let frames: u64 = procs_sel.iter().map(|r| r.u("frames")).sum();
        let cpu_per_frame = if frames > 0 {
            cpu as f64 / frames as f64 / 1e3
        } else {
            f64::NAN
        };
        let worst_p99 = worst.map_or(f64::NAN, |r| us(r.u("p99_ns")));
        let row = format!(
            "| {} | {} | {:.1} | {:.1} | {:.1} ({}, {}) | {:.1} | {} | {} | {} / {} | {} | {} ({}) | {}, {} ({}) | {} / {} / {} ({} / {} / {}) | {:.1} |\n",
            m.unwrap_or("**all**"),
            sel.len(),
            median(&mut p50),
            median(&mut p99),
            worst_p99,
            worst.and_then(|r| r.get("camera")).unwrap_or("-"),
            worst.and_then(|r| r.get("index")).unwrap_or("-"),
            us(max),
            sum("missing"),
            sum("skipped"),
            sum("torn") + sum("bad_meta"),
            sum("verified"),
            sum("pushed"),
            sum("queued"),
            sum("queued_at_loan"),
            sum("slow"),
            sum("slow_before_stamp"),
            worst.map_or(0, |r| r.u("slow")),
            sum("cadence_hits"),
            sum("cadence_misses"),
            sum("cadence_early"),
            worst.map_or(0, |r| r.u("cadence_hits")),
            worst.map_or(0, |r| r.u("cadence_misses")),
            worst.map_or(0, |r| r.u("cadence_early")),
            cpu_per_frame
        );
        md.push_str(&row);
        if m.is_none() {
            summary.insert("worst_p99_us", worst_p99);
            summary.insert("median_p99_us", median(&mut p99));
            summary.insert("missing", sum("missing") as f64);
            summary.insert("torn", (sum("torn") + sum("bad_meta")) as f64);
            summary.insert("verified", sum("verified") as f64);
            summary.insert("subscribers", sel.len() as f64);
            summary.insert("sub_cpu_per_frame_us", cpu_per_frame);
        }
    }
    // Producers.
    let rings: Vec<&Rec> = of("ring").collect();
    let prods: Vec<&Rec> = of("producer").collect();
    let cpu: u64 = prods.iter().map(|r| r.u("cpu_ns")).sum();
    let frames: u64 = prods.iter().map(|r| r.u("frames")).sum();
    let prod_cpu = if frames > 0 {
        cpu as f64 / frames as f64 / 1e3
    } else {
        f64::NAN
    };
    let mut pub50: Vec<f64> = rings.iter().map(|r| us(r.u("publish_p50_ns"))).collect();
    let pub99 = rings.iter().map(|r| r.u("publish_p99_ns")).max().unwrap_or(0);
    let mut fcpu: Vec<f64> = rings.iter().map(|r| us(r.u("frame_cpu_p50_ns"))).collect();
    let late: u64 = rings.iter().map(|r| r.u("late")).sum();
    let max_late = rings.iter().map(|r| r.u("max_late_ns")).max().unwrap_or(0);
    let published: u64 = rings.iter().map(|r| r.u("published")).sum();
    let short = rings
        .iter()
        .filter(|r| r.u("subscribers_at_end") < p.subs_per_ring as u64)
        .count();
    md.push_str(&format!(
        "\nProducers: {} process(es), {} rings, {published} frames published ({} measured); process CPU per frame **{prod_cpu:.1} µs**; publish call (`publish_cuda` / `publish`) p50 {:.1} µs (median over rings), worst ring p99 {:.1} µs; thread CPU per frame (loan + fill + publish) p50 {:.1} µs; frames started more than half a period late: {late} (max lateness {:.2} ms); rings with fewer than {} subscribers at the end: {short}.\n",
        prods.len(),
        rings.len(),
        frames,
        median(&mut pub50),
        us(pub99),
        median(&mut fcpu),
        max_late as f64 / 1e6,
        p.subs_per_ring
    ));
    md.push_str(&slow_frames_sentence(
        subs.iter().map(|r| r.get("slow_at").unwrap_or("-")),
    ));
    if let Some(h) = of("host").next() {
        let f = |k: &str| h.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
        let w = host::HostWindow {
            cpus: h.u("host_cpus") as usize,
            busy_pct: f("host_busy_pct"),
            steal_pct: f("host_steal_pct"),
            running_mean: f("host_running_mean"),
            running_max: h.u("host_running_max"),
            samples: h.u("host_samples") as usize,
        };
        md.push_str(&format!("\n{}\n", w.sentence()));
    }
    let lost: Vec<String> = subs
        .iter()
        .filter(|r| r.u("missing") > 0)
        .map(|r| {
            format!(
                "camera {} reader {} ({}): frame index {} of {}..{}; its stats: {} dropped, last seq {}",
                r.get("camera").unwrap_or("?"),
                r.get("index").unwrap_or("?"),
                r.get("mode").unwrap_or("?"),
                r.get("missing_at").unwrap_or("?"),
                p.warmup_frames(),
                p.warmup_frames() + p.measured_frames(),
                r.u("dropped"),
                r.u("last_seq")
            )
        })
        .collect();
    if !lost.is_empty() {
        md.push_str(&format!(
            "\nWhere frames went missing ({} readers): {}\n",
            lost.len(),
            lost.iter().take(8).cloned().collect::<Vec<_>>().join("; ")
        ));
    }
    let errors: Vec<String> = subs
        .iter()
        .filter_map(|r| {
            r.get("error")
                .filter(|e| *e != "-")
                .map(|e| format!("cam {}: {e}", r.get("camera").unwrap_or("?")))
        })
        .chain(of("error").map(|r| r.get("what").unwrap_or("?").to_string()))
        .collect();
    if !errors.is_empty() {
        md.push_str(&format!(
            "\nErrors ({}): {}\n",
            errors.len(),
            errors.iter().take(8).cloned().collect::<Vec<_>>().join("; ")
        ));
    }
    let expected_subs = (p.cameras * p.subs_per_ring) as f64;
    let worst = summary.get("worst_p99_us").copied().unwrap_or(f64::NAN);
    let complete = summary.get("subscribers").copied() == Some(expected_subs) && errors.is_empty();
    // "0 torn" says nothing when no frame was checked.
    let checked = summary.get("verified").is_some_and(|&v| v > 0.0);
    let goal = complete
        && checked
        && summary.get("missing") == Some(&0.0)
        && summary.get("torn") == Some(&0.0)
        && worst <= 100.0;
    md.push_str(&format!(
        "\nGoal (0 drops, 0 torn of the frames checked, worst-subscriber p99 ≤ 100 µs, every subscriber reporting): **{}**{}\n",
        if goal { "met" } else { "not met" },
        if checked { "" } else { " (no frame was checked for tearing)" }
    ));
    let mut s = Rec::kind("summary")
        .set("cameras", p.cameras)
        .set("subs_per_ring", p.subs_per_ring)
        .set("seconds", p.seconds)
        .set("fps", p.fps)
        .set("producer_cpu_per_frame_us", format!("{prod_cpu:.2}"))
        .set("published", published)
        .set("late", late)
        .set("goal_met", goal);
    for (k, v) in &summary {
        s = s.set(k, format!("{v:.2}"));
    }
    js.push_str(&s.json(&extra));
    js.push('\n');
    (md, js)
}

fn main() -> std::process::ExitCode {
    output::exit(real_main(), "scale: ", 1)
}

fn real_main() -> R<()> {
    let args: Vec<String> = std::env::args().filter(|a| a != "--bench").collect();
    let cli = Cli::parse_from(args);
    let p = Params::from_cli(&cli)?;
    if let Some(role) = cli.role {
        procs::child_init();
        let dir = cli.run_dir.as_deref().ok_or("--run-dir")?;
        return match role {
            Role::Producer => producer_main(&p, dir, cli.first, cli.count),
            Role::Subscriber => subscriber_main(&p, dir, cli.index),
        };
    }
    if p.backend == BackendArg::Cuda && !vramring::cuda::cuda_usable() {
        eprintln!("scale bench: no usable CUDA GPU here; nothing measured (--backend host runs on the CPU)");
        return Ok(());
    }
    procs::install_stop_handler();
    let deadline = Instant::now() + Duration::from_secs(cli.timeout_s);
    let shapes: &[Shape] = match cli.shape.unwrap_or(ShapeArg::Both) {
        ShapeArg::OneProcess => &[Shape::OneProcess],
        ShapeArg::PerCamera => &[Shape::PerCamera],
        ShapeArg::Both => &[Shape::OneProcess, Shape::PerCamera],
    };
    let mps = cli.mps;
    let root = std::env::temp_dir().join(format!("vramring-scale-{}", std::process::id()));
    std::fs::create_dir_all(&root)?;
    let mut md = format!(
        "## Scale: {} cameras × {} subscribers ({}), {}×{} NV12 at {} fps, {} slots, {} s measured after {} s warm-up, backend {:?}, {}; wait: {}\n",
        p.cameras,
        p.subs_per_ring,
        p.mix.iter().map(|m| m.name()).collect::<Vec<_>>().join(","),
        p.width,
        p.height,
        p.fps,
        p.slots,
        p.seconds,
        p.warmup_seconds,
        p.backend,
        p.verify_words(),
        p.spin_us.map_or("library default".to_string(), |s| format!("spin {s} µs"))
    );
    md.push_str(
        "\nLatency: producer's CLOCK_MONOTONIC just before the publish call → subscriber's `next()` returned. missing: frames of the measured window a subscriber never received (every reader here keeps up: none is slowed). torn: a sampled frame whose pixels are not the pattern of its seq, or whose meta names another camera or frame. CPU per frame: process CPU time over the window ÷ frames published (producers) or received (subscribers).\n",
    );
    let mut js = String::new();
    let mut failures = 0;
    let not_started = mps.run_passes(&mut md, |daemon, md| {
        for &shape in shapes {
            if procs::stop_requested() || Instant::now() > deadline {
                md.push_str(&format!(
                    "\n### shape {}: skipped (out of time or stopped)\n",
                    shape.name()
                ));
                continue;
            }
            let (m, j) = run_shape(&p, shape, daemon, &root, deadline);
            if m.contains("**run failed") {
                failures += 1;
            }
            for line in j.lines().filter(|l| l.contains("\"kind\":\"summary\"")) {
                eprintln!("{line}");
            }
            md.push_str(&m);
            js.push_str(&j);
        }
    });
    failures += not_started;
    let _ = std::fs::remove_dir_all(&root);
    println!("{md}");
    if let Some(out) = &cli.out {
        output::write_report_in(out, "scale", &md, &js)?;
    }
    if procs::stop_requested() {
        return Err("stopped by a signal".into());
    }
    if failures > 0 {
        return Err(format!("{failures} part(s) of the run failed (see the report)").into());
    }
    Ok(())
}
