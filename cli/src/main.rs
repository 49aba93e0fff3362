//! `vramring`: see, inspect and sample live rings without writing code.
//!
//! Every command attaches to a publisher the way an ordinary subscriber
//! does (named `vramring-cli` in its subscriber table), needs no more
//! rights than one, and never makes the publisher wait. See `docs/CLI.md`.

mod convert;
mod error;
mod ls;
mod play;
mod record;
mod render;
mod snapshot;
mod term;
mod top;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use error::{exit, CliError, CliResult};

/// The instant `d` from now, or about 136 years out where that does not fit.
pub fn after(d: std::time::Duration) -> std::time::Instant {
    let now = std::time::Instant::now();
    now.checked_add(d)
        .unwrap_or_else(|| now + std::time::Duration::from_secs(u64::from(u32::MAX)))
}

/// Wall-clock time in milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Name the CLI gives itself in publishers' subscriber tables (`ls`,
/// `inspect`, `top`; `snapshot` and `record` add `:snapshot`, `:record`).
pub const CLI_NAME: &str = "vramring-cli";

/// Environment variable naming the default run directory.
pub const DIR_ENV: &str = "VRAMRING_DIR";

/// Run directory used when neither an argument nor `VRAMRING_DIR` names one.
pub const DEFAULT_DIR: &str = "/run/vramring";

const EXIT_HELP: &str = "\
Exit status:
  0  success
  1  runtime failure (bad file, publisher refused for another reason, I/O error)
  2  usage error (bad arguments)
  3  not found or stale: no socket at the path, no publisher listening (a
     stale socket), or the publisher went away before the command was done
  4  permission denied: by the socket's file mode or the publisher's allow-list
  5  timeout: the publisher accepted but did not answer, or sent no frame in time
  6  incomplete: `record` lost packets to overruns (the file skips to a keyframe)

Environment:
  VRAMRING_DIR  default run directory for `ls` and `top` (else /run/vramring)
  RUST_LOG      tracing filter for diagnostics on stderr (e.g. RUST_LOG=debug)

Documentation: docs/CLI.md";

/// See, inspect and sample live vramring rings.
///
/// Every command attaches as an ordinary subscriber (named "vramring-cli"):
/// it needs no more rights than a detector and never makes the publisher
/// wait.
#[derive(Debug, Parser)]
#[command(name = "vramring", version, after_help = EXIT_HELP)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// List the ring sockets in directories: kind, format, backend,
    /// publisher state, subscribers, rate; stale sockets marked.
    Ls(ls::LsArgs),
    /// Show everything a subscriber may read of one ring: layout, geometry,
    /// slots, policy, the subscriber table; codec and keyframe for packets.
    Inspect(ls::InspectArgs),
    /// A live view of every ring in a directory (rates, lag, drops per ring
    /// and per subscriber); q or Ctrl-C quits. Prints lines when not on a
    /// terminal.
    Top(top::TopArgs),
    /// Grab frames through the normal subscriber path and write them as
    /// PNG (YUV converted to RGB, see --matrix).
    Snapshot(snapshot::SnapshotArgs),
    /// Record a packet ring to a file (Annex-B for H.264/H.265), exactly as
    /// published, starting on a keyframe.
    Record(record::RecordArgs),
    /// Publish an H.264 Annex-B file as a packet ring, one access unit per
    /// packet (test a pipeline without a camera).
    Play(play::PlayArgs),
}

/// The run directory: `VRAMRING_DIR`, else [`DEFAULT_DIR`].
pub fn default_dir() -> PathBuf {
    std::env::var_os(DIR_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from)
}

/// Writes one line to stdout; `false` when stdout is gone (a closed pipe).
pub fn emit(line: &str) -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

fn main() -> ExitCode {
    // clap prints usage errors and exits with 2 (`exit::USAGE`); --help and
    // --version exit with 0.
    let cli = Cli::parse();
    init_tracing();
    let result = match cli.cmd {
        Cmd::Ls(a) => ls::run_ls(&a),
        Cmd::Inspect(a) => ls::run_inspect(&a),
        Cmd::Top(a) => top::run(&a),
        Cmd::Snapshot(a) => snapshot::run(&a),
        Cmd::Record(a) => record::run(&a),
        Cmd::Play(a) => play::run(&a),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("vramring: {e}");
            ExitCode::from(e.code)
        }
    }
}
