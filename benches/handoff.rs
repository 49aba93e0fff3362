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

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cudarc::driver::sys;

use common::{ck, make_primary_current, R};
use vramring_benches as common;

const BYTES: usize = 2048 * 1620; // 1080p NV12 at a 2048-byte pitch
const ROUNDS: usize = 2000;

struct Side {
    stream: sys::CUstream,
    src: sys::CUdeviceptr,
    dst: sys::CUdeviceptr,
}

fn side() -> R<Side> {
    let (mut stream, mut src, mut dst) = (std::ptr::null_mut(), 0, 0);
    // SAFETY: valid out-pointers; a context is current.
    unsafe {
        ck("cuStreamCreate", sys::cuStreamCreate(&mut stream, 1))?;
        ck("cuMemAlloc", sys::cuMemAlloc_v2(&mut src, BYTES))?;
        ck("cuMemAlloc", sys::cuMemAlloc_v2(&mut dst, BYTES))?;
        ck("cuMemsetD8", sys::cuMemsetD8_v2(src, 7, BYTES))?;
    }
    Ok(Side { stream, src, dst })
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
            "dtod" => ck(
                "cuMemcpyDtoDAsync",
                sys::cuMemcpyDtoDAsync_v2(s.dst, s.src, BYTES, s.stream),
            ),
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
                        s.stream,
                    ),
                )
            }
            _ => Err("method".into()),
        }
    }
}

fn sync(s: &Side) -> R<()> {
    // SAFETY: live stream.
    unsafe { ck("cuStreamSynchronize", sys::cuStreamSynchronize(s.stream)) }
}

fn flag(map: &memmap2::MmapRaw) -> &AtomicU64 {
    // SAFETY: 8 aligned bytes at the start of a live 4 KiB shared map.
    unsafe { &*(map.as_ptr() as *const AtomicU64) }
}

/// One side of the ping-pong: copies when the turn counter says so.
fn play(method: &str, me: u64, map: &memmap2::MmapRaw, s: &Side) -> R<Vec<u64>> {
    let turn = flag(map);
    let mut times = Vec::with_capacity(ROUNDS);
    for r in 0..ROUNDS as u64 {
        let mine = 2 * r + me;
        while turn.load(Ordering::Acquire) != mine {
            std::hint::spin_loop();
        }
        let t = Instant::now();
        copy(method, s)?;
        sync(s)?;
        times.push(t.elapsed().as_nanos() as u64);
        turn.store(mine + 1, Ordering::Release);
    }
    Ok(times)
}

fn median_us(mut v: Vec<u64>) -> (f64, f64) {
    v.sort_unstable();
    let skip = v.len() / 10;
    let v = &v[skip..];
    (
        v[v.len() / 2] as f64 / 1000.0,
        v[(v.len() - 1) * 99 / 100] as f64 / 1000.0,
    )
}

fn shared_map(path: &str, create: bool) -> R<memmap2::MmapRaw> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(create)
        .open(path)?;
    if create {
        f.set_len(4096)?;
    }
    Ok(memmap2::MmapOptions::new().map_raw(&f)?)
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if args.first().map(String::as_str) == Some("--child") {
        make_primary_current()?;
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
    println!("| method | layout | A copy+sync p50 (µs) | A p99 | B p50 | B p99 |\n|---|---|---|---|---|---|");
    for method in ["dtod", "ce"] {
        // Two processes, alternating.
        let path = format!("/dev/shm/vramring-handoff-{}", std::process::id());
        let map = shared_map(&path, true)?;
        let s = side()?;
        // warm up
        for _ in 0..200 {
            copy(method, &s)?;
        }
        sync(&s)?;
        let child = std::process::Command::new(std::env::current_exe()?)
            .args(["--child", method, &path])
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
        let ctx = {
            let mut c = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            unsafe { ck("cuCtxGetCurrent", sys::cuCtxGetCurrent(&mut c))? };
            c as usize
        };
        let s2p = (s2.stream as usize, s2.src, s2.dst);
        let method_s = method.to_string();
        let h = std::thread::spawn(move || -> Result<Vec<u64>, String> {
            // SAFETY: the primary context, current in the parent thread too.
            unsafe { sys::cuCtxSetCurrent(ctx as sys::CUcontext) };
            let s = Side {
                stream: s2p.0 as sys::CUstream,
                src: s2p.1,
                dst: s2p.2,
            };
            play(&method_s, 1, &m2, &s).map_err(|e| e.to_string())
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
