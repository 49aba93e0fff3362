//! Why the packet ring's large writes cost what they cost: the price of a
//! memcpy depends on how much memory the destination rotates through.
//!
//! ```text
//! cargo bench --bench ring_footprint -- [SIZE_BYTES]      (default 1048576)
//! ```
//!
//! For one packet size it times, single-threaded, spinning between writes
//! for the period `benches/packet_race.rs` uses (1 ms from 1 MiB, 100 µs
//! below), the median of 500 after 100 warm-up writes:
//!
//! * `PacketWriter::write` of one packet into rings of 2, 4 and 8 × size;
//! * a plain `copy_from_slice` of the same bytes into 1, 2, 4 and 8 heap
//!   buffers used in turn (1 buffer: the same memory every time, as an
//!   allocator that hands back the chunk just freed; 4 buffers: the footprint
//!   of a 4 × size byte ring).
//!
//! The packet race's 1 MiB gap to iceoryx2 is the difference between the
//! 1-buffer and 4-buffer rows (docs/PERF.md).

use std::time::{Duration, Instant};

use vramring::packet::{PacketMeta, PacketRingConfig, PacketWriter};

use common::{median, now_ns, output, spin_until_ns, R};
use vramring_benches as common;

const WARMUP: usize = 100;
const SAMPLES: usize = 500;
const USAGE: &str = "ring_footprint bench: [SIZE_BYTES] (default 1048576): median µs of one packet write into rings \
of 2, 4 and 8 × size, and of a memcpy into 1, 2, 4 and 8 buffers in turn";

/// Median µs of `op(i)` over `SAMPLES` calls after `WARMUP`, `pause`
/// between calls.
fn time(pause: Duration, mut op: impl FnMut(usize)) -> f64 {
    let mut t = Vec::with_capacity(SAMPLES);
    for i in 0..WARMUP + SAMPLES {
        let start = Instant::now();
        op(i);
        if i >= WARMUP {
            t.push(start.elapsed().as_secs_f64() * 1e6);
        }
        // Spin, as the race's busy-mode publisher does (a sleep lets the
        // core idle and its caches cool, which is another experiment).
        spin_until_ns(now_ns() + pause.as_nanos() as u64);
    }
    median(&mut t)
}

fn main() -> R<()> {
    let args = output::args();
    if output::help(&args, USAGE) {
        return Ok(());
    }
    let size: usize = args
        .iter()
        .find(|a| !a.starts_with('-'))
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1 << 20);
    let src = vec![0x5au8; size];
    let pause = Duration::from_micros(if size >= 1 << 20 { 1000 } else { 100 });
    println!("| what | footprint | median µs |");
    println!("|---|---:|---:|");
    for factor in [2u64, 4, 8] {
        let ring = PacketRingConfig::new(factor * size as u64, 64, size as u32);
        let mut w = PacketWriter::create("ring-footprint", ring)?;
        let us = time(pause, |_| {
            w.write(&src, PacketMeta::default()).expect("write");
        });
        println!("| PacketWriter::write | {factor} x {size} B ring | {us:.1} |");
    }
    for buffers in [1usize, 2, 4, 8] {
        let mut dst: Vec<Vec<u8>> = (0..buffers).map(|_| vec![0u8; size]).collect();
        let us = time(pause, |i| {
            let d = &mut dst[i % buffers];
            d.copy_from_slice(&src);
            std::hint::black_box(d);
        });
        println!("| memcpy | {buffers} buffer(s) in turn | {us:.1} |");
    }
    Ok(())
}
