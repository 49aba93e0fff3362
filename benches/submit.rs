//! What each way of putting work in a CUDA stream's order costs the
//! calling thread's CPU: the floor under any stream-order publish (issue
//! 15, goal 1 asks ≤ 5 µs of producer CPU per publish; vramring's publish
//! is one kernel launch plus the protocol's own work, ADR 0009).
//!
//! One process, device 0's primary context, one non-blocking stream per
//! primitive:
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
//! The calls are paced, one every interval (2 ms and 40 ms by default: the
//! latency bench's frame interval and 25 fps), the primitives in turn, so
//! that every primitive sees the same machine. Each primitive is thus
//! called once every five intervals, on a stream nothing else touched
//! since: its absolute cost is that of a colder call than a publish every
//! interval on one stream (the latency bench's launch column); read the
//! ratios to `launch`. Each call is timed with the thread's CPU clock
//! (`CLOCK_THREAD_CPUTIME_ID`, the latency bench's producer CPU column)
//! and the monotonic clock.
//!
//! `cargo bench --bench submit -- [--samples N] [--intervals 2000,40000]
//! [--out DIR]` (intervals in µs; N calls of each primitive per interval,
//! default 500). On a GPU machine, the staged binary:
//! `bash .device/run.sh bench submit --out $OUT`. `--out DIR` receives
//! `submit.md` and `submit.jsonl`.

use std::ffi::c_void;
use std::path::PathBuf;

use cudarc::driver::sys;

#[path = "common/mod.rs"]
#[allow(dead_code)]
mod common;
use common::{ck, make_primary_current, pct_us, sleep_until_ns, thread_cpu_ns, FLOOR_PTX, R};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Primitive {
    Launch,
    Graph,
    Event,
    Memop,
    Clock,
}

const PRIMITIVES: [Primitive; 5] = [
    Primitive::Launch,
    Primitive::Graph,
    Primitive::Event,
    Primitive::Memop,
    Primitive::Clock,
];

impl Primitive {
    fn key(self) -> &'static str {
        match self {
            Primitive::Launch => "launch",
            Primitive::Graph => "graph",
            Primitive::Event => "event",
            Primitive::Memop => "memop",
            Primitive::Clock => "clock",
        }
    }
    fn call(self) -> &'static str {
        match self {
            Primitive::Launch => "`cuLaunchKernel`, empty kernel, 192-byte parameter",
            Primitive::Graph => "`cuGraphLaunch`, one kernel node",
            Primitive::Event => "`cuEventRecord`",
            Primitive::Memop => "`cuStreamWriteValue32`, device word",
            Primitive::Clock => "nothing (the clock pair)",
        }
    }
}

/// The driver objects the primitives use, made once in the primary context.
struct Rig {
    module: sys::CUmodule,
    func: sys::CUfunction,
    streams: [sys::CUstream; 4],
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    event: sys::CUevent,
    word: sys::CUdeviceptr,
    desc: [u64; 24],
}

impl Rig {
    fn new() -> R<Rig> {
        make_primary_current()?;
        let mut rig = Rig {
            module: std::ptr::null_mut(),
            func: std::ptr::null_mut(),
            streams: [std::ptr::null_mut(); 4],
            graph: std::ptr::null_mut(),
            exec: std::ptr::null_mut(),
            event: std::ptr::null_mut(),
            word: 0,
            desc: [0; 24],
        };
        // SAFETY: plain driver calls with valid out-pointers in the current
        // (primary) context; the PTX image is NUL-terminated; the kernel
        // node's one parameter points at `rig.desc`, which the graph copies
        // when the node is added.
        unsafe {
            ck(
                "cuModuleLoadData",
                sys::cuModuleLoadData(&mut rig.module, FLOOR_PTX.as_ptr().cast()),
            )?;
            ck(
                "cuModuleGetFunction",
                sys::cuModuleGetFunction(&mut rig.func, rig.module, c"vramring_floor".as_ptr()),
            )?;
            for s in &mut rig.streams {
                ck(
                    "cuStreamCreate",
                    sys::cuStreamCreate(s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
                )?;
            }
            ck("cuEventCreate", sys::cuEventCreate(&mut rig.event, 0x2))?; // CU_EVENT_DISABLE_TIMING
            ck("cuMemAlloc", sys::cuMemAlloc_v2(&mut rig.word, 4))?;
            ck("cuGraphCreate", sys::cuGraphCreate(&mut rig.graph, 0))?;
            let mut params = [rig.desc.as_mut_ptr().cast::<c_void>()];
            let mut node_params: sys::CUDA_KERNEL_NODE_PARAMS = std::mem::zeroed();
            node_params.func = rig.func;
            (node_params.gridDimX, node_params.gridDimY, node_params.gridDimZ) = (1, 1, 1);
            (node_params.blockDimX, node_params.blockDimY, node_params.blockDimZ) = (256, 1, 1);
            node_params.kernelParams = params.as_mut_ptr();
            let mut node = std::ptr::null_mut();
            ck(
                "cuGraphAddKernelNode",
                sys::cuGraphAddKernelNode_v2(&mut node, rig.graph, std::ptr::null(), 0, &node_params),
            )?;
            ck(
                "cuGraphInstantiateWithFlags",
                sys::cuGraphInstantiateWithFlags(&mut rig.exec, rig.graph, 0),
            )?;
        }
        Ok(rig)
    }

    /// One call of `p` (sample `k`).
    fn submit(&mut self, p: Primitive, k: u32) -> R<()> {
        // SAFETY: every handle was made by `new` in the current context and
        // lives until `drop`; the kernel's one parameter is `desc`, 192
        // bytes, as the PTX declares; `word` is 4 bytes of device memory.
        unsafe {
            match p {
                Primitive::Launch => {
                    let mut params = [self.desc.as_mut_ptr().cast::<c_void>()];
                    ck(
                        "cuLaunchKernel",
                        sys::cuLaunchKernel(
                            self.func,
                            1,
                            1,
                            1,
                            256,
                            1,
                            1,
                            0,
                            self.streams[0],
                            params.as_mut_ptr(),
                            std::ptr::null_mut(),
                        ),
                    )
                }
                Primitive::Graph => ck("cuGraphLaunch", sys::cuGraphLaunch(self.exec, self.streams[1])),
                Primitive::Event => ck("cuEventRecord", sys::cuEventRecord(self.event, self.streams[2])),
                Primitive::Memop => ck(
                    "cuStreamWriteValue32",
                    sys::cuStreamWriteValue32_v2(self.streams[3], self.word, k, 0),
                ),
                Primitive::Clock => Ok(()),
            }
        }
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
            sys::cuGraphExecDestroy(self.exec);
            sys::cuGraphDestroy(self.graph);
            sys::cuEventDestroy_v2(self.event);
            sys::cuMemFree_v2(self.word);
            for s in self.streams {
                sys::cuStreamDestroy_v2(s);
            }
            sys::cuModuleUnload(self.module);
        }
    }
}

/// CPU and wall time (ns) of each call, per primitive.
struct Samples {
    cpu: Vec<Vec<u64>>,
    wall: Vec<Vec<u64>>,
}

fn measure(rig: &mut Rig, interval_us: u64, samples: u32) -> R<Samples> {
    let mut out = Samples {
        cpu: vec![Vec::with_capacity(samples as usize); PRIMITIVES.len()],
        wall: vec![Vec::with_capacity(samples as usize); PRIMITIVES.len()],
    };
    // Warm-up: each primitive a few times, unpaced.
    for k in 0..20 {
        for p in PRIMITIVES {
            rig.submit(p, k)?;
        }
    }
    rig.sync()?;
    let mut due = vramring::time::monotonic_ns();
    for k in 0..samples {
        for (i, p) in PRIMITIVES.into_iter().enumerate() {
            due += interval_us * 1000;
            sleep_until_ns(due);
            let (w0, c0) = (vramring::time::monotonic_ns(), thread_cpu_ns());
            rig.submit(p, k)?;
            let (c1, w1) = (thread_cpu_ns(), vramring::time::monotonic_ns());
            out.cpu[i].push(c1 - c0);
            out.wall[i].push(w1 - w0);
        }
    }
    rig.sync()?;
    Ok(out)
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let value_of = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1));
    let samples: u32 = match value_of("--samples") {
        Some(v) => v.parse().map_err(|_| format!("--samples takes a count, not {v:?}"))?,
        None => 500,
    };
    let intervals: Vec<u64> = match value_of("--intervals") {
        Some(v) => v
            .split(',')
            .map(|x| x.parse().map_err(|_| format!("--intervals takes µs values, not {x:?}")))
            .collect::<Result<_, _>>()?,
        None => vec![2000, 40_000],
    };
    let out_dir = value_of("--out").map(PathBuf::from);
    if !vramring::memory::cuda::cuda_usable() {
        eprintln!("submit bench: no usable CUDA GPU; nothing measured");
        return Ok(());
    }
    let mut rig = Rig::new()?;
    let mut md = format!(
        "What one call costs the calling thread, µs: CPU (`CLOCK_THREAD_CPUTIME_ID`) and wall time, {samples} calls of each primitive per interval, the primitives in turn\n\n\
         | interval | primitive | call | CPU p50 | CPU p99 | wall p50 | wall p99 | CPU p50 ÷ launch |\n|---|---|---|---|---|---|---|---|\n"
    );
    let mut jsonl = String::new();
    for &interval in &intervals {
        let mut s = measure(&mut rig, interval, samples)?;
        for v in s.cpu.iter_mut().chain(s.wall.iter_mut()) {
            v.sort_unstable();
        }
        let launch = pct_us(&s.cpu[0], 0.5);
        for (i, p) in PRIMITIVES.into_iter().enumerate() {
            let (c50, c99) = (pct_us(&s.cpu[i], 0.5), pct_us(&s.cpu[i], 0.99));
            let (w50, w99) = (pct_us(&s.wall[i], 0.5), pct_us(&s.wall[i], 0.99));
            md.push_str(&format!(
                "| {} ms | {} | {} | {c50:.2} | {c99:.2} | {w50:.2} | {w99:.2} | {:.2} |\n",
                interval as f64 / 1000.0,
                p.key(),
                p.call(),
                c50 / launch
            ));
            jsonl.push_str(&format!(
                "{{\"bench\":\"submit\",\"interval_us\":{interval},\"primitive\":\"{}\",\"samples\":{samples},\"cpu_p50_us\":{c50:.2},\"cpu_p99_us\":{c99:.2},\"wall_p50_us\":{w50:.2},\"wall_p99_us\":{w99:.2}}}\n",
                p.key()
            ));
        }
    }
    print!("{md}");
    if let Some(dir) = out_dir {
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("submit.md"), &md)?;
        std::fs::write(dir.join("submit.jsonl"), &jsonl)?;
    }
    Ok(())
}
