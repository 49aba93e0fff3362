//! Wakeup cost at camera rates: how soon a subscriber holds a frame after
//! its publish, and how much CPU it spends waiting, for each way of
//! waiting, against the raw futex floor measured in the same run.
//!
//! Rows, each a real producer process and a real subscriber process (the
//! bench re-runs itself with `--role`), interleaved round by round:
//!
//! * `futex floor`: no vramring. The waker stores `CLOCK_MONOTONIC` and a
//!   seq in a file both processes map `MAP_SHARED` (a shared futex, keyed
//!   by the page, as vramring's memfd doorbells are), then `FUTEX_WAKE`s; the waiter is always parked on the
//!   futex word (`FUTEX_WAIT`, no spin) and reads the time when it returns.
//! * `vramring park`: `WaitStrategy::Park`, spin 50 µs then park (the wait
//!   before the cadence wait became the default).
//! * `vramring cadence`: `WaitStrategy::Cadence`, the default.
//! * `vramring spin`: `WaitStrategy::Spin`, busy-polling (one core).
//! * `GPU floor` (CUDA backend only): no vramring. The producer does the
//!   GPU work a push delivery does, on its own stream: the frame's copy into
//!   a "slot", then (after its clock read) a copy of the slot into a
//!   second buffer (the push copy) and `cuStreamWriteValue64` of the seq
//!   into host memory registered for the device (the commit); the waiter
//!   busy-polls that word. What any GPU hand-off with a copy costs at this
//!   cadence on this machine, with the GPU idle between frames; the spin
//!   row's distance to it is vramring's own.
//! * `GPU floor, the copy by a kernel` (`gpuk`, CUDA only): the same, but
//!   the push copy is a grid-stride kernel of the commit kernel's shape
//!   (the SMs copy, as vramring's commit does) instead of the copy engine.
//!
//! at three cadences: one frame every 2 ms, every 40 ms (25 fps), and at
//! uniformly random intervals of 1–60 ms (the same seeded sequence for
//! every row). The producer sleeps to each frame's due time
//! (`clock_nanosleep`, absolute), as a decoder fed by a camera does, then
//! writes the frame and publishes it.
//!
//! Latency: from the producer's clock read just before `publish` (CUDA:
//! after enqueueing the frame's write on its stream, before
//! `publish_cuda`) to the subscriber holding the
//! frame (`next()` returned; push delivery by default). Subscriber CPU: the
//! subscriber process's CPU time over the measured span ÷ that span.
//! Host busy / stolen: the whole machine's CPUs over the row's cases
//! (`/proc/stat`, `common/host.rs`), so that a row slowed by the lent VM's
//! host (steal) is told from one slowed by what it measures.
//! Submit (vramring and GPU rows): from the same clock read to the
//! producer's call returning (`publish_cuda`, or the floor's last driver
//! call), per frame; "after submit" is each delivered frame's latency less
//! its own submit: the GPU's work and the wake, without the producer's CPU.
//! The GPU floors also give each frame's latency less the time to their
//! copy's call returning: what follows the copy's enqueue, as "after
//! submit" is for vramring, whose commit launch is its last call (the
//! floors' last call, the stream write, hides part of their GPU work).
//! `--producer-spin`: every producer spins to each frame's due time
//! instead of sleeping, as a thread that is never idle between frames.
//! `--probe`: vramring producers timestamp the publish's stage marks
//! (TRACE events of target `vramring::publish`) and print each stage's
//! time after the clock read, per row.
//! `--busy-us 0,2000` (CUDA): every cadence once per value; with a value
//! above 0 a second thread of each producer process launches a one-vector
//! kernel on its own stream every that many µs, halfway between frames, as
//! a decoder serving other cameras keeps launching work (is a publish at
//! camera rates slow because the whole process and GPU idle, or because
//! its own thread does?).
//!
//! `cargo bench --bench wake -- [--quick] [--backend host|cuda] [--pull]
//! [--producer-spin] [--probe] [--busy-us 0,2000] [--out DIR] [--frames N] [--cadences 2000,40000,0] [--waits
//! futex,park,cadence,spin,gpu,gpuk]` (intervals in µs, 0: the irregular one; the GPU floors
//! `gpu` and `gpuk` run with the CUDA backend only); on a GPU machine, the staged binary:
//! `bash .device/run.sh bench wake --backend cuda --quick --out $OUT`.
//! Host backend: a small (320×240 NV12) frame written by the CPU. CUDA
//! backend: a 1080p NV12 frame copied into the slot on the producer's
//! stream, committed with `SlotMut::publish_cuda`. `--out DIR` receives
//! `wake.md` (the table) and `wake.jsonl` (one JSON object per row).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use vramring::ClientOptions;
use vramring::{
    BackendChoice, Format, FrameMeta, Mode, Publisher, RingConfig, Subscriber, SubscriberOptions, WaitStrategy,
};

use common::gpu::{host_device_ptr, launch, register_host, Module};
use common::output::{self, json_num as num};
use common::procs::{self, Children};
use common::{ck, host, now_ns, pct_us as pct, process_cpu_ns, read_samples, write_samples, Gpu, SharedMap, R};
use vramring_benches as common;

const SLOTS: u32 = 8;
/// Seed of the irregular cadence (xorshift64).
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Futex,
    Park,
    Cadence,
    Spin,
    GpuFloor,
    GpuKernel,
}

const SYSTEMS: [System; 6] = [
    System::Futex,
    System::Park,
    System::Cadence,
    System::Spin,
    System::GpuFloor,
    System::GpuKernel,
];

impl System {
    fn key(self) -> &'static str {
        match self {
            System::Futex => "futex",
            System::Park => "park",
            System::Cadence => "cadence",
            System::Spin => "spin",
            System::GpuFloor => "gpu",
            System::GpuKernel => "gpuk",
        }
    }
    fn name(self) -> &'static str {
        match self {
            System::Futex => "futex floor (raw FUTEX_WAIT/WAKE)",
            System::Park => "vramring park (spin 50 µs, then futex)",
            System::Cadence => "**vramring cadence (default)**",
            System::Spin => "vramring spin (busy-poll)",
            System::GpuFloor => "GPU floor (copy + stream write to host memory, busy-poll)",
            System::GpuKernel => "GPU floor, the copy by a kernel (busy-poll)",
        }
    }
    fn from_key(k: &str) -> Option<System> {
        output::by_key(&SYSTEMS, System::key, k)
    }
    fn is_gpu_floor(self) -> bool {
        matches!(self, System::GpuFloor | System::GpuKernel)
    }
}

/// When frame `k` is due, in ns after the start: a fixed interval, or
/// (`interval_us == 0`) the sum of `k` uniformly random 1–60 ms intervals.
struct Pacer {
    interval_ns: u64,
    x: u64,
    due: u64,
}

impl Pacer {
    fn new(interval_us: u64) -> Pacer {
        Pacer {
            interval_ns: interval_us * 1000,
            x: SEED,
            due: 0,
        }
    }
    /// The offset of the next frame.
    fn next(&mut self) -> u64 {
        let step = if self.interval_ns > 0 {
            self.interval_ns
        } else {
            self.x ^= self.x << 13;
            self.x ^= self.x >> 7;
            self.x ^= self.x << 17;
            1_000_000 + self.x % 59_000_001
        };
        self.due += step;
        self.due
    }
}

/// One row, passed to both roles on their command line.
#[derive(Clone, Debug)]
struct Case {
    system: System,
    cuda: bool,
    push: bool,
    /// The producer waits for each frame's due time spinning, not asleep.
    producer_spin: bool,
    /// vramring producers time the publish's stage marks (`--probe`).
    probe: bool,
    interval_us: u64,
    /// CUDA producers: a second thread of the producer process enqueues a
    /// one-vector kernel on its own stream every this many µs, half a
    /// period out of phase with the frames (`--busy-us`; 0: none).
    busy_us: u64,
    warmup: u64,
    frames: u64,
    dir: PathBuf,
}

impl Case {
    fn args(&self) -> Vec<String> {
        vec![
            self.system.key().into(),
            u8::from(self.cuda).to_string(),
            u8::from(self.push).to_string(),
            u8::from(self.producer_spin).to_string(),
            u8::from(self.probe).to_string(),
            self.interval_us.to_string(),
            self.busy_us.to_string(),
            self.warmup.to_string(),
            self.frames.to_string(),
            self.dir.display().to_string(),
        ]
    }
    fn parse(a: &[String]) -> R<Case> {
        if a.len() < 10 {
            return Err("role arguments".into());
        }
        Ok(Case {
            system: System::from_key(&a[0]).ok_or("system")?,
            cuda: a[1] == "1",
            push: a[2] == "1",
            producer_spin: a[3] == "1",
            probe: a[4] == "1",
            interval_us: a[5].parse()?,
            busy_us: a[6].parse()?,
            warmup: a[7].parse()?,
            frames: a[8].parse()?,
            dir: PathBuf::from(&a[9]),
        })
    }
    fn sock(&self) -> PathBuf {
        self.dir.join("ring.sock")
    }
    /// The row's control block: in `/dev/shm` where there is one (the GPU
    /// floor registers it with the driver, which pins shmem pages but not
    /// those of an ordinary file), else in the row's directory.
    fn shm(&self) -> PathBuf {
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            let name = self.dir.to_string_lossy().replace('/', "-");
            shm.join(format!("vramring-wake{name}"))
        } else {
            self.dir.join("ctl")
        }
    }
    fn size(&self) -> (u32, u32) {
        if self.cuda {
            (1920, 1080)
        } else {
            (320, 240)
        }
    }
}

/// A 4 KiB control block shared by the two processes of a row:
/// `[0]` futex word (u32), `[1]` seq, `[2]` t0 of the seq, `[3]` the
/// subscriber is ready, `[4]` the producer is done, `[5]` the socket is up.
/// A file in the row's directory, mapped `MAP_SHARED` by both.
struct Ctl {
    map: SharedMap,
}

impl Ctl {
    fn create(path: &Path) -> R<Ctl> {
        Ok(Ctl {
            map: SharedMap::create(path, 4096)?,
        })
    }
    fn open(path: &Path) -> R<Ctl> {
        Ok(Ctl {
            map: SharedMap::open(path, Some(4096))?,
        })
    }
    fn word(&self, k: usize) -> &AtomicU64 {
        self.map.word(k)
    }
    /// Word 0, used only through this view.
    fn futex(&self) -> &AtomicU32 {
        self.map.word32()
    }
    fn seq(&self) -> &AtomicU64 {
        self.word(1)
    }
    fn t0(&self) -> &AtomicU64 {
        self.word(2)
    }
    fn ready(&self) -> &AtomicU64 {
        self.word(3)
    }
    fn done(&self) -> &AtomicU64 {
        self.word(4)
    }
    fn up(&self) -> &AtomicU64 {
        self.word(5)
    }
    /// A floor waiter's block, once it has told the producer it is ready.
    fn waiter(c: &Case) -> R<Ctl> {
        let ctl = Ctl::open(&c.shm())?;
        // SYNC: bench-ready — Release, paired with the producer's Acquire.
        ctl.ready().store(1, Ordering::Release);
        Ok(ctl)
    }
    /// Whether the producer is still at it.
    fn running(&self) -> bool {
        // SYNC: bench-done — Acquire pairs with the producer's Release.
        self.done().load(Ordering::Acquire) == 0
    }
    /// GPU floor: the seq the producer's stream wrote last.
    fn gpu_seq(&self) -> &AtomicU64 {
        self.word(GPU_SEQ_WORD)
    }
    /// GPU floor: the producer's t0 of seq `k` (a ring of 256).
    fn t0_of(&self, k: u64) -> &AtomicU64 {
        self.word(T0_WORDS + (k % 256) as usize)
    }
}

/// GPU floor: word the producer's stream writes the seq into.
const GPU_SEQ_WORD: usize = 8;
/// GPU floor: first of 256 words holding each seq's t0.
const T0_WORDS: usize = 64;

/// What a producer reports: for each seq (the index), how long after its
/// t0 the producer's thread had enqueued the frame's GPU work (`publish_cuda`
/// returned, or the floor's last driver call did). Joined with the
/// subscriber's per-frame seqs, it splits each latency into the
/// producer's submit and what follows it (the GPU's work and the wake).
struct Submit(Vec<u64>);

impl Submit {
    fn new(c: &Case) -> Submit {
        Submit(vec![0; (c.warmup + c.frames + 1) as usize])
    }
    fn record(&mut self, seq: u64, ns: u64) {
        if let Some(w) = self.0.get_mut(seq as usize) {
            *w = ns;
        }
    }
    fn write(&self, c: &Case, name: &str) -> R<()> {
        write_samples(&c.dir.join(name), &self.0)
    }
}

/// What a subscriber role reports: latencies, the seq of each, then
/// `[delivered, dropped, cpu_ns, wall_ns]`.
fn write_result(c: &Case, lat: &[u64], seqs: &[u64], delivered: u64, dropped: u64, cpu_ns: u64, wall_ns: u64) -> R<()> {
    write_samples(&c.dir.join("lat"), lat)?;
    write_samples(&c.dir.join("seqs"), seqs)?;
    write_samples(&c.dir.join("stats"), &[delivered, dropped, cpu_ns, wall_ns])
}

/// What a floor waiter counts: the measured frames' latencies, gaps, and
/// its process CPU over the measured span.
#[derive(Default)]
struct Tally {
    last: u64,
    lat: Vec<u64>,
    seqs: Vec<u64>,
    delivered: u64,
    dropped: u64,
    cpu0: u64,
    wall0: u64,
    cpu1: u64,
    wall1: u64,
}

impl Tally {
    /// Frame `seq`, published at `t0`, seen at `t1` (after `last`).
    fn saw(&mut self, c: &Case, seq: u64, t0: u64, t1: u64) {
        if seq > c.warmup {
            if self.lat.is_empty() {
                (self.cpu0, self.wall0) = (process_cpu_ns(), t1);
            }
            self.lat.push(t1.saturating_sub(t0));
            self.seqs.push(seq);
            self.delivered += 1;
            self.dropped += seq - self.last - 1;
            (self.cpu1, self.wall1) = (process_cpu_ns(), now_ns());
        }
        self.last = seq;
    }

    fn write(&self, c: &Case) -> R<()> {
        write_result(
            c,
            &self.lat,
            &self.seqs,
            self.delivered,
            self.dropped,
            self.cpu1 - self.cpu0,
            self.wall1 - self.wall0,
        )
    }
}

// ------------------------------------------------------------ futex floor

fn futex_waker(c: &Case) -> R<()> {
    let ctl = Ctl::open(&c.shm())?;
    // SYNC: bench-ready — Acquire pairs with the subscriber's Release.
    while ctl.ready().load(Ordering::Acquire) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut pacer = Pacer::new(c.interval_us);
    let start = now_ns();
    for k in 1..=c.warmup + c.frames {
        common::wait_until_ns(start + pacer.next(), c.producer_spin);
        let t0 = now_ns();
        ctl.t0().store(t0, Ordering::Relaxed);
        // SYNC: bench-seq — Release: the waiter that sees `k` sees its t0.
        ctl.seq().store(k, Ordering::Release);
        // SYNC: bench-futex — Release, paired with the waiter's Acquire.
        ctl.futex().store(k as u32, Ordering::Release);
        let _ = rustix::thread::futex::wake(ctl.futex(), rustix::thread::futex::Flags::empty(), 1);
    }
    std::thread::sleep(Duration::from_millis(20));
    // SYNC: bench-done — Release, paired with the waiter's Acquire.
    ctl.done().store(1, Ordering::Release);
    // SYNC: bench-futex — Release (a last change of the word wakes it).
    ctl.futex().store(u32::MAX, Ordering::Release);
    let _ = rustix::thread::futex::wake(ctl.futex(), rustix::thread::futex::Flags::empty(), 1);
    Ok(())
}

fn futex_waiter(c: &Case) -> R<()> {
    let ctl = Ctl::waiter(c)?;
    let mut tally = Tally::default();
    while ctl.running() {
        // SYNC: bench-futex — Acquire pairs with the waker's Release; the
        // word is loaded before the seq, so a wake after it is not missed.
        let word = ctl.futex().load(Ordering::Acquire);
        // SYNC: bench-seq — Acquire pairs with the waker's Release.
        let seq = ctl.seq().load(Ordering::Acquire);
        if seq > tally.last {
            let t1 = now_ns();
            tally.saw(c, seq, ctl.t0().load(Ordering::Relaxed), t1);
            continue;
        }
        let ts = rustix::time::Timespec { tv_sec: 1, tv_nsec: 0 };
        let _ = rustix::thread::futex::wait(ctl.futex(), rustix::thread::futex::Flags::empty(), word, Some(&ts));
    }
    tally.write(c)
}

// ------------------------------------------------------------ GPU floor

/// A grid-stride copy of 16-byte vectors (`dst`, `src`, count), launched
/// with the commit kernel's shape (256 threads, a block per 256 vectors):
/// the `gpuk` floor's push copy done by the SMs, as vramring's commit
/// kernel does it, instead of by the copy engine.
const COPY_PTX: &std::ffi::CStr = c"
.version 7.0
.target sm_70
.address_size 64
.visible .entry wake_copy(.param .u64 p_dst, .param .u64 p_src, .param .u64 p_vecs)
{
    .reg .pred %p<2>;
    .reg .b32 %r<10>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [p_dst];
    ld.param.u64 %rd2, [p_src];
    ld.param.u64 %rd3, [p_vecs];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
COPY_LOOP:
    setp.ge.u64 %p1, %rd4, %rd3;
    @%p1 bra COPY_DONE;
    shl.b64 %rd7, %rd4, 4;
    add.u64 %rd8, %rd2, %rd7;
    ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd8];
    add.u64 %rd9, %rd1, %rd7;
    st.global.v4.u32 [%rd9], {%r5, %r6, %r7, %r8};
    add.u64 %rd4, %rd4, %rd6;
    bra COPY_LOOP;
COPY_DONE:
    ret;
}
";

/// The `gpuk` floor's copy kernel, loaded in the current context.
struct CopyKernel {
    function: sys::CUfunction,
    _module: Module,
}

impl CopyKernel {
    fn load() -> R<CopyKernel> {
        let module = Module::load(COPY_PTX)?;
        Ok(CopyKernel {
            function: module.function(c"wake_copy")?,
            _module: module,
        })
    }

    /// Enqueues the copy of `bytes` (a multiple of 16) from `src` to `dst`.
    ///
    /// # Safety
    /// Both are live, 16-byte aligned device allocations of `bytes` in the
    /// current context; `stream` is live there.
    unsafe fn launch(&self, dst: u64, src: u64, bytes: usize, stream: sys::CUstream) -> R<()> {
        let (mut dst, mut src, mut vecs) = (dst, src, (bytes / 16) as u64);
        let blocks = vecs.div_ceil(256).clamp(1, 2048) as u32;
        let mut params = [
            (&mut dst as *mut u64).cast::<std::ffi::c_void>(),
            (&mut src as *mut u64).cast(),
            (&mut vecs as *mut u64).cast(),
        ];
        // SAFETY: three u64 parameters, as the PTX declares; the addresses
        // are valid (this function's contract). The module is unloaded
        // (dropped) only after the waker synchronised its stream.
        unsafe { launch(self.function, blocks, 256, stream, &mut params) }
    }
}

/// `--busy-us`: the rest of a decoder process. A second thread of a CUDA
/// producer, in the same (primary) context, enqueues a one-vector
/// [`CopyKernel`] on its own stream every `busy_us`, at the midpoints
/// between frames' due times (so at 25 fps with 2 ms the last one came
/// 1 ms before each frame), as a decoder serving other cameras would keep
/// launching work. The frames' own path is unchanged.
struct Busy {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<R<u64>>>,
}

impl Busy {
    /// Starts the thread when the case asks for it; `start` is the
    /// producer's pacing origin (ns, monotonic).
    fn start(c: &Case, start: u64) -> Option<Busy> {
        if !c.cuda || c.busy_us == 0 {
            return None;
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let period = c.busy_us * 1000;
        let flag = stop.clone();
        let thread = std::thread::spawn(move || Self::run(&flag, start + period / 2, period));
        Some(Busy {
            stop,
            thread: Some(thread),
        })
    }

    fn run(stop: &std::sync::atomic::AtomicBool, first: u64, period: u64) -> R<u64> {
        let gpu = Gpu::init()?;
        let kernel = CopyKernel::load()?;
        let (a, b) = (gpu.alloc(16)?, gpu.alloc(16)?);
        let mut launches = 0;
        let mut due = first;
        // Relaxed: a stop request; nothing else is published through it.
        while !stop.load(Ordering::Relaxed) {
            common::sleep_until_ns(due);
            due += period;
            // SAFETY: two live 16-byte allocations of this context (cuMemAlloc
            // aligns them), our live stream.
            unsafe { kernel.launch(b, a, 16, gpu.stream)? };
            launches += 1;
        }
        gpu.sync()?;
        // SAFETY: our allocations, idle (the stream is synchronised);
        // nothing uses them after.
        unsafe {
            gpu.free(a)?;
            gpu.free(b)?;
        }
        gpu.close()?;
        Ok(launches)
    }

    /// Stops the thread and reports how many kernels it launched.
    fn finish(mut self) -> R<u64> {
        // Relaxed: see `run`.
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().ok_or("busy thread already joined")?;
        thread.join().map_err(|_| "busy thread panicked")?
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        // Relaxed: see `run`. An error path drops it unjoined: the thread
        // ends at its next period.
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn gpu_waker(c: &Case) -> R<()> {
    let (w, h) = c.size();
    let bytes = vramring::Geometry::new(Format::Nv12, w, h)?.frame_bytes as usize;
    let (g, src) = source(bytes)?;
    let kernel = match c.system {
        System::GpuKernel if bytes % 16 == 0 => Some(CopyKernel::load()?),
        System::GpuKernel => return Err("the kernel copy needs a frame of whole 16-byte vectors".into()),
        _ => None,
    };
    let ctl = Ctl::open(&c.shm())?;
    let (slot, push) = (g.alloc(bytes)?, g.alloc(bytes)?);
    let base = ctl.map.as_mut_ptr().cast();
    // SAFETY: the primary context is current; `base` is this process's
    // 4 KiB shared mapping of the control block (page aligned), which
    // lives until the end of this function (unregistered before).
    let dev = unsafe {
        register_host(base, 4096, sys::CU_MEMHOSTREGISTER_DEVICEMAP)?;
        host_device_ptr(base)?
    };
    let seq_word = dev + 8 * GPU_SEQ_WORD as u64;
    // SYNC: bench-up — Release, paired with the orchestrator's Acquire.
    ctl.up().store(1, Ordering::Release);
    // SYNC: bench-ready — Acquire pairs with the subscriber's Release.
    while ctl.ready().load(Ordering::Acquire) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut pacer = Pacer::new(c.interval_us);
    let (mut submit, mut copied) = (Submit::new(c), Submit::new(c));
    let start = now_ns();
    let busy = Busy::start(c, start);
    for k in 1..=c.warmup + c.frames {
        common::wait_until_ns(start + pacer.next(), c.producer_spin);
        // SAFETY: our own buffers of `bytes` and stream; `seq_word` is
        // registered device-visible host memory, live until unregistered
        // after the stream is synchronised below.
        unsafe {
            g.copy(slot, src, bytes)?;
            let t0 = now_ns();
            // Relaxed: the store happens before the driver call that
            // enqueues the GPU's write of `k`, which the waiter polls.
            ctl.t0_of(k).store(t0, Ordering::Relaxed);
            match &kernel {
                Some(kernel) => kernel.launch(push, slot, bytes, g.stream)?,
                None => g.copy(push, slot, bytes)?,
            }
            copied.record(k, now_ns() - t0);
            ck(
                "cuStreamWriteValue64",
                sys::cuStreamWriteValue64_v2(g.stream, seq_word, k, 0),
            )?;
            submit.record(k, now_ns() - t0);
        }
    }
    g.sync()?;
    // SAFETY: the stream is synchronised: nothing pending uses the
    // registration.
    unsafe { common::gpu::unregister_host(base)? };
    drop(kernel);
    if let Some(busy) = busy {
        busy.finish()?;
    }
    submit.write(c, "submit")?;
    copied.write(c, "copied")?;
    std::thread::sleep(Duration::from_millis(20));
    // SYNC: bench-done — Release, paired with the waiter's Acquire.
    ctl.done().store(1, Ordering::Release);
    Ok(())
}

fn gpu_waiter(c: &Case) -> R<()> {
    let ctl = Ctl::waiter(c)?;
    let mut tally = Tally::default();
    while ctl.running() {
        // Acquire: the GPU's write of the seq follows the producer's t0
        // store (see the waker).
        let seq = ctl.gpu_seq().load(Ordering::Acquire);
        if seq <= tally.last {
            std::hint::spin_loop();
            continue;
        }
        let t1 = now_ns();
        tally.saw(c, seq, ctl.t0_of(seq).load(Ordering::Relaxed), t1);
    }
    tally.write(c)
}

// ------------------------------------------------------------ vramring

/// The CUDA side of a producer: a stream and a source frame of `bytes`.
fn source(bytes: usize) -> R<(Gpu, sys::CUdeviceptr)> {
    let gpu = Gpu::init()?;
    let src = gpu.alloc_filled(bytes, 0x5a)?;
    Ok((gpu, src))
}

fn vr_producer(c: &Case) -> R<()> {
    let (w, h) = c.size();
    let bytes = vramring::Geometry::new(Format::Nv12, w, h)?.frame_bytes as usize;
    let gpu = if c.cuda { Some(source(bytes)?) } else { None };
    let backend = if c.cuda {
        BackendChoice::Cuda(0)
    } else {
        BackendChoice::Host
    };
    let cfg = RingConfig::new(Format::Nv12, w, h)
        .slots(SLOTS)
        .backend(backend)
        .commit_graph(common::commit_graph_from_env());
    let mut p = Publisher::create(c.sock(), cfg)?;
    let ctl = Ctl::open(&c.shm())?;
    // SYNC: bench-up — Release, paired with the orchestrator's Acquire.
    ctl.up().store(1, Ordering::Release);
    // SYNC: bench-ready — Acquire pairs with the subscriber's Release.
    while ctl.ready().load(Ordering::Acquire) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut pacer = Pacer::new(c.interval_us);
    let mut submit = Submit::new(c);
    let mut stages = c.probe.then(probe::Stages::install);
    let start = now_ns();
    let busy = Busy::start(c, start);
    for k in 0..c.warmup + c.frames {
        common::wait_until_ns(start + pacer.next(), c.producer_spin);
        let mut slot = p.loan(Duration::from_secs(1))?;
        match &gpu {
            Some((g, src)) => {
                let dst = slot.device_mut()?.as_raw();
                // SAFETY: the slot is a `bytes`-long part of the pool in the
                // primary context, which is current; `src` holds `bytes`.
                unsafe { g.copy(dst, *src, bytes)? }
            }
            None => slot.plane_mut(0)?.fill(k as u8),
        }
        let t0 = now_ns();
        let meta = FrameMeta::pts(k as i64).with_user(&t0.to_le_bytes())?;
        match &gpu {
            // SAFETY: our live stream in the ring's context.
            Some((g, _)) => unsafe { slot.publish_cuda(meta, vramring::cuda::Stream::from_raw(g.stream))? },
            None => slot.publish(meta)?,
        };
        submit.record(k, now_ns() - t0);
        if let Some(stages) = &mut stages {
            stages.frame(t0, k >= c.warmup);
        }
    }
    if let Some(busy) = busy {
        busy.finish()?;
    }
    submit.write(c, "submit")?;
    if let Some(stages) = &stages {
        std::fs::write(c.dir.join("probe"), stages.summary())?;
    }
    std::thread::sleep(Duration::from_millis(20));
    p.close()?;
    Ok(())
}

fn vr_subscriber(c: &Case) -> R<()> {
    let wait = match c.system {
        System::Park => WaitStrategy::Park,
        System::Cadence => WaitStrategy::Cadence,
        _ => WaitStrategy::Spin,
    };
    let opts = SubscriberOptions::default()
        .mode(Mode::Latest)
        .push(c.push)
        .name(format!("wake-{}", c.system.key()))
        .wait(wait);
    let ctl = Ctl::open(&c.shm())?;
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut s = loop {
        match Subscriber::connect(c.sock(), opts.clone()) {
            Ok(s) => break s,
            Err(e) if Instant::now() > give_up => return Err(format!("connect: {e}").into()),
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    };
    // SYNC: bench-ready — Release, paired with the producer's Acquire.
    ctl.ready().store(1, Ordering::Release);
    let mut lat = Vec::with_capacity(c.frames as usize);
    let mut seqs = Vec::with_capacity(c.frames as usize);
    let (mut cpu0, mut wall0, mut cpu1, mut wall1) = (0, 0, 0, 0);
    let (mut delivered, mut first_dropped) = (0u64, None);
    // Cadence row: each frame's latency by how its wait ended (caught in
    // the window, came before it, came after a missed one, no window),
    // from the estimator's counters around each `next()` (two reads of its
    // state per frame, in the cadence row only; they count in its CPU).
    let cadence_row = c.system == System::Cadence;
    let mut by_class: [Vec<u64>; 4] = Default::default();
    loop {
        let before = cadence_row.then(|| s.cadence());
        match s.next(Duration::from_secs(2)) {
            Ok(f) => {
                let t1 = now_ns();
                let t0 = u64::from_le_bytes(f.user().get(..8).ok_or("user meta")?.try_into()?);
                let seq = f.pts() as u64;
                if seq >= c.warmup {
                    if lat.is_empty() {
                        (cpu0, wall0) = (process_cpu_ns(), t1);
                    }
                    if let Some(before) = before {
                        let after = s.cadence();
                        let class = if after.hits > before.hits {
                            0
                        } else if after.early > before.early {
                            1
                        } else if after.misses > before.misses {
                            2
                        } else {
                            3
                        };
                        by_class[class].push(t1.saturating_sub(t0));
                    }
                    lat.push(t1.saturating_sub(t0));
                    seqs.push(seq);
                    delivered += 1;
                    (cpu1, wall1) = (process_cpu_ns(), now_ns());
                }
            }
            Err(vramring::Error::ProducerGone { .. }) => break,
            Err(e) => return Err(e.into()),
        }
        if first_dropped.is_none() && !lat.is_empty() {
            // Gaps counted from the first measured frame on.
            first_dropped = Some(s.stats().dropped);
        }
    }
    let dropped = s.stats().dropped - first_dropped.unwrap_or(s.stats().dropped);
    if c.system == System::Cadence {
        let st = s.cadence();
        let classes = ["caught in the window", "came before it", "came after it", "no window"]
            .iter()
            .zip(by_class.iter_mut())
            .filter(|(_, v)| !v.is_empty())
            .map(|(name, v)| {
                v.sort_unstable();
                format!(
                    "{name}: {} (p50 {:.1}, max {:.1} µs)",
                    v.len(),
                    pct(v, 0.5),
                    pct(v, 1.0)
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        std::fs::write(
            c.dir.join("cadence"),
            format!(
                "interval {} µs ({}), margin {:.0} µs, tolerance {:.0} µs, windows {}, hits {}, misses {}, early {}; covers a timer overshoot of {:.0} µs, commits {:.0} µs early / {:.0} µs late",
                st.interval_ns
                    .map_or("none".into(), |i| format!("{:.1}", i as f64 / 1000.0)),
                if st.grid { "grid" } else { "last commit" },
                st.margin_ns as f64 / 1000.0,
                st.tolerance_ns as f64 / 1000.0,
                st.windows,
                st.hits,
                st.misses,
                st.early,
                st.overshoot_ns as f64 / 1000.0,
                st.early_ns as f64 / 1000.0,
                st.late_ns as f64 / 1000.0
            ) + "\nwake:   frames by how the wait ended: " + &classes,
        )?;
    }
    write_result(c, &lat, &seqs, delivered, dropped, cpu1 - cpu0, wall1 - wall0)
}

// ------------------------------------------------------------ orchestration

fn role_main(args: &[String]) -> R<()> {
    let role = args.first().ok_or("role")?.as_str();
    let c = Case::parse(&args[1..])?;
    match (role, c.system) {
        ("producer", System::Futex) => futex_waker(&c),
        ("subscriber", System::Futex) => futex_waiter(&c),
        ("producer", System::GpuFloor | System::GpuKernel) => gpu_waker(&c),
        ("subscriber", System::GpuFloor | System::GpuKernel) => gpu_waiter(&c),
        ("producer", _) => vr_producer(&c),
        ("subscriber", _) => vr_subscriber(&c),
        _ => Err("unknown role".into()),
    }
}

fn spawn_role(children: &mut Children, role: &str, c: &Case) -> R<()> {
    children.spawn(role, &mut procs::role_command(role, c.args())?)?;
    Ok(())
}

/// One row's outcome (several rounds merged).
#[derive(Default)]
struct Row {
    lat: Vec<u64>,
    /// GPU rows: each delivered frame's submit time, and its latency less
    /// that (see [`Submit`]).
    submit: Vec<u64>,
    after: Vec<u64>,
    /// GPU floors: each frame's latency less the time to its copy's call
    /// returning (the GPU's copy, the stream write and the wake).
    after_copy: Vec<u64>,
    delivered: u64,
    dropped: u64,
    cpu_ns: u64,
    wall_ns: u64,
    /// The whole machine's CPU counters over this row's cases
    /// (`/proc/stat`: total, idle and stolen ticks), summed.
    host: host::CpuTicks,
    failed: Option<String>,
}

/// One case's outcome: latencies, `[delivered, dropped, cpu_ns, wall_ns]`,
/// and (where the producer reported them) each delivered frame's submit
/// time and its latency after the submit.
struct Outcome {
    lat: Vec<u64>,
    stats: [u64; 4],
    submit: Vec<u64>,
    after: Vec<u64>,
    after_copy: Vec<u64>,
}

fn run_case(c: &Case) -> R<Outcome> {
    let _ = std::fs::remove_dir_all(&c.dir);
    std::fs::create_dir_all(&c.dir)?;
    let ctl = Ctl::create(&c.shm())?;
    // Killed and reaped on every path out (dropped).
    let mut children = Children::default();
    spawn_role(&mut children, "producer", c)?;
    if c.system != System::Futex {
        children.wait_for(
            // SYNC: bench-up — Acquire pairs with the producer's Release.
            || ctl.up().load(Ordering::Acquire) != 0,
            Instant::now() + Duration::from_secs(60),
            "producer",
            "producer did not start",
        )?;
    }
    spawn_role(&mut children, "subscriber", c)?;
    // Every frame at its longest interval (the irregular cadence's 60 ms),
    // and a minute for the processes' start and end.
    let frame_ns = if c.interval_us > 0 {
        c.interval_us * 1000
    } else {
        60_000_000
    };
    let deadline = Instant::now() + Duration::from_secs(60) + Duration::from_nanos(frame_ns * (c.warmup + c.frames));
    children.wait_all(deadline, Duration::from_secs(5))?;
    let lat = read_samples(&c.dir.join("lat"))?;
    let st = read_samples(&c.dir.join("stats"))?;
    if let Ok(d) = std::fs::read_to_string(c.dir.join("cadence")) {
        eprintln!("wake:   cadence wait at the end: {d}");
    }
    if let Ok(d) = std::fs::read_to_string(c.dir.join("probe")) {
        eprintln!("wake:   publish stages, µs after the producer's clock read, p50 / p99: {d}");
    }
    let stats: [u64; 4] = st.as_slice().try_into().map_err(|_| "stats")?;
    let (mut submit, mut after, mut after_copy) = (Vec::new(), Vec::new(), Vec::new());
    let seqs = read_samples(&c.dir.join("seqs")).unwrap_or_default();
    // Each delivered frame's producer-side time from `name`, indexed by seq.
    let joined = |name: &str| -> R<Vec<u64>> {
        let Ok(by_seq) = read_samples(&c.dir.join(name)) else {
            return Ok(Vec::new());
        };
        seqs.iter()
            .map(|&seq| {
                by_seq
                    .get(seq as usize)
                    .copied()
                    .ok_or_else(|| "a delivered seq the producer did not publish".into())
            })
            .collect()
    };
    for (&l, s) in lat.iter().zip(joined("submit")?) {
        submit.push(s);
        after.push(l.saturating_sub(s));
    }
    for (&l, s) in lat.iter().zip(joined("copied")?) {
        after_copy.push(l.saturating_sub(s));
    }
    let _ = std::fs::remove_dir_all(&c.dir);
    let _ = std::fs::remove_file(c.shm());
    Ok(Outcome {
        lat,
        stats,
        submit,
        after,
        after_copy,
    })
}

fn cadence_name(interval_us: u64) -> String {
    match interval_us {
        0 => "irregular 1–60 ms".into(),
        40_000 => "40 ms (25 fps)".into(),
        us => format!("{} ms", us as f64 / 1000.0),
    }
}

/// A row group's name: the cadence, and what else the producer process does.
fn variant_name(interval_us: u64, busy_us: u64) -> String {
    match busy_us {
        0 => cadence_name(interval_us),
        b => format!(
            "{}, producer process busy every {} ms",
            cadence_name(interval_us),
            b as f64 / 1000.0
        ),
    }
}

const USAGE: &str = "usage: wake [--quick] [--backend host|cuda] [--pull] [--frames N] \
[--cadences US,US,..(0: irregular)] [--waits futex,park,cadence,spin,gpu,gpuk] \
[--busy-us US,..(cuda)] [--producer-spin] [--probe] [--out DIR]";

fn main() -> std::process::ExitCode {
    output::exit(real_main(), "", 2)
}

fn real_main() -> R<()> {
    let args = output::args();
    if let Some(role) = procs::role_args(&args) {
        return role_main(role);
    }
    // Every argument is one this bench knows: a typo must not run the
    // default set for minutes instead.
    let mut k = 0;
    while k < args.len() {
        match args[k].as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            "--quick" | "--pull" | "--producer-spin" | "--probe" => k += 1,
            "--backend" | "--out" | "--frames" | "--cadences" | "--waits" | "--busy-us" if k + 1 < args.len() => k += 2,
            other => return Err(format!("wake bench: unknown or incomplete argument {other:?}\n{USAGE}").into()),
        }
    }
    let quick = output::has(&args, "--quick");
    let opt = |name: &str| output::value_of(&args, name).cloned();
    let cuda = match opt("--backend").as_deref() {
        None | Some("host") => false,
        Some("cuda") => true,
        Some(other) => return Err(format!("--backend {other}: host or cuda").into()),
    };
    if cuda && !vramring::cuda::cuda_usable() {
        return Err("wake bench: --backend cuda but no usable CUDA GPU here".into());
    }
    let push = !output::has(&args, "--pull");
    let out = opt("--out").map(PathBuf::from);
    let (frames, rounds, warmup) = if quick { (300, 1, 30) } else { (1500, 3, 30) };
    let frames = match opt("--frames") {
        Some(n) => n.parse().map_err(|e| format!("--frames {n}: {e}"))?,
        None => frames,
    };
    // `--cadences 2000,40000,0`: intervals in µs, 0 for the irregular one.
    let cadences: Vec<u64> = match opt("--cadences") {
        Some(list) => list
            .split(',')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("--cadences {list}: {e}"))?,
        None => vec![2_000, 40_000, 0],
    };
    // `--waits futex,park,cadence,spin`: the rows to run (the floor row is
    // the ratios' reference).
    let waits: Vec<System> = match opt("--waits") {
        Some(list) => list
            .split(',')
            .map(|k| System::from_key(k).ok_or_else(|| format!("--waits: unknown {k}")))
            .collect::<Result<_, _>>()?,
        None => SYSTEMS.to_vec(),
    };
    // `--busy-us 0,2000`: each cadence once per value (CUDA producers; 0:
    // the producer process does nothing else).
    let busy: Vec<u64> = match opt("--busy-us") {
        Some(list) => list
            .split(',')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("--busy-us {list}: {e}"))?,
        None => vec![0],
    };
    if !cuda && busy.iter().any(|&b| b > 0) {
        return Err("--busy-us needs --backend cuda".into());
    }
    // Rows by (cadence, busy), in that order.
    let variants: Vec<(u64, u64)> = cadences
        .iter()
        .flat_map(|&i| busy.iter().map(move |&b| (i, b)))
        .collect();
    let producer_spin = output::has(&args, "--producer-spin");
    let probe = output::has(&args, "--probe");
    let dir = std::env::temp_dir().join(format!("vramring-wake-{}", std::process::id()));
    let frame = if cuda {
        "1080p NV12, CUDA backend"
    } else {
        "320×240 NV12, host backend"
    };
    let delivery = if push { "push" } else { "pull" };
    let mut rows: Vec<Vec<Row>> = variants
        .iter()
        .map(|_| SYSTEMS.iter().map(|_| Row::default()).collect())
        .collect();
    // Interleaved: every round runs every row once.
    for round in 0..rounds {
        for (ci, &(interval_us, busy_us)) in variants.iter().enumerate() {
            for (si, &system) in SYSTEMS.iter().enumerate() {
                let row = &mut rows[ci][si];
                if !waits.contains(&system) {
                    row.failed = Some("not run (--waits)".into());
                }
                if system.is_gpu_floor() && !cuda {
                    row.failed = Some("not run (CUDA backend only)".into());
                }
                if row.failed.is_some() {
                    continue;
                }
                let case = Case {
                    system,
                    cuda,
                    push,
                    producer_spin,
                    probe,
                    interval_us,
                    busy_us,
                    warmup,
                    frames: frames / rounds,
                    dir: dir.join(format!("{round}-{ci}-{}", system.key())),
                };
                eprintln!(
                    "wake: round {}/{rounds}, {}, {}",
                    round + 1,
                    variant_name(interval_us, busy_us),
                    system.key()
                );
                let before = host::CpuTicks::now();
                let outcome = run_case(&case);
                if let Some(w) = row.host.add_since(before) {
                    eprintln!(
                        "wake: host over the case: busy {:.1} %, stolen {:.2} %",
                        w.busy_pct, w.steal_pct
                    );
                }
                match outcome {
                    Ok(Outcome {
                        lat,
                        stats: [delivered, dropped, cpu, wall],
                        submit,
                        after,
                        after_copy,
                    }) => {
                        row.lat.extend(lat);
                        row.submit.extend(submit);
                        row.after.extend(after);
                        row.after_copy.extend(after_copy);
                        row.delivered += delivered;
                        row.dropped += dropped;
                        row.cpu_ns += cpu;
                        row.wall_ns += wall;
                    }
                    Err(e) => row.failed = Some(e.to_string()),
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut md = format!(
        "Wake latency, publish → subscriber holds the frame (µs), {frame}, {delivery} delivery, {frames} frames per row after {warmup} warm-up, {rounds} interleaved round(s), producers {} between frames; {}\n\n",
        if producer_spin { "spinning" } else { "asleep" },
        host::machine()
    );
    md.push_str(&output::table_header("cadence | wait | p50 | p99 | max | frames | dropped | subscriber CPU (% of a core) | p50 / floor | p99 / floor | submit p50 / p99 | after submit p50 / p99 | floors: after the copy's call p50 / p99 | host busy / stolen %"));
    let mut jsonl = String::new();
    for (ci, &(interval_us, busy_us)) in variants.iter().enumerate() {
        let floor = {
            let mut l = rows[ci][0].lat.clone();
            l.sort_unstable();
            (pct(&l, 0.5), pct(&l, 0.99))
        };
        for (si, system) in SYSTEMS.iter().enumerate() {
            let row = &mut rows[ci][si];
            if let Some(e) = &row.failed {
                md.push_str(&format!(
                    "| {} | {} | failed: {e} |\n",
                    variant_name(interval_us, busy_us),
                    system.name()
                ));
                jsonl.push_str(&format!(
                    "{{\"cadence_us\":{interval_us},\"busy_us\":{busy_us},\"wait\":\"{}\",\"failed\":{:?}}}\n",
                    system.key(),
                    e
                ));
                continue;
            }
            row.lat.sort_unstable();
            row.submit.sort_unstable();
            row.after.sort_unstable();
            row.after_copy.sort_unstable();
            let (p50, p99, max) = (pct(&row.lat, 0.5), pct(&row.lat, 0.99), pct(&row.lat, 1.0));
            let (s50, s99) = (pct(&row.submit, 0.5), pct(&row.submit, 0.99));
            let (a50, a99) = (pct(&row.after, 0.5), pct(&row.after, 0.99));
            let (c50, c99) = (pct(&row.after_copy, 0.5), pct(&row.after_copy, 0.99));
            let pair = |a: f64, b: f64| {
                if a.is_finite() {
                    format!("{a:.1} / {b:.1}")
                } else {
                    "–".into()
                }
            };
            let cpu = if row.wall_ns > 0 {
                100.0 * row.cpu_ns as f64 / row.wall_ns as f64
            } else {
                f64::NAN
            };
            let ratio = |x: f64, f: f64| {
                if f.is_finite() {
                    format!("{:.2}×", x / f)
                } else {
                    "–".into()
                }
            };
            let host_pct = row.host.cell();
            let host_shares = row.host.shares();
            md.push_str(&format!(
                "| {} | {} | {p50:.1} | {p99:.1} | {max:.1} | {} | {} | {cpu:.2} | {} | {} | {} | {} | {} | {host_pct} |\n",
                variant_name(interval_us, busy_us),
                system.name(),
                row.delivered,
                row.dropped,
                ratio(p50, floor.0),
                ratio(p99, floor.1),
                pair(s50, s99),
                pair(a50, a99),
                pair(c50, c99),
            ));
            jsonl.push_str(&format!(
                "{{\"bench\":\"wake\",\"backend\":\"{}\",\"delivery\":\"{delivery}\",\"cadence_us\":{interval_us},\"busy_us\":{busy_us},\"wait\":\"{}\",\"producer_spin\":{producer_spin},\"p50_us\":{},\"p99_us\":{},\"max_us\":{},\"frames\":{},\"dropped\":{},\"cpu_pct\":{},\"floor_p50_us\":{},\"floor_p99_us\":{},\"submit_p50_us\":{},\"submit_p99_us\":{},\"after_submit_p50_us\":{},\"after_submit_p99_us\":{},\"after_copy_call_p50_us\":{},\"after_copy_call_p99_us\":{},\"host_busy_pct\":{},\"host_steal_pct\":{}}}\n",
                if cuda { "cuda" } else { "host" },
                system.key(),
                num(p50),
                num(p99),
                num(max),
                row.delivered,
                row.dropped,
                num(cpu),
                num(floor.0),
                num(floor.1),
                num(s50),
                num(s99),
                num(a50),
                num(a99),
                num(c50),
                num(c99),
                num(host_shares.map_or(f64::NAN, |(busy, _)| busy)),
                num(host_shares.map_or(f64::NAN, |(_, steal)| steal)),
            ));
        }
    }
    println!("{md}");
    if let Some(out) = out {
        output::write_report_in(&out, "wake", &md, &jsonl)?;
    }
    Ok(())
}

/// `--probe`: a tracing layer that timestamps the publish's stage marks
/// (TRACE events of target `vramring::publish`) on the producer's thread.
mod probe {
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer as _;

    const TARGET: &str = "vramring::publish";

    thread_local! {
        /// This frame's marks: (callsite, time).
        static MARKS: RefCell<Vec<(&'static str, u64)>> = const { RefCell::new(Vec::new()) };
        /// Each callsite's message, seen once.
        static NAMES: RefCell<BTreeMap<&'static str, String>> = const { RefCell::new(BTreeMap::new()) };
    }

    struct Layer;

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Layer {
        fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            let t = super::now_ns();
            let name = e.metadata().name();
            MARKS.with(|m| m.borrow_mut().push((name, t)));
            NAMES.with(|n| {
                n.borrow_mut()
                    .entry(name)
                    .or_insert_with(|| vramring_testkit::marks::message(e));
            });
        }
    }

    /// Each stage's times after the frames' clock reads, in the order the
    /// stages first came.
    pub(super) struct Stages {
        order: Vec<&'static str>,
        after_t0: BTreeMap<&'static str, Vec<u64>>,
        _guard: tracing::subscriber::DefaultGuard,
    }

    impl Stages {
        pub(super) fn install() -> Stages {
            let filter = tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::TRACE);
            let subscriber = tracing_subscriber::registry().with(Layer.with_filter(filter));
            Stages {
                order: Vec::new(),
                after_t0: BTreeMap::new(),
                _guard: tracing::subscriber::set_default(subscriber),
            }
        }

        /// Takes the marks of the frame whose clock read was `t0`, keeping
        /// them when `measured`.
        pub(super) fn frame(&mut self, t0: u64, measured: bool) {
            let marks = MARKS.with(|m| std::mem::take(&mut *m.borrow_mut()));
            if !measured {
                return;
            }
            for (name, t) in marks {
                if !self.order.contains(&name) {
                    self.order.push(name);
                }
                self.after_t0.entry(name).or_default().push(t.saturating_sub(t0));
            }
        }

        pub(super) fn summary(&self) -> String {
            let names = NAMES.with(|n| n.borrow().clone());
            self.order
                .iter()
                .map(|name| {
                    let mut v = self.after_t0[name].clone();
                    v.sort_unstable();
                    format!(
                        "{} {:.1} / {:.1}",
                        names.get(name).map_or(*name, String::as_str),
                        super::pct(&v, 0.5),
                        super::pct(&v, 0.99)
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        }
    }
}
