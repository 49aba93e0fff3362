//! What each way of putting work in a CUDA stream's order costs the
//! calling thread's CPU, and how soon the GPU acts on it: the floor under
//! any stream-order publish (issue 15, goal 1 asks ≤ 5 µs of producer CPU
//! per publish; vramring's publish is one kernel launch plus the
//! protocol's own work, ADR 0009).
//!
//! One process, device 0's primary context, one non-blocking stream per
//! primitive. What is only submitted:
//! * `launch`: `cuLaunchKernel` of an empty kernel taking the commit
//!   kernel's 192-byte parameter, one block of 256 threads (what a publish
//!   enqueues);
//! * `graph`: `cuGraphLaunch` of a graph holding that one kernel node,
//!   instantiated once (a replayed graph);
//! * `event`: `cuEventRecord`, timing disabled (the least a design that
//!   enqueues its commit elsewhere must do on the writer's stream);
//! * `memop`: `cuStreamWriteValue32` of the sample's index into a device
//!   word (a stream memory operation);
//! * `clock`: nothing between the two clock reads (the measurement's own
//!   cost).
//!
//! What is submitted and then waited for (the *ping* rows): each stores a
//! fresh value into a word of mapped host memory, and the calling thread
//! spins until it reads that value, so the row also gives the **round
//! trip** (call to store seen), what a commit's path to a polling
//! subscriber costs before any copy:
//! * `ping`: a kernel whose 192-byte parameter, by value, names the word
//!   and the value (how the commit kernel gets its descriptor);
//! * `ping-host`: the CPU writes the descriptor into the next entry of a
//!   ring in mapped host memory, then launches a kernel whose parameters
//!   are the ring's address and a device word counting the entries used;
//!   the kernel reads the count, then the entry over the bus, and counts
//!   one more (a kernel that finds its descriptor by itself);
//! * `ping-graph`: the same descriptor write, then `cuGraphLaunch` of a
//!   graph of that kernel, instantiated once (the replayed-graph publish a
//!   fixed graph would need, since its parameters cannot change per frame
//!   without an update call);
//! * `ping-graph-set`: that update call, `cuGraphExecKernelNodeSetParams`
//!   with a new 192-byte descriptor by value, then `cuGraphLaunch`;
//! * `ping-memop`: `cuStreamWriteValue32` straight into the mapped word.
//!
//! Two schedules, both paced one call every interval (2 ms and 40 ms by
//! default: the latency bench's frame interval and 25 fps):
//! * `turns`: the primitives take turns, so each sees the same machine but
//!   is called once every ten intervals, on a stream nothing else touched
//!   since (colder than a publish; read the ratios to `launch`);
//! * `alone`: each primitive's calls one after another, every interval on
//!   its own stream (a publish's rhythm; the absolute figures to hold
//!   against the latency bench's launch column), in four runs per
//!   primitive, the primitives taking turns between runs.
//!
//! Each call is timed with the thread's CPU clock
//! (`CLOCK_THREAD_CPUTIME_ID`, the latency bench's producer CPU column)
//! and the monotonic clock.
//!
//! `cargo bench --bench submit -- [--samples N] [--intervals 2000,40000]
//! [--schedules turns,alone] [--out DIR]` (intervals in µs; N calls of each
//! primitive per interval and schedule, default 300). On a GPU machine, the
//! staged binary: `bash .device/run.sh bench submit --out $OUT`. `--out DIR`
//! receives `submit.md` and `submit.jsonl`.

use std::ffi::c_void;
use std::path::PathBuf;

use cudarc::driver::sys;

use common::gpu::{launch, Floor, Module};
use common::{ck, make_primary_current, now_ns, output, pct_us, sleep_until_ns, thread_cpu_ns, R};
use vramring_benches as common;

const USAGE: &str = "submit bench: [--samples N] [--intervals US,US..] [--schedules turns,alone] [--out DIR]\n\
     --samples: calls of each primitive per interval and schedule (default 300)\n\
     --intervals: one call every this many µs (default 2000,40000)\n\
     --schedules: turns (the primitives in turn) and/or alone (each one's calls in a row); default both\n\
     --out DIR: submit.md (the table) and submit.jsonl (its rows); needs a CUDA GPU";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Primitive {
    Launch,
    Graph,
    Event,
    Memop,
    Clock,
    Ping,
    PingHost,
    PingGraph,
    PingGraphSet,
    PingMemop,
}

const PRIMITIVES: [Primitive; 10] = [
    Primitive::Launch,
    Primitive::Graph,
    Primitive::Event,
    Primitive::Memop,
    Primitive::Clock,
    Primitive::Ping,
    Primitive::PingHost,
    Primitive::PingGraph,
    Primitive::PingGraphSet,
    Primitive::PingMemop,
];

impl Primitive {
    fn key(self) -> &'static str {
        match self {
            Primitive::Launch => "launch",
            Primitive::Graph => "graph",
            Primitive::Event => "event",
            Primitive::Memop => "memop",
            Primitive::Clock => "clock",
            Primitive::Ping => "ping",
            Primitive::PingHost => "ping-host",
            Primitive::PingGraph => "ping-graph",
            Primitive::PingGraphSet => "ping-graph-set",
            Primitive::PingMemop => "ping-memop",
        }
    }
    fn call(self) -> &'static str {
        match self {
            Primitive::Launch => "`cuLaunchKernel`, empty kernel, 192-byte parameter",
            Primitive::Graph => "`cuGraphLaunch`, one kernel node",
            Primitive::Event => "`cuEventRecord`",
            Primitive::Memop => "`cuStreamWriteValue32`, device word",
            Primitive::Clock => "nothing (the clock pair)",
            Primitive::Ping => "`cuLaunchKernel`, descriptor by value (192 bytes)",
            Primitive::PingHost => "descriptor written to a host ring, `cuLaunchKernel` of the ring",
            Primitive::PingGraph => "descriptor written to a host ring, `cuGraphLaunch`",
            Primitive::PingGraphSet => "`cuGraphExecKernelNodeSetParams` (192 bytes), `cuGraphLaunch`",
            Primitive::PingMemop => "`cuStreamWriteValue32`, mapped host word",
        }
    }
    /// The stream this primitive submits to (none for `clock`).
    fn stream(self) -> Option<usize> {
        match self {
            Primitive::Launch => Some(0),
            Primitive::Graph => Some(1),
            Primitive::Event => Some(2),
            Primitive::Memop => Some(3),
            Primitive::Clock => None,
            Primitive::Ping => Some(4),
            Primitive::PingHost => Some(5),
            Primitive::PingGraph => Some(6),
            Primitive::PingMemop => Some(7),
            Primitive::PingGraphSet => Some(8),
        }
    }
    /// Whether the call makes the GPU store a value the CPU then waits for.
    fn pings(self) -> bool {
        matches!(
            self,
            Primitive::Ping
                | Primitive::PingHost
                | Primitive::PingGraph
                | Primitive::PingGraphSet
                | Primitive::PingMemop
        )
    }
}

/// The ping kernels: thread 0 stores a value into a word of mapped host
/// memory, then fences at system scope. `vramring_ping` takes word and
/// value from its 192-byte parameter (offsets 0 and 8).
/// `vramring_ping_host` takes fixed parameters, as a replayed graph's node
/// must: a ring of 64 descriptors in mapped host memory and a count of the
/// descriptors used, in device memory. It reads the count, then word and
/// value from that ring entry (over the bus), and counts one more: the
/// shape of a commit kernel that finds each frame's descriptor by itself.
const PING_PTX: &std::ffi::CStr = c"
.version 7.0
.target sm_70
.address_size 64
.visible .entry vramring_ping(.param .align 8 .b8 p_desc[192])
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    mov.u32 %r0, %tid.x;
    setp.ne.u32 %p0, %r0, 0;
    @%p0 bra PING_DONE;
    ld.param.u64 %rd0, [p_desc+0];
    ld.param.u64 %rd1, [p_desc+8];
    cvta.to.global.u64 %rd0, %rd0;
    cvt.u32.u64 %r1, %rd1;
    st.volatile.global.u32 [%rd0], %r1;
    membar.sys;
PING_DONE:
    ret;
}
.visible .entry vramring_ping_host(.param .u64 p_ring, .param .u64 p_next)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    mov.u32 %r0, %tid.x;
    setp.ne.u32 %p0, %r0, 0;
    @%p0 bra PING_HOST_DONE;
    ld.param.u64 %rd2, [p_ring];
    ld.param.u64 %rd3, [p_next];
    cvta.to.global.u64 %rd2, %rd2;
    cvta.to.global.u64 %rd3, %rd3;
    ld.volatile.global.u64 %rd4, [%rd3];
    and.b64 %rd5, %rd4, 63;
    shl.b64 %rd5, %rd5, 6;
    add.u64 %rd5, %rd2, %rd5;
    ld.volatile.global.v2.u64 {%rd0, %rd1}, [%rd5];
    cvta.to.global.u64 %rd0, %rd0;
    cvt.u32.u64 %r1, %rd1;
    add.u64 %rd4, %rd4, 1;
    st.volatile.global.u64 [%rd3], %rd4;
    st.volatile.global.u32 [%rd0], %r1;
    membar.sys;
PING_HOST_DONE:
    ret;
}
";

/// Bytes of mapped host memory: the ping word at 0, the descriptor ring
/// ([`RING_ENTRIES`] entries of [`ENTRY`] bytes) at [`RING_AT`].
const PAGE: usize = 8192;
const RING_AT: usize = 4096;
const RING_ENTRIES: u64 = 64;
const ENTRY: usize = 64;

/// The driver objects the primitives use, made once in the primary context.
struct Rig {
    /// The empty kernel (`launch`, `graph`), with its descriptor.
    floor: Floor,
    ping: sys::CUfunction,
    ping_host: sys::CUfunction,
    streams: [sys::CUstream; 9],
    graphs: [sys::CUgraph; 3],
    execs: [sys::CUgraphExec; 3],
    /// The kernel node of `graphs[2]` (`vramring_ping`, updated per call).
    set_node: sys::CUgraphNode,
    event: sys::CUevent,
    word: sys::CUdeviceptr,
    /// The count of ring descriptors used (device memory, 8 bytes).
    next: sys::CUdeviceptr,
    /// The count as the CPU keeps it.
    ring_n: u64,
    /// Mapped host memory ([`PAGE`] bytes) and its device address.
    page: *mut c_void,
    page_dev: sys::CUdeviceptr,
    /// The last value a ping stored.
    pinged: u32,
    /// `ping` and `ping_host`'s module (unloaded after `drop`, with the
    /// floor's).
    _ping_module: Module,
}

/// Adds one kernel node (one block of 256 threads) to a new graph and
/// instantiates it; `params` are the node's parameters, copied at the add.
///
/// # Safety
/// `func` is a live kernel of the current context whose parameters are
/// those `params` point at.
unsafe fn one_node_graph(
    func: sys::CUfunction,
    params: &mut [*mut c_void],
) -> R<(sys::CUgraph, sys::CUgraphExec, sys::CUgraphNode)> {
    let (mut graph, mut exec, mut node) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: the caller's contract; valid out-pointers; the node's
    // parameter array lives across the add, which copies it.
    unsafe {
        ck("cuGraphCreate", sys::cuGraphCreate(&mut graph, 0))?;
        let mut node_params: sys::CUDA_KERNEL_NODE_PARAMS = std::mem::zeroed();
        node_params.func = func;
        (node_params.gridDimX, node_params.gridDimY, node_params.gridDimZ) = (1, 1, 1);
        (node_params.blockDimX, node_params.blockDimY, node_params.blockDimZ) = (256, 1, 1);
        node_params.kernelParams = params.as_mut_ptr();
        ck(
            "cuGraphAddKernelNode",
            sys::cuGraphAddKernelNode_v2(&mut node, graph, std::ptr::null(), 0, &node_params),
        )?;
        ck(
            "cuGraphInstantiateWithFlags",
            sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
        )?;
    }
    Ok((graph, exec, node))
}

impl Rig {
    fn new() -> R<Rig> {
        make_primary_current()?;
        let ping_module = Module::load(PING_PTX)?;
        let mut rig = Rig {
            floor: Floor::load()?,
            ping: ping_module.function(c"vramring_ping")?,
            ping_host: ping_module.function(c"vramring_ping_host")?,
            streams: [std::ptr::null_mut(); 9],
            graphs: [std::ptr::null_mut(); 3],
            execs: [std::ptr::null_mut(); 3],
            set_node: std::ptr::null_mut(),
            event: std::ptr::null_mut(),
            word: 0,
            next: 0,
            ring_n: 0,
            page: std::ptr::null_mut(),
            page_dev: 0,
            pinged: 0,
            _ping_module: ping_module,
        };
        // SAFETY: plain driver calls with valid out-pointers in the current
        // (primary) context; each graph's kernel takes the parameter given
        // to `one_node_graph`.
        unsafe {
            for s in &mut rig.streams {
                ck(
                    "cuStreamCreate",
                    sys::cuStreamCreate(s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
                )?;
            }
            ck("cuEventCreate", sys::cuEventCreate(&mut rig.event, 0x2))?; // CU_EVENT_DISABLE_TIMING
            ck("cuMemAlloc", sys::cuMemAlloc_v2(&mut rig.word, 4))?;
            ck("cuMemAlloc", sys::cuMemAlloc_v2(&mut rig.next, 8))?;
            ck("cuMemsetD8", sys::cuMemsetD8_v2(rig.next, 0, 8))?;
            ck("cuMemHostAlloc", sys::cuMemHostAlloc(&mut rig.page, PAGE, 0x2))?; // CU_MEMHOSTALLOC_DEVICEMAP
            std::ptr::write_bytes(rig.page.cast::<u8>(), 0, PAGE);
            ck(
                "cuMemHostGetDevicePointer",
                sys::cuMemHostGetDevicePointer_v2(&mut rig.page_dev, rig.page, 0),
            )?;
            let mut desc = rig.floor.desc;
            (rig.graphs[0], rig.execs[0], _) = one_node_graph(rig.floor.function, &mut [desc.as_mut_ptr().cast()])?;
            let (mut ring, mut next) = (rig.page_dev + RING_AT as u64, rig.next);
            (rig.graphs[1], rig.execs[1], _) = one_node_graph(
                rig.ping_host,
                &mut [(&mut ring as *mut u64).cast(), (&mut next as *mut u64).cast()],
            )?;
            (rig.graphs[2], rig.execs[2], rig.set_node) = one_node_graph(rig.ping, &mut [desc.as_mut_ptr().cast()])?;
        }
        Ok(rig)
    }

    /// Writes the ping descriptor (word, value) into the next ring entry.
    fn write_host_desc(&mut self, value: u32) {
        let entry = RING_AT + (self.ring_n % RING_ENTRIES) as usize * ENTRY;
        self.ring_n += 1;
        // SAFETY: `page` is PAGE bytes of mapped host memory, 8-aligned at
        // every entry; only a finished kernel read this entry before (every
        // ping is waited for before the next call).
        unsafe {
            let d = self.page.cast::<u8>().add(entry).cast::<u64>();
            d.write_volatile(self.page_dev);
            d.add(1).write_volatile(u64::from(value));
        }
        // The driver's submission (a device-visible store) follows these
        // stores in program order.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }

    /// One call of `p` (sample `k`).
    fn submit(&mut self, p: Primitive, k: u32) -> R<()> {
        let stream = p.stream().map_or(std::ptr::null_mut(), |i| self.streams[i]);
        let value = self.pinged.wrapping_add(1);
        if p.pings() {
            self.pinged = value;
        }
        let launch = |func: sys::CUfunction, params: &mut [*mut c_void]| {
            // SAFETY: `func` takes exactly the parameters passed (the PTX
            // declarations above), which address live memory of ours.
            unsafe { launch(func, 1, 256, stream, params) }
        };
        match p {
            // SAFETY: our live stream (or the legacy one) in the context the
            // floor kernel was loaded in.
            Primitive::Launch => unsafe { self.floor.launch(stream) },
            Primitive::Ping => {
                let mut desc = [0u64; 24];
                (desc[0], desc[1]) = (self.page_dev, u64::from(value));
                launch(self.ping, &mut [desc.as_mut_ptr().cast()])
            }
            Primitive::PingHost => {
                self.write_host_desc(value);
                let (mut ring, mut next) = (self.page_dev + RING_AT as u64, self.next);
                launch(
                    self.ping_host,
                    &mut [(&mut ring as *mut u64).cast(), (&mut next as *mut u64).cast()],
                )
            }
            Primitive::PingGraphSet => {
                let mut desc = [0u64; 24];
                (desc[0], desc[1]) = (self.page_dev, u64::from(value));
                let mut params = [desc.as_mut_ptr().cast::<c_void>()];
                // SAFETY: a zeroed parameter block is valid; the node is
                // `graphs[2]`'s, of `vramring_ping`, whose one parameter is
                // this 192-byte descriptor (copied by the call); `execs[2]`
                // lives until `drop`.
                unsafe {
                    let mut node_params: sys::CUDA_KERNEL_NODE_PARAMS = std::mem::zeroed();
                    node_params.func = self.ping;
                    (node_params.gridDimX, node_params.gridDimY, node_params.gridDimZ) = (1, 1, 1);
                    (node_params.blockDimX, node_params.blockDimY, node_params.blockDimZ) = (256, 1, 1);
                    node_params.kernelParams = params.as_mut_ptr();
                    ck(
                        "cuGraphExecKernelNodeSetParams",
                        sys::cuGraphExecKernelNodeSetParams_v2(self.execs[2], self.set_node, &node_params),
                    )?;
                    ck("cuGraphLaunch", sys::cuGraphLaunch(self.execs[2], stream))
                }
            }
            Primitive::Graph => {
                // SAFETY: `execs` were made by `new` in the current context
                // and live until `drop`.
                ck("cuGraphLaunch", unsafe { sys::cuGraphLaunch(self.execs[0], stream) })
            }
            Primitive::PingGraph => {
                self.write_host_desc(value);
                // SAFETY: as for `Graph`.
                ck("cuGraphLaunch", unsafe { sys::cuGraphLaunch(self.execs[1], stream) })
            }
            Primitive::Event => {
                // SAFETY: `event` was made by `new` and lives until `drop`.
                ck("cuEventRecord", unsafe { sys::cuEventRecord(self.event, stream) })
            }
            Primitive::Memop => {
                // SAFETY: `word` is 4 bytes of device memory made by `new`.
                ck("cuStreamWriteValue32", unsafe {
                    sys::cuStreamWriteValue32_v2(stream, self.word, k, 0)
                })
            }
            Primitive::PingMemop => {
                // SAFETY: `page_dev` is the device address of the mapped
                // host page made by `new`, 4-aligned.
                ck("cuStreamWriteValue32", unsafe {
                    sys::cuStreamWriteValue32_v2(stream, self.page_dev, value, 0)
                })
            }
            Primitive::Clock => Ok(()),
        }
    }

    /// Spins until the ping word reads the last value pinged (1 s at most).
    fn wait_ping(&self) -> R<()> {
        let start = std::time::Instant::now();
        // SAFETY: `page` is mapped host memory, 4-aligned; the GPU stores
        // the word, so it is read volatile.
        while unsafe { self.page.cast::<u32>().read_volatile() } != self.pinged {
            if start.elapsed() > std::time::Duration::from_secs(1) {
                return Err(format!("the GPU did not store ping {} within 1 s", self.pinged).into());
            }
            std::hint::spin_loop();
        }
        Ok(())
    }

    fn sync(&self) -> R<()> {
        for s in self.streams {
            // SAFETY: a live stream of the current context.
            unsafe { ck("cuStreamSynchronize", sys::cuStreamSynchronize(s))? };
        }
        Ok(())
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = self.sync();
        // SAFETY: made by `new`; every stream is synchronised, so nothing of
        // them runs. Errors at teardown are ignored (the process ends).
        unsafe {
            for (e, g) in self.execs.into_iter().zip(self.graphs) {
                sys::cuGraphExecDestroy(e);
                sys::cuGraphDestroy(g);
            }
            sys::cuEventDestroy_v2(self.event);
            sys::cuMemFree_v2(self.word);
            sys::cuMemFree_v2(self.next);
            sys::cuMemFreeHost(self.page);
            for s in self.streams {
                sys::cuStreamDestroy_v2(s);
            }
        }
        // The modules are unloaded when the fields drop, after this.
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Schedule {
    Turns,
    Alone,
}

impl Schedule {
    fn key(self) -> &'static str {
        match self {
            Schedule::Turns => "turns",
            Schedule::Alone => "alone",
        }
    }
}

/// CPU and wall time of each call, and the ping round trips (ns), per
/// primitive.
struct Samples {
    cpu: Vec<Vec<u64>>,
    wall: Vec<Vec<u64>>,
    trip: Vec<Vec<u64>>,
}

/// One paced call of `p` (sample `k`), due at `due`, into row `i` of `out`.
fn sample(rig: &mut Rig, p: Primitive, k: u32, due: u64, i: usize, out: &mut Samples) -> R<()> {
    sleep_until_ns(due);
    let (w0, c0) = (now_ns(), thread_cpu_ns());
    rig.submit(p, k)?;
    let (c1, w1) = (thread_cpu_ns(), now_ns());
    out.cpu[i].push(c1 - c0);
    out.wall[i].push(w1 - w0);
    if p.pings() {
        rig.wait_ping()?;
        out.trip[i].push(now_ns() - w0);
    }
    Ok(())
}

/// Rounds of the `alone` schedule: each primitive's calls come in this many
/// runs, the primitives in turn between runs.
const ALONE_ROUNDS: u32 = 4;

fn measure(rig: &mut Rig, schedule: Schedule, interval_us: u64, samples: u32) -> R<Samples> {
    let rows = || vec![Vec::with_capacity(samples as usize); PRIMITIVES.len()];
    let mut out = Samples {
        cpu: rows(),
        wall: rows(),
        trip: rows(),
    };
    let warm_up = |rig: &mut Rig, p: Primitive| -> R<()> {
        for k in 0..10 {
            rig.submit(p, k)?;
            if p.pings() {
                rig.wait_ping()?;
            }
        }
        rig.sync()
    };
    let step = interval_us * 1000;
    match schedule {
        Schedule::Turns => {
            for p in PRIMITIVES {
                warm_up(rig, p)?;
            }
            let mut due = now_ns();
            for k in 0..samples {
                for (i, p) in PRIMITIVES.into_iter().enumerate() {
                    due += step;
                    sample(rig, p, k, due, i, &mut out)?;
                }
            }
        }
        Schedule::Alone => {
            // In rounds, so that a stretch of a noisy host falls on every
            // primitive rather than on one.
            let per_round = samples.div_ceil(ALONE_ROUNDS);
            for round in 0..ALONE_ROUNDS {
                for (i, p) in PRIMITIVES.into_iter().enumerate() {
                    warm_up(rig, p)?;
                    let mut due = now_ns();
                    for k in round * per_round..((round + 1) * per_round).min(samples) {
                        due += step;
                        sample(rig, p, k, due, i, &mut out)?;
                    }
                }
            }
        }
    }
    rig.sync()?;
    Ok(out)
}

fn main() -> R<()> {
    let args = output::args();
    if output::help(&args, USAGE) {
        return Ok(());
    }
    let value_of = |flag: &str| output::value_of(&args, flag);
    let samples: u32 = match value_of("--samples") {
        Some(v) => v.parse().map_err(|_| format!("--samples takes a count, not {v:?}"))?,
        None => 300,
    };
    let intervals: Vec<u64> = match value_of("--intervals") {
        Some(v) => v
            .split(',')
            .map(|x| x.parse().map_err(|_| format!("--intervals takes µs values, not {x:?}")))
            .collect::<Result<_, _>>()?,
        None => vec![2000, 40_000],
    };
    let schedules: Vec<Schedule> = match value_of("--schedules") {
        Some(v) => v
            .split(',')
            .map(|x| match x {
                "turns" => Ok(Schedule::Turns),
                "alone" => Ok(Schedule::Alone),
                _ => Err(format!("--schedules takes turns and/or alone, not {x:?}")),
            })
            .collect::<Result<_, _>>()?,
        None => vec![Schedule::Turns, Schedule::Alone],
    };
    let out_dir = value_of("--out").map(PathBuf::from);
    if !vramring::cuda::cuda_usable() {
        eprintln!("submit bench: no usable CUDA GPU; nothing measured");
        return Ok(());
    }
    let mut rig = Rig::new()?;
    let mut md = format!(
        "What one call costs the calling thread, µs: CPU (`CLOCK_THREAD_CPUTIME_ID`) and wall time, and for the ping rows the round trip (call to the GPU's store seen on the CPU); {samples} calls of each primitive per interval and schedule\n\n\
         {}",
        output::table_header("schedule | interval | primitive | call | CPU p50 | CPU p99 | wall p50 | wall p99 | round trip p50 | round trip p99 | CPU p50 ÷ launch")
    );
    let mut jsonl = String::new();
    for &schedule in &schedules {
        for &interval in &intervals {
            let mut s = measure(&mut rig, schedule, interval, samples)?;
            for v in s.cpu.iter_mut().chain(s.wall.iter_mut()).chain(s.trip.iter_mut()) {
                v.sort_unstable();
            }
            let launch = pct_us(&s.cpu[0], 0.5);
            for (i, p) in PRIMITIVES.into_iter().enumerate() {
                let (c50, c99) = (pct_us(&s.cpu[i], 0.5), pct_us(&s.cpu[i], 0.99));
                let (w50, w99) = (pct_us(&s.wall[i], 0.5), pct_us(&s.wall[i], 0.99));
                let (t50, t99) = (pct_us(&s.trip[i], 0.5), pct_us(&s.trip[i], 0.99));
                let trip = |t: f64| if p.pings() { format!("{t:.2}") } else { "–".into() };
                md.push_str(&format!(
                    "| {} | {} ms | {} | {} | {c50:.2} | {c99:.2} | {w50:.2} | {w99:.2} | {} | {} | {:.2} |\n",
                    schedule.key(),
                    interval as f64 / 1000.0,
                    p.key(),
                    p.call(),
                    trip(t50),
                    trip(t99),
                    c50 / launch
                ));
                let trip_json = if p.pings() {
                    format!(",\"trip_p50_us\":{t50:.2},\"trip_p99_us\":{t99:.2}")
                } else {
                    String::new()
                };
                jsonl.push_str(&format!(
                    "{{\"bench\":\"submit\",\"schedule\":\"{}\",\"interval_us\":{interval},\"primitive\":\"{}\",\"samples\":{samples},\"cpu_p50_us\":{c50:.2},\"cpu_p99_us\":{c99:.2},\"wall_p50_us\":{w50:.2},\"wall_p99_us\":{w99:.2}{trip_json}}}\n",
                    schedule.key(),
                    p.key()
                ));
            }
        }
    }
    print!("{md}");
    if let Some(dir) = out_dir {
        output::write_report_in(&dir, "submit", &md, &jsonl)?;
    }
    Ok(())
}
