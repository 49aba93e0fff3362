//! Records a packet ring to a file: connects (lossless by default, so no
//! packet is ever lost to a slow disk), starts at a keyframe, writes every
//! packet it gets to `--output` in order, and stops when the publisher is
//! gone and every packet left in the ring is written.
//!
//! ```text
//! cargo run --release --example recorder -- --socket /tmp/cam1.packets.sock --output /tmp/cam1.h264
//! ```
//!
//! Recording an H.264 Annex-B stream from `examples/packet_producer.rs`
//! gives a playable `.h264` file (`ffplay /tmp/cam1.h264`). With `--json`
//! the last line (`"event":"final"`) is the summary. `--no-lossless` makes
//! it a plain reader that skips to the next keyframe when it falls a whole
//! ring behind.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use vramring::packet::{PacketSubscriber, PacketSubscriberOptions};
use vramring::ClientOptions;
use vramring::Error;

#[path = "common/mod.rs"]
#[allow(dead_code)]
mod common;

use common::{emit, stop_requested, AnyResult, Json};

/// Record a vramring packet ring to a file.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Socket path of the packet publisher.
    #[arg(long, default_value = "/tmp/vramring-packets.sock")]
    socket: PathBuf,
    /// File to write the packets to.
    #[arg(long)]
    output: PathBuf,
    /// Read without the lossless guarantee.
    #[arg(long)]
    no_lossless: bool,
    /// Name shown to the publisher.
    #[arg(long, default_value = "recorder")]
    name: String,
    /// Sleep this long after each packet (to play a slow disk).
    #[arg(long, default_value_t = 0)]
    delay_us: u64,
    /// Stop after this many packets (0: no limit).
    #[arg(long, default_value_t = 0)]
    max_packets: u64,
    /// Give up when no packet comes for this long, in ms.
    #[arg(long, default_value_t = 10_000)]
    idle_ms: u64,
    /// Keep trying to connect this long while nothing listens yet, in ms.
    #[arg(long, default_value_t = 5000)]
    connect_wait_ms: u64,
    /// Print JSON lines.
    #[arg(long)]
    json: bool,
}

/// Connects, retrying while the socket does not exist yet or refuses (the
/// publisher is still starting), for up to `wait`.
fn connect(cli: &Cli, opts: PacketSubscriberOptions, wait: Duration) -> AnyResult<PacketSubscriber> {
    let start = Instant::now();
    loop {
        match PacketSubscriber::connect(&cli.socket, opts.clone()) {
            Ok(s) => return Ok(s),
            Err(Error::Io { .. }) if start.elapsed() < wait && !stop_requested() => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn main() -> std::process::ExitCode {
    common::exit_with(run())
}

fn run() -> AnyResult<()> {
    let cli = Cli::parse();
    common::install_stop_handler();
    let opts = PacketSubscriberOptions::new()
        .lossless(!cli.no_lossless)
        .name(cli.name.clone());
    let mut sub = connect(&cli, opts, Duration::from_millis(cli.connect_wait_ms))?;
    if cli.json {
        emit(
            &Json::event("connected")
                .str("role", "recorder")
                .str("name", &cli.name)
                .finish(),
        );
    }
    let mut out = std::io::BufWriter::new(std::fs::File::create(&cli.output)?);
    let mut buf = Vec::new();
    let mut params = Vec::new();
    let (mut packets, mut bytes, mut first_seq, mut first_key, mut overrun_errors) = (0u64, 0u64, 0u64, false, 0u64);
    let start = Instant::now();
    let end = loop {
        if stop_requested() {
            break "interrupted";
        }
        if cli.max_packets != 0 && packets >= cli.max_packets {
            break "max_packets";
        }
        match sub.next_copy(&mut buf, Duration::from_millis(cli.idle_ms)) {
            Ok(p) => {
                if packets == 0 {
                    first_seq = p.seq;
                    first_key = p.is_key();
                    sub.codec_params(&mut params)?;
                }
                out.write_all(&buf)?;
                packets += 1;
                bytes += buf.len() as u64;
                if cli.delay_us > 0 {
                    std::thread::sleep(Duration::from_micros(cli.delay_us));
                }
            }
            Err(Error::PacketOverrun { .. }) => overrun_errors += 1,
            Err(Error::ProducerGone { .. }) => break "producer_gone",
            Err(Error::Timeout(..)) => break "idle",
            Err(e) => return Err(e.into()),
        }
    };
    out.flush()?;
    let st = sub.stats();
    let summary = Json::event("final")
        .str("role", "recorder")
        .str("name", &cli.name)
        .u64("packets", packets)
        .u64("bytes", bytes)
        .u64("first_seq", first_seq)
        .u64("first_key", u64::from(first_key))
        .u64("params_bytes", params.len() as u64)
        .u64("skipped", st.skipped)
        .u64("overruns", st.overruns.max(overrun_errors))
        .f64("seconds", start.elapsed().as_secs_f64())
        .str("end", end)
        .finish();
    if cli.json {
        emit(&summary);
    } else {
        println!(
            "recorded {packets} packets ({bytes} bytes) from seq {first_seq} to {}; {} skipped, {} overruns; {end}",
            cli.output.display(),
            st.skipped,
            st.overruns
        );
    }
    Ok(())
}
