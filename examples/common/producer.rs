//! The producer example's loop: its arguments, the ring it makes, the
//! frames it publishes at its pace, and its report.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use vramring::cuda::CommitGraph;
use vramring::{
    AccessPolicy, AttachRate, BackendChoice, BackendKind, Error as RingError, Format, FrameMeta, LosslessBackoff,
    Policy, Publisher, PullAccess, RingConfig, ServeConfig, ServeOptions, UidAccess,
};
use vramring_testkit::gpu::{fill_cuda, GpuTestPattern};
use vramring_testkit::json::{emit, Json};
use vramring_testkit::pattern as testpattern;

use super::{resolve_backend, stop_requested, AnyResult};

/// The producer's policy, as typed on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyArg {
    /// Never wait; slow readers lose frames.
    Overwrite,
    /// Wait for lossless readers.
    Lossless,
}

/// Arguments of the producer.
#[derive(Debug, Clone, clap::Args)]
pub struct ProducerArgs {
    /// Socket path to serve subscribers on.
    #[arg(long)]
    pub socket: PathBuf,
    /// Memory backend: host, cuda, cuda:N or auto (CUDA when usable, else host).
    #[arg(long, default_value = "auto")]
    pub backend: BackendChoice,
    /// Pixel format (nv12, p010, gray8, rgb8, rgba8, raw).
    #[arg(long, default_value = "nv12")]
    pub format: Format,
    /// Frame width in pixels.
    #[arg(long, default_value_t = 1920)]
    pub width: u32,
    /// Frame height in rows.
    #[arg(long, default_value_t = 1080)]
    pub height: u32,
    /// Slots in the ring (a power of two).
    #[arg(long, default_value_t = 16)]
    pub slots: u32,
    /// Frames per second; 0 publishes as fast as possible.
    #[arg(long, default_value_t = 30.0)]
    pub fps: f64,
    /// Frames to publish; 0 runs until Ctrl-C.
    #[arg(long, default_value_t = 0)]
    pub frames: u64,
    /// overwrite (live video) or lossless (wait for lossless subscribers).
    #[arg(long, value_enum, default_value_t = PolicyArg::Overwrite)]
    pub policy: PolicyArg,
    /// Evict a lossless subscriber that holds a frame longer than this.
    #[arg(long, default_value_t = ServeConfig::default().lossless_lease.as_millis() as u64)]
    pub lossless_lease_ms: u64,
    /// Subscribers connected at once (the subscriber table's entries).
    #[arg(long, default_value_t = ServeConfig::default().max_subscribers)]
    pub max_subscribers: u32,
    /// Who receives the pool (pull delivery): auto (anyone on the host
    /// backend, this process's uid on CUDA), anyone, nobody (push only), or
    /// uids=UID[,UID...]; the others are served by push.
    #[arg(long, default_value = "auto", value_parser = parse_pull_access)]
    pub pull: PullAccess,
    /// Who may read lossless: anyone, nobody, or uids=UID[,UID...]; the
    /// others are refused (REJECT_POLICY) and may connect without lossless.
    #[arg(long, default_value = "anyone", value_parser = parse_uid_access)]
    pub lossless_access: UidAccess,
    /// How long a uid whose lossless reader was evicted for the lease is
    /// refused lossless the first time (doubled per repeat up to
    /// --lossless-backoff-cap-ms); 0: never refused.
    #[arg(long, default_value_t = LosslessBackoff::DEFAULT.base.as_millis() as u64)]
    pub lossless_backoff_ms: u64,
    /// The longest lossless back-off.
    #[arg(long, default_value_t = LosslessBackoff::DEFAULT.cap.as_millis() as u64)]
    pub lossless_backoff_cap_ms: u64,
    /// How long one loan waits for lossless subscribers before it gives up
    /// (and is retried; the lease runs on across retries).
    #[arg(long, default_value_t = 500)]
    pub loan_timeout_ms: u64,
    /// Grant write access to the pool to subscribers that ask for it.
    #[arg(long)]
    pub allow_write: bool,
    /// The socket file's mode, in octal (who may connect at all).
    #[arg(long, default_value = "660", value_parser = parse_octal)]
    pub socket_mode: u32,
    /// Only these uids may subscribe (repeatable; with --allow-gid, either
    /// list admits). None given: anyone the socket mode lets in.
    #[arg(long = "allow-uid")]
    pub allow_uids: Vec<u32>,
    /// Only these gids may subscribe (repeatable).
    #[arg(long = "allow-gid")]
    pub allow_gids: Vec<u32>,
    /// Push subscribers' buffers taken per second once the burst is spent
    /// (ADR 0020; 0: every Attach at once, for trusted subscribers only).
    #[arg(long, default_value_t = AttachRate::DEFAULT.per_second)]
    pub attach_rate: u32,
    /// Push subscribers' buffers taken at once after a quiet spell.
    #[arg(long, default_value_t = AttachRate::DEFAULT.burst)]
    pub attach_burst: u32,
    /// CUDA rings: when push commits replay the commit graph instead of
    /// launching the commit kernel (auto, always, never).
    #[arg(long, default_value = "auto", env = "VRAMRING_COMMIT_GRAPH")]
    pub commit_graph: CommitGraph,
    /// Wait for this many subscribers before publishing the first frame.
    #[arg(long, default_value_t = 0)]
    pub wait_subscribers: u32,
    /// Print a status line this often (0: only the final summary).
    #[arg(long, default_value_t = 1000)]
    pub report_ms: u64,
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What a producer run did.
#[derive(Debug, Clone, Default)]
pub struct ProducerReport {
    /// Frames published.
    pub published: u64,
    /// Seconds from the first loan to the last publish.
    pub seconds: f64,
    /// Subscribers that connected.
    pub connects: u64,
    /// Lossless subscribers evicted.
    pub evictions: u64,
    /// Loans that waited for a lossless subscriber.
    pub lossless_waits: u64,
    /// Loans that gave up waiting for a lossless subscriber (retried).
    pub loans_blocked: u64,
    /// Lease deadlines that evicted lossless subscribers.
    pub lease_deadlines: u64,
    /// Lossless Hellos refused for their uid's back-off.
    pub lossless_backoffs: u64,
    /// Push subscribers' buffers taken, and Attaches that waited for the
    /// attach rate (taken in the end or not).
    pub attaches: u64,
    pub attaches_deferred: u64,
}

impl ProducerReport {
    /// Frames per second over the run.
    pub fn fps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.published as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// `--pull`, `--lossless-access`: `anyone`, `nobody` or `uids=UID[,UID...]`.
fn parse_uid_access(s: &str) -> Result<UidAccess, String> {
    match s {
        "anyone" => Ok(UidAccess::Anyone),
        "nobody" => Ok(UidAccess::Nobody),
        _ => {
            let list = s
                .strip_prefix("uids=")
                .ok_or_else(|| format!("{s:?} is not anyone, nobody or uids=UID[,UID...]"))?;
            let uids = list
                .split(',')
                .map(|u| u.trim().parse::<u32>().map_err(|e| format!("uid {u:?}: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(UidAccess::Uids(uids))
        }
    }
}

/// `--pull`: `auto`, `anyone`, `nobody` or `uids=UID[,UID...]`.
fn parse_pull_access(s: &str) -> Result<PullAccess, String> {
    Ok(match parse_uid_access(s) {
        Ok(UidAccess::Anyone) => PullAccess::Anyone,
        Ok(UidAccess::Nobody) => PullAccess::Nobody,
        Ok(UidAccess::Uids(list)) => PullAccess::Uids(list),
        Err(_) if s == "auto" => PullAccess::Auto,
        Err(e) => return Err(format!("{e}, or auto")),
    })
}

/// `--socket-mode`: an octal file mode such as `660`.
fn parse_octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8).map_err(|e| format!("{s:?} is not an octal mode: {e}"))
}

/// Publishes frames as `args` says until the frame count is reached or a
/// stop signal arrives.
///
/// # Errors
/// Publisher creation, loan or publish errors.
pub fn run_producer(args: &ProducerArgs) -> AnyResult<ProducerReport> {
    let backend = resolve_backend(args.backend);
    let policy = match args.policy {
        PolicyArg::Overwrite => Policy::Overwrite,
        PolicyArg::Lossless => Policy::Lossless,
    };
    let cfg = RingConfig::new(args.format, args.width, args.height)
        .slots(args.slots)
        .policy(policy)
        .backend(backend)
        .commit_graph(args.commit_graph)
        .allow_write(args.allow_write)
        .pull(args.pull.clone())
        .lossless_lease(Duration::from_millis(args.lossless_lease_ms))
        .lossless_access(args.lossless_access.clone())
        .max_subscribers(args.max_subscribers)
        .socket_mode(args.socket_mode)
        .access(AccessPolicy {
            uids: args.allow_uids.clone(),
            gids: args.allow_gids.clone(),
        });
    let cfg = if args.attach_rate == 0 {
        cfg.unbounded_attaches()
    } else {
        cfg.attach_rate(args.attach_rate, args.attach_burst)
    };
    let cfg = if args.lossless_backoff_ms == 0 {
        cfg.no_lossless_backoff()
    } else {
        let base = Duration::from_millis(args.lossless_backoff_ms);
        cfg.lossless_backoff(LosslessBackoff {
            base,
            cap: Duration::from_millis(args.lossless_backoff_cap_ms).max(base),
            ..LosslessBackoff::DEFAULT
        })
    };
    let mut publisher = Publisher::create(&args.socket, cfg)?;
    let frame_bytes = publisher.geometry().frame_bytes;
    let kind = publisher.backend();
    let gpu = match kind {
        BackendKind::Cuda => Some(GpuTestPattern::for_uuid(publisher.info().device_uuid())?),
        _ => None,
    };
    if args.json {
        emit(
            &Json::event("ready")
                .str("role", "producer")
                .str("socket", &args.socket.display().to_string())
                .str("backend", kind.name())
                .str("format", args.format.name())
                .u64("width", args.width.into())
                .u64("height", args.height.into())
                .u64("slots", args.slots.into())
                .u64("frame_bytes", frame_bytes)
                .finish(),
        );
    } else {
        emit(&format!(
            "producer: {} {}x{} ({} bytes a frame), {} slots, {:?}, {} backend, at {}",
            args.format.name(),
            args.width,
            args.height,
            frame_bytes,
            args.slots,
            policy,
            kind.name(),
            args.socket.display()
        ));
    }
    while publisher.stats().subscribers < args.wait_subscribers {
        if stop_requested() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let period = (args.fps > 0.0).then(|| Duration::from_secs_f64(1.0 / args.fps));
    let start = Instant::now();
    let mut next_due = start;
    let mut report_due = start + Duration::from_millis(args.report_ms.max(1));
    let mut report = ProducerReport::default();
    let mut last_report = (start, 0u64);
    while !stop_requested() && (args.frames == 0 || report.published < args.frames) {
        if let Some(period) = period {
            let now = Instant::now();
            if next_due > now {
                std::thread::sleep(next_due - now);
            }
            // Never bank more than one period of debt: a stall is not
            // followed by a burst.
            next_due = (next_due + period).max(Instant::now() - period);
        }
        let slot = match publisher.loan(Duration::from_millis(args.loan_timeout_ms)) {
            Ok(slot) => slot,
            Err(RingError::LosslessBlocked { name, held_seq, .. }) => {
                report.loans_blocked += 1;
                eprintln!("producer: waiting for lossless subscriber {name} to release frame {held_seq}");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let seq = slot.seq();
        let meta = FrameMeta::pts(seq as i64);
        match kind {
            BackendKind::Host => {
                let mut slot = slot;
                testpattern::fill(slot.bytes_mut()?, seq);
                slot.publish(meta)?;
            }
            _ => {
                let gpu = gpu.as_ref().ok_or("no GPU pattern kernels for a CUDA ring")?;
                fill_cuda(gpu, slot, seq)?;
            }
        }
        report.published += 1;
        if args.report_ms > 0 && Instant::now() >= report_due {
            let now = Instant::now();
            let fps = (report.published - last_report.1) as f64 / (now - last_report.0).as_secs_f64();
            let stats = publisher.stats();
            let subs = stats.subscribers;
            if args.json {
                emit(
                    &Json::event("status")
                        .str("role", "producer")
                        .u64("published", report.published)
                        .f64("fps", fps)
                        .u64("subscribers", subs.into())
                        .u64("evictions", stats.evictions)
                        .u64("lease_deadlines", stats.lease_deadlines)
                        .u64("lossless_backoffs", stats.lossless_backoffs)
                        .u64("loans_blocked", report.loans_blocked)
                        .finish(),
                );
            } else {
                emit(&format!(
                    "producer: {} published, {fps:.1} fps, {subs} subscribers",
                    report.published
                ));
            }
            last_report = (now, report.published);
            report_due = now + Duration::from_millis(args.report_ms);
        }
    }
    report.seconds = start.elapsed().as_secs_f64();
    let stats = publisher.stats();
    report.connects = stats.connects;
    report.evictions = stats.evictions;
    report.lossless_waits = stats.lossless_waits;
    report.lease_deadlines = stats.lease_deadlines;
    report.lossless_backoffs = stats.lossless_backoffs;
    report.attaches = stats.attaches;
    report.attaches_deferred = stats.attaches_deferred;
    let stream_commit = publisher.stream_commit();
    publisher.close()?;
    if args.json {
        emit(
            &Json::event("final")
                .str("role", "producer")
                .u64("published", report.published)
                .f64("seconds", report.seconds)
                .f64("fps", report.fps())
                .u64("connects", report.connects)
                .u64("evictions", report.evictions)
                .u64("lossless_waits", report.lossless_waits)
                .u64("lease_deadlines", report.lease_deadlines)
                .u64("lossless_backoffs", report.lossless_backoffs)
                .u64("loans_blocked", report.loans_blocked)
                .u64("attaches", report.attaches)
                .u64("attaches_deferred", report.attaches_deferred)
                .u64("stream_commit", u64::from(stream_commit))
                .finish(),
        );
    } else {
        emit(&format!(
            "producer: published {} frames in {:.2} s ({:.1} fps); {} subscribers connected, {} evicted, {} lossless waits, {} push attaches ({} waited for the attach rate)",
            report.published,
            report.seconds,
            report.fps(),
            report.connects,
            report.evictions,
            report.lossless_waits,
            report.attaches,
            report.attaches_deferred
        ));
    }
    Ok(report)
}
