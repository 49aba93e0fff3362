//! The multi-camera decoder's parts that need no GPU: the config file, the
//! camera supervisor and the inputs. `nvr_decoder.rs` adds the NVDEC step
//! (`nvdec_stage.rs`); `tests/nvr.rs` includes this module by path and
//! drives the supervisor with fakes.

pub mod config;
pub mod sources;
pub mod supervisor;
