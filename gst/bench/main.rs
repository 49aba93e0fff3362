//! Inter-process delivery of 1080p NV12 in CUDA memory between GStreamer
//! pipelines: `cudaipcsink ipc-mode=mmap` → `cudaipcsrc` (its default
//! `io-mode=copy`, and `io-mode=import`), `cudaipcsink ipc-mode=legacy` →
//! `cudaipcsrc` and `vramringsink` → `vramringsrc` (zero-copy, its default,
//! and `zero-copy=false`), and the library's own Rust subscriber, with 1,
//! 4 and 8 subscriber processes, a frame every 2 ms and at 25 fps,
//! optionally under MPS. Writes a Markdown table (`--out DIR`, `$OUT` by
//! default). How to build, stage and run it on the GPU machine:
//! `gst/bench/README.md`.
//!
//! One process publishes: `appsrc ! cudaupload ! <sink>`, each buffer a
//! pooled system-memory frame whose first 8 luma bytes carry its index; a
//! pad probe on the sink's pad records when each buffer reaches the sink
//! (`CLOCK_MONOTONIC`). Each subscriber process runs `<src> ! appsink`,
//! records the arrival instant in appsink's `new-sample` callback, then learns the frame's index from its
//! metadata, with no GPU work in its process: a custom meta that
//! `cudaipcsink` serialises, the published pts for `vramringsrc
//! timestamp-mode=pts` and the Rust subscriber (without MPS, a subscriber's
//! own GPU call is a context switch that the publisher's next frame pays
//! for, about 137 µs: PERF.md). The pixels of the last frame, where it
//! arrives, are read to check that the index is the frame's; `--readback` reads every frame's
//! index from its pixels instead. Two
//! tables (`--memory cuda,system`): with `cuda`, every source hands the
//! appsink CUDA memory (`... ! video/x-raw(memory:CUDAMemory)`), no
//! download; with
//! `system`, system memory (`cudaipcsrc ! cudadownload`, `vramringsrc !
//! video/x-raw`, its own copy from the ring to the host). Latency is
//! arrival minus sink entry, same host, same clock; the first `WARMUP`
//! frames are left out of every figure. The producer's CPU per frame is its
//! process's user + system time over the paced pushes (the upload's share
//! is the same for every pair).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gst::prelude::*;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const WIDTH: u32 = 1920;
const HEIGHT: u32 = 1080;
/// Frames at the start of each run left out of every figure (first
/// imports, lazy CUDA set-up).
const WARMUP: u64 = 30;
/// `cudaipc-*` are `cudaipcsrc` as it comes (`io-mode=copy`);
/// `cudaipc-import` is its zero-copy mode (`ipc-mode=mmap`,
/// `io-mode=import`). `vramring` is `vramringsrc` as it comes (zero-copy:
/// the subscriber's push buffer, ADR 0028); `vramring-copy` is
/// `zero-copy=false` (delivery=auto: pull for the publisher's own uid,
/// each frame copied into a pool buffer); `vramring-rust` is no GStreamer
/// on the subscriber side: the library's own `Subscriber` (push), the
/// frame in hand when `next` returns. `vramring-push` (push, then copied:
/// `delivery=push zero-copy=false`) runs when named, as do
/// `vramring-rust-queue` (the Rust subscriber reading as `vramringsrc`
/// does: a push queue in order, reconnecting) and the [`host_pair`]s
/// `vramring-host`, `vramring-rust-host` and `vramring-rust-queue-host`.
const PAIRS: [&str; 6] = [
    "cudaipc-mmap",
    "cudaipc-legacy",
    "cudaipc-import",
    "vramring",
    "vramring-copy",
    "vramring-rust",
];
/// What the subscribers' appsinks get: `cuda` (GStreamer CUDA memory, no
/// download) and `system` (system memory).
const MEMORIES: [&str; 2] = ["cuda", "system"];
/// The custom meta that carries a frame's index through `cudaipcsink`
/// (it serialises custom metas) and `cudaupload` (it copies metas with no
/// tags).
const INDEX_META: &str = "GstVramringBenchIndex";
/// `GST_MAP_CUDA` (`gstcudamemory.h`): map a `GstCudaMemory` for its
/// device address.
const GST_MAP_CUDA: gst::ffi::GstMapFlags = gst::ffi::GST_MAP_FLAG_LAST << 1;

/// Calls `seen(offset, now_ns())` for every buffer on the pad `pad` of the
/// element named `element` in `p`, on the streaming thread.
fn on_buffer(p: &gst::Pipeline, element: &str, pad: &str, seen: impl Fn(u64, u64) + Send + Sync + 'static) -> Res<()> {
    let pad = p
        .by_name(element)
        .and_then(|e| e.static_pad(pad))
        .ok_or_else(|| format!("no pad {pad} on an element named {element}"))?;
    pad.add_probe(gst::PadProbeType::BUFFER, move |_, info| {
        if let Some(b) = info.buffer() {
            seen(b.offset(), now_ns());
        }
        gst::PadProbeReturn::Ok
    });
    Ok(())
}

/// `CLOCK_MONOTONIC` now, ns.
fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// User + system CPU time of this process, ns.
fn cpu_ns() -> u64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is a writable rusage.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let t = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000_000 + tv.tv_usec as u64 * 1000;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn init() -> Res<()> {
    gst::init()?;
    gst::meta::CustomMeta::register(INDEX_META, &[]);
    if gst::ElementFactory::find("vramringsink").is_none() {
        // No libgstvramring.so on GST_PLUGIN_PATH: this binary's own copy.
        gstvramring::plugin_register_static()?;
    }
    Ok(())
}

fn sink_desc(pair: &str, addr: &str, subs: u32) -> String {
    match pair {
        "cudaipc-mmap" | "cudaipc-import" => format!("cudaipcsink name=sink address={addr} ipc-mode=mmap sync=false"),
        "cudaipc-legacy" => format!("cudaipcsink name=sink address={addr} ipc-mode=legacy sync=false"),
        _ if host_pair(pair) => {
            format!("vramringsink name=sink socket-path={addr} wait-subscribers={subs} sync=false backend=host")
        }
        _ => format!("vramringsink name=sink socket-path={addr} wait-subscribers={subs} sync=false"),
    }
}

/// The pairs on a host ring (system memory, no CUDA element): a check of
/// this harness, and of what `vramringsrc` adds over the Rust subscriber on
/// the CPU, on a machine without a GPU; not part of the tables.
fn host_pair(pair: &str) -> bool {
    pair.ends_with("-host")
}

/// What puts the frames in CUDA memory: nothing for a [`host_pair`].
fn upload(pair: &str) -> &'static str {
    if host_pair(pair) {
        ""
    } else {
        // The caps filter: without it cudaupload passes system memory
        // through to a sink that takes both (seen on the H200, 2026-12-05).
        "cudaupload ! video/x-raw(memory:CUDAMemory) ! "
    }
}

fn src_desc(pair: &str, addr: &str, memory: &str) -> String {
    match (pair, memory) {
        ("vramring", "cuda") => {
            format!("vramringsrc name=src socket-path={addr} timeout=10000 timestamp-mode=pts ! video/x-raw(memory:CUDAMemory)")
        }
        // Push, as the Rust subscriber: the host push buffer handed out
        // (zero-copy).
        ("vramring-host", _) => {
            format!(
                "vramringsrc name=src socket-path={addr} timeout=10000 timestamp-mode=pts delivery=push ! video/x-raw"
            )
        }
        ("vramring", _) => {
            format!("vramringsrc name=src socket-path={addr} timeout=10000 timestamp-mode=pts ! video/x-raw")
        }
        ("vramring-copy" | "vramring-push", _) => {
            let delivery = if pair == "vramring-push" { "push" } else { "auto" };
            let caps = if memory == "cuda" {
                "video/x-raw(memory:CUDAMemory)"
            } else {
                "video/x-raw"
            };
            format!("vramringsrc name=src socket-path={addr} timeout=10000 timestamp-mode=pts zero-copy=false delivery={delivery} ! {caps}")
        }
        ("cudaipc-import", "cuda") => {
            format!("cudaipcsrc address={addr} io-mode=import ! video/x-raw(memory:CUDAMemory)")
        }
        ("cudaipc-import", _) => format!("cudaipcsrc address={addr} io-mode=import ! cudadownload"),
        (_, "cuda") => format!("cudaipcsrc address={addr} ! video/x-raw(memory:CUDAMemory)"),
        _ => format!("cudaipcsrc address={addr} ! cudadownload"),
    }
}

/// Makes device 0's primary context current on this thread, for
/// [`cuda_index`]'s read-back.
fn cuda_thread() -> Res<()> {
    use cudarc::driver::sys as cu;
    let ok = |call: &str, r: cu::CUresult| -> Res<()> {
        if r == cu::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(format!("{call}: {r:?}").into())
        }
    };
    let mut dev: cu::CUdevice = 0;
    let mut ctx: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: out-parameters are valid locals; the context is retained for
    // the life of the process (never released).
    unsafe {
        ok("cuInit", cu::cuInit(0))?;
        ok("cuDeviceGet", cu::cuDeviceGet(&mut dev, 0))?;
        ok("cuDevicePrimaryCtxRetain", cu::cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
        ok("cuCtxSetCurrent", cu::cuCtxSetCurrent(ctx))?;
    }
    Ok(())
}

/// The frame index in the first 8 luma bytes of a buffer of CUDA memory:
/// its memory mapped for the device (`GST_MAP_CUDA`, no download) and 8
/// bytes copied back (unified addressing: the copy finds the memory's
/// context from the address).
fn cuda_index(b: &gst::BufferRef) -> Res<u64> {
    use cudarc::driver::sys as cu;
    let mem = b.peek_memory(0);
    let mut info = std::mem::MaybeUninit::<gst::ffi::GstMapInfo>::zeroed();
    let mem_ptr = mem.as_ptr() as *mut gst::ffi::GstMemory;
    // SAFETY: a live memory of `b`; `info` is writable.
    let mapped = unsafe { gst::ffi::gst_memory_map(mem_ptr, info.as_mut_ptr(), gst::ffi::GST_MAP_READ | GST_MAP_CUDA) };
    if mapped == gst::glib::ffi::GFALSE {
        return Err("cannot map the CUDA memory for the device".into());
    }
    // SAFETY: mapped successfully above.
    let mut info = unsafe { info.assume_init() };
    let mut idx = [0u8; 8];
    // SAFETY: `info.data` is the memory's device address (a frame: more
    // than 8 bytes); `idx` holds 8 bytes; a context is current
    // (`cuda_thread`).
    let r = unsafe { cu::cuMemcpyDtoH_v2(idx.as_mut_ptr().cast(), info.data as cu::CUdeviceptr, 8) };
    // SAFETY: mapped above, unmapped once.
    unsafe { gst::ffi::gst_memory_unmap(mem_ptr, &mut info) };
    if r != cu::CUresult::CUDA_SUCCESS {
        return Err(format!("cuMemcpyDtoH: {r:?}").into());
    }
    Ok(u64::from_le_bytes(idx))
}

fn launch(line: &str) -> Res<gst::Pipeline> {
    Ok(gst::parse::launch(line)?
        .downcast::<gst::Pipeline>()
        .map_err(|_| "not a pipeline")?)
}

/// Fails with the first error on the bus, if any.
fn bus_error(p: &gst::Pipeline) -> Res<()> {
    let bus = p.bus().ok_or("no bus")?;
    while let Some(msg) = bus.pop_filtered(&[gst::MessageType::Error]) {
        if let gst::MessageView::Error(e) = msg.view() {
            return Err(format!("{}: {:?}", e.error(), e.debug()).into());
        }
    }
    Ok(())
}

/// `publish PAIR ADDR INTERVAL_US FRAMES SUBS OUT_FILE`: waits for a line
/// on stdin, then pushes; writes `index sink_ns` lines and a last
/// `cpu_ns_per_frame N` line.
fn publish(args: &[String]) -> Res<()> {
    let [pair, addr, interval_us, frames, subs, out] = args else {
        return Err("publish PAIR ADDR INTERVAL_US FRAMES SUBS OUT".into());
    };
    let (interval, frames, subs) = (
        Duration::from_micros(interval_us.parse()?),
        frames.parse::<u64>()?,
        subs.parse::<u32>()?,
    );
    init()?;
    let marks = std::env::var_os("GST_IPC_BENCH_STAGES").is_some().then(stages::install);
    // A host pair's frames are 2048 wide: the ring's 512-byte pitch is then
    // GStreamer's default stride, so `vramringsrc` hands the appsink (which
    // reads no video meta) the push buffer itself, as the Rust subscriber
    // gets it, and the pairs differ only by GStreamer's own path.
    let width = if host_pair(pair) { 2048 } else { WIDTH };
    let caps = format!("video/x-raw,format=NV12,width={width},height={HEIGHT},framerate=0/1");
    let p = launch(&format!(
        "appsrc name=src is-live=true format=time caps={caps} max-buffers=4 block=true ! {}{}",
        upload(pair),
        sink_desc(pair, addr, subs)
    ))?;
    let src = p
        .by_name("src")
        .ok_or("no appsrc")?
        .downcast::<gst_app::AppSrc>()
        .map_err(|_| "not an appsrc")?;
    let stamps = Arc::new(Mutex::new(Vec::<(u64, u64)>::with_capacity(frames as usize)));
    {
        let stamps = stamps.clone();
        on_buffer(&p, "sink", "sink", move |offset, t| {
            stamps.lock().unwrap_or_else(|e| e.into_inner()).push((offset, t));
        })?;
    }
    let info = gst_video::VideoInfo::builder(gst_video::VideoFormat::Nv12, width, HEIGHT).build()?;
    let pool = gst_video::VideoBufferPool::new();
    let mut config = pool.config();
    config.set_params(Some(&info.to_caps()?), info.size() as u32, 8, 0);
    pool.set_config(config)?;
    pool.set_active(true)?;
    p.set_state(gst::State::Playing)?;
    println!("ready");
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let cpu0 = cpu_ns();
    let start = Instant::now();
    for i in 0..frames {
        let next = start + interval * i as u32;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let mut buffer = pool.acquire_buffer(None)?;
        {
            let b = buffer.get_mut().ok_or("a pooled buffer is shared")?;
            b.set_pts(gst::ClockTime::from_nseconds(i * interval.as_nanos() as u64));
            b.set_offset(i);
            gst::meta::CustomMeta::add(b, INDEX_META)?
                .mut_structure()
                .set("index", i);
            let mut map = b.map_writable()?;
            map[..8].copy_from_slice(&i.to_le_bytes());
        }
        src.push_buffer(buffer)?;
    }
    let cpu = cpu_ns() - cpu0;
    src.end_of_stream()?;
    let bus = p.bus().ok_or("no bus")?;
    let _ = bus.timed_pop_filtered(
        gst::ClockTime::from_seconds(5),
        &[gst::MessageType::Eos, gst::MessageType::Error],
    );
    bus_error(&p)?;
    // Subscribers read what is in flight before the server goes away.
    std::thread::sleep(Duration::from_millis(500));
    p.set_state(gst::State::Null)?;
    let mut f = std::io::BufWriter::new(std::fs::File::create(out)?);
    for (i, t) in stamps.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        writeln!(f, "{i} {t}")?;
    }
    writeln!(f, "cpu_ns_per_frame {}", cpu / frames.max(1))?;
    if let Some(marks) = marks {
        let stamps = stamps.lock().unwrap_or_else(|e| e.into_inner());
        let summary = marks.summary(&stamps);
        eprintln!("stages {pair} every {interval:?} to {subs}: p50 / p99 µs after sink entry: {summary}");
        if pair.starts_with("vramring") && !summary.contains("sink:") {
            eprintln!(
                "stages: no mark of the sink came: the plugin was loaded from GST_PLUGIN_PATH, whose own copy of \
                 tracing this bench does not see; run without GST_PLUGIN_PATH (gst/bench/README.md)"
            );
        }
    }
    Ok(())
}

/// How a subscriber learns a frame's index: from its metadata (no GPU
/// work in the subscriber's process; the last frame's pixels checked) or,
/// with `--readback`, from every frame's pixels.
#[derive(Clone, Copy, PartialEq)]
enum Index {
    Meta,
    Pixels,
}

/// `subscribe PAIR ADDR MEMORY FRAMES DEADLINE_MS INTERVAL_US INDEX OUT_FILE`:
/// records `index arrival_ns` lines until the last frame, end of stream or
/// the deadline.
fn subscribe(args: &[String]) -> Res<()> {
    let [pair, addr, memory, frames, deadline_ms, interval_us, index, out] = args else {
        return Err("subscribe PAIR ADDR MEMORY FRAMES DEADLINE_MS INTERVAL_US INDEX OUT".into());
    };
    let frames: u64 = frames.parse()?;
    let interval_ns = interval_us.parse::<u64>()? * 1000;
    let index = if index == "pixels" { Index::Pixels } else { Index::Meta };
    let cuda = memory == "cuda";
    let run_for = Duration::from_millis(deadline_ms.parse()?);
    if cuda {
        cuda_thread()?;
    }
    let got = if pair.starts_with("vramring-rust") {
        subscribe_rust(addr, cuda, pair.contains("-queue"), frames, run_for, interval_ns, index)?
    } else {
        subscribe_gst(pair, addr, memory, frames, run_for, interval_ns, index)?
    };
    let mut f = std::io::BufWriter::new(std::fs::File::create(out)?);
    for (i, t, mark) in got {
        writeln!(f, "{i} {t} {mark}")?;
    }
    Ok(())
}

/// One arrival: the frame's index, the arrival instant and the split mark
/// (ns, `CLOCK_MONOTONIC`, 0 where none): the frame's commit for the Rust
/// subscriber, the buffer leaving `vramringsrc` for the element.
type Arrival = (u64, u64, u64);

/// A GStreamer subscriber: `<src> ! appsink`, the arrival instant taken in
/// appsink's `new-sample` callback, on the streaming thread that brought
/// the buffer (no hand-over to another thread in the figure).
fn subscribe_gst(
    pair: &str,
    addr: &str,
    memory: &str,
    frames: u64,
    run_for: Duration,
    interval_ns: u64,
    index: Index,
) -> Res<Vec<Arrival>> {
    /// What the callback has seen: arrivals, the last frame's sample, the end.
    #[derive(Default)]
    struct Seen {
        got: Vec<Arrival>,
        last: Option<(gst::Sample, u64)>,
        done: bool,
        error: Option<String>,
    }
    init()?;
    let p = launch(&format!(
        "{} ! appsink name=sink sync=false max-buffers=2 drop=false",
        src_desc(pair, addr, memory)
    ))?;
    let sink = p
        .by_name("sink")
        .ok_or("no appsink")?
        .downcast::<gst_app::AppSink>()
        .map_err(|_| "not an appsink")?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let cuda = memory == "cuda";
    // The split mark: when each buffer leaves `vramringsrc` (by offset,
    // the ring's sequence number; read by the appsink callback on the same
    // streaming thread).
    let left = Arc::new(Mutex::new(std::collections::VecDeque::<(u64, u64)>::new()));
    if pair.starts_with("vramring") {
        let left = left.clone();
        on_buffer(&p, "src", "src", move |offset, t| {
            let mut left = left.lock().unwrap_or_else(|e| e.into_inner());
            if left.len() >= 64 {
                left.pop_front();
            }
            left.push_back((offset, t));
        })?;
    }
    {
        let seen = seen.clone();
        let pair = pair.to_owned();
        sink.set_callbacks(
            gst_app::AppSinkCallbacks::builder()
                .new_sample(move |sink| {
                    let s = sink.pull_sample().map_err(|_| gst::FlowError::Eos)?;
                    let t = now_ns();
                    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                    if seen.done {
                        return Err(gst::FlowError::Eos);
                    }
                    let Some(b) = s.buffer() else {
                        return Ok(gst::FlowSuccess::Ok);
                    };
                    let mark = {
                        let left = left.lock().unwrap_or_else(|e| e.into_inner());
                        left.iter().rev().find(|(o, _)| *o == b.offset()).map_or(0, |(_, t)| *t)
                    };
                    let idx = match index {
                        Index::Meta => meta_index(&pair, b, interval_ns),
                        Index::Pixels => pixel_index_here(b, cuda),
                    };
                    match idx {
                        Ok(idx) => {
                            seen.got.push((idx, t, mark));
                            seen.done = idx + 1 >= frames;
                            if seen.done {
                                // Kept for the check; earlier samples are not
                                // (a kept buffer is one the source cannot reuse).
                                seen.last = Some((s, idx));
                            }
                            Ok(gst::FlowSuccess::Ok)
                        }
                        Err(e) => {
                            seen.error = Some(e.to_string());
                            seen.done = true;
                            Err(gst::FlowError::Error)
                        }
                    }
                })
                .build(),
        );
    }
    p.set_state(gst::State::Playing)?;
    println!("ready");
    std::io::stdout().flush()?;
    let deadline = Instant::now() + run_for;
    while Instant::now() < deadline && !sink.is_eos() {
        if seen.lock().unwrap_or_else(|e| e.into_inner()).done {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (got, last) = {
        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.done = true;
        if let Some(e) = seen.error.take() {
            return Err(e.into());
        }
        (std::mem::take(&mut seen.got), seen.last.take())
    };
    // The check, after the last arrival: the index is the frame's own.
    if let Some((s, idx)) = last {
        let b = s.buffer().ok_or("a sample without a buffer")?;
        let seen = pixel_index(b)?;
        if seen != idx {
            return Err(format!("frame {idx} by its metadata holds frame {seen} by its pixels").into());
        }
    }
    let _ = p.set_state(gst::State::Null);
    Ok(got)
}

/// [`pixel_index`] on a streaming thread: the primary context made
/// current on it first (once per thread) for CUDA memory.
fn pixel_index_here(b: &gst::BufferRef, cuda: bool) -> Res<u64> {
    thread_local!(static CURRENT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if cuda && !CURRENT.get() {
        cuda_thread()?;
        CURRENT.set(true);
    }
    pixel_index(b)
}

/// A frame's index from its metadata: the published pts for `vramringsrc
/// timestamp-mode=pts`, the custom meta for `cudaipcsrc`.
fn meta_index(pair: &str, b: &gst::BufferRef, interval_ns: u64) -> Res<u64> {
    if pair.starts_with("vramring") {
        let pts = b.pts().ok_or("a vramringsrc buffer without a pts")?;
        return Ok(pts.nseconds() / interval_ns.max(1));
    }
    let meta = gst::meta::CustomMeta::from_buffer(b, INDEX_META)
        .map_err(|_| format!("a buffer without the {INDEX_META} meta (not carried by the sink?)"))?;
    Ok(meta.structure().get::<u64>("index")?)
}

/// A frame's index from its first 8 luma bytes.
fn pixel_index(b: &gst::BufferRef) -> Res<u64> {
    let cuda = b
        .peek_memory(0)
        .allocator()
        .is_some_and(|a| a.memory_type().as_str() == "gst.cuda.memory");
    if cuda {
        return cuda_index(b);
    }
    let map = b.map_readable()?;
    Ok(u64::from_le_bytes(map[..8].try_into()?))
}

/// `subscribe vramring-rust ...`: the library's `Subscriber` with push
/// delivery, no GStreamer; the arrival instant is taken when `next`
/// returns, then the index is learnt from the frame's pts (or read from
/// its pixels: 8 bytes back from the device with `cuda`, the whole frame
/// to the host without, as `cudadownload` does).
fn subscribe_rust(
    addr: &str,
    cuda: bool,
    queue: bool,
    frames: u64,
    run_for: Duration,
    interval_ns: u64,
    index: Index,
) -> Res<Vec<Arrival>> {
    use vramring::{ClientOptions, Delivery, Error, Mode, Subscriber, SubscriberOptions};
    let mut opts = SubscriberOptions::default()
        .delivery(Delivery::Push)
        .name("bench-rust")
        .connect_timeout(Duration::from_secs(10));
    if queue {
        // As `vramringsrc` reads by default (zero-copy): a push queue read
        // in order, reconnecting.
        opts = opts.mode(Mode::Sequential).reconnect(true);
    }
    let mut sub = Subscriber::connect(addr, opts)?;
    println!("ready");
    std::io::stdout().flush()?;
    let deadline = Instant::now() + run_for;
    let mut host = Vec::new();
    let mut got = Vec::with_capacity(frames as usize);
    let mut pixels = |frame: &vramring::Frame<'_>| -> Res<u64> {
        match frame.device().filter(|_| cuda) {
            Some(view) => {
                use cudarc::driver::sys as cu;
                let mut idx = [0u8; 8];
                // SAFETY: `view` is the subscriber's own copy of the frame
                // (more than 8 bytes), alive while `frame` is; `idx` holds
                // 8 bytes; the primary context is current (`cuda_thread`).
                let r = unsafe { cu::cuMemcpyDtoH_v2(idx.as_mut_ptr().cast(), view.as_raw(), 8) };
                if r != cu::CUresult::CUDA_SUCCESS {
                    return Err(format!("cuMemcpyDtoH: {r:?}").into());
                }
                Ok(u64::from_le_bytes(idx))
            }
            None => {
                host.resize(frame.len() as usize, 0);
                frame.copy_to_host(&mut host)?;
                Ok(u64::from_le_bytes(host[..8].try_into()?))
            }
        }
    };
    while Instant::now() < deadline {
        let frame = match sub.next(Duration::from_millis(100)) {
            Ok(f) => f,
            Err(Error::Timeout(..)) => continue,
            Err(Error::ProducerGone { .. }) => break,
            Err(e) => return Err(e.into()),
        };
        let t = now_ns();
        let idx = match index {
            Index::Meta => u64::try_from(frame.pts()).map_err(|_| "a frame without a pts")? / interval_ns.max(1),
            Index::Pixels => pixels(&frame)?,
        };
        got.push((idx, t, frame.commit_ns()));
        if idx + 1 >= frames {
            // The check, after the last arrival: the index is the frame's own.
            let seen = pixels(&frame)?;
            if seen != idx {
                return Err(format!("frame {idx} by its pts holds frame {seen} by its pixels").into());
            }
            break;
        }
    }
    let _ = sub.close();
    Ok(got)
}

/// `GST_IPC_BENCH_STAGES=1`: the publisher records the publish's stage
/// marks (TRACE events of target `vramring::publish`, the sink's and the
/// library's) and prints each stage's time after the frame's sink entry.
mod stages {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer as _;

    /// Every mark: its callsite's message (looked up once) and its time.
    #[derive(Clone, Default)]
    pub(super) struct Marks {
        at: Arc<Mutex<Vec<(&'static str, u64)>>>,
        names: Arc<Mutex<BTreeMap<&'static str, String>>>,
    }

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Marks {
        fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            let t = super::now_ns();
            let name = e.metadata().name();
            self.at.lock().unwrap_or_else(|e| e.into_inner()).push((name, t));
            self.names
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(name)
                .or_insert_with(|| vramring_testkit::marks::message(e));
        }
    }

    /// Records every thread's marks from now on.
    pub(super) fn install() -> Marks {
        let marks = Marks::default();
        let filter = tracing_subscriber::filter::Targets::new().with_target("vramring::publish", tracing::Level::TRACE);
        let _ = tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(marks.clone().with_filter(filter)),
        );
        marks
    }

    impl Marks {
        /// Each stage's p50 / p99 after its frame's sink entry (a mark
        /// belongs to the last frame that entered before it), in the order
        /// the stages first came; the first `WARMUP` frames left out.
        pub(super) fn summary(&self, entries: &[(u64, u64)]) -> String {
            let mut entries: Vec<(u64, u64)> = entries.to_vec();
            entries.sort_by_key(|&(_, t)| t);
            let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
            let mut order = Vec::new();
            let mut after: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
            for &(name, t) in self.at.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                let k = entries.partition_point(|&(_, t0)| t0 <= t);
                let Some(&(i, t0)) = k.checked_sub(1).and_then(|k| entries.get(k)) else {
                    continue;
                };
                if i < super::WARMUP {
                    continue;
                }
                if !order.contains(&name) {
                    order.push(name);
                }
                after.entry(name).or_default().push((t - t0) as f64 / 1000.0);
            }
            order
                .iter()
                .map(|name| {
                    let v = after.get_mut(name).expect("a stage with marks");
                    v.sort_by(f64::total_cmp);
                    format!(
                        "{} {:.1} / {:.1}",
                        names.get(name).map_or(*name, String::as_str),
                        super::pct(v, 0.5),
                        super::pct(v, 0.99)
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        }
    }
}

/// A child process of ours, killed (by its own id) if it outlives us.
struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Proc {
    fn spawn(args: &[String], env: &[(String, String)]) -> Res<Proc> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        Ok(Proc { child, stdin, stdout })
    }

    fn wait_ready(&mut self) -> Res<()> {
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        if line.trim() != "ready" {
            return Err(format!("a child did not start: {line:?}").into());
        }
        Ok(())
    }

    /// Waits up to `limit` for the exit; kills it past that.
    fn finish(&mut self, limit: Duration) -> Res<()> {
        let end = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait()? {
                return if st.success() {
                    Ok(())
                } else {
                    Err(format!("a child exited with {st}").into())
                };
            }
            if Instant::now() >= end {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err("a child did not finish in time (killed)".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

struct RunResult {
    frames: u64,
    delivered: Vec<u64>,
    dropped: u64,
    lat_us: Vec<f64>,
    /// Sink entry → the split mark, and the mark → arrival, µs (empty for
    /// pairs with no mark).
    to_mark_us: Vec<f64>,
    from_mark_us: Vec<f64>,
    cpu_us: f64,
}

/// A record file: (frame index, instant ns, split mark ns or 0) lines, and
/// the producer's CPU per frame where the file has it.
type Records = (Vec<Arrival>, Option<u64>);

fn read_pairs(path: &Path) -> Res<Records> {
    let mut v = Vec::new();
    let mut cpu = None;
    for line in std::fs::read_to_string(path)?.lines() {
        let mut it = line.split_whitespace();
        match (it.next(), it.next()) {
            (Some("cpu_ns_per_frame"), Some(n)) => cpu = Some(n.parse()?),
            (Some(a), Some(b)) => v.push((a.parse()?, b.parse()?, it.next().map_or(Ok(0), str::parse)?)),
            _ => {}
        }
    }
    Ok((v, cpu))
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    dir: &Path,
    pair: &str,
    memory: &str,
    interval_us: u64,
    frames: u64,
    subs: u32,
    readback: bool,
    env: &[(String, String)],
) -> Res<RunResult> {
    let tag = format!("{pair}-{memory}-{interval_us}-{subs}");
    let addr = dir.join(format!("{tag}.sock")).display().to_string();
    let pub_out = dir.join(format!("{tag}.pub"));
    let run_ms = frames * interval_us / 1000;
    let mut publisher = Proc::spawn(
        &[
            "publish".into(),
            pair.into(),
            addr.clone(),
            interval_us.to_string(),
            frames.to_string(),
            subs.to_string(),
            pub_out.display().to_string(),
        ],
        env,
    )?;
    publisher.wait_ready()?;
    let mut subscribers = Vec::new();
    let mut sub_outs = Vec::new();
    for k in 0..subs {
        let out = dir.join(format!("{tag}.sub{k}"));
        let s = Proc::spawn(
            &[
                "subscribe".into(),
                pair.into(),
                addr.clone(),
                memory.into(),
                frames.to_string(),
                (run_ms + 6000).to_string(),
                interval_us.to_string(),
                if readback { "pixels" } else { "meta" }.into(),
                out.display().to_string(),
            ],
            env,
        )?;
        subscribers.push(s);
        sub_outs.push(out);
    }
    for s in &mut subscribers {
        s.wait_ready()?;
    }
    // Let every subscriber connect before the first frame.
    std::thread::sleep(Duration::from_millis(1000));
    if let Some(mut w) = publisher.stdin.take() {
        writeln!(w, "go")?;
    }
    let limit = Duration::from_millis(run_ms + 10_000);
    publisher.finish(limit)?;
    for s in &mut subscribers {
        s.finish(limit)?;
    }
    let (sink_in, cpu) = read_pairs(&pub_out)?;
    let mut at_sink = vec![None; frames as usize];
    for (i, t, _) in sink_in {
        if let Some(slot) = at_sink.get_mut(i as usize) {
            *slot = Some(t);
        }
    }
    let mut res = RunResult {
        frames: frames.saturating_sub(WARMUP),
        delivered: Vec::new(),
        dropped: 0,
        lat_us: Vec::new(),
        to_mark_us: Vec::new(),
        from_mark_us: Vec::new(),
        cpu_us: cpu.unwrap_or(0) as f64 / 1000.0,
    };
    for out in &sub_outs {
        let (got, _) = read_pairs(out)?;
        let mut seen = std::collections::HashSet::new();
        for (i, t, mark) in got {
            if i < WARMUP || i >= frames || !seen.insert(i) {
                continue;
            }
            if let Some(Some(t0)) = at_sink.get(i as usize) {
                res.lat_us.push(t.saturating_sub(*t0) as f64 / 1000.0);
                if mark != 0 {
                    res.to_mark_us.push((mark as f64 - *t0 as f64) / 1000.0);
                    res.from_mark_us.push((t as f64 - mark as f64) / 1000.0);
                }
            }
        }
        res.delivered.push(seen.len() as u64);
        res.dropped += res.frames - seen.len() as u64;
    }
    for v in [&mut res.lat_us, &mut res.to_mark_us, &mut res.from_mark_us] {
        v.sort_by(f64::total_cmp);
    }
    Ok(res)
}

/// The split column: sink entry → mark and mark → arrival, p50 µs, where
/// the pair has a mark (the Rust subscriber: the commit; `vramringsrc`: its
/// src pad).
fn split(r: &RunResult) -> String {
    if r.to_mark_us.is_empty() {
        return String::new();
    }
    format!("{:.0} + {:.0}", pct(&r.to_mark_us, 0.5), pct(&r.from_mark_us, 0.5))
}

fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Starts an MPS control daemon with a private pipe directory; `quit` on
/// drop.
struct Mps {
    env: Vec<(String, String)>,
}

impl Mps {
    fn start() -> Res<Mps> {
        let base = PathBuf::from(format!("/tmp/gst-ipc-bench-mps-{}", std::process::id()));
        let (pipe, log) = (base.join("pipe"), base.join("log"));
        std::fs::create_dir_all(&pipe)?;
        std::fs::create_dir_all(&log)?;
        let env = vec![
            ("CUDA_MPS_PIPE_DIRECTORY".to_string(), pipe.display().to_string()),
            ("CUDA_MPS_LOG_DIRECTORY".to_string(), log.display().to_string()),
        ];
        let st = Command::new("nvidia-cuda-mps-control")
            .arg("-d")
            .envs(env.iter().cloned())
            .status()?;
        if !st.success() {
            return Err(format!("nvidia-cuda-mps-control -d: {st}").into());
        }
        Ok(Mps { env })
    }
}

impl Drop for Mps {
    fn drop(&mut self) {
        if let Ok(mut c) = Command::new("nvidia-cuda-mps-control")
            .envs(self.env.iter().cloned())
            .stdin(Stdio::piped())
            .spawn()
        {
            if let Some(mut w) = c.stdin.take() {
                let _ = writeln!(w, "quit");
            }
            let _ = c.wait();
        }
    }
}

/// The value after the last `name` in `args` (a later one wins), or `default`.
fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> Res<T> {
    match args.iter().rposition(|a| a == name) {
        Some(k) => args
            .get(k + 1)
            .ok_or_else(|| format!("{name} needs a value"))?
            .parse()
            .map_err(|_| format!("{name}: not a valid value").into()),
        None => Ok(default),
    }
}

fn bench(args: &[String]) -> Res<()> {
    let out: PathBuf = arg(
        args,
        "--out",
        std::env::var("OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(".")),
    )?;
    let fast: u64 = arg(args, "--frames-fast", 1000)?;
    let slow: u64 = arg(args, "--frames-slow", 100)?;
    let subs_list: String = arg(args, "--subs", "1,4,8".to_string())?;
    let pairs: String = arg(args, "--pairs", PAIRS.join(","))?;
    let mps: String = arg(args, "--mps", "auto".to_string())?;
    // Every frame's index read from its pixels: GPU work in each
    // subscriber's process (a context switch per frame without MPS).
    let readback = args.iter().any(|a| a == "--readback");
    // Runs that would start past this many seconds are skipped (listed as
    // such), so the whole command ends in time on a leased machine.
    let budget = Duration::from_secs(arg(args, "--budget-s", 300)?);
    let began = Instant::now();
    let subs_list: Vec<u32> = subs_list.split(',').map(str::parse).collect::<Result<_, _>>()?;
    std::fs::create_dir_all(&out)?;
    let dir = tempfile::tempdir()?;
    init()?;
    let needed: &[&str] = if pairs.split(',').all(host_pair) {
        &["vramringsink"]
    } else {
        &[
            "cudaupload",
            "cudadownload",
            "cudaipcsink",
            "cudaipcsrc",
            "vramringsink",
        ]
    };
    for &f in needed {
        if gst::ElementFactory::find(f).is_none() {
            return Err(format!("no element {f}: run with the GStreamer of build.sh (env.sh) on a GPU machine").into());
        }
    }
    let have_mps = Command::new("nvidia-cuda-mps-control")
        .arg("-h")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    let mps_modes: Vec<bool> = match mps.as_str() {
        "off" => vec![false],
        "on" => vec![true],
        _ if have_mps => vec![false, true],
        _ => vec![false],
    };
    let memories: String = arg(args, "--memory", MEMORIES.join(","))?;
    let mut table = String::new();
    table.push_str(&format!(
        "# GStreamer CUDA IPC: 1080p NV12, publish → subscriber appsink\n\n\
         `gst_ipc_bench {}` on {} ({}), {} frames at 2 ms, {} at 25 fps, the first {WARMUP} left out.\n\
         Latency: sink pad entry → subscriber appsink, CLOCK_MONOTONIC. Frame index: {}.\n\
         Split: sink entry → mark + mark → arrival, p50, where the pair has a mark: the frame's commit (`commit_ns`) for the Rust subscriber, \
         the buffer on `vramringsrc`'s src pad for the element.\n",
        args.join(" "),
        gpu_name(),
        gst::version_string(),
        fast,
        slow,
        if readback {
            "every frame's pixels (GPU work in each subscriber)"
        } else {
            "metadata (no GPU work in a subscriber; the last frame's pixels checked where it arrives)"
        }
    ));
    let path = out.join("gst-ipc-bench.md");
    for memory in memories.split(',') {
        let heading = match memory {
            "cuda" => "## CUDA memory out (no download)\n\n\
                       Both sources hand the appsink `video/x-raw(memory:CUDAMemory)`: `cudaipcsrc` a copy of the imported memory \
                       (`io-mode=copy`) or the imported memory itself (`cudaipc-import`), `vramringsrc` the subscriber's own push buffer \
                       (zero-copy) or a GstCudaBufferPool buffer it copied the frame into on the GPU (`vramring-copy`, waited for before the push).\n\n",
            "system" => "## System memory out (download)\n\n\
                         `cudaipcsrc ! cudadownload`; `vramringsrc ! video/x-raw` copies from the ring to system memory itself.\n\n",
            other => return Err(format!("--memory: {other} is neither cuda nor system").into()),
        };
        table.push_str(heading);
        table.push_str(
            "| pair | pace | subs | MPS | frames | delivered per sub (min) | dropped (all subs) | p50 µs | p99 µs | max µs | producer CPU µs/frame | split p50 µs |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        );
        for &on in &mps_modes {
            let mps_guard = match on.then(Mps::start).transpose() {
                Ok(g) => g,
                Err(e) => {
                    let row = format!(
                        "| (all) | | | on | MPS did not start: {} | | | | | | | |\n",
                        e.to_string().replace('|', "/")
                    );
                    eprint!("{row}");
                    table.push_str(&row);
                    std::fs::write(&path, &table)?;
                    continue;
                }
            };
            let env = mps_guard.as_ref().map(|m| m.env.clone()).unwrap_or_default();
            for pair in pairs.split(',') {
                if host_pair(pair) && memory == "cuda" {
                    continue; // a host ring has no CUDA memory to hand out
                }
                for (interval_us, frames, pace) in [(2000u64, fast, "2 ms"), (40_000, slow, "25 fps")] {
                    for &subs in &subs_list {
                        let row = if began.elapsed() > budget {
                            Err(format!("skipped: past the {budget:?} budget").into())
                        } else {
                            run_one(dir.path(), pair, memory, interval_us, frames, subs, readback, &env)
                        };
                        let row = match row {
                            Ok(r) => format!(
                                "| {pair} | {pace} | {subs} | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} |\n",
                                if on { "on" } else { "off" },
                                r.frames,
                                r.delivered.iter().min().copied().unwrap_or(0),
                                r.dropped,
                                pct(&r.lat_us, 0.5),
                                pct(&r.lat_us, 0.99),
                                pct(&r.lat_us, 1.0),
                                r.cpu_us,
                                split(&r)
                            ),
                            Err(e) => format!(
                                "| {pair} | {pace} | {subs} | {} | failed: {} | | | | | | | |\n",
                                if on { "on" } else { "off" },
                                e.to_string().replace('|', "/")
                            ),
                        };
                        eprint!("{row}");
                        table.push_str(&row);
                        std::fs::write(&path, &table)?;
                    }
                }
            }
            drop(mps_guard);
        }
        table.push('\n');
    }
    println!("{table}\nwritten to {}", path.display());
    Ok(())
}

fn gpu_name() -> String {
    Command::new("nvidia-smi")
        .args(["--query-gpu=name,driver_version", "--format=csv,noheader"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.lines().next().unwrap_or("").trim().to_owned())
        .unwrap_or_else(|| "an unknown GPU".into())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(args.first().map(String::as_str), Some("publish" | "subscribe")) {
        // A child dies with the bench (a timeout kills the bench).
        // SAFETY: prctl with an integer argument; no memory is passed.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    }
    match args.first().map(String::as_str) {
        Some("publish") => publish(&args[1..]),
        Some("subscribe") => subscribe(&args[1..]),
        _ => bench(&args),
    }
}
