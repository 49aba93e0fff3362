//! Subscribes to a publisher and verifies every frame it gets against the
//! test pattern (seq and checksum), printing frame rate, delivery latency
//! percentiles (now minus the frame's commit time, both `CLOCK_MONOTONIC`),
//! drops, overruns and torn frames.
//!
//! ```text
//! cargo run --release --example consumer -- --socket /tmp/cam1.sock --mode latest --delay-us 20000
//! ```
//!
//! `--json` prints one JSON object per line; the last one (`"event":"final"`)
//! is the summary. Exits non-zero if any frame was torn.

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
    Ok(())
}
