//! `vramring play`: an H.264 Annex-B file published as a packet ring.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;
use vramring::packet::{annexb, PacketMeta, PacketPublisher, PacketPublisherConfig, PacketRingConfig, PACKET_KEY};
use vramring::AccessPolicy;
use vramring::ServeOptions;

use crate::error::{exit, CliError, CliResult};
use crate::term;

/// FourCC of H.264, stored in the ring's header.
const CODEC_H264: u32 = u32::from_le_bytes(*b"H264");

/// Arguments of `play`.
#[derive(Debug, Args)]
pub struct PlayArgs {
    /// H.264 Annex-B elementary stream to publish.
    pub file: PathBuf,
    /// Socket path to serve the packet ring on.
    pub socket: PathBuf,
    /// Access units per second (0: as fast as the ring allows).
    #[arg(long, default_value_t = 30.0)]
    pub fps: f64,
    /// Times to play the file (0: until Ctrl-C).
    #[arg(long, default_value_t = 1)]
    pub loops: u64,
    /// Bytes of the ring's data area (a power of two, at least twice --max-packet).
    #[arg(long, default_value_t = 4 << 20)]
    pub ring_bytes: u64,
    /// Records in the ring (a power of two).
    #[arg(long, default_value_t = 512)]
    pub records: u32,
    /// Largest access unit accepted, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub max_packet: u32,
    /// Wait for this many subscribers before the first packet.
    #[arg(long, default_value_t = 0)]
    pub wait_subscribers: u32,
    /// Wait this long before the first packet (after --wait-subscribers is
    /// met), in ms: a subscriber is counted when the publisher assigns its
    /// entry and attaches a moment later, and one that attaches once
    /// packets flow joins at the newest keyframe, not at the first packet.
    #[arg(long, default_value_t = 200)]
    pub start_delay_ms: u64,
    /// Give up waiting for subscribers after this many ms.
    #[arg(long, default_value_t = 30_000)]
    pub wait_ms: u64,
    /// Socket file mode, octal.
    #[arg(long, default_value = "660", value_parser = parse_mode)]
    pub socket_mode: u32,
    /// Allow only these uids to subscribe (repeatable; with --allow-gid, either matches).
    #[arg(long = "allow-uid")]
    pub allow_uids: Vec<u32>,
    /// Allow only these gids to subscribe (repeatable).
    #[arg(long = "allow-gid")]
    pub allow_gids: Vec<u32>,
    /// Refuse lossless subscribers (by default a lossless recorder may make
    /// this publisher wait, up to --write-timeout-ms).
    #[arg(long)]
    pub no_lossless: bool,
    /// How long a write may wait for a lossless subscriber, in ms.
    #[arg(long, default_value_t = 2000)]
    pub write_timeout_ms: u64,
    /// Keep the ring open this long after the last packet, in ms, so a
    /// subscriber still connecting can attach and drain it.
    #[arg(long, default_value_t = 500)]
    pub linger_ms: u64,
    /// Print the summary as one JSON object (and a `ready` object first).
    #[arg(long)]
    pub json: bool,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    let t = s.trim_start_matches("0o");
    u32::from_str_radix(t, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal file mode such as 660"))
}

/// `vramring play`.
pub fn run(a: &PlayArgs) -> CliResult {
    term::install_stop_handler();
    let stream = std::fs::read(&a.file).map_err(|e| CliError {
        code: if e.kind() == std::io::ErrorKind::NotFound {
            exit::NOT_FOUND
        } else {
            exit::FAILURE
        },
        msg: format!("cannot read {}: {e}", a.file.display()),
    })?;
    let units = annexb::access_units(&stream);
    if !units.iter().any(|u| u.key) {
        return Err(CliError::failure(format!(
            "{} holds no H.264 keyframe (IDR access unit); is it an Annex-B elementary stream?",
            a.file.display()
        )));
    }
    let ring = PacketRingConfig::new(a.ring_bytes, a.records, a.max_packet).codec(CODEC_H264);
    let cfg = PacketPublisherConfig::new(ring)
        .allow_lossless(!a.no_lossless)
        .write_timeout(Duration::from_millis(a.write_timeout_ms))
        .socket_mode(a.socket_mode)
        .access(AccessPolicy {
            uids: a.allow_uids.clone(),
            gids: a.allow_gids.clone(),
        });
    let fail = |e: vramring::Error| CliError::failure(format!("publishing on {}: {e}", a.socket.display()));
    let mut publisher = PacketPublisher::create(&a.socket, cfg).map_err(fail)?;
    if a.json {
        crate::emit(
            &json!({"event": "ready", "socket": a.socket.display().to_string(), "access_units": units.len()})
                .to_string(),
        );
    } else {
        crate::emit(&format!(
            "publishing {} ({} access units) on {}",
            a.file.display(),
            units.len(),
            a.socket.display()
        ));
    }
    let wait_start = Instant::now();
    while publisher.stats().subscribers < a.wait_subscribers {
        if term::stop_requested() {
            return Ok(exit::OK);
        }
        if wait_start.elapsed() > Duration::from_millis(a.wait_ms) {
            return Err(CliError {
                code: exit::TIMEOUT,
                msg: format!(
                    "{} subscribers did not connect within {} ms",
                    a.wait_subscribers, a.wait_ms
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let delay = crate::after(Duration::from_millis(a.start_delay_ms));
    while Instant::now() < delay && !term::stop_requested() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let period = (a.fps > 0.0).then(|| Duration::from_secs_f64(1.0 / a.fps));
    let tick = if a.fps > 0.0 { 90_000.0 / a.fps } else { 3000.0 };
    let start = Instant::now();
    let (mut packets, mut bytes, mut keys) = (0u64, 0u64, 0u64);
    let mut params = Vec::new();
    'play: for round in 0.. {
        if a.loops != 0 && round >= a.loops {
            break;
        }
        for au in &units {
            if term::stop_requested() {
                break 'play;
            }
            if au.key {
                let ps = annexb::parameter_sets(au.bytes);
                if !ps.is_empty() && ps != params {
                    publisher.set_codec_params(&ps).map_err(fail)?;
                    params = ps;
                }
            }
            if let Some(p) = period {
                let due = start + p.mul_f64(packets as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            // 90 kHz ticks; no B-frames assumed, so dts = pts.
            let pts = (packets as f64 * tick) as i64;
            let meta = PacketMeta {
                pts,
                dts: pts,
                flags: if au.key { PACKET_KEY } else { 0 },
                codec: 0,
            };
            // A stalled lossless recorder is evicted after its lease (which
            // runs across writes): a write that timed out is retried.
            loop {
                match publisher.write(au.bytes, meta) {
                    Err(vramring::Error::LosslessBlocked { .. }) if !term::stop_requested() => continue,
                    other => {
                        other.map_err(fail)?;
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
    let linger = crate::after(Duration::from_millis(a.linger_ms));
    while Instant::now() < linger && !term::stop_requested() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stats = publisher.stats();
    publisher.close();
    if a.json {
        crate::emit(
            &json!({"event": "final", "packets": packets, "bytes": bytes, "keyframes": keys,
                    "seconds": seconds, "connects": stats.connects, "evictions": stats.evictions,
                    "lossless_waits": stats.lossless_waits})
            .to_string(),
        );
    } else {
        crate::emit(&format!(
            "published {packets} packets ({bytes} bytes, {keys} keyframes) in {seconds:.1} s; \
             {} subscribers connected, {} evicted",
            stats.connects, stats.evictions
        ));
    }
    Ok(exit::OK)
}
