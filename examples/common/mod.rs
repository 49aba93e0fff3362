//! What the `producer`, `consumer` and `demo` examples share: the producer
//! loop (`producer.rs`) and the consumer loop (`consumer.rs`) with their
//! command-line arguments and one-line JSON reports, which the demo and the
//! tests read; a stop flag set by SIGINT/SIGTERM (`stop.rs`); how `auto`
//! picks a backend.
//!
//! Included by each example with `#[path = "common/mod.rs"] mod common;`.

use std::error::Error;

use vramring::BackendChoice;
// The examples' reports are the test kit's JSON lines: the demo and the
// tests read them back.
#[allow(unused_imports)]
pub use vramring_testkit::json::{emit, Json, JsonLine};

/// What every example's `main` returns.
pub type AnyResult<T> = Result<T, Box<dyn Error>>;

/// Ends an example: prints an error as the sentence its `Display` gives
/// (not `Debug`) on stderr and exits 1; 0 on success.
pub fn exit_with(result: AnyResult<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

mod stop;
// Not every program that includes this module calls both.
#[allow(unused_imports)]
pub use stop::{install_stop_handler, stop_requested};

/// `auto` resolved the way the examples report it: CUDA device 0 when a
/// usable GPU is present, host memory otherwise.
pub fn resolve_backend(choice: BackendChoice) -> BackendChoice {
    match choice {
        BackendChoice::Auto if vramring::cuda::cuda_usable() => BackendChoice::Cuda(0),
        BackendChoice::Auto => BackendChoice::Host,
        other => other,
    }
}

mod consumer;
mod producer;
// Not every program that includes this module uses both.
#[allow(unused_imports)]
pub use consumer::{run_consumer, ConsumerArgs};
#[allow(unused_imports)]
pub use producer::{run_producer, ProducerArgs};
