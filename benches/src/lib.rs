//! What the benches share, one copy of each, so that each bench file is a
//! scenario:
//! * [`clock`]: monotonic time, thread and process CPU time, waiting until
//!   a time asleep or spinning (pacing);
//! * [`stats`]: percentiles over samples, one definition (nearest rank on
//!   the (n − 1) scale);
//! * [`gpu`]: the GPU floor: checked driver calls, device 0's primary
//!   context, a [`Gpu`] (stream, allocations, copies), PTX modules and
//!   launches, the empty kernel under a stream-order publish;
//! * [`shm`]: a block of memory the processes of a measurement share, and
//!   samples passed between them through files;
//! * [`procs`]: child processes in named roles (this executable started
//!   again), dying with their parent, waited for within bounds; MPS passes
//!   under a daemon of the bench's own;
//! * [`output`]: the command line, the report, its tables and JSON lines;
//! * [`host`]: what the whole machine did while a bench measured.

pub mod clock;
pub mod gpu;
pub mod host;
pub mod output;
pub mod procs;
pub mod shm;
pub mod stats;

pub use clock::{now_ns, process_cpu_ns, sleep_until_ns, spin_until_ns, thread_cpu_ns, wait_until_ns};
pub use gpu::{ck, make_primary_current, Gpu, FLOOR_PTX};
pub use shm::{read_samples, write_samples, SharedMap};
pub use stats::{median, pct, pct_us};

/// The commit graph mode `VRAMRING_COMMIT_GRAPH` asks for (`always`/`1`,
/// `never`/`0`, `auto`/unset), for the benches' rings; a value that is
/// none of these stops the bench with a sentence.
pub fn commit_graph_from_env() -> vramring::cuda::CommitGraph {
    match std::env::var("VRAMRING_COMMIT_GRAPH") {
        Err(_) => vramring::cuda::CommitGraph::AUTO,
        Ok(v) => v.parse().unwrap_or_else(|e| {
            eprintln!("VRAMRING_COMMIT_GRAPH: {e}");
            std::process::exit(2)
        }),
    }
}

/// A benchmark's result type (its errors may cross threads).
pub type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;
