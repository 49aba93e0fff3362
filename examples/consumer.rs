//! Subscribes to a publisher and verifies every frame it gets against the
//! test pattern (seq and checksum), printing frame rate, delivery latency
//! percentiles (now minus the frame's commit time, both `CLOCK_MONOTONIC`),
//! drops, overruns and torn frames.
//!
//! ```text
//! cargo run --release --example consumer -- --socket /tmp/cam1.sock --mode latest --delay-us 20000
//! ```
//!
//! `--prepare-ahead-us N` parks before each read until N µs before the
//! wait would start spinning for the frame
//! (`Subscriber::park_until_due`), as a reader with per-frame work to
//! prepare does.
//!
//! `--json` prints one JSON object per line; the last one (`"event":"final"`)
//! is the summary, with the cadence wait's counters. Exits 1 if any frame
//! was torn, or if frames stopped coming for `--timeout-ms` while the
//! publisher still held the ring
//! (`"end":"timeout"`: a stalled publisher is a failure, not an end).

use clap::Parser;

#[path = "common/mod.rs"]
#[allow(dead_code)]
mod common;

/// Read and verify frames from a vramring publisher.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    #[command(flatten)]
    args: common::ConsumerArgs,
}

fn main() -> std::process::ExitCode {
    common::exit_with(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    common::install_stop_handler();
    let report = common::run_consumer(&cli.args)?;
    if report.torn > 0 {
        return Err(format!("{}: {} torn frames", report.name, report.torn).into());
    }
    if report.end == "timeout" {
        return Err(format!(
            "{}: no frame came for {} ms after frame {} while the publisher still held the ring; \
             it stalled or stopped publishing without closing (raise --timeout-ms for a slower source)",
            report.name, cli.args.timeout_ms, report.last_seq
        )
        .into());
    }
    Ok(())
}
