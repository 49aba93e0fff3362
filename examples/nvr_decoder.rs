//! The multi-camera decoder: one process, one CUDA context (the device's
//! primary context, shared by every NVDEC decoder and every ring), N
//! cameras, each decoded into a CUDA frame ring of its own.
//!
//! ```text
//! cargo run --release --features nvdec --example nvr_decoder -- \
//!     --config examples/nvr/cameras.example.toml
//! vramring top /tmp/vramring-nvr        # the config's socket_dir: every camera's ring
//! ```
//!
//! With `[decoder] memory = "host"` in the config, or `--host-memory`, the
//! rings are in host shared memory instead: each decoded picture is copied
//! device-to-host into its loaned slot and committed from the CPU, and a
//! reader that wants the frame on the GPU uploads it itself (the
//! host-memory way of Frigate-style NVRs, kept as the peer to compare
//! with: `benches/nvr_scale.py`).
//!
//! Cameras come from a TOML file (`examples/nvr/config.rs` documents it;
//! `examples/nvr/cameras.example.toml` is an example): each has an input
//! (an Annex-B H.264/H.265 file played at a frame rate, looped as a camera
//! stand-in, or a packet ring of `vramring::packet`) and an output socket
//! in the one `socket_dir`, so `vramring ls`/`top` on that directory show
//! every camera's ring and its subscribers. Each camera runs on its own
//! thread (`examples/nvr/supervisor.rs`): an input that stalls, goes away,
//! is overrun or sends garbage, or a decoder that fails, is recovered at
//! the camera's next keyframe, counted and logged, and no other camera
//! notices. Frames carry the user metadata `nvdec_producer` writes (index
//! in the segment, segment number).
//!
//! Output: a sentence on stderr per camera event (resync, stall, input
//! gone, decoder made again); every `report_ms` one line per camera
//! (`--json`: `{"event":"camera",...}` objects, then one
//! `{"event":"tick",...}` with the totals and the `CLOCK_MONOTONIC` time
//! `t_ns`), and at the end one per camera and `{"event":"final",...}`. `--check` reads the config, prints
//! the cameras and exits without opening anything.
//!
//! Exit codes: 0 done (stopped by SIGINT/SIGTERM, `--seconds`, or every
//! input ended), 1 error, 2 a bad config file (the sentence names the file,
//! the camera and the key), 3 no NVDEC or no CUDA GPU here.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use vramring::Error;
use vramring_testkit::json::{emit, Json};

#[path = "common/stop.rs"]
mod stop;

#[path = "nvr/mod.rs"]
mod nvr;

#[path = "nvr/nvdec_stage.rs"]
mod nvdec_stage;

use nvdec_stage::{DecoderSpec, NvdecStage};
use nvr::config::{self, CameraConfig, Config, ConfigError, FrameMemory, Input};
use nvr::sources::{FileSource, PacketSource};
use nvr::supervisor::{self, CameraStats, Cameras, DecodeError, InputError, Log, Source, Timing};

/// Decode many cameras with NVDEC into one frame ring each (GPU memory, or host memory).
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// The cameras' TOML config (see examples/nvr/cameras.example.toml).
    #[arg(long)]
    config: PathBuf,
    /// The socket directory when the config names none.
    #[arg(long, env = "VRAMRING_DIR", default_value = config::DEFAULT_SOCKET_DIR)]
    run_dir: PathBuf,
    /// Put every ring in host shared memory, whatever the config's
    /// `[decoder] memory` says: each picture is copied device-to-host.
    #[arg(long)]
    host_memory: bool,
    /// Read and check the config, print the cameras, and exit.
    #[arg(long)]
    check: bool,
    /// Stop after this many seconds (0: until SIGINT/SIGTERM or every input ends).
    #[arg(long, default_value_t = 0)]
    seconds: u64,
    /// The NVDEC library to open instead of libnvcuvid.so.1.
    #[arg(long, env = "VRAMRING_NVCUVID")]
    nvcuvid: Option<String>,
    /// Print JSON lines.
    #[arg(long)]
    json: bool,
}

/// Why the program stops.
#[derive(Debug, thiserror::Error)]
enum NvrError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Ring(#[from] Error),
    #[error("camera {camera:?}: {error}")]
    Camera { camera: String, error: Error },
    #[error("cannot make the socket directory {dir}: {source}")]
    Dir { dir: PathBuf, source: std::io::Error },
}

impl NvrError {
    fn exit_code(&self) -> i32 {
        let unavailable = |e: &Error| matches!(e, Error::DecoderUnavailable(_) | Error::CudaUnavailable(_));
        match self {
            NvrError::Config(_) => ConfigError::EXIT_CODE,
            NvrError::Ring(e) | NvrError::Camera { error: e, .. } if unavailable(e) => 3,
            _ => 1,
        }
    }
}

fn main() {
    let cli = Cli::parse();
    stop::install_stop_handler();
    if let Err(e) = run(&cli) {
        eprintln!("nvr_decoder: {e}");
        std::process::exit(e.exit_code());
    }
}

/// Makes the cameras' parts for the supervisor.
struct Nvr {
    device: u32,
    display_delay: u32,
    memory: FrameMemory,
}

impl Cameras for Nvr {
    type Camera = CameraConfig;
    type Src = Box<dyn Source>;
    type Dec = NvdecStage;

    fn open(&self, cam: &CameraConfig) -> Result<Box<dyn Source>, InputError> {
        Ok(match &cam.input {
            Input::File { path, looped, fps } => Box::new(FileSource::open(path, cam.codec, *looped, *fps)?),
            Input::Packets { socket } => Box::new(PacketSource::open(socket, &format!("nvr:{}", cam.name))?),
        })
    }

    fn decoder(&self, cam: &CameraConfig) -> Result<NvdecStage, DecodeError> {
        NvdecStage::new(cam, DecoderSpec::of(cam, self.device, self.display_delay), self.memory)
            .map_err(|e| DecodeError(e.to_string()))
    }
}

/// Camera events: a sentence on stderr, and a JSON line with `--json`.
struct Printer {
    json: bool,
}

impl Log for Printer {
    fn line(&self, name: &str, event: &str, text: &str) {
        eprintln!("nvr_decoder: camera {name}: {text}");
        if self.json {
            emit(
                &Json::event("camera-event")
                    .str("camera", name)
                    .str("kind", event)
                    .str("text", text)
                    .finish(),
            );
        }
    }
}

fn run(cli: &Cli) -> Result<(), NvrError> {
    let mut cfg = config::load(&cli.config, &cli.run_dir)?;
    if cli.host_memory {
        cfg.memory = FrameMemory::Host;
    }
    if cli.check {
        print_check(&cfg, cli.json);
        return Ok(());
    }
    if let Some(lib) = &cli.nvcuvid {
        vramring::nvdec::use_library(lib.clone())?;
    }
    std::fs::create_dir_all(&cfg.socket_dir).map_err(|source| NvrError::Dir {
        dir: cfg.socket_dir.clone(),
        source,
    })?;
    for cam in &cfg.cameras {
        if let Some(parent) = cam.output.parent() {
            std::fs::create_dir_all(parent).map_err(|source| NvrError::Dir {
                dir: parent.to_owned(),
                source,
            })?;
        }
        if cam.output.parent() != Some(cfg.socket_dir.as_path()) {
            eprintln!(
                "nvr_decoder: camera {}: its ring {} is outside {}, so `vramring top {}` will not list it",
                cam.name,
                cam.output.display(),
                cfg.socket_dir.display(),
                cfg.socket_dir.display()
            );
        }
    }
    let nvr = Nvr {
        device: cfg.device,
        display_delay: cfg.display_delay,
        memory: cfg.memory,
    };
    // Every camera's decoder is made here, before any thread starts: a
    // process without NVDEC or a GPU stops now with the reason.
    let mut first = Vec::with_capacity(cfg.cameras.len());
    for cam in &cfg.cameras {
        let spec = DecoderSpec::of(cam, cfg.device, cfg.display_delay);
        let stage = NvdecStage::new(cam, spec, cfg.memory).map_err(|error| NvrError::Camera {
            camera: cam.name.clone(),
            error,
        })?;
        first.push(stage);
    }
    let stats: Vec<Arc<CameraStats>> = cfg.cameras.iter().map(|_| Arc::default()).collect();
    let halt = AtomicBool::new(false);
    let timing = Timing {
        stall: cfg.stall,
        retry: cfg.retry,
    };
    let printer = Printer { json: cli.json };
    let dir = cfg.socket_dir.display().to_string();
    if cli.json {
        emit(
            &Json::event("ready")
                .str("role", "nvr_decoder")
                .u64("cameras", cfg.cameras.len() as u64)
                .str("socket_dir", &dir)
                .u64("device", cfg.device.into())
                .str("memory", cfg.memory.name())
                .finish(),
        );
    } else {
        println!(
            "nvr_decoder: {} cameras on CUDA device {}; rings in {} memory in {dir} (watch them with `vramring top {dir}`)",
            cfg.cameras.len(),
            cfg.device,
            cfg.memory.name()
        );
    }
    let start = Instant::now();
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for ((cam, stage), st) in cfg.cameras.iter().zip(first).zip(&stats) {
            let (nvr, printer, halt) = (&nvr, &printer, &halt);
            let h = std::thread::Builder::new()
                .name(format!("cam-{}", cam.name))
                .spawn_scoped(s, move || {
                    let env = supervisor::Env {
                        cams: nvr,
                        cam,
                        name: &cam.name,
                        stats: st,
                        timing,
                        log: printer,
                        stop: halt,
                    };
                    supervisor::supervise(&env, stage);
                });
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    eprintln!("nvr_decoder: camera {}: cannot start its thread: {e}", cam.name);
                }
            }
        }
        let mut last = Instant::now();
        let mut prev: Vec<u64> = vec![0; stats.len()];
        loop {
            std::thread::sleep(Duration::from_millis(50));
            let timed_out = cli.seconds > 0 && start.elapsed() >= Duration::from_secs(cli.seconds);
            if stop::stop_requested() || timed_out {
                // Relaxed: a flag polled by the camera loops.
                halt.store(true, Ordering::Relaxed);
                break;
            }
            if handles.iter().all(|h| h.is_finished()) {
                break;
            }
            if !cfg.report.is_zero() && last.elapsed() >= cfg.report {
                let dt = last.elapsed().as_secs_f64();
                last = Instant::now();
                for ((cam, st), p) in cfg.cameras.iter().zip(&stats).zip(prev.iter_mut()) {
                    let frames = CameraStats::get(&st.frames);
                    let fps = frames.saturating_sub(*p) as f64 / dt;
                    *p = frames;
                    report(cli.json, "camera", cam, st, fps);
                }
                if cli.json {
                    tick(&stats);
                }
            }
        }
    });
    let secs = start.elapsed().as_secs_f64();
    let mut total = 0;
    for (cam, st) in cfg.cameras.iter().zip(&stats) {
        let frames = CameraStats::get(&st.frames);
        total += frames;
        report(cli.json, "camera-final", cam, st, frames as f64 / secs.max(1e-9));
    }
    if cli.json {
        emit(
            &Json::event("final")
                .str("role", "nvr_decoder")
                .u64("cameras", cfg.cameras.len() as u64)
                .str("memory", cfg.memory.name())
                .u64("frames", total)
                .u64("dropped", stats.iter().map(|s| CameraStats::get(&s.dropped)).sum())
                .f64("seconds", secs)
                .finish(),
        );
    } else {
        println!(
            "nvr_decoder: done: {total} frames from {} cameras in {secs:.1} s",
            cfg.cameras.len()
        );
    }
    Ok(())
}

/// The totals over every camera after a round of status lines, stamped
/// with `CLOCK_MONOTONIC` (the clock of the frames' commit times), so that
/// a bench can take the rates over a window of its choosing.
fn tick(stats: &[Arc<CameraStats>]) {
    let sum = |f: fn(&CameraStats) -> &std::sync::atomic::AtomicU64| -> u64 {
        stats.iter().map(|s| CameraStats::get(f(s))).sum()
    };
    let running = stats.iter().filter(|s| s.state() == supervisor::State::Running).count();
    emit(
        &Json::event("tick")
            .str("role", "nvr_decoder")
            .u64("t_ns", vramring::monotonic_ns())
            .u64("frames", sum(|s| &s.frames))
            .u64("dropped", sum(|s| &s.dropped))
            .u64("resyncs", sum(|s| &s.resyncs))
            .u64("decode_errors", sum(|s| &s.decode_errors))
            .u64("running", running as u64)
            .finish(),
    );
}

/// One camera's status line.
fn report(json: bool, event: &str, cam: &CameraConfig, st: &CameraStats, fps: f64) {
    let g = CameraStats::get;
    let subs = u64::from(st.subscribers.load(Ordering::Relaxed));
    if json {
        emit(
            &Json::event(event)
                .str("camera", &cam.name)
                .str("socket", &cam.output.display().to_string())
                .str("input", &cam.input.describe())
                .str("state", st.state().name())
                .u64("units", g(&st.units))
                .u64("frames", g(&st.frames))
                .f64("fps", fps)
                .u64("subscribers", subs)
                .u64("dropped", g(&st.dropped))
                .u64("resyncs", g(&st.resyncs))
                .u64("input_restarts", g(&st.input_restarts))
                .u64("stalls", g(&st.stalls))
                .u64("skipped", g(&st.skipped))
                .u64("decode_errors", g(&st.decode_errors))
                .u64("decoder_resets", g(&st.decoder_resets))
                .u64("loops", g(&st.loops))
                .u64("panics", g(&st.panics))
                .str("last_error", &st.last_error())
                .finish(),
        );
    } else {
        println!(
            "{:<12} {:<14} {:>8} frames {:>6.1} fps {:>3} subs, {} resyncs, {} input restarts, {} stalls, {} decoder resets",
            cam.name,
            st.state().name(),
            g(&st.frames),
            fps,
            subs,
            g(&st.resyncs),
            g(&st.input_restarts),
            g(&st.stalls),
            g(&st.decoder_resets),
        );
    }
}

/// `--check`: the cameras as understood.
fn print_check(cfg: &Config, json: bool) {
    for cam in &cfg.cameras {
        let line = format!(
            "{}: {} ({}) -> {} ({} slots, {:?}, pull {:?}, up to {} subscribers)",
            cam.name,
            cam.input.describe(),
            cam.codec.name(),
            cam.output.display(),
            cam.ring.slots,
            cam.ring.policy,
            cam.ring.pull,
            cam.ring.max_subscribers
        );
        if json {
            emit(
                &Json::event("camera-config")
                    .str("camera", &cam.name)
                    .str("input", &cam.input.describe())
                    .str("codec", cam.codec.name())
                    .str("socket", &cam.output.display().to_string())
                    .u64("slots", cam.ring.slots.into())
                    .finish(),
            );
        } else {
            println!("{line}");
        }
    }
    let dir: &Path = &cfg.socket_dir;
    if json {
        emit(
            &Json::event("config")
                .u64("cameras", cfg.cameras.len() as u64)
                .str("socket_dir", &dir.display().to_string())
                .u64("device", cfg.device.into())
                .str("memory", cfg.memory.name())
                .finish(),
        );
    } else {
        println!(
            "{} cameras; rings in {} memory in {} (`vramring top {}`)",
            cfg.cameras.len(),
            cfg.memory.name(),
            dir.display(),
            dir.display()
        );
    }
}
