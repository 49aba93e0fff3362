//! Publishes a moving, self-checking test pattern: every frame carries its
//! seq and a checksum in its pixels (`vramring_testkit::pattern`), so any
//! consumer can prove each frame it gets is whole and is the frame it was
//! told it is.
//!
//! ```text
//! cargo run --release --example producer -- --socket /tmp/cam1.sock --backend host --fps 30
//! cargo run --release --example consumer -- --socket /tmp/cam1.sock --mode sequential
//! ```
//!
//! Prints the published frame rate every second and a summary at the end
//! (`--frames N`, or Ctrl-C), with how many push subscribers' buffers it
//! took and how many Attaches waited for its attach rate
//! (`--attach-rate 8 --attach-burst 16` by default; `--attach-rate 0`
//! takes every one at once, for trusted subscribers only; ADR 0020):
//!
//! ```text
//! cargo run --release --example producer -- --socket /tmp/cam1.sock --backend host --attach-rate 2 --attach-burst 1
//! for i in 1 2 3; do cargo run --release --example consumer -- --socket /tmp/cam1.sock --push --frames 50 & done
//! ```
//!
//! The three push consumers start about half a second apart.
//!
//! Lossless delivery can be kept to named uids (`--lossless-access
//! anyone|nobody|uids=UID[,UID...]`); a uid whose lossless reader is
//! evicted for the lease is refused lossless for `--lossless-backoff-ms`
//! (10 s by default, doubled per repeat; 0: never):
//!
//! ```text
//! cargo run --release --example producer -- --socket /tmp/cam1.sock --backend host --policy lossless --lossless-access nobody
//! cargo run --release --example consumer -- --socket /tmp/cam1.sock --mode sequential --lossless   # refused (REJECT_POLICY)
//! ```

use clap::Parser;

#[path = "common/mod.rs"]
#[allow(dead_code)]
mod common;

/// Publish a self-checking test pattern on a vramring socket.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    #[command(flatten)]
    args: common::ProducerArgs,
}

fn main() -> std::process::ExitCode {
    common::exit_with(run())
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    common::install_stop_handler();
    common::run_producer(&cli.args)?;
    Ok(())
}
