//! What a push subscriber's arrival and departure cost the producer's
//! thread on a CUDA ring (ADR 0018): mapping its buffers
//! (`ExportedPool::attach_target`: `cuMemImportFromShareableHandle`,
//! reserve, map, set access) and unmapping them, without synchronising
//! (`release_target`, what a publish does once the last copy landed) and
//! with a `cuCtxSynchronize` first (`detach_target`, the old path, here on
//! an idle context: with GPU work queued it waits for all of it).
//!
//! 1080p NV12 push buffers (3 × 3.1 MB, one allocation), imported by the
//! pool of this process from a push-only import's export, as the publisher
//! imports a subscriber's. Run on a GPU machine:
//! `cargo bench --bench attach` (staged: `bash .device/run.sh bench attach`).

use std::sync::Arc;
use std::time::Instant;

use vramring::memory::cuda::{CudaImport, CudaPool, DeviceSelector, RealDriver};
use vramring::memory::{ExportedPool, ImportedPool};

#[path = "common/mod.rs"]
#[allow(dead_code)]
mod common;
use common::{pct, R};

const ROUNDS: usize = 300;
/// 1080p NV12, rounded up to the crate's slot alignment as push strides are.
const STRIDE: u64 = (1920 * 1080 * 3 / 2u64).next_multiple_of(vramring::format::SLOT_ALIGN);

fn main() -> R<()> {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        println!("attach bench: maps and unmaps a 1080p push subscriber's buffers {ROUNDS} times; needs a CUDA GPU");
        return Ok(());
    }
    let d = RealDriver::shared()?;
    let mut pool = CudaPool::create(Arc::clone(&d), DeviceSelector::Ordinal(0), 64 << 20)?;
    let mut sub = CudaImport::push_only(Arc::clone(&d), pool.device_uuid())?;
    let (fd, bytes) = sub.alloc_push(vramring::layout::PUSH_BUFFERS as u32, STRIDE)?;
    let mut rows = Vec::new();
    for (name, sync) in [
        ("release (no synchronisation)", false),
        ("detach (cuCtxSynchronize first)", true),
    ] {
        let (mut map, mut unmap) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
        for _ in 0..ROUNDS {
            let t0 = Instant::now();
            let id = pool.attach_target(&fd, bytes)?;
            let t1 = Instant::now();
            if sync {
                pool.detach_target(id)?;
            } else {
                pool.release_target(id)?;
            }
            map.push((t1 - t0).as_nanos() as u64);
            unmap.push(t1.elapsed().as_nanos() as u64);
        }
        map.sort_unstable();
        unmap.sort_unstable();
        rows.push((name, map, unmap));
    }
    println!(
        "Push buffers of {bytes} bytes (3 × {STRIDE}), mapped and unmapped {ROUNDS} times per row, producer thread wall time (µs):\n"
    );
    println!("| unmapping | map p50 | map p99 | unmap p50 | unmap p99 |\n|---|---|---|---|---|");
    for (name, map, unmap) in &rows {
        let us = |v: &[u64], p| pct(v, p) as f64 / 1000.0;
        println!(
            "| {name} | {:.1} | {:.1} | {:.1} | {:.1} |",
            us(map, 0.5),
            us(map, 0.99),
            us(unmap, 0.5),
            us(unmap, 0.99)
        );
    }
    drop(fd);
    sub.close()?;
    pool.close()?;
    Ok(())
}
