//! The README's first command: one producer and three consumers, each its
//! own process, sharing frames through one socket in a temporary directory.
//!
//! ```text
//! cargo run --release --example demo
//! ```
//!
//! The demo re-executes itself once per role (`demo producer ...`,
//! `demo consumer ...`), so `cargo run --example demo` needs no other
//! binary. The consumers are a `detector` (latest frame), a `recorder`
//! (every frame in order) and a `slow-analytics` reader that spends 30 ms
//! on each frame and so skips most of them. Every consumer checks every
//! frame it gets against the test pattern; the final table shows frame
//! rates, delivery latency, drops, overruns and torn frames (always 0).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use vramring::BackendChoice;

#[path = "common/mod.rs"]
#[allow(dead_code)]
mod common;

use common::JsonLine;

/// One producer and three consumers as separate processes, for a few seconds.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Seconds to run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Memory backend: auto (CUDA when usable, else host), host or cuda.
    #[arg(long, default_value = "auto")]
    backend: BackendChoice,
    /// Frame width.
    #[arg(long, default_value_t = 1920)]
    width: u32,
    /// Frame height.
    #[arg(long, default_value_t = 1080)]
    height: u32,
    /// Frames per second the producer publishes.
    #[arg(long, default_value_t = 60.0)]
    fps: f64,
    /// What the producer publishes: `pattern` (the test pattern, checked by
    /// every consumer) or `clip` (an H.264 clip decoded on the GPU by
    /// `examples/nvdec_producer.rs`, built with `--features nvdec`; needs a
    /// CUDA GPU with NVDEC).
    #[arg(long, default_value = "pattern", value_parser = ["pattern", "clip"])]
    source: String,
    /// The clip `--source clip` decodes (H.264 Annex-B, looped).
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/clip1080.h264"))]
    clip: PathBuf,
    /// Internal: run one role of the demo in this process.
    #[command(subcommand)]
    role: Option<Role>,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// Run the producer (what `examples/producer.rs` runs).
    #[command(hide = true)]
    Producer(common::ProducerArgs),
    /// Run a consumer (what `examples/consumer.rs` runs).
    #[command(hide = true)]
    Consumer(common::ConsumerArgs),
}

fn main() -> std::process::ExitCode {
    common::exit_with(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    common::install_stop_handler();
    match &cli.role {
        Some(Role::Producer(args)) => {
            common::run_producer(args)?;
            Ok(())
        }
        Some(Role::Consumer(args)) => {
            let report = common::run_consumer(args)?;
            if report.torn > 0 {
                return Err(format!("{}: {} torn frames", report.name, report.torn).into());
            }
            Ok(())
        }
        None => run_demo(&cli),
    }
}

/// A child process of the demo, killed if the demo returns early.
struct Proc {
    name: String,
    child: Child,
    status: Option<ExitStatus>,
    last: Option<JsonLine>,
    last_final: Option<JsonLine>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A temporary directory for the socket, removed at the end.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn spawn(name: &str, args: &[String], lines: &mpsc::Sender<(usize, String)>, index: usize) -> std::io::Result<Proc> {
    spawn_exe(&std::env::current_exe()?, name, args, lines, index)
}

fn spawn_exe(
    exe: &Path,
    name: &str,
    args: &[String],
    lines: &mpsc::Sender<(usize, String)>,
    index: usize,
) -> std::io::Result<Proc> {
    let mut child = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no stdout pipe"))?;
    let tx = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send((index, line)).is_err() {
                break;
            }
        }
    });
    Ok(Proc {
        name: name.to_owned(),
        child,
        status: None,
        last: None,
        last_final: None,
    })
}

fn signal(p: &Proc, sig: rustix::process::Signal) {
    if p.status.is_none() {
        let _ = rustix::process::kill_process(rustix::process::Pid::from_child(&p.child), sig);
    }
}

fn run_demo(cli: &Cli) -> Result<(), Box<dyn std::error::Error>> {
    let dir = TempDir(std::env::temp_dir().join(format!("vramring-demo-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0)?;
    let socket = dir.0.join("cam0.sock");
    let backend = common::resolve_backend(cli.backend);
    let backend_arg = match backend {
        BackendChoice::Cuda(n) => format!("cuda:{n}"),
        _ => "host".to_owned(),
    };
    println!(
        "vramring demo: 1 producer + 3 consumers, separate processes, {}x{} NV12 at {} fps on the {} backend, {} s",
        cli.width, cli.height, cli.fps, backend_arg, cli.seconds
    );
    println!("socket: {}", socket.display());
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let s = |p: &Path| p.display().to_string();
    let producer_args = vec![
        "producer".into(),
        "--socket".into(),
        s(&socket),
        "--backend".into(),
        backend_arg,
        "--width".into(),
        cli.width.to_string(),
        "--height".into(),
        cli.height.to_string(),
        "--fps".into(),
        cli.fps.to_string(),
        "--slots".into(),
        "8".into(),
        "--report-ms".into(),
        "250".into(),
        "--json".into(),
    ];
    let clip = cli.source == "clip";
    let mut procs = if clip {
        // The NVDEC producer, a sibling binary: the decoded clip, looped.
        let exe = std::env::current_exe()?.with_file_name("nvdec_producer");
        if !exe.exists() {
            return Err(format!(
                "--source clip needs {}: build it with `cargo build --release --features nvdec --example nvdec_producer`",
                exe.display()
            )
            .into());
        }
        println!(
            "source: {} decoded by NVDEC (frames are real video: consumers skip the pattern check)",
            cli.clip.display()
        );
        let args: Vec<String> = vec![
            "--socket".into(),
            s(&socket),
            "--input".into(),
            s(&cli.clip),
            "--fps".into(),
            cli.fps.to_string(),
            "--loops".into(),
            "0".into(),
            "--report-ms".into(),
            "250".into(),
            "--json".into(),
        ];
        vec![spawn_exe(&exe, "producer", &args, &tx, 0)?]
    } else {
        vec![spawn("producer", &producer_args, &tx, 0)?]
    };
    wait_ready(&rx, &mut procs, Duration::from_secs(10))?;
    // The detector asks for push delivery: the producer copies each frame
    // into the detector's own buffers, so the detector does no GPU work to
    // receive it.
    let consumers: [(&str, &str, u64, bool); 3] = [
        ("detector", "latest", 0, true),
        ("recorder", "sequential", 0, false),
        ("slow-analytics", "latest", 30_000, false),
    ];
    for (name, mode, delay_us, push) in consumers {
        let mut args: Vec<String> = vec![
            "consumer".into(),
            "--socket".into(),
            s(&socket),
            "--name".into(),
            name.into(),
            "--mode".into(),
            mode.into(),
            "--delay-us".into(),
            delay_us.to_string(),
            "--report-ms".into(),
            "250".into(),
            "--json".into(),
        ];
        if push {
            args.push("--push".into());
        }
        if clip {
            args.push("--no-verify".into());
        }
        let index = procs.len();
        procs.push(spawn(name, &args, &tx, index)?);
    }
    drop(tx);

    let tty = std::io::stdout().is_terminal();
    let start = Instant::now();
    let run_for = Duration::from_secs_f64(cli.seconds.max(0.1));
    let mut drawn = 0usize;
    let mut next_draw = Instant::now();
    // None: running; Some((stage, deadline)): stage 1 after asking the
    // producer to stop, stage 2 after asking everyone.
    let mut stopping: Option<(u8, Instant)> = None;
    loop {
        while let Ok((k, line)) = rx.recv_timeout(Duration::from_millis(20)) {
            record(&mut procs[k], &line);
        }
        for p in procs.iter_mut().filter(|p| p.status.is_none()) {
            p.status = p.child.try_wait()?;
        }
        if Instant::now() >= next_draw && stopping.is_none() {
            drawn = draw_status(&procs, start, tty, drawn);
            next_draw = Instant::now() + Duration::from_millis(if tty { 250 } else { 1000 });
        }
        if procs.iter().all(|p| p.status.is_some()) {
            break;
        }
        match stopping {
            None if start.elapsed() >= run_for || common::stop_requested() => {
                // The producer closes the ring; the consumers see it go
                // away, print their summaries and exit.
                signal(&procs[0], rustix::process::Signal::INT);
                stopping = Some((1, Instant::now() + Duration::from_secs(10)));
            }
            Some((1, deadline)) if Instant::now() >= deadline => {
                for p in &procs {
                    signal(p, rustix::process::Signal::TERM);
                }
                stopping = Some((2, Instant::now() + Duration::from_secs(5)));
            }
            // Still running: give up; dropping a `Proc` kills it.
            Some((_, deadline)) if Instant::now() >= deadline => break,
            _ => {}
        }
    }
    // Whatever the children printed last.
    while let Ok((k, line)) = rx.recv_timeout(Duration::from_millis(100)) {
        record(&mut procs[k], &line);
    }
    print_final(&procs, clip)
}

fn record(p: &mut Proc, line: &str) {
    match JsonLine::parse(line) {
        Some(j) if j.get("event") == Some("final") => p.last_final = Some(j),
        Some(j) => p.last = Some(j),
        None => println!("[{}] {line}", p.name),
    }
}

fn wait_ready(
    rx: &mpsc::Receiver<(usize, String)>,
    procs: &mut [Proc],
    timeout: Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok((k, line)) = rx.recv_timeout(Duration::from_millis(50)) {
            let ready = JsonLine::parse(&line).is_some_and(|j| j.get("event") == Some("ready"));
            record(&mut procs[k], &line);
            if ready {
                return Ok(());
            }
        }
        if let Some(status) = procs[0].child.try_wait()? {
            procs[0].status = Some(status);
            return Err(format!("the producer exited before it was ready ({status})").into());
        }
    }
    Err("the producer did not start within 10 s".into())
}

fn status_line(p: &Proc) -> String {
    let Some(j) = &p.last else {
        return format!("{:<15} starting", p.name);
    };
    let f = |k: &str| j.f64(k).unwrap_or(0.0);
    let u = |k: &str| j.u64(k).unwrap_or(0);
    if j.get("role") == Some("producer") {
        match j.get("event") {
            Some("status") => format!(
                "{:<15} published {:>7}  {:>7.1} fps  {} subscribers",
                p.name,
                u("published"),
                f("fps"),
                u("subscribers")
            ),
            _ => format!("{:<15} ready ({} backend)", p.name, j.get("backend").unwrap_or("?")),
        }
    } else {
        match j.get("event") {
            Some("status") => format!(
                "{:<15} received  {:>7}  {:>7.1} fps  p50 {:>8.1} us  p99 {:>8.1} us  dropped {:>6}  overruns {:>3}  torn {}",
                p.name,
                u("delivered"),
                f("fps"),
                f("p50_us"),
                f("p99_us"),
                u("dropped"),
                u("overruns"),
                u("torn")
            ),
            _ => format!("{:<15} connected ({})", p.name, j.get("mode").unwrap_or("?")),
        }
    }
}

fn draw_status(procs: &[Proc], start: Instant, tty: bool, drawn: usize) -> usize {
    let mut out = std::io::stdout().lock();
    if tty && drawn > 0 {
        // Move back over the previous block and redraw it in place.
        let _ = write!(out, "\x1b[{drawn}A");
    }
    let mut lines = vec![format!("--- {:>5.1} s", start.elapsed().as_secs_f64())];
    lines.extend(procs.iter().map(status_line));
    for l in &lines {
        if tty {
            let _ = writeln!(out, "\x1b[2K{l}");
        } else {
            let _ = writeln!(out, "{l}");
        }
    }
    let _ = out.flush();
    lines.len()
}

fn print_final(procs: &[Proc], clip: bool) -> Result<(), Box<dyn std::error::Error>> {
    println!();
    println!(
        "{:<15} {:>10} {:>9} {:>10} {:>10} {:>9} {:>9} {:>5}  exit",
        "process", "frames", "fps", "p50 us", "p99 us", "dropped", "overruns", "torn"
    );
    let mut problems = Vec::new();
    let mut summary: BTreeMap<&str, u64> = BTreeMap::new();
    for p in procs {
        let exit = p.status.map_or("running".to_owned(), |s| s.to_string());
        if !p.status.is_some_and(|s| s.success()) {
            problems.push(format!("{} exited with {exit}", p.name));
        }
        let Some(j) = &p.last_final else {
            println!("{:<15} (no summary)  {exit}", p.name);
            problems.push(format!("{} printed no summary", p.name));
            continue;
        };
        let f = |k: &str| j.f64(k).unwrap_or(0.0);
        let u = |k: &str| j.u64(k).unwrap_or(0);
        if j.get("role") == Some("producer") {
            println!(
                "{:<15} {:>10} {:>9.1} {:>10} {:>10} {:>9} {:>9} {:>5}  {exit}",
                p.name,
                u("published"),
                f("fps"),
                "-",
                "-",
                "-",
                "-",
                "-"
            );
        } else {
            println!(
                "{:<15} {:>10} {:>9.1} {:>10.1} {:>10.1} {:>9} {:>9} {:>5}  {exit}",
                p.name,
                u("delivered"),
                f("fps"),
                f("p50_us"),
                f("p99_us"),
                u("dropped"),
                u("overruns"),
                u("torn")
            );
            *summary.entry("torn").or_default() += u("torn");
            if u("delivered") == 0 {
                problems.push(format!("{} received no frame", p.name));
            }
        }
    }
    println!();
    println!("frames: the producer's published count, each consumer's verified count; latency = time from commit to delivery");
    let torn = summary.get("torn").copied().unwrap_or(0);
    if torn > 0 {
        problems.push(format!("{torn} torn frames"));
    }
    if problems.is_empty() && clip {
        println!("frames are decoded video, not pattern-checked here (tests/gpu_nvdec.rs proves them bit-exact)");
        Ok(())
    } else if problems.is_empty() {
        println!("every delivered frame verified: torn = 0");
        Ok(())
    } else {
        Err(problems.join("; ").into())
    }
}
