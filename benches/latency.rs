//! Multi-process latency and throughput harness for the CUDA backend, with
//! two peers measured in the same run:
//!
//! * `vramring`: the publisher copies a source frame into a loaned VMM slot on
//!   its stream and publishes (stream sync + commit); each subscriber copies
//!   the slot into its own device buffer on its own stream (`next()`).
//! * `host-rt`: the host round trip CPU-shm NVRs do today: the producer
//!   downloads the frame into pinned host shared memory, each subscriber
//!   uploads it into its own device buffer.
//! * `legacy-ipc`: legacy CUDA IPC (`cuIpcGetMemHandle` + IPC events), which
//!   needs a shared PID namespace: the producer copies into an IPC slot and
//!   records an IPC event without blocking; each subscriber makes its stream
//!   wait on the event and copies the slot into its own buffer.
//!   Two experiments, run only when `--systems` names them: `ipcwd` and
//!   `ipcwh`, legacy IPC whose subscribers make their stream wait with
//!   `cuStreamWaitValue64` on a word the producer's stream writes each
//!   frame's seq into (`cuStreamWriteValue64`): a device-memory word shared
//!   by IPC, or a word of host shared memory registered with the driver
//!   (where vramring's queued pull waits). They measure what the GPU-side
//!   wait itself costs, apart from the rest of vramring's path. A third,
//!   `vrpc`, is push with one more push subscriber beside the measured
//!   ones that attaches, takes a frame and leaves, over and over: what a
//!   subscriber that comes and goes costs the others (ADR 0018). A
//!   fourth, `vrpb`, puts beside push a process that does the same on the
//!   GPU (a context, push buffers made and freed) without connecting: the
//!   share of `vrpc`'s cost that any process using the GPU causes.
//!   `vrpcw` and `vrpbw` are the same two with that process keeping its
//!   GPU context for its whole life: the churner then comes and goes as
//!   fast as the publisher lets it, as a hostile peer would, and what it
//!   costs the others is the publisher's mapping work, not a context's
//!   making. `vrpcwu` is `vrpcw` against a publisher that serves every
//!   Attach at once, without the attach rate (ADR 0020). `vrpg` is push
//!   whose producer always replays the commit graph, `vrpl` push whose
//!   producer always launches each commit kernel with its descriptor by
//!   value (`vrp` does what a producer does by default: replays only at a
//!   high rate; ADR 0021, ADR 0022).
//!
//! Latency is "publish → subscriber holds its copy": from the moment the
//! producer has enqueued the frame's write and starts publishing, to the
//! moment the subscriber's copy has completed on its stream
//! (`CLOCK_MONOTONIC`, comparable across processes). Each row also gives
//! how busy the whole machine's CPUs were over its runs and how much of
//! their time the hypervisor stole (`/proc/stat`, `common/host.rs`): on the
//! lent VM a row slowed by its host is told from one slowed by what it
//! measures.
//!
//! Run on a GPU machine: `cargo bench --bench latency -- [--quick]
//! [--mps [off|on|both]] [--systems K,K..] [--subs N,N..] [--no-rate]
//! [--rounds R] [--frames N] [--timeout-s S] [--out FILE]` (`--rounds R` runs every
//! latency case R times, the cases interleaved round by round, and pools
//! the samples: the table gives the pooled percentiles and each round's
//! p50, so a difference between rows can be told from the spread between
//! runs of one row; `--systems` and `--subs` run only those
//! rows, e.g. `--systems vr,vrq,vra,ipc --subs 1,4` for the pull rows
//! against legacy IPC, to spend less GPU time; or the staged binary:
//! `bash .device/run.sh bench latency --quick --mps both`). Every subscriber
//! busy-polls in the headline rows (as the peers do); the "push futex wait"
//! row uses the default spin-then-park wait.
//!
//! `--mps` runs every case under a private CUDA MPS control daemon (fresh
//! pipe and log directories under `/tmp`, passed to every child process;
//! quit at the end, on errors and on SIGINT/SIGTERM too); `--mps both` runs
//! the cases without, then with MPS and prints both tables, legacy CUDA IPC
//! p50 ÷ each vramring mode's p50 in each, and MPS ÷ no-MPS per system.
//! Every case is bounded in time (its frames plus 60 s, and `--timeout-s`
//! for the whole run, default 570 s): a hung process is killed, never waited
//! for.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use vramring::cuda::CommitGraph;
use vramring::BackendChoice;
use vramring::ClientOptions;
use vramring::ServeOptions as _;
use vramring::{
    CommitMode, Delivery, Format, FrameMeta, Mode, Policy, Publisher, PullStart, RingConfig, Subscriber,
    SubscriberOptions,
};

use common::gpu::{gpu_name, host_device_ptr, register_host, Floor};
use common::{ck, make_primary_current, now_ns, pct_us as pct, read_samples, thread_cpu_ns, write_samples, Gpu, R};
use common::{host, output, procs, SharedMap};
use procs::{hex, unhex, Children, MpsChoice, MpsDaemon};
use vramring_benches as common;

/// A tiny seqlock-style control block in a `/dev/shm` file, shared by the
/// peers' processes (they share an IPC namespace by construction: legacy
/// IPC needs it anyway). Layout: `[global_seq][ready_subs]` then per slot
/// `[seq][t0]`, then (host round trip) the slot data.
struct BenchShm {
    map: SharedMap,
    slots: usize,
    data_off: usize,
    slot_bytes: usize,
}

impl BenchShm {
    fn create(path: &Path, slots: usize, slot_bytes: usize) -> R<BenchShm> {
        let map = SharedMap::create(path, 4096 + slots * slot_bytes)?;
        Ok(BenchShm::with(map, slots, slot_bytes))
    }

    fn open(path: &Path, slots: usize, slot_bytes: usize) -> R<BenchShm> {
        Ok(BenchShm::with(SharedMap::open(path, None)?, slots, slot_bytes))
    }

    fn with(map: SharedMap, slots: usize, slot_bytes: usize) -> BenchShm {
        BenchShm {
            map,
            slots,
            data_off: 4096,
            slot_bytes,
        }
    }

    fn word(&self, k: usize) -> &AtomicU64 {
        assert!(k < 512);
        self.map.word(k)
    }
    fn global(&self) -> &AtomicU64 {
        self.word(0)
    }
    fn ready(&self) -> &AtomicU64 {
        self.word(1)
    }
    fn slot_seq(&self, s: usize) -> &AtomicU64 {
        self.word(8 + 2 * s)
    }
    fn slot_t0(&self, s: usize) -> &AtomicU64 {
        self.word(9 + 2 * s)
    }
    fn data(&self, s: usize) -> *mut u8 {
        // SAFETY: slot `s < slots` lies inside the mapping.
        unsafe {
            self.map
                .as_mut_ptr()
                .add(self.data_off + (s % self.slots) * self.slot_bytes)
        }
    }
    fn data_len(&self) -> usize {
        self.slots * self.slot_bytes
    }
    /// Marks slot `s` as being written with `seq` (a seqlock's odd state).
    fn begin(&self, s: usize, seq: u64) {
        self.slot_seq(s).store(seq | 1 << 63, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
    }
    /// Waits until every subscriber has finished connecting (CUDA import
    /// included), not merely been accepted.
    fn wait_subscribers(&self, c: &Case) {
        while self.ready().load(Ordering::Acquire) < c.subs as u64 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    /// Pins the slot data for DMA (`cuMemHostRegister`).
    fn register_data(&self) -> R<()> {
        // SAFETY: the range is our live shared mapping (page aligned), kept
        // for the life of the process.
        unsafe { register_host(self.data(0).cast(), self.data_len(), 0) }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Vramring,
    VramringPush,
    /// Push delivery with protocol 2's CPU commit (`CommitMode::Synchronous`).
    VramringPushSync,
    VramringFutex,
    /// Pull with the copy queued on the GPU behind the commit (ADR 0010).
    VramringPullQueued,
    /// Pull with the copy started after the commit landed (protocol 3's way).
    VramringPullAfter,
    HostRt,
    LegacyIpc,
    /// Legacy IPC whose subscribers wait with `cuStreamWaitValue64` on a
    /// device-memory word the producer's stream writes (an experiment:
    /// what a GPU-side wait costs on device memory).
    LegacyIpcWaitDev,
    /// The same on a word in host shared memory registered with the
    /// driver (where vramring's queued pull waits today).
    LegacyIpcWaitHost,
    /// Push, with one more push subscriber beside the measured ones that
    /// attaches, takes one frame and leaves, over and over (an experiment:
    /// what a subscriber that comes and goes costs the others, ADR 0018).
    VramringPushChurn,
    /// Push, with a process beside that does on the GPU what `vrpc`'s
    /// subscriber does (its own context, push buffers made and freed, over
    /// and over) without ever connecting: which part of `vrpc`'s cost is
    /// the GPU's, shared with any process that uses it.
    VramringPushBystander,
    /// `vrpc` whose subscriber's process keeps its GPU context between
    /// connections, so it comes and goes as fast as the publisher lets it
    /// (what a hostile peer would do, with no context to make each time).
    VramringPushChurnWarm,
    /// `vrpb` keeping its context: push buffers made and freed in a loop.
    VramringPushBystanderWarm,
    /// `vrpcw` against a publisher that serves every Attach at once
    /// (`ServeOptions::unbounded_attaches`): what the attach rate (ADR
    /// 0020) spares the others.
    VramringPushChurnWarmUnbounded,
    /// Push whose producer always replays the commit graph instead of
    /// launching each commit with its descriptor by value
    /// (`VRAMRING_COMMIT_GRAPH=1`; ADR 0021's comparison).
    VramringPushGraph,
    /// Push whose producer always launches (`VRAMRING_COMMIT_GRAPH=0`; ADR
    /// 0022's comparison).
    VramringPushLaunch,
    /// Push to sequential readers: each takes every frame from its own
    /// queue of buffers (PROTOCOL.md §16.8).
    VramringPushSequential,
    /// Push to lossless readers on a lossless ring: the producer waits for
    /// room in every reader's queue.
    VramringPushLossless,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Vramring => "vramring pull",
            System::VramringPush => "vramring push",
            System::VramringPushSync => "vramring push, CPU commit (v2)",
            System::VramringFutex => "vramring push, futex wait",
            System::VramringPullQueued => "vramring pull, copy queued on the GPU",
            System::VramringPullAfter => "vramring pull, copy after the commit (v3)",
            System::HostRt => "host round trip",
            System::LegacyIpc => "legacy CUDA IPC",
            System::LegacyIpcWaitDev => "legacy CUDA IPC, stream wait on a device word",
            System::LegacyIpcWaitHost => "legacy CUDA IPC, stream wait on a host word",
            System::VramringPushChurn => "vramring push, one more push subscriber coming and going",
            System::VramringPushBystander => "vramring push, a GPU process beside making and freeing push buffers",
            System::VramringPushChurnWarm => {
                "vramring push, one more push subscriber coming and going, its process keeping its context"
            }
            System::VramringPushBystanderWarm => {
                "vramring push, a GPU process beside making and freeing push buffers in one context"
            }
            System::VramringPushChurnWarmUnbounded => {
                "vramring push, one more push subscriber coming and going, its process keeping its context, attaches unbounded"
            }
            System::VramringPushGraph => "vramring push, commit graph replayed",
            System::VramringPushLaunch => "vramring push, commit kernel launched",
            System::VramringPushSequential => "vramring push, sequential readers (a queue each)",
            System::VramringPushLossless => "vramring push, lossless readers (a queue each, lossless ring)",
        }
    }
    /// The short label of the mode in the tables.
    fn mode(self) -> &'static str {
        match self {
            System::Vramring => "pull",
            System::VramringPush => "push",
            System::VramringPushSync => "push CPU commit",
            System::VramringFutex => "push futex wait",
            System::VramringPullQueued => "pull queued",
            System::VramringPullAfter => "pull after commit",
            System::HostRt => "host rt",
            System::LegacyIpc => "legacy IPC",
            System::LegacyIpcWaitDev => "IPC wait dev word",
            System::LegacyIpcWaitHost => "IPC wait host word",
            System::VramringPushChurn => "push + churn",
            System::VramringPushBystander => "push + bystander",
            System::VramringPushChurnWarm => "push + warm churn",
            System::VramringPushBystanderWarm => "push + warm bystander",
            System::VramringPushChurnWarmUnbounded => "push + warm churn, no attach rate",
            System::VramringPushGraph => "push, commit graph",
            System::VramringPushLaunch => "push, commit launch",
            System::VramringPushSequential => "push sequential",
            System::VramringPushLossless => "push lossless",
        }
    }
    fn key(self) -> &'static str {
        match self {
            System::Vramring => "vr",
            System::VramringPush => "vrp",
            System::VramringPushSync => "vrps",
            System::VramringFutex => "vrf",
            System::VramringPullQueued => "vrq",
            System::VramringPullAfter => "vra",
            System::HostRt => "host",
            System::LegacyIpc => "ipc",
            System::LegacyIpcWaitDev => "ipcwd",
            System::LegacyIpcWaitHost => "ipcwh",
            System::VramringPushChurn => "vrpc",
            System::VramringPushBystander => "vrpb",
            System::VramringPushChurnWarm => "vrpcw",
            System::VramringPushBystanderWarm => "vrpbw",
            System::VramringPushChurnWarmUnbounded => "vrpcwu",
            System::VramringPushGraph => "vrpg",
            System::VramringPushLaunch => "vrpl",
            System::VramringPushSequential => "vrpq",
            System::VramringPushLossless => "vrpx",
        }
    }
    fn from_key(k: &str) -> Option<System> {
        output::by_key(&System::ALL, System::key, k)
    }
    const ALL: [System; 19] = [
        System::Vramring,
        System::VramringPush,
        System::VramringPushSync,
        System::VramringFutex,
        System::VramringPullQueued,
        System::VramringPullAfter,
        System::HostRt,
        System::LegacyIpc,
        System::LegacyIpcWaitDev,
        System::LegacyIpcWaitHost,
        System::VramringPushChurn,
        System::VramringPushBystander,
        System::VramringPushChurnWarm,
        System::VramringPushBystanderWarm,
        System::VramringPushChurnWarmUnbounded,
        System::VramringPushGraph,
        System::VramringPushLaunch,
        System::VramringPushSequential,
        System::VramringPushLossless,
    ];
    /// A vramring case (its producer is a vramring publisher).
    fn is_vramring(self) -> bool {
        !matches!(
            self,
            System::HostRt | System::LegacyIpc | System::LegacyIpcWaitDev | System::LegacyIpcWaitHost
        )
    }
    /// The process an experiment runs beside the readers: `Some((role,
    /// warm))`, the role `"churner"` or `"bystander"`, `warm` when it keeps
    /// its GPU context for its whole life.
    fn beside(self) -> Option<(&'static str, bool)> {
        match self {
            System::VramringPushChurn => Some(("churner", false)),
            System::VramringPushBystander => Some(("bystander", false)),
            System::VramringPushChurnWarm | System::VramringPushChurnWarmUnbounded => Some(("churner", true)),
            System::VramringPushBystanderWarm => Some(("bystander", true)),
            _ => None,
        }
    }
}

/// One measured configuration, passed to every role on its command line.
#[derive(Clone, Debug)]
struct Case {
    system: System,
    width: u32,
    height: u32,
    subs: usize,
    frames: u64,
    warmup: u64,
    interval_us: u64,
    dir: PathBuf,
}

impl Case {
    fn args(&self) -> Vec<String> {
        vec![
            self.system.key().into(),
            self.width.to_string(),
            self.height.to_string(),
            self.subs.to_string(),
            self.frames.to_string(),
            self.warmup.to_string(),
            self.interval_us.to_string(),
            self.dir.display().to_string(),
        ]
    }
    fn parse(a: &[String]) -> R<Case> {
        Ok(Case {
            system: System::from_key(&a[0]).ok_or("system")?,
            width: a[1].parse()?,
            height: a[2].parse()?,
            subs: a[3].parse()?,
            frames: a[4].parse()?,
            warmup: a[5].parse()?,
            interval_us: a[6].parse()?,
            dir: PathBuf::from(&a[7]),
        })
    }
    fn geometry(&self) -> vramring::Geometry {
        vramring::Geometry::new(Format::Nv12, self.width, self.height).expect("geometry")
    }
    fn sock(&self) -> PathBuf {
        self.dir.join("ring.sock")
    }
    fn shm(&self) -> PathBuf {
        PathBuf::from(format!("/dev/shm/vramring-bench-{}", std::process::id()))
    }
}

const SLOTS: usize = 8;

/// Spins until frame `k` is due, `interval_us` apart from `start` (ns); an
/// unpaced case (0) does not wait.
fn pace(start: u64, k: u64, interval_us: u64) {
    if interval_us > 0 {
        common::spin_until_ns(start + k * interval_us * 1000);
    }
}

/// What a producer measured per measured frame: its thread's CPU and wall
/// time around the publish, and the span of the measured frames.
struct PublishLog {
    cpu: Vec<u64>,
    wall: Vec<u64>,
    span_start: u64,
}

impl PublishLog {
    fn new() -> PublishLog {
        PublishLog {
            cpu: Vec::new(),
            wall: Vec::new(),
            span_start: now_ns(),
        }
    }
    /// Frame `k` starts (the span starts at the first measured one).
    fn frame(&mut self, c: &Case, k: u64) {
        if k == c.warmup {
            self.span_start = now_ns();
        }
    }
    /// One measured publish, begun at `c0` (thread CPU) and `t0` (wall).
    #[inline]
    fn publish(&mut self, c0: u64, t0: u64) {
        self.cpu.push(thread_cpu_ns() - c0);
        self.wall.push(now_ns() - t0);
    }
    /// Writes the samples for the orchestrator (the span ends now).
    fn write(&self, c: &Case) -> R<()> {
        write_samples(&c.dir.join("pub-cpu"), &self.cpu)?;
        write_samples(&c.dir.join("pub-wall"), &self.wall)?;
        write_samples(&c.dir.join("pub-span"), &[self.span_start, now_ns()])
    }
}

// ---------------------------------------------------------------- vramring

fn vr_producer(c: &Case, shm_path: &Path) -> R<()> {
    let gpu = Gpu::init()?;
    let g = c.geometry();
    let src = gpu.alloc_filled(g.frame_bytes as usize, 0x5a)?;
    let mut cfg = RingConfig::new(Format::Nv12, c.width, c.height)
        .slots(SLOTS as u32)
        .backend(BackendChoice::Cuda(0))
        .policy(if c.system == System::VramringPushLossless {
            Policy::Lossless
        } else {
            Policy::Overwrite
        })
        .commit(if c.system == System::VramringPushSync {
            CommitMode::Synchronous
        } else {
            CommitMode::Stream
        })
        .commit_graph(match c.system {
            System::VramringPushGraph => CommitGraph::Always,
            System::VramringPushLaunch => CommitGraph::Never,
            _ => common::commit_graph_from_env(),
        });
    if c.system == System::VramringPushChurnWarmUnbounded {
        cfg = cfg.unbounded_attaches();
    }
    let mut p = Publisher::create(c.sock(), cfg)?;
    let ready = BenchShm::open(shm_path, 1, 0)?;
    ready.global().store(1, Ordering::Release); // the socket is up
    ready.wait_subscribers(c);
    // The floor under the publish column, paced as the frames are, while
    // the subscribers wait (their first frame comes after it). Paced cases
    // only: the unpaced rate table has no such column.
    if c.interval_us > 0 {
        let mut floor = Floor::load()?;
        let cpu = floor.paced_cpu(&gpu, c.interval_us * 1000, 300)?;
        drop(floor);
        write_samples(&c.dir.join("launch-cpu"), &cpu)?;
    }
    let mut log = PublishLog::new();
    let start = now_ns();
    for k in 0..c.warmup + c.frames {
        log.frame(c, k);
        pace(start, k, c.interval_us);
        let mut slot = p.loan(Duration::from_secs(1))?;
        let dst = slot.device_mut()?.as_raw();
        // SAFETY: `dst` is a slot of the pool in the primary context, which
        // is current; `src` holds frame_bytes.
        unsafe { gpu.copy(dst, src, g.frame_bytes as usize)? };
        let (c0, t0) = (thread_cpu_ns(), now_ns());
        let meta = FrameMeta::pts(k as i64).with_user(&t0.to_le_bytes())?;
        // SAFETY: our live stream in the ring's context.
        unsafe { slot.publish_cuda(meta, vramring::cuda::Stream::from_raw(gpu.stream))? };
        if k >= c.warmup {
            log.publish(c0, t0);
        } else if c.interval_us < 1000 {
            // An unpaced run still warms up at 1 kHz, so push subscribers'
            // buffers get attached (the service polls every 20 ms) before
            // the measured frames.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    log.write(c)?;
    std::thread::sleep(Duration::from_millis(50));
    p.close()?;
    Ok(())
}

fn vr_subscriber(c: &Case, id: usize, shm_path: &Path) -> R<()> {
    let spin = if c.system == System::VramringFutex {
        Duration::from_micros(50)
    } else {
        Duration::from_secs(3600)
    };
    let push = matches!(
        c.system,
        System::VramringPush
            | System::VramringPushSync
            | System::VramringFutex
            | System::VramringPushChurn
            | System::VramringPushBystander
            | System::VramringPushChurnWarm
            | System::VramringPushBystanderWarm
            | System::VramringPushChurnWarmUnbounded
            | System::VramringPushGraph
            | System::VramringPushLaunch
            | System::VramringPushSequential
            | System::VramringPushLossless
    );
    let mode = match c.system {
        System::VramringPushSequential | System::VramringPushLossless => Mode::Sequential,
        _ if push => Mode::Latest,
        _ => Mode::Sequential,
    };
    let pull_start = match c.system {
        System::VramringPullQueued => PullStart::Queued,
        System::VramringPullAfter => PullStart::AfterCommit,
        _ => PullStart::Auto,
    };
    let opts = SubscriberOptions::default()
        .mode(mode)
        .lossless(c.system == System::VramringPushLossless)
        .delivery(if push { Delivery::Push } else { Delivery::Pull })
        .name(format!("bench-{id}"))
        .spin(spin)
        .pull_start(pull_start);
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut first_err = None;
    let mut s = loop {
        match Subscriber::connect(c.sock(), opts.clone()) {
            Ok(s) => break s,
            Err(e) if Instant::now() > give_up => {
                return Err(format!("subscriber {id}: first error {first_err:?}, last {e}").into())
            }
            Err(e) => {
                first_err.get_or_insert_with(|| e.to_string());
                std::thread::sleep(Duration::from_millis(2))
            }
        }
    };
    BenchShm::open(shm_path, 1, 0)?.ready().fetch_add(1, Ordering::AcqRel);
    let mut lat = Vec::with_capacity(c.frames as usize);
    loop {
        match s.next(Duration::from_secs(10)) {
            Ok(f) => {
                let t1 = now_ns();
                let t0 = u64::from_le_bytes(f.user()[..8].try_into()?);
                if f.pts() as u64 >= c.warmup {
                    lat.push(t1.saturating_sub(t0));
                }
            }
            Err(vramring::Error::ProducerGone { .. }) => break,
            Err(e) => return Err(e.into()),
        }
    }
    let st = s.stats();
    tracing::debug!(target: "bench", id, "subscriber: the publisher is gone; closing");
    write_samples(&c.dir.join(format!("sub-{id}")), &lat)?;
    std::fs::write(
        c.dir.join(format!("sub-{id}.stats")),
        format!(
            "{} {} {} {} {}",
            st.delivered, st.dropped, st.overruns, st.queued, st.queued_at_loan
        ),
    )?;
    drop(s);
    tracing::debug!(target: "bench", id, "subscriber: closed");
    Ok(())
}

/// The `vrpc` case's extra push subscriber: connects (its push buffers
/// are made and sent, and the publisher's service maps them), waits for
/// one pushed frame (the producer has adopted them), leaves (the service
/// unmaps them once its copies have landed), and again, until the
/// publisher is gone. Writes how many times it came and went. `vrpcw`'s
/// keeps the device's primary context retained, so that no connection
/// makes or destroys a context.
fn vr_churner(c: &Case) -> R<()> {
    if c.system.beside().is_some_and(|(_, warm)| warm) {
        make_primary_current()?;
    }
    let opts = SubscriberOptions::default()
        .mode(Mode::Latest)
        .push(true)
        .name("bench-churn")
        .spin(Duration::from_secs(3600));
    let (mut cycles, mut refused) = (0u64, 0u64);
    let give_up = Instant::now() + Duration::from_secs(600);
    while Instant::now() < give_up && c.sock().exists() {
        tracing::debug!(target: "bench", cycles, "churner: connecting");
        let mut s = match Subscriber::connect(c.sock(), opts.clone()) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(target: "bench", error = %e, "churner: not connected");
                // The publisher closing (its socket goes next) or a full
                // table; either way, look again shortly.
                refused += 1;
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
        };
        tracing::debug!(target: "bench", "churner: connected");
        match s.next(Duration::from_secs(20)) {
            Ok(_) => cycles += 1,
            Err(vramring::Error::ProducerGone { .. }) => break,
            Err(e) => return Err(format!("churner: {e}").into()),
        }
        drop(s);
        tracing::debug!(target: "bench", "churner: left");
    }
    tracing::debug!(target: "bench", cycles, refused, "churner: done");
    std::fs::write(c.dir.join("churn.stats"), format!("{cycles} {refused}"))?;
    Ok(())
}

/// The `vrpb` case's process beside the ring: what `vr_churner`'s
/// subscriber does on the GPU (its context, a 1080p subscriber's push
/// buffers made, exported and freed; a pause as long as the churner stays
/// connected), without ever connecting, until the publisher is gone.
/// `vrpbw`'s keeps its context (the primary one, retained) and pauses one
/// frame interval, about as long as `vrpcw`'s churner stays.
fn vr_bystander(c: &Case) -> R<()> {
    use vramring::seam::cuda::ImportedPool;
    use vramring::seam::cuda::{CudaImport, RealDriver};
    let mut u = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: cuInit, then device 0's UUID into a local.
    unsafe {
        ck("cuInit", sys::cuInit(0))?;
        let mut dev = 0;
        ck("cuDeviceGet", sys::cuDeviceGet(&mut dev, 0))?;
        ck("cuDeviceGetUuid_v2", sys::cuDeviceGetUuid_v2(&mut u, dev))?;
    }
    let uuid = u.bytes.map(|b| b as u8);
    let stride = c
        .geometry()
        .frame_bytes
        .next_multiple_of(vramring::seam::format::SLOT_ALIGN);
    let pause = if c.system.beside().is_some_and(|(_, warm)| warm) {
        make_primary_current()?;
        Duration::from_micros(c.interval_us)
    } else {
        Duration::from_millis(70)
    };
    let mut cycles = 0u64;
    let give_up = Instant::now() + Duration::from_secs(600);
    while Instant::now() < give_up && c.sock().exists() {
        let mut imp = CudaImport::push_only(RealDriver::shared()?, uuid)?;
        let (fd, _) = imp.alloc_push(vramring::seam::layout::PUSH_BUFFERS as u32, stride)?;
        drop(fd);
        std::thread::sleep(pause);
        imp.close()?;
        cycles += 1;
    }
    std::fs::write(c.dir.join("churn.stats"), format!("{cycles} 0"))?;
    Ok(())
}

// ------------------------------------------------------------ peers: host rt

/// The peers' producer loop: frame `k` (seq `k + 1`, in slot `seq %
/// SLOTS`), paced, is written by `write(slot, seq)`, which marks the slot
/// as being written ([`BenchShm::begin`]) and returns the thread CPU and
/// wall clocks its measured part began at; the slot is then published in
/// the control block.
fn peer_frames(c: &Case, shm: &BenchShm, mut write: impl FnMut(usize, u64) -> R<(u64, u64)>) -> R<PublishLog> {
    let mut log = PublishLog::new();
    let start = now_ns();
    for k in 0..c.warmup + c.frames {
        log.frame(c, k);
        pace(start, k, c.interval_us);
        let seq = k + 1;
        let s = (seq as usize) % SLOTS;
        let (c0, t0) = write(s, seq)?;
        shm.slot_t0(s).store(t0, Ordering::Relaxed);
        shm.slot_seq(s).store(seq, Ordering::Release);
        shm.global().store(seq, Ordering::Release);
        if k >= c.warmup {
            log.publish(c0, t0);
        }
    }
    Ok(log)
}

fn host_producer(c: &Case, shm_path: &Path) -> R<()> {
    let gpu = Gpu::init()?;
    let g = c.geometry();
    let bytes = g.frame_bytes as usize;
    let src = gpu.alloc_filled(bytes, 0x5a)?;
    let shm = BenchShm::open(shm_path, SLOTS, bytes.next_multiple_of(4096))?;
    // Pinned, the DtoH copy is a DMA (the peer's best case).
    shm.register_data()?;
    shm.wait_subscribers(c);
    let log = peer_frames(c, &shm, |s, seq| {
        let (c0, t0) = (thread_cpu_ns(), now_ns());
        shm.begin(s, seq);
        // SAFETY: the slot lies in the pinned mapping; `src` holds `bytes`.
        unsafe {
            ck(
                "cuMemcpyDtoHAsync",
                sys::cuMemcpyDtoHAsync_v2(shm.data(s) as _, src, bytes, gpu.stream),
            )?;
        }
        gpu.sync()?;
        Ok((c0, t0))
    })?;
    log.write(c)?;
    std::thread::sleep(Duration::from_millis(50));
    shm.global().store(u64::MAX, Ordering::Release);
    Ok(())
}

/// A peer subscriber's loop: spin on the control block, take the newest
/// safe frame (as vramring's Sequential reader does), `copy` slot `s` into
/// the subscriber's own buffer and complete it, validate after the copy,
/// and record latency and counts.
fn peer_loop(c: &Case, id: usize, shm: &BenchShm, mut copy: impl FnMut(usize, u64) -> R<()>) -> R<()> {
    let mut last = 0u64;
    let mut lat = Vec::new();
    let (mut delivered, mut dropped, mut overruns) = (0u64, 0u64, 0u64);
    loop {
        let g = shm.global().load(Ordering::Acquire);
        if g == u64::MAX {
            break;
        }
        if g <= last {
            std::hint::spin_loop();
            continue;
        }
        let want = (last + 1).max(g.saturating_sub(SLOTS as u64 - 2));
        dropped += want - last - 1;
        let s = (want as usize) % SLOTS;
        if shm.slot_seq(s).load(Ordering::Acquire) != want {
            dropped += 1;
            last = want;
            continue;
        }
        let t0 = shm.slot_t0(s).load(Ordering::Relaxed);
        copy(s, want)?;
        std::sync::atomic::fence(Ordering::Acquire);
        let t1 = now_ns();
        last = want;
        if shm.slot_seq(s).load(Ordering::Relaxed) != want {
            overruns += 1;
            dropped += 1;
            continue;
        }
        delivered += 1;
        if want > c.warmup {
            lat.push(t1.saturating_sub(t0));
        }
    }
    write_samples(&c.dir.join(format!("sub-{id}")), &lat)?;
    std::fs::write(
        c.dir.join(format!("sub-{id}.stats")),
        format!("{delivered} {dropped} {overruns}"),
    )?;
    Ok(())
}

fn host_subscriber(c: &Case, id: usize, shm_path: &Path) -> R<()> {
    let gpu = Gpu::init()?;
    let bytes = c.geometry().frame_bytes as usize;
    let shm = BenchShm::open(shm_path, SLOTS, bytes.next_multiple_of(4096))?;
    // Pinned for HtoD DMA.
    shm.register_data()?;
    let dst = gpu.alloc_filled(bytes, 0x5a)?;
    shm.ready().fetch_add(1, Ordering::AcqRel);
    peer_loop(c, id, &shm, |s, _| {
        // SAFETY: slot in the pinned mapping; `dst` holds `bytes`.
        unsafe {
            ck(
                "cuMemcpyHtoDAsync",
                sys::cuMemcpyHtoDAsync_v2(dst, shm.data(s) as _, bytes, gpu.stream),
            )?
        };
        gpu.sync()
    })?;
    Ok(())
}

// ---------------------------------------------------------- peers: legacy IPC

/// The IPC memory handle of our allocation `p`, in hex (see [`open_ipc_mem`]).
fn ipc_mem_handle_hex(p: sys::CUdeviceptr) -> R<String> {
    let mut mh = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
    // SAFETY: `p` is a live cuMemAlloc allocation; a valid out-pointer.
    let mh = unsafe {
        ck("cuIpcGetMemHandle", sys::cuIpcGetMemHandle(mh.as_mut_ptr(), p))?;
        mh.assume_init()
    };
    // SAFETY: the handle is a plain 64-byte array.
    Ok(hex(unsafe {
        std::slice::from_raw_parts(mh.reserved.as_ptr() as *const u8, 64)
    }))
}

/// Maps the allocation whose 64-byte IPC memory handle is `handle`.
fn open_ipc_mem(handle: &[u8]) -> R<sys::CUdeviceptr> {
    if handle.len() != 64 {
        return Err(format!("an IPC memory handle is 64 bytes, not {}", handle.len()).into());
    }
    let mut mh = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
    let mut p = 0;
    // SAFETY: 64 bytes into the 64-byte plain handle; a valid out-pointer.
    unsafe {
        std::ptr::copy_nonoverlapping(handle.as_ptr(), mh.as_mut_ptr() as *mut u8, 64);
        ck(
            "cuIpcOpenMemHandle",
            sys::cuIpcOpenMemHandle_v2(
                &mut p,
                mh.assume_init(),
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            ),
        )?;
    }
    Ok(p)
}

/// The word of the `ipcwh` experiment: word 64 of the control block.
const GATE_WORD: usize = 64;

/// `ipcwh`: registers the control block's page with the driver (read-only
/// for a subscriber) and returns the device address of [`GATE_WORD`].
fn register_host_gate(shm: &BenchShm, read_only: bool) -> R<sys::CUdeviceptr> {
    let base = shm.map.as_mut_ptr();
    let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP
        | if read_only {
            sys::CU_MEMHOSTREGISTER_READ_ONLY
        } else {
            0
        };
    // SAFETY: the first 4 KiB of our live shared mapping (page aligned),
    // registered once per process and kept for its lifetime; the gate word
    // lies in it.
    unsafe {
        register_host(base.cast(), 4096, flags)?;
        host_device_ptr(base.add(GATE_WORD * 8).cast())
    }
}

fn ipc_producer(c: &Case, shm_path: &Path) -> R<()> {
    let gpu = Gpu::init()?;
    let bytes = c.geometry().frame_bytes as usize;
    let src = gpu.alloc_filled(bytes, 0x5a)?;
    let shm = BenchShm::open(shm_path, SLOTS, 0)?;
    let mut slots = Vec::new();
    let mut events = Vec::new();
    let mut handles = String::new();
    for _ in 0..SLOTS {
        let p = gpu.alloc_filled(bytes, 0x5a)?;
        let mut ev = std::ptr::null_mut();
        let mut eh = std::mem::MaybeUninit::<sys::CUipcEventHandle>::zeroed();
        let flags =
            sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32 | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: valid out-pointers.
        let eh = unsafe {
            ck("cuEventCreate", sys::cuEventCreate(&mut ev, flags))?;
            ck("cuIpcGetEventHandle", sys::cuIpcGetEventHandle(eh.as_mut_ptr(), ev))?;
            eh.assume_init()
        };
        // SAFETY: the handle is a plain 64-byte array.
        let eb = unsafe { std::slice::from_raw_parts(eh.reserved.as_ptr() as *const u8, 64) };
        handles.push_str(&format!("{} {}\n", ipc_mem_handle_hex(p)?, hex(eb)));
        slots.push(p);
        events.push(ev);
    }
    std::fs::write(c.dir.join("ipc-handles"), handles)?;
    // The experiments' gate: a word the producer's stream sets to each
    // frame's seq (`cuStreamWriteValue64`, which orders the frame's copy
    // before it) instead of recording the slot's IPC event.
    let gate = match c.system {
        System::LegacyIpcWaitDev => {
            let p = gpu.alloc_filled(256, 0)?;
            std::fs::write(c.dir.join("ipc-gate"), ipc_mem_handle_hex(p)?)?;
            Some(p)
        }
        System::LegacyIpcWaitHost => {
            shm.word(GATE_WORD).store(0, Ordering::Relaxed);
            Some(register_host_gate(&shm, false)?)
        }
        _ => None,
    };
    gpu.sync()?;
    shm.word(2).store(1, Ordering::Release); // handles written
    shm.wait_subscribers(c);
    let log = peer_frames(c, &shm, |s, seq| {
        shm.begin(s, seq);
        // SAFETY: live allocations of `bytes` in the current context.
        unsafe { gpu.copy(slots[s], src, bytes)? };
        let (c0, t0) = (thread_cpu_ns(), now_ns());
        match gate {
            // SAFETY: the gate word is live device (or registered host)
            // memory of this context; our live stream.
            Some(g) => unsafe {
                ck(
                    "cuStreamWriteValue64",
                    sys::cuStreamWriteValue64_v2(gpu.stream, g, seq, 0),
                )?
            },
            // SAFETY: live event and stream.
            None => unsafe { ck("cuEventRecord", sys::cuEventRecord(events[s], gpu.stream))? },
        }
        Ok((c0, t0))
    })?;
    gpu.sync()?;
    log.write(c)?;
    std::thread::sleep(Duration::from_millis(50));
    shm.global().store(u64::MAX, Ordering::Release);
    // Keep the allocations alive until every subscriber has left.
    while shm.ready().load(Ordering::Acquire) > 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

fn ipc_subscriber(c: &Case, id: usize, shm_path: &Path) -> R<()> {
    let gpu = Gpu::init()?;
    let bytes = c.geometry().frame_bytes as usize;
    let shm = BenchShm::open(shm_path, SLOTS, 0)?;
    while shm.word(2).load(Ordering::Acquire) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let text = std::fs::read_to_string(c.dir.join("ipc-handles"))?;
    let mut ptrs = Vec::new();
    let mut evs = Vec::new();
    for line in text.lines() {
        let mut it = line.split(' ');
        let (m, e) = (unhex(it.next().ok_or("handle")?)?, unhex(it.next().ok_or("handle")?)?);
        let p = open_ipc_mem(&m)?;
        let mut eh = std::mem::MaybeUninit::<sys::CUipcEventHandle>::zeroed();
        let mut ev = std::ptr::null_mut();
        // SAFETY: the handle is a 64-byte plain array; out-pointer valid.
        unsafe {
            std::ptr::copy_nonoverlapping(e.as_ptr(), eh.as_mut_ptr() as *mut u8, 64);
            ck(
                "cuIpcOpenEventHandle",
                sys::cuIpcOpenEventHandle(&mut ev, eh.assume_init()),
            )?;
        }
        ptrs.push(p);
        evs.push(ev);
    }
    let gate = match c.system {
        System::LegacyIpcWaitDev => Some(open_ipc_mem(&unhex(
            std::fs::read_to_string(c.dir.join("ipc-gate"))?.trim(),
        )?)?),
        System::LegacyIpcWaitHost => Some(register_host_gate(&shm, true)?),
        _ => None,
    };
    let dst = gpu.alloc_filled(bytes, 0x5a)?;
    shm.ready().fetch_add(1, Ordering::AcqRel);
    peer_loop(c, id, &shm, |s, seq| {
        // SAFETY: imported IPC allocation/event (or gate word) and our own
        // stream/buffer.
        unsafe {
            match gate {
                Some(g) => ck(
                    "cuStreamWaitValue64",
                    sys::cuStreamWaitValue64_v2(
                        gpu.stream,
                        g,
                        seq,
                        sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
                    ),
                )?,
                None => ck("cuStreamWaitEvent", sys::cuStreamWaitEvent(gpu.stream, evs[s], 0))?,
            }
            gpu.copy(dst, ptrs[s], bytes)?;
        }
        gpu.sync()
    })?;
    shm.ready().fetch_sub(1, Ordering::AcqRel);
    Ok(())
}

// ------------------------------------------------------------ orchestration

struct Outcome {
    lat: Vec<u64>,
    span_s: f64,
    pub_cpu: Vec<u64>,
    pub_wall: Vec<u64>,
    /// vramring producers: CPU per empty kernel launch, same pace.
    launch_cpu: Vec<u64>,
    delivered: u64,
    dropped: u64,
    overruns: u64,
    /// Frames pulled by a copy queued on the GPU (vramring pull only).
    queued: u64,
    /// Of those, copies queued at the publisher's loan (ADR 0014).
    at_loan: u64,
    /// `vrpc`, `vrpb` and their warm twins: how many times the process
    /// beside the readers came and went (connected, or made and freed its
    /// buffers).
    churn: u64,
}

impl Outcome {
    /// Pools `o`'s samples and counts into `self`; sorted afterwards.
    fn merge(&mut self, o: Outcome) {
        self.lat.extend(o.lat);
        self.span_s += o.span_s;
        self.pub_cpu.extend(o.pub_cpu);
        self.pub_wall.extend(o.pub_wall);
        self.launch_cpu.extend(o.launch_cpu);
        self.delivered += o.delivered;
        self.dropped += o.dropped;
        self.overruns += o.overruns;
        self.queued += o.queued;
        self.at_loan += o.at_loan;
        self.churn += o.churn;
        for v in [
            &mut self.lat,
            &mut self.pub_cpu,
            &mut self.pub_wall,
            &mut self.launch_cpu,
        ] {
            v.sort_unstable();
        }
    }
}

fn spawn_role(children: &mut Children, role: &str, c: &Case, extra: &[String], mps: Option<&MpsDaemon>) -> R<()> {
    let mut cmd = procs::role_command(role, c.args().iter().chain(extra))?;
    procs::set_child_env(&mut cmd, mps);
    let name = match extra.get(1) {
        Some(id) => format!("{role} {id}"),
        None => role.to_string(),
    };
    children.spawn(name, &mut cmd)?;
    Ok(())
}

/// Runs one case; every process is killed and reaped by `deadline` (or on a
/// stop signal) at the latest.
fn run_case(c: &Case, mps: Option<&MpsDaemon>, deadline: Instant) -> R<Outcome> {
    let _ = std::fs::remove_dir_all(&c.dir);
    std::fs::create_dir_all(&c.dir)?;
    let shm = c.shm();
    let shm_bytes = if c.system == System::HostRt {
        c.geometry().frame_bytes as usize
    } else {
        0
    };
    let ctl = BenchShm::create(&shm, SLOTS, shm_bytes.next_multiple_of(4096))?;
    let shm_arg = vec![shm.display().to_string()];
    let mut children = Children::default();
    let result = (|| -> R<()> {
        spawn_role(&mut children, "producer", c, &shm_arg, mps)?;
        if c.system.is_vramring() {
            children.wait_for(
                || ctl.global().load(Ordering::Acquire) != 0,
                deadline,
                "producer",
                "the producer's socket did not come up in time",
            )?;
        }
        for id in 0..c.subs {
            let mut a = shm_arg.clone();
            a.push(id.to_string());
            spawn_role(&mut children, "subscriber", c, &a, mps)?;
        }
        if let Some((role, _)) = c.system.beside() {
            spawn_role(&mut children, role, c, &shm_arg, mps)?;
        }
        children.wait_all(deadline, Duration::from_secs(5))?;
        Ok(())
    })();
    drop(children); // kills and reaps whatever is left on an error path
    let _ = std::fs::remove_file(&shm);
    if let Err(e) = result {
        return Err(format!("{} {}x{} x{}: {e}", c.system.name(), c.width, c.height, c.subs).into());
    }
    let mut lat = Vec::new();
    let (mut delivered, mut dropped, mut overruns, mut queued, mut at_loan) = (0, 0, 0, 0, 0);
    for id in 0..c.subs {
        lat.extend(read_samples(&c.dir.join(format!("sub-{id}")))?);
        let st = std::fs::read_to_string(c.dir.join(format!("sub-{id}.stats")))?;
        let v: Vec<u64> = st.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        delivered += v.first().copied().unwrap_or(0);
        dropped += v.get(1).copied().unwrap_or(0);
        overruns += v.get(2).copied().unwrap_or(0);
        queued += v.get(3).copied().unwrap_or(0);
        at_loan += v.get(4).copied().unwrap_or(0);
    }
    lat.sort_unstable();
    let mut pub_cpu = read_samples(&c.dir.join("pub-cpu"))?;
    let mut pub_wall = read_samples(&c.dir.join("pub-wall"))?;
    pub_cpu.sort_unstable();
    pub_wall.sort_unstable();
    let mut launch_cpu = read_samples(&c.dir.join("launch-cpu")).unwrap_or_default();
    launch_cpu.sort_unstable();
    let churn = match std::fs::read_to_string(c.dir.join("churn.stats")) {
        Ok(st) => st.split_whitespace().next().and_then(|x| x.parse().ok()).unwrap_or(0),
        Err(_) if c.system.beside().is_none() => 0,
        Err(e) => return Err(format!("the churner left no count: {e}").into()),
    };
    let span = read_samples(&c.dir.join("pub-span"))?;
    let span_s = match span.as_slice() {
        [a, b] => b.saturating_sub(*a) as f64 / 1e9,
        _ => f64::NAN,
    };
    Ok(Outcome {
        lat,
        span_s,
        pub_cpu,
        pub_wall,
        launch_cpu,
        delivered,
        dropped,
        overruns,
        queued,
        at_loan,
        churn,
    })
}

fn role_main(args: &[String]) -> R<()> {
    let role = args[0].as_str();
    let c = Case::parse(&args[1..9])?;
    let shm = PathBuf::from(&args[9]);
    match (role, c.system) {
        ("producer", s) if s.is_vramring() => vr_producer(&c, &shm),
        ("churner", s) if s.beside().is_some_and(|(r, _)| r == "churner") => vr_churner(&c),
        ("bystander", s) if s.beside().is_some_and(|(r, _)| r == "bystander") => vr_bystander(&c),
        ("producer", System::HostRt) => host_producer(&c, &shm),
        ("producer", System::LegacyIpc | System::LegacyIpcWaitDev | System::LegacyIpcWaitHost) => {
            ipc_producer(&c, &shm)
        }
        ("subscriber", sys_) => {
            let id: usize = args[10].parse()?;
            match sys_ {
                System::HostRt => host_subscriber(&c, id, &shm),
                System::LegacyIpc | System::LegacyIpcWaitDev | System::LegacyIpcWaitHost => {
                    ipc_subscriber(&c, id, &shm)
                }
                _ => vr_subscriber(&c, id, &shm),
            }
        }
        _ => Err("unknown role".into()),
    }
}

/// What a run measures: sizes, subscriber counts, frames.
struct Plan {
    sizes: &'static [(u32, u32, &'static str)],
    sub_counts: Vec<usize>,
    /// The latency rows to run, in order (all of [`LATENCY_SYSTEMS`] unless
    /// `--systems` narrows them; the rate table keeps only these too).
    systems: Vec<System>,
    frames: u64,
    /// Interleaved rounds: every case once per round, samples pooled.
    rounds: usize,
    throughput: bool,
    throughput_sizes: &'static [(u32, u32, &'static str)],
    throughput_frames: u64,
    dir: PathBuf,
    deadline: Instant,
}

/// Results of every pass, for the ratio tables: p50 by (MPS, frame, subs, system).
#[derive(Default)]
struct Results {
    p50: std::collections::HashMap<(bool, &'static str, usize, &'static str), f64>,
    jsonl: String,
}

fn mps_label(with_mps: bool) -> &'static str {
    if with_mps {
        "on"
    } else {
        "off"
    }
}

const LATENCY_SYSTEMS: [System; 10] = [
    System::VramringPush,
    System::VramringPushSequential,
    System::VramringPushLossless,
    System::VramringPushSync,
    System::Vramring,
    System::VramringPullQueued,
    System::VramringPullAfter,
    System::VramringFutex,
    System::HostRt,
    System::LegacyIpc,
];

/// Time left for one case: its frames at their pace plus process start-up
/// and teardown, never past the run's deadline.
fn case_deadline(c: &Case, plan: &Plan) -> Instant {
    let paced = Duration::from_micros(c.interval_us * (c.frames + c.warmup));
    (Instant::now() + Duration::from_secs(60) + paced).min(plan.deadline)
}

/// One latency case over the rounds of a pass.
struct CaseRuns {
    size: (u32, u32, &'static str),
    n: usize,
    system: System,
    /// Every round's samples, pooled.
    pooled: Option<Outcome>,
    /// Each round's p50 (µs).
    p50s: Vec<f64>,
    /// The whole machine's CPU counters over this case's runs
    /// (`/proc/stat`), summed over the rounds.
    host: host::CpuTicks,
    /// Why the case stopped being run.
    failed: Option<String>,
    /// A round of it was killed at the run's time limit (or by a stop).
    cut_off: bool,
}

/// One pass (with or without MPS): the latency table, then the maximum rate.
fn run_pass(plan: &Plan, mps: Option<&MpsDaemon>, res: &mut Results) -> String {
    let with_mps = mps.is_some();
    let tag = mps_label(with_mps);
    let mut report = format!(
        "\n### MPS {tag}\n\n{}",
        output::table_header("MPS | frame | subs | mode | system | p50 | p50 by round | p99 | max | delivered | dropped | overruns | producer CPU/publish p50 (µs) | producer wall/publish p50 / p99 / max (µs) | kernel launch CPU p50 (µs), same pace | host busy / stolen %")
    );
    // Every case once per round, rounds interleaved; outcomes pooled.
    let mut cases: Vec<CaseRuns> = Vec::new();
    for &(w, h, label) in plan.sizes {
        for &n in &plan.sub_counts {
            for &system in &plan.systems {
                cases.push(CaseRuns {
                    size: (w, h, label),
                    n,
                    system,
                    pooled: None,
                    p50s: Vec::new(),
                    host: host::CpuTicks::default(),
                    failed: None,
                    cut_off: false,
                });
            }
        }
    }
    'rounds: for round in 0..plan.rounds {
        for c in cases.iter_mut() {
            let ((w, h, label), n, system) = (c.size, c.n, c.system);
            let (pooled, p50s, failed, ticks) = (&mut c.pooled, &mut c.p50s, &mut c.failed, &mut c.host);
            if failed.is_some() {
                continue;
            }
            if procs::stop_requested() || Instant::now() > plan.deadline {
                // What the rounds so far measured stands; a case never run
                // says it was skipped.
                break 'rounds;
            }
            let case = Case {
                system,
                width: w,
                height: h,
                subs: n,
                frames: plan.frames,
                warmup: 200,
                interval_us: 2000,
                dir: plan.dir.join(format!("{tag}-{}-{label}-{n}-r{round}", system.key())),
            };
            if plan.rounds > 1 {
                eprintln!(
                    "latency: round {}/{}, {label}, {n} subs, {}",
                    round + 1,
                    plan.rounds,
                    system.key()
                );
            }
            let before = host::CpuTicks::now();
            let outcome = run_case(&case, mps, case_deadline(&case, plan));
            ticks.add_since(before);
            match outcome {
                Ok(o) => {
                    p50s.push(pct(&o.lat, 0.5));
                    match pooled {
                        Some(p) => p.merge(o),
                        None => *pooled = Some(o),
                    }
                }
                // Killed at the run's time limit (`--timeout-s`) or by a
                // stop: cut off, not failed; the rounds so far stand.
                Err(_) if Instant::now() >= plan.deadline || procs::stop_requested() => {
                    c.cut_off = true;
                    break 'rounds;
                }
                Err(e) => *failed = Some(format!("failed: {e}")),
            }
        }
    }
    for c in cases {
        let ((_, _, label), n, system, p50s, cut_off) = (c.size, c.n, c.system, c.p50s, c.cut_off);
        let (host_busy, host_steal) = c.host.shares().unwrap_or((f64::NAN, f64::NAN));
        let host_cell = c.host.cell();
        let line = match (c.pooled, c.failed) {
            (Some(o), None) => {
                let (p50, p99, max) = (pct(&o.lat, 0.5), pct(&o.lat, 0.99), pct(&o.lat, 1.0));
                let (cpu, wall) = (pct(&o.pub_cpu, 0.5), pct(&o.pub_wall, 0.5));
                let (wall99, wall_max) = (pct(&o.pub_wall, 0.99), pct(&o.pub_wall, 1.0));
                let launch = pct(&o.launch_cpu, 0.5);
                res.p50.insert((with_mps, label, n, system.key()), p50);
                let mut rounds: Vec<String> = p50s.iter().map(|p| format!("{p:.1}")).collect();
                res.jsonl.push_str(&format!(
                    "{{\"bench\":\"latency\",\"mps\":\"{tag}\",\"frame\":\"{label}\",\"subs\":{n},\"mode\":\"{}\",\"system\":\"{}\",\"samples\":{},\"rounds\":{},\"cut_off\":{cut_off},\"p50_us\":{p50:.1},\"p50_by_round_us\":[{}],\"p99_us\":{p99:.1},\"max_us\":{max:.1},\"delivered\":{},\"dropped\":{},\"overruns\":{},\"queued\":{},\"queued_at_loan\":{},\"churn_cycles\":{},\"pub_cpu_p50_us\":{cpu:.1},\"pub_wall_p50_us\":{wall:.1},\"pub_wall_p99_us\":{wall99:.1},\"pub_wall_max_us\":{wall_max:.1},\"launch_cpu_p50_us\":{launch:.1},\"host_busy_pct\":{host_busy:.1},\"host_steal_pct\":{host_steal:.2}}}\n",
                    system.mode(),
                    system.name(),
                    o.lat.len(),
                    p50s.len(),
                    rounds.join(","),
                    o.delivered,
                    o.dropped,
                    o.overruns,
                    o.queued,
                    o.at_loan,
                    o.churn
                ).replace("NaN", "null"));
                if cut_off {
                    rounds.push("the next cut off by the run's time limit".into());
                }
                let delivered = if o.queued > 0 {
                    format!("{} ({} queued, {} at the loan)", o.delivered, o.queued, o.at_loan)
                } else if matches!(system.beside(), Some(("churner", _))) {
                    format!(
                        "{} (beside them, a subscriber came and went {} times)",
                        o.delivered, o.churn
                    )
                } else if system.beside().is_some() {
                    format!(
                        "{} (beside them, a GPU process made and freed push buffers {} times)",
                        o.delivered, o.churn
                    )
                } else {
                    o.delivered.to_string()
                };
                format!(
                    "| {tag} | {label} | {n} | {} | {} | {p50:.1} | {} | {p99:.1} | {max:.1} | {delivered} | {} | {} | {cpu:.1} | {wall:.1} / {wall99:.1} / {wall_max:.1} | {} | {host_cell} |\n",
                    system.mode(),
                    system.name(),
                    rounds.join(" / "),
                    o.dropped,
                    o.overruns,
                    if o.launch_cpu.is_empty() { "—".to_string() } else { format!("{launch:.1}") },
                )
            }
            (_, why) => format!(
                "| {tag} | {label} | {n} | {} | {} | {} |\n",
                system.mode(),
                system.name(),
                why.unwrap_or_else(|| {
                    if cut_off {
                        "cut off by the run's time limit (`--timeout-s`) or a stop".into()
                    } else {
                        "skipped: out of time or stopped".into()
                    }
                })
            ),
        };
        eprint!("{line}");
        report.push_str(&line);
    }
    report.push_str(&format!(
        "\nProducer CPU/publish is read between two `CLOCK_THREAD_CPUTIME_ID` reads around the publish call; \
         two back-to-back reads take {:.2} µs here (wall time, median of 10 000, warm), and the column includes about one \
         read's worth of it (the end of the first, the start of the second). The kernel launch column is the floor under a \
         stream-order publish, measured by each vramring producer before its frames with the same clock pair and pace: \
         300 launches of an empty kernel taking the commit kernel's 192-byte parameter, on the producer's stream.\n",
        common::clock::clock_pair_us()
    ));
    if !plan.throughput {
        return report;
    }
    report.push_str(&format!(
        "\nMaximum sustained rate (MPS {tag}), 4 subscribers, producer unpaced, overwrite policy:\n\n{}",
        output::table_header(
            "MPS | frame | mode | system | frames/s published | frames/s delivered per subscriber (mean)"
        )
    ));
    for &(w, h, label) in plan.throughput_sizes {
        for system in [
            System::VramringPush,
            System::Vramring,
            System::HostRt,
            System::LegacyIpc,
        ]
        .into_iter()
        .filter(|s| plan.systems.contains(s))
        {
            let case = Case {
                system,
                width: w,
                height: h,
                subs: 4,
                frames: plan.throughput_frames,
                warmup: 200,
                interval_us: 0,
                dir: plan.dir.join(format!("{tag}-tp-{}-{label}", system.key())),
            };
            if procs::stop_requested() || Instant::now() > plan.deadline {
                report.push_str(&format!(
                    "| {tag} | {label} | {} | {} | skipped: out of time or stopped | |\n",
                    system.mode(),
                    system.name()
                ));
                continue;
            }
            let line = match run_case(&case, mps, case_deadline(&case, plan)) {
                Ok(o) => {
                    // Measured frames over the producer's measured span; a
                    // subscriber's rate counts the measured frames it got.
                    let fps_pub = case.frames as f64 / o.span_s;
                    let fps_sub = o.lat.len() as f64 / 4.0 / o.span_s;
                    format!(
                        "| {tag} | {label} | {} | {} | {fps_pub:.0} | {fps_sub:.0} |\n",
                        system.mode(),
                        system.name()
                    )
                }
                Err(e) => format!(
                    "| {tag} | {label} | {} | {} | failed: {e} | |\n",
                    system.mode(),
                    system.name()
                ),
            };
            eprint!("{line}");
            report.push_str(&line);
        }
    }
    report
}

/// A ratio cell: "1.23×", or "–" where a side was not measured.
fn ratio(x: f64) -> String {
    if x.is_nan() {
        "–".to_string()
    } else {
        format!("{x:.2}×")
    }
}

/// The ratio tables of one pass, and across passes when both ran.
fn ratio_tables(plan: &Plan, passes: &[bool], res: &Results) -> String {
    let get = |m: bool, label: &'static str, n: usize, k: &'static str| {
        res.p50.get(&(m, label, n, k)).copied().unwrap_or(f64::NAN)
    };
    let mut out = String::new();
    for &m in passes {
        let tag = mps_label(m);
        out.push_str(&format!(
            "\nMPS {tag}: legacy CUDA IPC p50 ÷ each vramring mode's p50 (> 1 means that vramring mode is faster; the goal under MPS: every vramring mode ≥ 1.00×):\n\n{}",
            output::table_header("MPS | frame | subs | push | pull | push futex wait | every vramring mode at or below legacy IPC")
        ));
        for &(_, _, label) in plan.sizes {
            for &n in &plan.sub_counts {
                let ipc = get(m, label, n, "ipc");
                let r: Vec<f64> = ["vrp", "vr", "vrf"].iter().map(|k| ipc / get(m, label, n, k)).collect();
                // Modes not run (or failed) are named, not counted as a miss.
                let missing: Vec<&str> = ["push", "pull", "push futex wait"]
                    .iter()
                    .zip(&r)
                    .filter(|(_, x)| x.is_nan())
                    .map(|(name, _)| *name)
                    .collect();
                let verdict = if ipc.is_nan() || missing.len() == r.len() {
                    "no figure to compare".to_string()
                } else if r.iter().filter(|x| !x.is_nan()).all(|&x| x >= 1.0) {
                    if missing.is_empty() {
                        "yes".to_string()
                    } else {
                        format!("yes, of the modes measured (not measured: {})", missing.join(", "))
                    }
                } else {
                    "**no**".to_string()
                };
                out.push_str(&format!(
                    "| {tag} | {label} | {n} | {} | {} | {} | {verdict} |\n",
                    ratio(r[0]),
                    ratio(r[1]),
                    ratio(r[2])
                ));
            }
        }
        out.push_str(&format!(
            "\nMPS {tag}: other p50 ÷ vramring push p50 (> 1 means vramring push is faster):\n\n{}",
            output::table_header("MPS | frame | subs | host rt | legacy IPC | pull | push futex wait")
        ));
        for &(_, _, label) in plan.sizes {
            for &n in &plan.sub_counts {
                let vr = get(m, label, n, "vrp");
                out.push_str(&format!(
                    "| {tag} | {label} | {n} | {} | {} | {} | {} |\n",
                    ratio(get(m, label, n, "host") / vr),
                    ratio(get(m, label, n, "ipc") / vr),
                    ratio(get(m, label, n, "vr") / vr),
                    ratio(get(m, label, n, "vrf") / vr)
                ));
            }
        }
    }
    if passes.len() == 2 {
        out.push_str("\np50 with MPS ÷ p50 without (< 1 means MPS made it faster):\n\n");
        out.push_str(&output::table_header(
            "frame | subs | push | pull | push futex wait | host rt | legacy IPC",
        ));
        for &(_, _, label) in plan.sizes {
            for &n in &plan.sub_counts {
                let r = |k| get(true, label, n, k) / get(false, label, n, k);
                out.push_str(&format!(
                    "| {label} | {n} | {} | {} | {} | {} | {} |\n",
                    ratio(r("vrp")),
                    ratio(r("vr")),
                    ratio(r("vrf")),
                    ratio(r("host")),
                    ratio(r("ipc"))
                ));
            }
        }
    }
    out
}

fn usage() -> &'static str {
    "latency bench: [--quick] [--throughput-only] [--no-rate] [--systems K,K..] [--subs N,N..] [--mps [off|on|both]] [--rounds R] [--frames N] [--timeout-s S] [--out FILE]\n\
     --quick: 1080p at 1, 4 and 8 subscribers, 300 measured frames each (and the rate at 1080p)\n\
     --systems: only these rows (keys vrp push, vrpq push sequential, vrpx push lossless, vrps push CPU commit, vr pull, vrq pull queued, vra pull after commit, vrf push futex wait, host, ipc; experiments, not run by default: ipcwd, ipcwh legacy IPC with a stream wait on a device / host word, vrpc push with one more push subscriber coming and going beside the measured ones, vrpb push with a GPU process beside that makes and frees push buffers without connecting; vrpcw, vrpbw the same two with that process keeping its GPU context; vrpcwu vrpcw against a publisher without an attach rate; vrpg push whose producer replays the commit graph instead of launching each commit)\n\
     --subs: only these subscriber counts (default 1,4,8); --no-rate: skip the maximum-rate table\n\
     --frames N: measured frames per latency case (default 2000, 300 with --quick)\n\
     --mps: run under a private MPS control daemon (on), or without then with it (both); the daemon is always quit\n\
     --out FILE: the Markdown report; the rows as JSON lines go to FILE with the extension .jsonl"
}

fn main() -> R<()> {
    let args = output::args();
    if let Some(role) = procs::role_args(&args) {
        return role_main(role);
    }
    if output::help(&args, usage()) {
        return Ok(());
    }
    let mps_choice = MpsChoice::from_args(&args)?;
    let value_of = |flag: &str| output::value_of(&args, flag);
    let timeout_s: u64 = match value_of("--timeout-s") {
        Some(v) => v.parse().map_err(|_| format!("--timeout-s takes seconds, not {v:?}"))?,
        None => 570,
    };
    let throughput_only = output::has(&args, "--throughput-only");
    let systems = match value_of("--systems") {
        Some(list) => list
            .split(',')
            .map(|k| {
                System::from_key(k).ok_or_else(|| {
                    let keys: Vec<&str> = LATENCY_SYSTEMS.iter().map(|s| s.key()).collect();
                    format!(
                        "--systems: unknown system {k:?}; the keys are {} (and the experiments ipcwd, ipcwh, vrpc, vrpb, vrpcw, vrpbw, vrpcwu, vrpg)",
                        keys.join(",")
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => LATENCY_SYSTEMS.to_vec(),
    };
    let sub_counts = match value_of("--subs") {
        _ if throughput_only => Vec::new(),
        Some(list) => list
            .split(',')
            .map(|n| match n.parse::<usize>() {
                Ok(n) if (1..=64).contains(&n) => Ok(n),
                _ => Err(format!("--subs takes subscriber counts from 1 to 64, not {n:?}")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => vec![1, 4, 8],
    };
    if !vramring::cuda::cuda_usable() {
        eprintln!("latency bench: no usable CUDA GPU here; nothing measured (run it on a GPU machine)");
        return Ok(());
    }
    procs::install_stop_handler();
    let quick = output::has(&args, "--quick");
    let out = value_of("--out").map(PathBuf::from);
    const SIZES: &[(u32, u32, &str)] = &[(1920, 1080, "1080p"), (3840, 2160, "4K")];
    const HD: &[(u32, u32, &str)] = &[(1920, 1080, "1080p")];
    // `--rounds R`: every latency case R times, interleaved, samples pooled.
    let rounds: usize = match args.iter().position(|a| a == "--rounds") {
        Some(_) => value_of("--rounds").ok_or("--rounds N")?.parse()?,
        None => 1,
    };
    if rounds == 0 {
        return Err("--rounds: at least 1".into());
    }
    // `--frames N`: measured frames per latency case.
    let frames: u64 = match value_of("--frames") {
        Some(v) => match v.parse() {
            Ok(n) if n >= 1 => n,
            _ => return Err(format!("--frames takes a count of at least 1, not {v:?}").into()),
        },
        None if quick => 300,
        None => 2000,
    };
    let plan = Plan {
        sizes: if quick { HD } else { SIZES },
        sub_counts,
        systems,
        frames,
        rounds,
        throughput: !output::has(&args, "--no-rate"),
        throughput_sizes: if quick { HD } else { SIZES },
        throughput_frames: if quick { 2000 } else { 5000 },
        dir: std::env::temp_dir().join(format!("vramring-bench-{}", std::process::id())),
        deadline: Instant::now() + Duration::from_secs(timeout_s),
    };
    let mut report = format!(
        "Latency, publish → subscriber holds its copy (µs), NV12, {SLOTS} slots, {} frames per subscriber after 200 warm-up, 1 frame every 2 ms; GPU: {}; MPS: {:?}\n",
        plan.frames,
        gpu_name(),
        mps_choice
    );
    let mut res = Results::default();
    let mps_failed = mps_choice.run_passes(&mut report, |mps, report| {
        report.push_str(&run_pass(&plan, mps, &mut res));
    }) > 0;
    report.push_str(&ratio_tables(&plan, mps_choice.passes(), &res));
    let _ = std::fs::remove_dir_all(&plan.dir);
    println!("{report}");
    if let Some(out) = out {
        output::write_report(&out, &report, &res.jsonl)?;
    }
    if procs::stop_requested() {
        return Err("stopped by a signal".into());
    }
    if mps_failed {
        return Err("the MPS pass did not run (see the report)".into());
    }
    Ok(())
}
