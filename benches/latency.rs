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
//!
//! Latency is "publish → subscriber holds its copy": from the moment the
//! producer has enqueued the frame's write and starts publishing, to the
//! moment the subscriber's copy has completed on its stream
//! (`CLOCK_MONOTONIC`, comparable across processes).
//!
//! Run on a GPU machine: `cargo bench --bench latency -- [--quick] [--out FILE]`
//! (or the staged binary: `bash .device/run.sh bench latency`). Every
//! subscriber busy-polls in the headline rows (as the peers do); the
//! `vramring (futex)` row uses the default spin-then-park wait.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::sys;
use vramring::BackendChoice;
use vramring::{Format, FrameMeta, Mode, Policy, Publisher, RingConfig, Subscriber, SubscriberOptions};

#[path = "common/mod.rs"]
mod common;
use common::{ck, make_primary_current, R};

fn now_ns() -> u64 {
    vramring::time::monotonic_ns()
}

fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// A current CUDA context (the device's primary context, which the
/// vramring pool also uses) and a non-blocking stream.
struct Gpu {
    stream: sys::CUstream,
}

impl Gpu {
    fn init() -> R<Gpu> {
        make_primary_current()?;
        // SAFETY: a valid out-pointer; the primary context is current.
        unsafe {
            let mut stream = std::ptr::null_mut();
            ck(
                "cuStreamCreate",
                sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
            )?;
            Ok(Gpu { stream })
        }
    }

    fn alloc(&self, bytes: usize) -> R<sys::CUdeviceptr> {
        let mut p = 0;
        // SAFETY: valid out-pointer; a context is current.
        unsafe {
            ck("cuMemAlloc", sys::cuMemAlloc_v2(&mut p, bytes))?;
            ck("cuMemsetD8", sys::cuMemsetD8_v2(p, 0x5a, bytes))?;
        }
        Ok(p)
    }

    fn sync(&self) -> R<()> {
        // SAFETY: our own live stream.
        unsafe { ck("cuStreamSynchronize", sys::cuStreamSynchronize(self.stream)) }
    }
}

/// A tiny seqlock-style control block in a `/dev/shm` file, shared by the
/// peers' processes (they share an IPC namespace by construction: legacy
/// IPC needs it anyway). Layout: `[global_seq][ready_subs]` then per slot
/// `[seq][t0]`, then (host round trip) the slot data.
struct BenchShm {
    map: memmap2::MmapRaw,
    slots: usize,
    data_off: usize,
    slot_bytes: usize,
}

impl BenchShm {
    fn create(path: &Path, slots: usize, slot_bytes: usize) -> R<BenchShm> {
        let data_off = 4096;
        let len = data_off + slots * slot_bytes;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        f.set_len(len as u64)?;
        Self::open(path, slots, slot_bytes)
    }

    fn open(path: &Path, slots: usize, slot_bytes: usize) -> R<BenchShm> {
        let f = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
        let map = memmap2::MmapOptions::new().map_raw(&f)?;
        Ok(BenchShm {
            map,
            slots,
            data_off: 4096,
            slot_bytes,
        })
    }

    fn word(&self, k: usize) -> &AtomicU64 {
        assert!(k < 512);
        // SAFETY: in bounds of the 4 KiB control block, 8-byte aligned; the
        // mapping lives as long as `self`; AtomicU64 is valid for any bits.
        unsafe { &*(self.map.as_ptr().add(k * 8) as *const AtomicU64) }
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    Vramring,
    VramringPush,
    VramringFutex,
    HostRt,
    LegacyIpc,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Vramring => "vramring pull",
            System::VramringPush => "vramring push",
            System::VramringFutex => "vramring push, futex wait",
            System::HostRt => "host round trip",
            System::LegacyIpc => "legacy CUDA IPC",
        }
    }
    fn key(self) -> &'static str {
        match self {
            System::Vramring => "vr",
            System::VramringPush => "vrp",
            System::VramringFutex => "vrf",
            System::HostRt => "host",
            System::LegacyIpc => "ipc",
        }
    }
    fn from_key(k: &str) -> Option<System> {
        [
            System::Vramring,
            System::VramringPush,
            System::VramringFutex,
            System::HostRt,
            System::LegacyIpc,
        ]
        .into_iter()
        .find(|s| s.key() == k)
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

fn write_samples(path: &Path, samples: &[u64]) -> R<()> {
    let mut f = File::create(path)?;
    for s in samples {
        f.write_all(&s.to_le_bytes())?;
    }
    Ok(())
}

fn read_samples(path: &Path) -> R<Vec<u64>> {
    let mut b = Vec::new();
    File::open(path)?.read_to_end(&mut b)?;
    Ok(b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

fn pace(start: Instant, k: u64, interval_us: u64) {
    if interval_us == 0 {
        return;
    }
    let due = start + Duration::from_micros(k * interval_us);
    while Instant::now() < due {
        std::hint::spin_loop();
    }
}

// ---------------------------------------------------------------- vramring

fn vr_producer(c: &Case, shm_path: &Path) -> R<()> {
    let gpu = Gpu::init()?;
    let g = c.geometry();
    let src = gpu.alloc(g.frame_bytes as usize)?;
    let cfg = RingConfig::new(Format::Nv12, c.width, c.height)
        .slots(SLOTS as u32)
        .backend(BackendChoice::Cuda(0))
        .policy(Policy::Overwrite);
    let mut p = Publisher::create(c.sock(), cfg)?;
    let ready = BenchShm::open(shm_path, 1, 0)?;
    ready.global().store(1, Ordering::Release); // the socket is up
                                                // Wait until every subscriber has finished connecting (CUDA import
                                                // included), not merely been accepted.
    while ready.ready().load(Ordering::Acquire) < c.subs as u64 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut cpu = Vec::new();
    let mut wall = Vec::new();
    let start = Instant::now();
    let mut span_start = now_ns();
    for k in 0..c.warmup + c.frames {
        if k == c.warmup {
            span_start = now_ns();
        }
        pace(start, k, c.interval_us);
        let slot = p.loan(Duration::from_secs(1))?;
        let dst = slot.addr();
        // SAFETY: `dst` is a slot of the pool in the primary context, which
        // is current; `src` holds frame_bytes.
        unsafe {
            ck(
                "cuMemcpyDtoDAsync",
                sys::cuMemcpyDtoDAsync_v2(dst, src, g.frame_bytes as usize, gpu.stream),
            )?;
        }
        let (c0, t0) = (thread_cpu_ns(), now_ns());
        let meta = FrameMeta::pts(k as i64).with_user(&t0.to_le_bytes())?;
        // SAFETY: our live stream in the ring's context.
        unsafe { slot.publish_cuda(meta, gpu.stream)? };
        if k >= c.warmup {
            cpu.push(thread_cpu_ns() - c0);
            wall.push(now_ns() - t0);
        } else if c.interval_us < 1000 {
            // An unpaced run still warms up at 1 kHz, so push subscribers'
            // buffers get attached (the service polls every 20 ms) before
            // the measured frames.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    write_samples(&c.dir.join("pub-cpu"), &cpu)?;
    write_samples(&c.dir.join("pub-wall"), &wall)?;
    write_samples(&c.dir.join("pub-span"), &[span_start, now_ns()])?;
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
    let push = matches!(c.system, System::VramringPush | System::VramringFutex);
    let mode = if push { Mode::Latest } else { Mode::Sequential };
    let opts = SubscriberOptions::default()
        .mode(mode)
        .push(push)
        .name(format!("bench-{id}"))
        .spin(spin);
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
    write_samples(&c.dir.join(format!("sub-{id}")), &lat)?;
    std::fs::write(
        c.dir.join(format!("sub-{id}.stats")),
        format!("{} {} {}", st.delivered, st.dropped, st.overruns),
    )?;
    Ok(())
}

// ------------------------------------------------------------ peers: host rt

fn host_producer(c: &Case, shm_path: &Path) -> R<()> {
    let gpu = Gpu::init()?;
    let g = c.geometry();
    let bytes = g.frame_bytes as usize;
    let src = gpu.alloc(bytes)?;
    let shm = BenchShm::open(shm_path, SLOTS, bytes.next_multiple_of(4096))?;
    // SAFETY: the range is our live shared mapping; pinning it makes the
    // DtoH copy a DMA (the peer's best case).
    unsafe {
        ck(
            "cuMemHostRegister",
            sys::cuMemHostRegister_v2(shm.data(0) as _, shm.data_len(), 0),
        )?
    };
    while shm.ready().load(Ordering::Acquire) < c.subs as u64 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let (mut cpu, mut wall) = (Vec::new(), Vec::new());
    let start = Instant::now();
    let mut span_start = now_ns();
    for k in 0..c.warmup + c.frames {
        if k == c.warmup {
            span_start = now_ns();
        }
        pace(start, k, c.interval_us);
        let seq = k + 1;
        let s = (seq as usize) % SLOTS;
        let (c0, t0) = (thread_cpu_ns(), now_ns());
        shm.slot_seq(s).store(seq | 1 << 63, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
        // SAFETY: the slot lies in the pinned mapping; `src` holds `bytes`.
        unsafe {
            ck(
                "cuMemcpyDtoHAsync",
                sys::cuMemcpyDtoHAsync_v2(shm.data(s) as _, src, bytes, gpu.stream),
            )?;
        }
        gpu.sync()?;
        shm.slot_t0(s).store(t0, Ordering::Relaxed);
        shm.slot_seq(s).store(seq, Ordering::Release);
        shm.global().store(seq, Ordering::Release);
        if k >= c.warmup {
            cpu.push(thread_cpu_ns() - c0);
            wall.push(now_ns() - t0);
        }
    }
    write_samples(&c.dir.join("pub-cpu"), &cpu)?;
    write_samples(&c.dir.join("pub-wall"), &wall)?;
    write_samples(&c.dir.join("pub-span"), &[span_start, now_ns()])?;
    std::thread::sleep(Duration::from_millis(50));
    shm.global().store(u64::MAX, Ordering::Release);
    Ok(())
}

/// A peer subscriber's loop: spin on the control block, take the newest
/// safe frame (as vramring's Sequential reader does), `copy` slot `s` into
/// the subscriber's own buffer and complete it, validate after the copy,
/// and record latency and counts.
fn peer_loop(c: &Case, id: usize, shm: &BenchShm, mut copy: impl FnMut(usize) -> R<()>) -> R<()> {
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
        copy(s)?;
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
    // SAFETY: our live shared mapping, pinned for HtoD DMA.
    unsafe {
        ck(
            "cuMemHostRegister",
            sys::cuMemHostRegister_v2(shm.data(0) as _, shm.data_len(), 0),
        )?
    };
    let dst = gpu.alloc(bytes)?;
    shm.ready().fetch_add(1, Ordering::AcqRel);
    peer_loop(c, id, &shm, |s| {
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

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> R<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| Ok(u8::from_str_radix(&s[i..i + 2], 16)?))
        .collect()
}

fn ipc_producer(c: &Case, shm_path: &Path) -> R<()> {
    let gpu = Gpu::init()?;
    let bytes = c.geometry().frame_bytes as usize;
    let src = gpu.alloc(bytes)?;
    let shm = BenchShm::open(shm_path, SLOTS, 0)?;
    let mut slots = Vec::new();
    let mut events = Vec::new();
    let mut handles = String::new();
    for _ in 0..SLOTS {
        let p = gpu.alloc(bytes)?;
        let mut ev = std::ptr::null_mut();
        let mut mh = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
        let mut eh = std::mem::MaybeUninit::<sys::CUipcEventHandle>::zeroed();
        let flags =
            sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32 | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: valid out-pointers; `p` is a live cuMemAlloc allocation.
        let (mh, eh) = unsafe {
            ck("cuEventCreate", sys::cuEventCreate(&mut ev, flags))?;
            ck("cuIpcGetMemHandle", sys::cuIpcGetMemHandle(mh.as_mut_ptr(), p))?;
            ck("cuIpcGetEventHandle", sys::cuIpcGetEventHandle(eh.as_mut_ptr(), ev))?;
            (mh.assume_init(), eh.assume_init())
        };
        // SAFETY: the handles are plain 64-byte arrays.
        let (mb, eb) = unsafe {
            (
                std::slice::from_raw_parts(mh.reserved.as_ptr() as *const u8, 64),
                std::slice::from_raw_parts(eh.reserved.as_ptr() as *const u8, 64),
            )
        };
        handles.push_str(&format!("{} {}\n", hex(mb), hex(eb)));
        slots.push(p);
        events.push(ev);
    }
    std::fs::write(c.dir.join("ipc-handles"), handles)?;
    shm.word(2).store(1, Ordering::Release); // handles written
    while shm.ready().load(Ordering::Acquire) < c.subs as u64 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let (mut cpu, mut wall) = (Vec::new(), Vec::new());
    let start = Instant::now();
    let mut span_start = now_ns();
    for k in 0..c.warmup + c.frames {
        if k == c.warmup {
            span_start = now_ns();
        }
        pace(start, k, c.interval_us);
        let seq = k + 1;
        let s = (seq as usize) % SLOTS;
        shm.slot_seq(s).store(seq | 1 << 63, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
        // SAFETY: live allocations and stream in the current context.
        unsafe {
            ck(
                "cuMemcpyDtoDAsync",
                sys::cuMemcpyDtoDAsync_v2(slots[s], src, bytes, gpu.stream),
            )?
        };
        let (c0, t0) = (thread_cpu_ns(), now_ns());
        // SAFETY: live event and stream.
        unsafe { ck("cuEventRecord", sys::cuEventRecord(events[s], gpu.stream))? };
        shm.slot_t0(s).store(t0, Ordering::Relaxed);
        shm.slot_seq(s).store(seq, Ordering::Release);
        shm.global().store(seq, Ordering::Release);
        if k >= c.warmup {
            cpu.push(thread_cpu_ns() - c0);
            wall.push(now_ns() - t0);
        }
    }
    gpu.sync()?;
    write_samples(&c.dir.join("pub-cpu"), &cpu)?;
    write_samples(&c.dir.join("pub-wall"), &wall)?;
    write_samples(&c.dir.join("pub-span"), &[span_start, now_ns()])?;
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
        let mut mh = std::mem::MaybeUninit::<sys::CUipcMemHandle>::zeroed();
        let mut eh = std::mem::MaybeUninit::<sys::CUipcEventHandle>::zeroed();
        let (mut p, mut ev) = (0, std::ptr::null_mut());
        // SAFETY: the handles are 64-byte plain arrays; out-pointers valid.
        unsafe {
            std::ptr::copy_nonoverlapping(m.as_ptr(), mh.as_mut_ptr() as *mut u8, 64);
            std::ptr::copy_nonoverlapping(e.as_ptr(), eh.as_mut_ptr() as *mut u8, 64);
            ck(
                "cuIpcOpenMemHandle",
                sys::cuIpcOpenMemHandle_v2(
                    &mut p,
                    mh.assume_init(),
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                ),
            )?;
            ck(
                "cuIpcOpenEventHandle",
                sys::cuIpcOpenEventHandle(&mut ev, eh.assume_init()),
            )?;
        }
        ptrs.push(p);
        evs.push(ev);
    }
    let dst = gpu.alloc(bytes)?;
    shm.ready().fetch_add(1, Ordering::AcqRel);
    peer_loop(c, id, &shm, |s| {
        // SAFETY: imported IPC allocation/event and our own stream/buffer.
        unsafe {
            ck("cuStreamWaitEvent", sys::cuStreamWaitEvent(gpu.stream, evs[s], 0))?;
            ck(
                "cuMemcpyDtoDAsync",
                sys::cuMemcpyDtoDAsync_v2(dst, ptrs[s], bytes, gpu.stream),
            )?;
        }
        gpu.sync()
    })?;
    shm.ready().fetch_sub(1, Ordering::AcqRel);
    Ok(())
}

// ------------------------------------------------------------ orchestration

fn gpu_name() -> String {
    let mut name = [0 as std::ffi::c_char; 128];
    // SAFETY: valid buffer of 128 chars; device 0 after cuInit.
    let ok = unsafe {
        sys::cuInit(0) == sys::CUresult::CUDA_SUCCESS
            && sys::cuDeviceGetName(name.as_mut_ptr(), 128, 0) == sys::CUresult::CUDA_SUCCESS
    };
    if !ok {
        return "unknown".into();
    }
    // SAFETY: the driver wrote a NUL-terminated string into `name`.
    unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let k = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[k] as f64 / 1000.0
}

struct Outcome {
    lat: Vec<u64>,
    span_s: f64,
    pub_cpu: Vec<u64>,
    pub_wall: Vec<u64>,
    delivered: u64,
    dropped: u64,
    overruns: u64,
}

fn spawn_role(role: &str, c: &Case, extra: &[String]) -> R<Child> {
    let exe = std::env::current_exe()?;
    Ok(Command::new(exe)
        .arg("--role")
        .arg(role)
        .args(c.args())
        .args(extra)
        .stdin(Stdio::null())
        .spawn()?)
}

fn run_case(c: &Case) -> R<Outcome> {
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
    let mut producer = spawn_role("producer", c, &shm_arg)?;
    if matches!(
        c.system,
        System::Vramring | System::VramringPush | System::VramringFutex
    ) {
        while ctl.global().load(Ordering::Acquire) == 0 {
            if let Some(st) = producer.try_wait()? {
                return Err(format!("producer exited early: {st}").into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let mut subs = Vec::new();
    for id in 0..c.subs {
        let mut a = shm_arg.clone();
        a.push(id.to_string());
        subs.push(spawn_role("subscriber", c, &a)?);
    }
    let pst = producer.wait()?;
    if !pst.success() {
        eprintln!("{} producer exited with {pst}", c.system.name());
    }
    let mut ok = pst.success();
    for mut s in subs {
        ok &= s.wait()?.success();
    }
    let _ = std::fs::remove_file(&shm);
    if !ok {
        return Err(format!(
            "{} {}x{} x{}: a process failed",
            c.system.name(),
            c.width,
            c.height,
            c.subs
        )
        .into());
    }
    let mut lat = Vec::new();
    let (mut delivered, mut dropped, mut overruns) = (0, 0, 0);
    for id in 0..c.subs {
        lat.extend(read_samples(&c.dir.join(format!("sub-{id}")))?);
        let st = std::fs::read_to_string(c.dir.join(format!("sub-{id}.stats")))?;
        let v: Vec<u64> = st.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        delivered += v.first().copied().unwrap_or(0);
        dropped += v.get(1).copied().unwrap_or(0);
        overruns += v.get(2).copied().unwrap_or(0);
    }
    lat.sort_unstable();
    let mut pub_cpu = read_samples(&c.dir.join("pub-cpu"))?;
    let mut pub_wall = read_samples(&c.dir.join("pub-wall"))?;
    pub_cpu.sort_unstable();
    pub_wall.sort_unstable();
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
        delivered,
        dropped,
        overruns,
    })
}

fn role_main(args: &[String]) -> R<()> {
    let role = args[0].as_str();
    let c = Case::parse(&args[1..9])?;
    let shm = PathBuf::from(&args[9]);
    match (role, c.system) {
        ("producer", System::Vramring | System::VramringPush | System::VramringFutex) => vr_producer(&c, &shm),
        ("producer", System::HostRt) => host_producer(&c, &shm),
        ("producer", System::LegacyIpc) => ipc_producer(&c, &shm),
        ("subscriber", sys_) => {
            let id: usize = args[10].parse()?;
            match sys_ {
                System::Vramring | System::VramringPush | System::VramringFutex => vr_subscriber(&c, id, &shm),
                System::HostRt => host_subscriber(&c, id, &shm),
                System::LegacyIpc => ipc_subscriber(&c, id, &shm),
            }
        }
        _ => Err("unknown role".into()),
    }
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if let Some(i) = args.iter().position(|a| a == "--role") {
        return role_main(&args[i + 1..]);
    }
    if !vramring::memory::cuda::cuda_usable() {
        eprintln!("latency bench: no usable CUDA GPU here; nothing measured (run it on a GPU machine)");
        return Ok(());
    }
    let quick = args.iter().any(|a| a == "--quick");
    let throughput_only = args.iter().any(|a| a == "--throughput-only");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);
    let frames = if quick { 300 } else { 2000 };
    let dir = std::env::temp_dir().join(format!("vramring-bench-{}", std::process::id()));
    let mut report = String::new();
    report.push_str(&format!(
        "Latency, publish → subscriber holds its copy (µs), NV12, {SLOTS} slots, {frames} frames per subscriber after warm-up, 1 frame every 2 ms; GPU: {}\n\n",
        gpu_name()
    ));
    report.push_str("| frame | subs | system | p50 | p99 | max | delivered | dropped | overruns | producer CPU/publish p50 (µs) | producer wall/publish p50 (µs) |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut ratios = String::from("\nRatios (other p50 / vramring push p50; > 1 means vramring push is faster):\n\n| frame | subs | host round trip | legacy CUDA IPC | vramring pull | vramring push, futex wait |\n|---|---|---|---|---|---|\n");
    let sizes: &[(u32, u32, &str)] = &[(1920, 1080, "1080p"), (3840, 2160, "4K")];
    let sub_counts: &[usize] = if quick { &[1, 4] } else { &[1, 4, 8] };
    for &(w, h, label) in sizes {
        for &n in sub_counts.iter().filter(|_| !throughput_only) {
            let mut p50 = std::collections::HashMap::new();
            for system in [
                System::VramringPush,
                System::Vramring,
                System::VramringFutex,
                System::HostRt,
                System::LegacyIpc,
            ] {
                let case = Case {
                    system,
                    width: w,
                    height: h,
                    subs: n,
                    frames,
                    warmup: 200,
                    interval_us: 2000,
                    dir: dir.join(format!("{}-{label}-{n}", system.key())),
                };
                match run_case(&case) {
                    Ok(o) => {
                        let line = format!(
                            "| {label} | {n} | {} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {:.1} | {:.1} |\n",
                            system.name(),
                            pct(&o.lat, 0.5),
                            pct(&o.lat, 0.99),
                            pct(&o.lat, 1.0),
                            o.delivered,
                            o.dropped,
                            o.overruns,
                            pct(&o.pub_cpu, 0.5),
                            pct(&o.pub_wall, 0.5),
                        );
                        eprint!("{line}");
                        report.push_str(&line);
                        p50.insert(system.key(), pct(&o.lat, 0.5));
                    }
                    Err(e) => {
                        let line = format!("| {label} | {n} | {} | failed: {e} |\n", system.name());
                        eprint!("{line}");
                        report.push_str(&line);
                    }
                }
            }
            let vr = p50.get("vrp").copied().unwrap_or(f64::NAN);
            let r = |k: &str| p50.get(k).copied().unwrap_or(f64::NAN) / vr;
            ratios.push_str(&format!(
                "| {label} | {n} | {:.2}× | {:.2}× | {:.2}× | {:.2}× |\n",
                r("host"),
                r("ipc"),
                r("vr"),
                r("vrf")
            ));
        }
    }
    report.push_str(&ratios);
    // Throughput: 4 subscribers, producer as fast as it can.
    report.push_str("\nMaximum sustained rate, 4 subscribers, producer unpaced, overwrite policy:\n\n| frame | system | frames/s published | frames/s delivered per subscriber (mean) |\n|---|---|---|---|\n");
    for &(w, h, label) in sizes {
        for system in [
            System::VramringPush,
            System::Vramring,
            System::HostRt,
            System::LegacyIpc,
        ] {
            let case = Case {
                system,
                width: w,
                height: h,
                subs: 4,
                frames: if quick { 2000 } else { 5000 },
                warmup: 200,
                interval_us: 0,
                dir: dir.join(format!("tp-{}-{label}", system.key())),
            };
            match run_case(&case) {
                Ok(o) => {
                    // Measured frames over the producer's measured span; a
                    // subscriber's rate counts the measured frames it got.
                    let fps_pub = case.frames as f64 / o.span_s;
                    let fps_sub = o.lat.len() as f64 / 4.0 / o.span_s;
                    let line = format!("| {label} | {} | {:.0} | {:.0} |\n", system.name(), fps_pub, fps_sub);
                    eprint!("{line}");
                    report.push_str(&line);
                }
                Err(e) => report.push_str(&format!("| {label} | {} | failed: {e} | |\n", system.name())),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("{report}");
    if let Some(out) = out {
        std::fs::write(out, &report)?;
    }
    Ok(())
}
