//! The real producer: decodes H.264 on the GPU with NVDEC and publishes
//! each NV12 picture into a CUDA ring, one device-to-device copy per frame,
//! never through the host.
//!
//! ```text
//! # from a file (Annex-B), looped, paced at 30 fps:
//! cargo run --release --features nvdec --example nvdec_producer -- \
//!     --socket /tmp/cam1.sock --input tests/data/clip1080.h264 --fps 30 --loops 0
//! # from a packet ring (examples/packet_producer.rs or `vramring play`):
//! cargo run --release --features nvdec --example nvdec_producer -- \
//!     --socket /tmp/cam1.sock --packets /tmp/cam1.packets.sock
//! ```
//!
//! Frames carry pts (90 kHz: the packet's pts from a packet ring, the frame
//! count times 90000/fps from a file) and 8 bytes of user metadata: the
//! picture's index in display order within the clip (u32 LE) and the loop
//! number (u32 LE), which is how `tests/gpu_nvdec.rs` matches each received
//! frame against the reference digests. With `--json` it prints one JSON
//! object per line; the last (`"event":"final"`) is the summary.
//!
//! Exit codes: 0 done, 1 error, 3 no NVDEC or no CUDA GPU here.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use vramring::nvdec::{Codec, DecodedFrame, Decoder, DecoderOptions};
use vramring::packet::{annexb, PacketSubscriber, PacketSubscriberOptions};
use vramring::ClientOptions;
use vramring::{BackendChoice, BackendKind, Error, Format, FrameMeta, Policy, Publisher, RingConfig};

#[path = "common/mod.rs"]
#[allow(dead_code)]
mod common;

use common::{emit, stop_requested, Json};

/// The clip the tests ship.
const DEFAULT_CLIP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/clip.h264");

/// Decode H.264 with NVDEC and publish the frames on a vramring.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Socket path to serve frames on.
    #[arg(long, default_value = "/tmp/vramring-cam.sock")]
    socket: PathBuf,
    /// H.264 Annex-B input file.
    #[arg(long, default_value = DEFAULT_CLIP)]
    input: PathBuf,
    /// Read access units from this packet ring's socket instead of a file.
    #[arg(long)]
    packets: Option<PathBuf>,
    /// Codec: h264 or hevc.
    #[arg(long, default_value = "h264")]
    codec: Codec,
    /// CUDA device ordinal to decode on (the ring is on the same device).
    #[arg(long, default_value_t = 0)]
    device: u32,
    /// The NVDEC library to open instead of libnvcuvid.so.1 (a path or a
    /// soname).
    #[arg(long, env = "VRAMRING_NVCUVID")]
    nvcuvid: Option<String>,
    /// When push commits replay the commit graph instead of launching the
    /// commit kernel (auto, always, never).
    #[arg(long, default_value = "auto", env = "VRAMRING_COMMIT_GRAPH")]
    commit_graph: vramring::cuda::CommitGraph,
    /// Ring backend: cuda, cuda:N, host or auto.
    #[arg(long)]
    backend: Option<BackendChoice>,
    /// Slots in the ring.
    #[arg(long, default_value_t = 8)]
    slots: u32,
    /// Lossless policy: never overwrite a frame a lossless subscriber holds.
    #[arg(long)]
    lossless: bool,
    /// How long a loan may wait for a lossless subscriber, in ms.
    #[arg(long, default_value_t = 5000)]
    loan_timeout_ms: u64,
    /// Frames per second from a file (0: as fast as NVDEC and the ring go).
    #[arg(long, default_value_t = 30.0)]
    fps: f64,
    /// Times to play the file (0: until interrupted).
    #[arg(long, default_value_t = 1)]
    loops: u64,
    /// NVDEC display delay in pictures (0 lowest latency).
    #[arg(long, default_value_t = 1)]
    display_delay: u32,
    /// Wait for this many subscribers before the first frame.
    #[arg(long, default_value_t = 0)]
    wait_subscribers: u32,
    /// Give up waiting for subscribers after this many seconds.
    #[arg(long, default_value_t = 30)]
    wait_secs: u64,
    /// Print a progress line every this many ms (0: only the final line).
    #[arg(long, default_value_t = 1000)]
    report_ms: u64,
    /// Print JSON lines.
    #[arg(long)]
    json: bool,
}

/// What the sink keeps between frames.
struct Out {
    publisher: Option<Publisher>,
    published: u64,
    /// Display index within the current loop.
    index_in_loop: u32,
    loop_no: u32,
    /// pts to give the next frame from a file (90 kHz).
    file_pts: Option<f64>,
    pts_step: f64,
    copy_ns: Vec<u64>,
}

fn main() {
    let cli = Cli::parse();
    common::install_stop_handler();
    if let Err(e) = run(&cli) {
        eprintln!("nvdec_producer: {e}");
        let code = match e {
            Error::DecoderUnavailable(_) | Error::CudaUnavailable(_) => 3,
            _ => 1,
        };
        std::process::exit(code);
    }
}

fn run(cli: &Cli) -> vramring::Result<()> {
    if let Some(lib) = &cli.nvcuvid {
        vramring::nvdec::use_library(lib.clone())?;
    }
    let mut decoder = Decoder::new(
        DecoderOptions::new(cli.codec)
            .device(cli.device)
            .display_delay(cli.display_delay),
    )?;
    let rate = if cli.fps > 0.0 { cli.fps } else { 30.0 };
    let mut out = Out {
        publisher: None,
        published: 0,
        index_in_loop: 0,
        loop_no: 0,
        file_pts: if cli.packets.is_none() { Some(0.0) } else { None },
        pts_step: 90_000.0 / rate,
        copy_ns: Vec::new(),
    };
    let start = Instant::now();
    let mut last_report = Instant::now();
    let mut report = |out: &Out, decoded: u64| {
        if cli.report_ms == 0 || last_report.elapsed() < Duration::from_millis(cli.report_ms) {
            return;
        }
        last_report = Instant::now();
        let secs = start.elapsed().as_secs_f64();
        let subs = out.publisher.as_ref().map_or(0, |p| p.stats().subscribers);
        if cli.json {
            emit(
                &Json::event("status")
                    .str("role", "producer")
                    .u64("decoded", decoded)
                    .u64("published", out.published)
                    .u64("subscribers", u64::from(subs))
                    .f64("fps", out.published as f64 / secs)
                    .finish(),
            );
        } else {
            println!(
                "{decoded} frames decoded, {} published, {:.1} fps, {subs} subscribers",
                out.published,
                decoded as f64 / secs
            );
        }
    };
    if let Some(packets) = &cli.packets {
        let mut sub = PacketSubscriber::connect(packets, PacketSubscriberOptions::new().name("nvdec_producer"))?;
        let mut buf = Vec::new();
        let mut params = Vec::new();
        let mut au = Vec::new();
        // The reader joins (and resyncs after an overrun) at a keyframe; the
        // ring's codec parameters go in front of it, for cameras that do not
        // repeat SPS/PPS before every keyframe.
        let mut need_params = true;
        while !stop_requested() {
            let p = match sub.next_copy(&mut buf, Duration::from_millis(500)) {
                Ok(p) => p,
                Err(Error::Timeout(..)) => continue,
                Err(Error::PacketOverrun { .. }) => {
                    need_params = true;
                    continue;
                }
                Err(Error::ProducerGone { .. }) => break,
                Err(e) => return Err(e),
            };
            let data = if need_params {
                sub.codec_params(&mut params)?;
                need_params = false;
                au.clear();
                au.extend_from_slice(&params);
                au.extend_from_slice(&buf[..p.len]);
                &au[..]
            } else {
                &buf[..p.len]
            };
            decoder.decode(data, Some(p.pts), &mut |f| publish(cli, &mut out, f))?;
            report(&out, decoder.output_count());
        }
        decoder.flush(&mut |f| publish(cli, &mut out, f))?;
    } else {
        let stream = std::fs::read(&cli.input).map_err(|e| Error::io(format!("reading {}", cli.input.display()), e))?;
        let units = annexb::access_units(&stream);
        if units.is_empty() {
            return Err(Error::Config(format!("{} holds no access unit", cli.input.display())));
        }
        let period = if cli.fps > 0.0 {
            Some(Duration::from_secs_f64(1.0 / cli.fps))
        } else {
            None
        };
        let mut next = Instant::now();
        let mut loop_no = 0u64;
        'play: while cli.loops == 0 || loop_no < cli.loops {
            for (k, au) in units.iter().enumerate() {
                if stop_requested() {
                    break 'play;
                }
                if let Some(p) = period {
                    let now = Instant::now();
                    if next > now {
                        std::thread::sleep(next - now);
                    }
                    next += p;
                }
                decoder.decode(au.bytes, Some(k as i64), &mut |f| publish(cli, &mut out, f))?;
                report(&out, decoder.output_count());
            }
            // End of the file: the parser hands over the pictures it still
            // holds, and the next loop starts a new stream at the first IDR.
            decoder.flush(&mut |f| publish(cli, &mut out, f))?;
            loop_no += 1;
            out.loop_no += 1;
            out.index_in_loop = 0;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let decoded = decoder.output_count();
    let info = decoder.info();
    decoder.close()?;
    let mut copy = out.copy_ns.clone();
    copy.sort_unstable();
    let pct = |p: f64| copy.get(((copy.len() as f64 - 1.0) * p) as usize).copied().unwrap_or(0);
    let (w, h, cw, ch) = info.map_or((0, 0, 0, 0), |i| (i.width, i.height, i.coded_width, i.coded_height));
    if cli.json {
        emit(
            &Json::event("final")
                .str("role", "producer")
                .u64("decoded", decoded)
                .u64("published", out.published)
                .u64("loops", u64::from(out.loop_no))
                .u64("width", u64::from(w))
                .u64("height", u64::from(h))
                .u64("coded_width", u64::from(cw))
                .u64("coded_height", u64::from(ch))
                .f64("seconds", secs)
                .f64("fps", decoded as f64 / secs)
                .u64("copy_publish_p50_ns", pct(0.5))
                .u64("copy_publish_p99_ns", pct(0.99))
                .finish(),
        );
    } else {
        println!(
            "done: {decoded} frames decoded ({w}x{h}, coded {cw}x{ch}), {} published in {secs:.2} s, {:.1} fps; copy+publish p50 {:.1} us p99 {:.1} us",
            out.published,
            decoded as f64 / secs,
            pct(0.5) as f64 / 1e3,
            pct(0.99) as f64 / 1e3
        );
    }
    if let Some(mut p) = out.publisher.take() {
        p.close()?;
    }
    Ok(())
}

/// The sink: makes the ring at the first frame (its size is the decoded
/// size), waits for subscribers, then copies each frame into a loaned slot
/// and publishes it.
fn publish(cli: &Cli, out: &mut Out, f: &DecodedFrame<'_>) -> vramring::Result<()> {
    if out.publisher.is_none() {
        let backend = cli.backend.unwrap_or(BackendChoice::Cuda(cli.device));
        let policy = if cli.lossless {
            Policy::Lossless
        } else {
            Policy::Overwrite
        };
        let cfg = RingConfig::new(Format::Nv12, f.width(), f.height())
            .slots(cli.slots)
            .backend(backend)
            .policy(policy)
            .commit_graph(cli.commit_graph);
        let p = Publisher::create(&cli.socket, cfg)?;
        if cli.json {
            emit(
                &Json::event("ready")
                    .str("role", "producer")
                    .str("socket", &cli.socket.display().to_string())
                    .str("backend", p.backend().name())
                    .str("format", "nv12")
                    .u64("width", f.width().into())
                    .u64("height", f.height().into())
                    .u64("slots", cli.slots.into())
                    .finish(),
            );
        }
        let waited = Instant::now();
        while p.stats().subscribers < cli.wait_subscribers {
            if stop_requested() || waited.elapsed() > Duration::from_secs(cli.wait_secs) {
                return Err(Error::Timeout(waited.elapsed(), "the subscribers to connect"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        out.publisher = Some(p);
    }
    let publisher = out.publisher.as_mut().expect("made above");
    let t = Instant::now();
    let pts = match out.file_pts.as_mut() {
        Some(next) => {
            let v = *next as i64;
            *next += out.pts_step;
            v
        }
        None => f.timestamp(),
    };
    let mut user = [0u8; 8];
    user[..4].copy_from_slice(&out.index_in_loop.to_le_bytes());
    user[4..].copy_from_slice(&out.loop_no.to_le_bytes());
    let meta = FrameMeta::pts(pts).with_user(&user)?;
    let mut slot = publisher.loan(Duration::from_millis(cli.loan_timeout_ms))?;
    f.copy_to_slot(&mut slot)?;
    if slot.backend() == BackendKind::Cuda {
        // SAFETY: the decoder's stream belongs to the primary context of the
        // ring's device and stays live for this call.
        unsafe { slot.publish_cuda(meta, f.stream()) }?;
    } else {
        slot.publish(meta)?;
    }
    if out.copy_ns.len() < 1 << 20 {
        out.copy_ns.push(t.elapsed().as_nanos() as u64);
    }
    out.published += 1;
    out.index_in_loop += 1;
    Ok(())
}
