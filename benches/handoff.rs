//! Probe: what does a GPU copy cost when GPU work alternates between two
//! processes (as a publisher's write and a subscriber's copy do), per copy
//! method? Lockstep ping-pong through a shared-memory flag:
//! process A copies 3.1 MB and synchronises, then B does the same, and so on;
//! the same is run with both sides in one process for comparison.
//!
//! Methods: `cuMemcpyDtoDAsync` (SM copy kernel) and `cuMemcpyBatchAsync`
//! with `CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE` (copy engine).
//!
//! Run on a GPU machine: `cargo bench --bench handoff`.

use std::sync::atomic::Ordering;
use std::time::Instant;

use cudarc::driver::sys;

use common::{ck, make_primary_current, output, pct_us, procs, Gpu, SharedMap, R};
use vramring_benches as common;

const BYTES: usize = 2048 * 1620; // 1080p NV12 at a 2048-byte pitch
const ROUNDS: usize = 2000;
const USAGE: &str = "handoff probe: a 3.1 MB copy and its synchronisation, alternating between two processes and \
between two threads of one, per copy method (dtod, ce); no flags; needs a CUDA GPU";

/// One side's stream (in device 0's primary context) and buffers.
struct Side {
    gpu: Gpu,
    src: sys::CUdeviceptr,
    dst: sys::CUdeviceptr,
}

fn side() -> R<Side> {
    let gpu = Gpu::init()?;
    let src = gpu.alloc(BYTES)?;
    let dst = gpu.alloc(BYTES)?;
    // SAFETY: `src` is a live allocation of BYTES in the current context.
    unsafe { ck("cuMemsetD8", sys::cuMemsetD8_v2(src, 7, BYTES))? };
    Ok(Side { gpu, src, dst })
}

type BatchFn = unsafe extern "C" fn(
    *mut sys::CUdeviceptr,
    *mut sys::CUdeviceptr,
    *mut usize,
    usize,
    *mut sys::CUmemcpyAttributes,
    *mut usize,
    usize,
    sys::CUstream,
) -> sys::CUresult;

fn batch_fn() -> Option<BatchFn> {
    // SAFETY: looking up a symbol of the loaded driver library; the
    // signature is cuMemcpyBatchAsync_v2's (CUDA 13).
    unsafe {
        let lib = sys::culib();
        lib.get::<BatchFn>(b"cuMemcpyBatchAsync_v2\0").ok().map(|s| *s)
    }
}

fn copy(method: &str, s: &Side) -> R<()> {
    // SAFETY: live buffers of BYTES bytes and a live stream in the current context.
    unsafe {
        match method {
            "dtod" => s.gpu.copy(s.dst, s.src, BYTES),
            "ce" => {
                let f = batch_fn().ok_or("no cuMemcpyBatchAsync_v2")?;
                let mut dsts = [s.dst];
                let mut srcs = [s.src];
                let mut sizes = [BYTES];
                let mut attr: sys::CUmemcpyAttributes = std::mem::zeroed();
                attr.srcAccessOrder = sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
                attr.srcLocHint.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
                attr.srcLocHint.id = 0;
                attr.dstLocHint.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
                attr.dstLocHint.id = 0;
                attr.flags = sys::CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE as u32;
                let mut idx = [0usize];
                ck(
                    "cuMemcpyBatchAsync_v2",
                    f(
                        dsts.as_mut_ptr(),
                        srcs.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        1,
                        &mut attr,
                        idx.as_mut_ptr(),
                        1,
                        s.gpu.stream,
                    ),
                )
            }
            _ => Err("method".into()),
        }
    }
}

/// One side of the ping-pong: copies when the turn counter (word 0 of the
/// shared map) says so.
fn play(method: &str, me: u64, map: &SharedMap, s: &Side) -> R<Vec<u64>> {
    let turn = map.word(0);
    let mut times = Vec::with_capacity(ROUNDS);
    for r in 0..ROUNDS as u64 {
        let mine = 2 * r + me;
        while turn.load(Ordering::Acquire) != mine {
            std::hint::spin_loop();
        }
        let t = Instant::now();
        copy(method, s)?;
        s.gpu.sync()?;
        times.push(t.elapsed().as_nanos() as u64);
        turn.store(mine + 1, Ordering::Release);
    }
    Ok(times)
}

/// p50 and p99 (µs) of the copies, the fastest tenth left out.
fn median_us(mut v: Vec<u64>) -> (f64, f64) {
    v.sort_unstable();
    let v = &v[v.len() / 10..];
    (pct_us(v, 0.5), pct_us(v, 0.99))
}

fn shared_map(path: &str, create: bool) -> R<SharedMap> {
    let path = std::path::Path::new(path);
    if create {
        SharedMap::create(path, 4096)
    } else {
        SharedMap::open(path, None)
    }
}

fn main() -> R<()> {
    let args = output::args();
    if output::help(&args, USAGE) {
        return Ok(());
    }
    if args.first().map(String::as_str) == Some("--child") {
        let s = side()?;
        let map = shared_map(&args[2], false)?;
        let t = play(&args[1], 1, &map, &s)?;
        let (p50, p99) = median_us(t);
        println!("{p50:.1} {p99:.1}");
        return Ok(());
    }
    if !vramring::cuda::cuda_usable() {
        eprintln!("handoff probe: no usable CUDA GPU; nothing measured");
        return Ok(());
    }
    make_primary_current()?;
    print!(
        "{}",
        output::table_header("method | layout | A copy+sync p50 (µs) | A p99 | B p50 | B p99")
    );
    for method in ["dtod", "ce"] {
        // Two processes, alternating.
        let path = format!("/dev/shm/vramring-handoff-{}", std::process::id());
        let map = shared_map(&path, true)?;
        let s = side()?;
        // warm up
        for _ in 0..200 {
            copy(method, &s)?;
        }
        s.gpu.sync()?;
        let child = procs::self_command(["--child", method, &path])?
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let a = play(method, 0, &map, &s);
        let out = child.wait_with_output()?;
        let a = median_us(a?);
        println!(
            "| {method} | two processes | {:.1} | {:.1} | {} |",
            a.0,
            a.1,
            String::from_utf8_lossy(&out.stdout).trim().replace(' ', " | ")
        );
        let _ = std::fs::remove_file(&path);
        // One process, two streams, alternating on two threads.
        let map = std::sync::Arc::new(shared_map(&path, true)?);
        let s2 = side()?;
        let m2 = std::sync::Arc::clone(&map);
        let method_s = method.to_string();
        let h = std::thread::spawn(move || -> R<Vec<u64>> {
            // The primary context, current in this thread too.
            make_primary_current()?;
            play(&method_s, 1, &m2, &s2)
        });
        let a = median_us(play(method, 0, &map, &s)?);
        let b = median_us(h.join().map_err(|_| "thread panicked")??);
        println!(
            "| {method} | one process | {:.1} | {:.1} | {:.1} | {:.1} |",
            a.0, a.1, b.0, b.1
        );
        let _ = std::fs::remove_file(&path);
    }
    Ok(())
}
