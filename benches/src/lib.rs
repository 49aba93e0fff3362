//! What the benches share, so that each bench file is a scenario:
//! * clocks and pacing ([`thread_cpu_ns`], [`sleep_until_ns`]) and
//!   statistics ([`pct`], [`pct_us`]), samples passed between processes
//!   ([`write_samples`], [`read_samples`]);
//! * the GPU floor: a checked driver call ([`ck`]), device 0's primary
//!   context made current, an empty kernel ([`FLOOR_PTX`]);
//! * [`procs`]: child processes in named roles, dying with their parent,
//!   an MPS daemon of the bench's own;
//! * [`host`]: what the whole machine did while a bench measured.

pub mod host;
pub mod procs;

/// The commit graph mode `VRAMRING_COMMIT_GRAPH` asks for (`always`/`1`,
/// `never`/`0`, `auto`/unset), for the benches' rings; a value that is
/// none of these stops the bench with a sentence.
pub fn commit_graph_from_env() -> vramring::cuda::CommitGraph {
    match std::env::var("VRAMRING_COMMIT_GRAPH") {
        Err(_) => vramring::cuda::CommitGraph::AUTO,
        Ok(v) => v.parse().unwrap_or_else(|e| {
            eprintln!("VRAMRING_COMMIT_GRAPH: {e}");
            std::process::exit(2)
        }),
    }
}

use cudarc::driver::sys;

/// A benchmark's result type.
pub type R<T> = Result<T, Box<dyn std::error::Error>>;

/// `Ok` when the driver call `call` returned `CUDA_SUCCESS`.
pub fn ck(call: &str, r: sys::CUresult) -> R<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {r:?}").into())
    }
}

/// Initialises the driver and makes device 0's primary context current on
/// this thread. The context stays retained for the life of the process.
pub fn make_primary_current() -> R<()> {
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        ck("cuInit", sys::cuInit(0))?;
        let mut dev = 0;
        ck("cuDeviceGet", sys::cuDeviceGet(&mut dev, 0))?;
        let mut ctx = std::ptr::null_mut();
        ck("cuDevicePrimaryCtxRetain", sys::cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
        ck("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx))?;
    }
    Ok(())
}

/// An empty kernel, `vramring_floor`, with the commit kernel's parameter
/// (192 bytes by value): what one launch costs the producer's CPU, the
/// floor under vramring's stream-order publish (which is one such launch
/// plus the protocol's own work).
pub const FLOOR_PTX: &std::ffi::CStr = c"
.version 7.0
.target sm_70
.address_size 64
.visible .entry vramring_floor(.param .align 8 .b8 p_desc[192])
{
    ret;
}
";

/// This thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), ns.
pub fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Sleeps until `CLOCK_MONOTONIC` reads `t` ns (absolute: a late wake-up
/// does not shift the schedule). EINTR: just late.
pub fn sleep_until_ns(t: u64) {
    let ts = rustix::time::Timespec {
        tv_sec: (t / 1_000_000_000) as _,
        tv_nsec: (t % 1_000_000_000) as _,
    };
    let _ = rustix::thread::clock_nanosleep_absolute(rustix::thread::ClockId::Monotonic, &ts);
}

/// The `p` quantile (0..=1, nearest rank) of `sorted`; 0 when empty.
pub fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// [`pct`] of nanosecond samples, in microseconds; NaN when empty.
pub fn pct_us(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    pct(sorted, p) as f64 / 1000.0
}

/// Writes `samples` to `path` as little-endian u64s (a role process's
/// results, read back by the orchestrator with [`read_samples`]).
pub fn write_samples(path: &std::path::Path, samples: &[u64]) -> R<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path)?;
    for s in samples {
        f.write_all(&s.to_le_bytes())?;
    }
    Ok(())
}

/// The u64s [`write_samples`] wrote to `path`.
pub fn read_samples(path: &std::path::Path) -> R<Vec<u64>> {
    use std::io::Read;
    let mut b = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut b)?;
    Ok(b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}
