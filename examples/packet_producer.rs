//! Publishes an H.264 Annex-B stream on a packet ring, one access unit per
//! packet: the codec parameters (SPS/PPS) of each keyframe go into the
//! ring's header, keyframes are flagged, pts/dts count 90 kHz ticks.
//!
//! ```text
//! cargo run --release --example packet_producer -- --socket /tmp/cam1.packets.sock --fps 30 --loops 0
//! ```
//!
//! The input defaults to the clip the tests ship (`tests/data/clip.h264`,
//! 300 access units, an IDR every 30). With `--json` it prints one JSON
//! object per line; the last (`"event":"final"`) is the summary. Pair it
//! with `examples/recorder.rs`.

use std::path::PathBuf;
use std::time::{Duration, Instant};
use vramring::ServeOptions;

use clap::Parser;
use vramring::packet::{annexb, PacketMeta, PacketPublisher, PacketPublisherConfig, PacketRingConfig, PACKET_KEY};

#[path = "common/mod.rs"]
#[allow(dead_code)]
mod common;

use common::{emit, stop_requested, AnyResult, Json};

/// The clip the tests ship.
const DEFAULT_CLIP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/clip.h264");
/// FourCC of the stream's codec, stored in the ring.
const CODEC_H264: u32 = u32::from_le_bytes(*b"H264");

/// Publish an H.264 Annex-B file on a vramring packet ring.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Socket path to serve on.
    #[arg(long, default_value = "/tmp/vramring-packets.sock")]
    socket: PathBuf,
    /// H.264 Annex-B input.
    #[arg(long, default_value = DEFAULT_CLIP)]
    input: PathBuf,
    /// Access units per second (0: as fast as the ring allows).
    #[arg(long, default_value_t = 30.0)]
    fps: f64,
    /// Times to play the input (0: until interrupted).
    #[arg(long, default_value_t = 1)]
    loops: u64,
    /// Bytes of the ring's data area (a power of two, at least twice the
    /// largest packet).
    #[arg(long, default_value_t = 4 << 20)]
    ring_bytes: u64,
    /// Records in the ring (a power of two).
    #[arg(long, default_value_t = 512)]
    records: u32,
    /// Largest packet accepted.
    #[arg(long, default_value_t = 1 << 20)]
    max_packet: u32,
    /// Wait for this many subscribers before the first packet.
    #[arg(long, default_value_t = 0)]
    wait_subscribers: u32,
    /// Give up waiting for subscribers after this many seconds.
    #[arg(long, default_value_t = 30)]
    wait_secs: u64,
    /// How long one write may wait for a lossless subscriber, in ms; a write
    /// that runs out is retried (the lease still runs).
    #[arg(long, default_value_t = 2000)]
    write_timeout_ms: u64,
    /// A lossless subscriber that keeps the writer waiting this long is
    /// evicted, in ms.
    #[arg(long, default_value_t = 1000)]
    lease_ms: u64,
    /// Print JSON lines.
    #[arg(long)]
    json: bool,
}

fn main() -> std::process::ExitCode {
    common::exit_with(run())
}

fn run() -> AnyResult<()> {
    let cli = Cli::parse();
    common::install_stop_handler();
    let stream = std::fs::read(&cli.input).map_err(|e| format!("reading {}: {e}", cli.input.display()))?;
    let units = annexb::access_units(&stream);
    if units.is_empty() {
        return Err(format!("{} holds no access unit", cli.input.display()).into());
    }
    let ring = PacketRingConfig::new(cli.ring_bytes, cli.records, cli.max_packet).codec(CODEC_H264);
    let cfg = PacketPublisherConfig::new(ring)
        .write_timeout(Duration::from_millis(cli.write_timeout_ms))
        .lossless_lease(Duration::from_millis(cli.lease_ms));
    let mut publisher = PacketPublisher::create(&cli.socket, cfg)?;
    let start_wait = Instant::now();
    while publisher.stats().subscribers < cli.wait_subscribers {
        if stop_requested() || start_wait.elapsed() > Duration::from_secs(cli.wait_secs) {
            return Err(format!("{} subscribers did not connect in time", cli.wait_subscribers).into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if cli.json {
        emit(
            &Json::event("ready")
                .str("role", "packet_producer")
                .u64("access_units", units.len() as u64)
                .finish(),
        );
    }

    let period = (cli.fps > 0.0).then(|| Duration::from_secs_f64(1.0 / cli.fps));
    let start = Instant::now();
    let (mut packets, mut bytes, mut keys, mut params) = (0u64, 0u64, 0u64, Vec::new());
    'play: for round in 0.. {
        if cli.loops != 0 && round >= cli.loops {
            break;
        }
        for au in &units {
            if stop_requested() {
                break 'play;
            }
            if au.key {
                let ps = annexb::parameter_sets(au.bytes);
                if !ps.is_empty() && ps != params {
                    publisher.set_codec_params(&ps)?;
                    params = ps;
                }
            }
            if let Some(p) = period {
                let due = start + p.mul_f64(packets as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            // 90 kHz ticks at the nominal frame rate; no B-frames, so dts = pts.
            let pts = (packets * 90_000 / 30) as i64;
            let meta = PacketMeta {
                pts,
                dts: pts,
                flags: if au.key { PACKET_KEY } else { 0 },
                codec: 0,
            };
            // A stalled lossless recorder is evicted after its lease (measured
            // across writes), so a write that timed out is simply retried.
            loop {
                match publisher.write(au.bytes, meta) {
                    Err(vramring::Error::LosslessBlocked { .. }) if !stop_requested() => continue,
                    other => {
                        other?;
                        break;
                    }
                }
            }
            packets += 1;
            bytes += au.bytes.len() as u64;
            keys += u64::from(au.key);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let stats = publisher.stats();
    publisher.close();
    let summary = Json::event("final")
        .str("role", "packet_producer")
        .u64("packets", packets)
        .u64("bytes", bytes)
        .u64("keyframes", keys)
        .f64("seconds", seconds)
        .u64("lossless_waits", stats.lossless_waits)
        .u64("evictions", stats.evictions)
        .u64("connects", stats.connects)
        .finish();
    if cli.json {
        emit(&summary);
    } else {
        println!(
            "published {packets} packets ({bytes} bytes, {keys} keyframes) in {seconds:.2} s; \
             {} writes waited for a lossless subscriber, {} evicted",
            stats.lossless_waits, stats.evictions
        );
    }
    Ok(())
}
