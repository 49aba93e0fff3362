//! The consumer example's loop: its arguments, how it connects and reads,
//! the latency it measures, and its report.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use vramring::ClientOptions;
use vramring::{
    monotonic_ns, BackendKind, Delivery, Error as RingError, Frame, Mode, PullStart, Subscriber, SubscriberOptions,
    WaitStrategy,
};
use vramring_testkit::gpu::{verify_cuda, GpuTestPattern};
use vramring_testkit::json::{emit, Json};
use vramring_testkit::pattern::{self as testpattern, PatternError};
use vramring_testkit::percentile_of;

use super::{stop_requested, AnyResult};

/// The consumer's read mode, as typed on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// Jump to the newest frame.
    Latest,
    /// Every frame in order; gaps counted.
    Sequential,
}

/// How frames reach the consumer, as typed on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeliveryArg {
    /// Pull where the publisher hands out its pool, push where it does not.
    Auto,
    /// Pull only.
    Pull,
    /// Push only.
    Push,
}

/// When a CUDA pull copy starts, as typed on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PullStartArg {
    /// Queued on the GPU under MPS, after the commit otherwise.
    Auto,
    /// Queued on the GPU behind the commit, as soon as the slot is loaned
    /// or the commit announced.
    Queued,
    /// After the commit has landed.
    AfterCommit,
}

/// How a consumer waits for the next frame, as typed on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WaitArg {
    /// Learn the publisher's cadence and spin only when a frame is due
    /// (the library's default).
    Cadence,
    /// Spin briefly, then park on the futex.
    Park,
    /// Busy-poll (one core).
    Spin,
}

/// Arguments of the consumer.
#[derive(Debug, Clone, clap::Args)]
pub struct ConsumerArgs {
    /// Socket path of the publisher.
    #[arg(long)]
    pub socket: PathBuf,
    /// latest (jump to the newest frame) or sequential (every frame, gaps counted).
    #[arg(long, value_enum, default_value_t = ModeArg::Latest)]
    pub mode: ModeArg,
    /// Ask to be a lossless reader (the producer must use --policy lossless).
    #[arg(long)]
    pub lossless: bool,
    /// How frames arrive: auto (pull where the publisher hands out its
    /// pool, push where it does not), pull, or push (the publisher copies
    /// frames into this consumer's own buffers, so it does no GPU work to
    /// receive them; any mode).
    #[arg(long, value_enum, default_value_t = DeliveryArg::Auto)]
    pub delivery: DeliveryArg,
    /// Short for --delivery push.
    #[arg(long, conflicts_with = "delivery")]
    pub push: bool,
    /// Buffers of a sequential or lossless push consumer's queue.
    #[arg(long, default_value_t = SubscriberOptions::default().push_buffers)]
    pub push_buffers: u32,
    /// Follow the publisher across restarts: when it goes away, wait for
    /// the next instance at the same socket instead of ending.
    #[arg(long)]
    pub reconnect: bool,
    /// Name shown by the publisher.
    #[arg(long, default_value = "consumer")]
    pub name: String,
    /// Frames to read; 0 reads until the producer goes away or Ctrl-C.
    #[arg(long, default_value_t = 0)]
    pub frames: u64,
    /// How long to wait for the publisher to appear, and for each frame.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
    /// Skip the test-pattern check (the frames are real video, e.g. from
    /// `examples/nvdec_producer.rs`); torn frames are then not detected.
    #[arg(long)]
    pub no_verify: bool,
    /// Artificial work per frame, in microseconds (a slow detector).
    #[arg(long, default_value_t = 0)]
    pub delay_us: u64,
    /// Before each read, park until this many microseconds before the wait
    /// would start spinning for the frame (`Subscriber::park_until_due`),
    /// as a reader with work to prepare per frame does; 0: do not.
    #[arg(long, default_value_t = 0)]
    pub prepare_ahead_us: u64,
    /// Print a status line this often (0: only the final summary).
    #[arg(long, default_value_t = 1000)]
    pub report_ms: u64,
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// When a pull copy of a CUDA frame starts: auto (queued on the GPU
    /// under MPS), queued, or after-commit.
    #[arg(long, value_enum, default_value_t = PullStartArg::Auto)]
    pub pull_start: PullStartArg,
    /// How to wait for each frame.
    #[arg(long, value_enum, default_value_t = WaitArg::Cadence)]
    pub wait: WaitArg,
    /// Longest single sleep on the futex, in ms, between looks at the
    /// socket (`SubscriberOptions::park_slice`; the library's default is
    /// 20).
    #[arg(long)]
    pub park_slice_ms: Option<u64>,
}

/// Latency samples in nanoseconds: every sample up to a cap, then a uniform
/// reservoir, so a consumer that runs for days keeps bounded memory.
#[derive(Debug, Clone)]
pub struct Latencies {
    samples: Vec<u64>,
    seen: u64,
    max: u64,
    rng: u64,
}

const RESERVOIR: usize = 1 << 20;

impl Default for Latencies {
    fn default() -> Self {
        Latencies {
            samples: Vec::new(),
            seen: 0,
            max: 0,
            rng: 0x9E37_79B9_7F4A_7C15,
        }
    }
}

impl Latencies {
    /// Records one sample.
    pub fn record(&mut self, ns: u64) {
        self.seen += 1;
        self.max = self.max.max(ns);
        if self.samples.len() < RESERVOIR {
            self.samples.push(ns);
            return;
        }
        // xorshift64: cheap and good enough to pick a slot to replace.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let k = self.rng % self.seen;
        if let Some(s) = self.samples.get_mut(k as usize) {
            *s = ns;
        }
    }
    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.seen
    }
    /// The largest sample.
    pub fn max(&self) -> u64 {
        self.max
    }
    /// The `p`-th percentile (0..=100), nearest rank; 0 with no samples.
    pub fn percentile(&self, p: f64) -> u64 {
        let mut v = self.samples.clone();
        percentile_of(&mut v, p)
    }
    /// Forgets every sample.
    pub fn clear(&mut self) {
        self.samples.clear();
        self.seen = 0;
        self.max = 0;
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// What a consumer run saw.
#[derive(Debug, Clone, Default)]
pub struct ConsumerReport {
    /// The consumer's name.
    pub name: String,
    /// Frames delivered (each one verified).
    pub delivered: u64,
    /// Frames skipped (gaps), from the subscriber's stats.
    pub dropped: u64,
    /// The frames the delivered frames said were lost before them (the sum
    /// of their `skipped`); `dropped` less this is what was lost after the
    /// last one.
    pub skipped: u64,
    /// What the first delivered frame said was lost before it.
    pub first_skipped: u64,
    /// Reads discarded because the producer overwrote the slot mid-copy.
    pub overruns: u64,
    /// Delivered frames that failed the pattern check. Must be 0.
    pub torn: u64,
    /// Seq of the first frame delivered.
    pub first_seq: u64,
    /// Seq of the last frame delivered.
    pub last_seq: u64,
    /// Seconds from the first frame to the last.
    pub seconds: f64,
    /// Delivery latency (now minus the frame's commit time), ns.
    pub latency: Latencies,
    /// Why the run ended.
    pub end: &'static str,
    /// Times the publisher went away (with `--reconnect`, the consumer then
    /// followed it to the next instance).
    pub producer_gone: u64,
    /// Frames pulled by a copy queued on the GPU behind the commit.
    pub queued: u64,
    /// Of those, the copies queued at the publisher's loan (ADR 0014).
    pub queued_at_loan: u64,
    /// Queued copies set aside because their commit never landed.
    pub abandoned: u64,
    /// What queued copies wait on: `pool` (the gate word in device memory,
    /// ADR 0011), `host` (`global_seq` in host memory, ADR 0010) or `none`
    /// (copies start after the commit).
    pub gate: &'static str,
    /// How frames arrived: `pull` or `push`.
    pub delivery: &'static str,
    /// Frames received by push delivery.
    pub pushed: u64,
    /// The cadence wait: spin windows planned, frames caught in one,
    /// windows that ended without their frame, frames that came before
    /// their window's spin began.
    pub cadence: [u64; 4],
}

impl ConsumerReport {
    /// Frames delivered per second.
    pub fn fps(&self) -> f64 {
        if self.seconds > 0.0 && self.delivered > 1 {
            (self.delivered - 1) as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// The final JSON line.
    pub fn to_json(&self) -> String {
        Json::event("final")
            .str("role", "consumer")
            .str("name", &self.name)
            .u64("delivered", self.delivered)
            .u64("dropped", self.dropped)
            .u64("skipped", self.skipped)
            .u64("first_skipped", self.first_skipped)
            .u64("overruns", self.overruns)
            .u64("torn", self.torn)
            .u64("first_seq", self.first_seq)
            .u64("last_seq", self.last_seq)
            .f64("seconds", self.seconds)
            .f64("fps", self.fps())
            .f64("p50_us", us(self.latency.percentile(50.0)))
            .f64("p99_us", us(self.latency.percentile(99.0)))
            .f64("max_us", us(self.latency.max()))
            .str("end", self.end)
            .u64("producer_gone", self.producer_gone)
            .u64("queued", self.queued)
            .u64("queued_at_loan", self.queued_at_loan)
            .u64("abandoned", self.abandoned)
            .str("gate", self.gate)
            .str("delivery", self.delivery)
            .u64("pushed", self.pushed)
            .u64("cadence_windows", self.cadence[0])
            .u64("cadence_hits", self.cadence[1])
            .u64("cadence_misses", self.cadence[2])
            .u64("cadence_early", self.cadence[3])
            .finish()
    }
}

/// Checks that `frame` carries the pattern of its seq. The outer error is
/// "could not check"; the inner one is a torn or wrong frame.
pub fn verify_frame(gpu: Option<&GpuTestPattern>, frame: &Frame<'_>) -> AnyResult<Result<(), PatternError>> {
    match (frame.host_bytes(), gpu) {
        (Some(bytes), _) => Ok(testpattern::verify(bytes, frame.seq())),
        (None, Some(gpu)) => Ok(verify_cuda(gpu, frame)?),
        (None, None) => Err("a GPU frame needs the GPU pattern kernels".into()),
    }
}

fn connect_with_retry(args: &ConsumerArgs, opts: SubscriberOptions) -> AnyResult<Subscriber> {
    let deadline = Instant::now() + Duration::from_millis(args.timeout_ms);
    loop {
        match Subscriber::connect(&args.socket, opts.clone()) {
            Ok(sub) => return Ok(sub),
            // Nothing listens yet: the producer may still be starting.
            Err(RingError::Io { .. }) if Instant::now() < deadline && !stop_requested() => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads and verifies frames as `args` says until the frame count is
/// reached, the producer goes away, no frame comes within the timeout
/// (after the first), or a stop signal arrives.
///
/// # Errors
/// Connection errors, no first frame within the timeout, or a check that
/// could not run. Torn frames are counted in the report, not errors.
pub fn run_consumer(args: &ConsumerArgs) -> AnyResult<ConsumerReport> {
    let mode = match args.mode {
        ModeArg::Latest => Mode::Latest,
        ModeArg::Sequential => Mode::Sequential,
    };
    let mut opts = SubscriberOptions::default()
        .name(args.name.clone())
        .mode(mode)
        .lossless(args.lossless)
        .delivery(match (args.push, args.delivery) {
            (true, _) | (_, DeliveryArg::Push) => Delivery::Push,
            (_, DeliveryArg::Pull) => Delivery::Pull,
            (_, DeliveryArg::Auto) => Delivery::Auto,
        })
        .push_buffers(args.push_buffers)
        .reconnect(args.reconnect)
        .pull_start(match args.pull_start {
            PullStartArg::Auto => PullStart::Auto,
            PullStartArg::Queued => PullStart::Queued,
            PullStartArg::AfterCommit => PullStart::AfterCommit,
        })
        .wait(match args.wait {
            WaitArg::Cadence => WaitStrategy::Cadence,
            WaitArg::Park => WaitStrategy::Park,
            WaitArg::Spin => WaitStrategy::Spin,
        });
    if let Some(ms) = args.park_slice_ms {
        opts.client.park_slice = Duration::from_millis(ms.max(1));
    }
    let mut sub = connect_with_retry(args, opts)?;
    let gpu = match sub.backend() {
        BackendKind::Cuda => Some(GpuTestPattern::for_uuid(sub.info().device_uuid())?),
        _ => None,
    };
    let mode_name = if args.lossless { "lossless" } else { args.mode_name() };
    if args.json {
        emit(
            &Json::event("ready")
                .str("role", "consumer")
                .str("name", &args.name)
                .str("mode", mode_name)
                .str("backend", sub.backend().name())
                .finish(),
        );
    } else {
        emit(&format!(
            "{}: connected ({mode_name}, {} backend) to {}",
            args.name,
            sub.backend().name(),
            args.socket.display()
        ));
    }
    let timeout = Duration::from_millis(args.timeout_ms);
    let mut report = ConsumerReport {
        name: args.name.clone(),
        end: "frames",
        ..Default::default()
    };
    let mut window = Latencies::default();
    let mut first_at = None;
    let mut last_at = Instant::now();
    let mut report_due = Instant::now() + Duration::from_millis(args.report_ms.max(1));
    let mut window_start = (Instant::now(), 0u64);
    while args.frames == 0 || report.delivered < args.frames {
        if stop_requested() {
            report.end = "signal";
            break;
        }
        if args.prepare_ahead_us > 0 {
            sub.park_until_due(Duration::from_micros(args.prepare_ahead_us), timeout);
        }
        let frame = match sub.next(timeout) {
            Ok(frame) => frame,
            Err(RingError::ProducerGone { .. }) if args.reconnect => {
                report.producer_gone += 1;
                continue;
            }
            // Waiting for the next publisher instance to come up.
            Err(RingError::Timeout(..)) if args.reconnect && report.producer_gone > 0 => continue,
            Err(RingError::ProducerGone { .. }) => {
                report.end = "producer gone";
                break;
            }
            Err(RingError::Timeout(..)) if report.delivered > 0 => {
                report.end = "timeout";
                break;
            }
            Err(e) => return Err(e.into()),
        };
        let latency = monotonic_ns().saturating_sub(frame.commit_ns());
        let (seq, skipped) = (frame.seq(), frame.skipped());
        let checked = if args.no_verify {
            Ok(())
        } else {
            verify_frame(gpu.as_ref(), &frame)?
        };
        last_at = Instant::now();
        first_at.get_or_insert(last_at);
        if report.delivered == 0 {
            report.first_seq = seq;
            report.first_skipped = skipped;
        }
        report.skipped += skipped;
        report.delivered += 1;
        report.last_seq = seq;
        report.latency.record(latency);
        window.record(latency);
        if let Err(e) = checked {
            report.torn += 1;
            eprintln!("{}: TORN frame {seq}: {e}", args.name);
        }
        if args.delay_us > 0 {
            std::thread::sleep(Duration::from_micros(args.delay_us));
        }
        if args.report_ms > 0 && Instant::now() >= report_due {
            let now = Instant::now();
            let stats = sub.stats();
            let fps = (report.delivered - window_start.1) as f64 / (now - window_start.0).as_secs_f64();
            let (p50, p99) = (us(window.percentile(50.0)), us(window.percentile(99.0)));
            if args.json {
                emit(
                    &Json::event("status")
                        .str("role", "consumer")
                        .str("name", &args.name)
                        .u64("delivered", report.delivered)
                        .f64("fps", fps)
                        .f64("p50_us", p50)
                        .f64("p99_us", p99)
                        .u64("dropped", stats.dropped)
                        .u64("overruns", stats.overruns)
                        .u64("torn", report.torn)
                        .u64("producer_gone", report.producer_gone)
                        .finish(),
                );
            } else {
                emit(&format!(
                    "{}: {} frames, {fps:.1} fps, latency p50 {p50:.1} us p99 {p99:.1} us, dropped {}, overruns {}, torn {}",
                    args.name, report.delivered, stats.dropped, stats.overruns, report.torn
                ));
            }
            window.clear();
            window_start = (now, report.delivered);
            report_due = now + Duration::from_millis(args.report_ms);
        }
    }
    let stats = sub.stats();
    report.dropped = stats.dropped;
    report.overruns = stats.overruns;
    report.queued = stats.queued;
    report.pushed = stats.pushed;
    report.delivery = match stats.delivery {
        Delivery::Push => "push",
        _ => "pull",
    };
    report.gate = match (sub.pull_queued(), sub.info().gate_offset()) {
        (false, _) => "none",
        (true, Some(_)) => "pool",
        (true, None) => "host",
    };
    report.seconds = first_at.map_or(0.0, |f| (last_at - f).as_secs_f64());
    let c = sub.cadence();
    report.cadence = [c.windows, c.hits, c.misses, c.early];
    if let Err(e) = sub.close() {
        eprintln!("{}: close: {e}", args.name);
    }
    let stats = sub.stats();
    report.queued_at_loan = stats.queued_at_loan;
    report.abandoned = stats.abandoned;
    if args.json {
        emit(&report.to_json());
    } else {
        emit(&format!(
            "{}: {} frames ({} .. {}), {:.1} fps, latency p50 {:.1} us p99 {:.1} us max {:.1} us, dropped {}, overruns {}, torn {} (ended: {})",
            report.name,
            report.delivered,
            report.first_seq,
            report.last_seq,
            report.fps(),
            us(report.latency.percentile(50.0)),
            us(report.latency.percentile(99.0)),
            us(report.latency.max()),
            report.dropped,
            report.overruns,
            report.torn,
            report.end
        ));
    }
    Ok(report)
}

impl ConsumerArgs {
    fn mode_name(&self) -> &'static str {
        match self.mode {
            ModeArg::Latest => "latest",
            ModeArg::Sequential => "sequential",
        }
    }
}
