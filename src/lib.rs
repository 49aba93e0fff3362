//! # vramring
//!
//! Pass video frames that live in GPU memory from one producer process to
//! many subscriber processes with no trip through the CPU, across containers
//! that share no PID namespace and no IPC namespace: only a directory holding
//! a Unix socket.
//!
//! * A [`Publisher`] creates a ring of slots (one CUDA VMM allocation, or a
//!   host memfd) and listens on a `SOCK_SEQPACKET` socket. It loans a slot,
//!   the caller writes a frame into it, and [`SlotMut::publish`] commits it.
//! * A [`Subscriber`] connects, receives the ring's file descriptors by
//!   `SCM_RIGHTS`, imports the pool once, and [`Subscriber::next`] copies each
//!   frame into its own buffer and proves the copy was not torn.
//! * [`inspect`]: read-only snapshots of a live ring (producer state,
//!   slots, the subscriber table) for tools such as the `vramring` command.
//! * [`packet`]: the encoded side of a camera (H.264/H.265 access units) in
//!   a CPU shared-memory packet ring, served over the same handshake:
//!   keyframe join, overrun resync, codec parameters, lossless recorders.
//! * [`cuda`]: which GPUs can hold a ring, how a CUDA ring commits, and
//!   typed device memory ([`cuda::DeviceView`]) and streams
//!   ([`cuda::Stream`]) for writing and reading frames on the GPU.
//!
//! How the crate is built (its layers, a frame's path through them, the
//! workspace around it) is in `ARCHITECTURE.md`. The shared layout is in
//! `src/layout.rs` and, for other languages, in `proto/vramring.h` and
//! `proto/PROTOCOL.md`. Who may write what, and what
//! a hostile subscriber can and cannot do, is in `docs/SECURITY.md`.
//!
//! Test scaffolding (the fake CUDA driver, the CPU and GPU test patterns, the
//! multi-process harness) is the `vramring-testkit` crate, a dev-dependency.
//!
//! # Examples
//! ```no_run
//! use std::time::Duration;
//! use vramring::{Format, Publisher, RingConfig, Subscriber, SubscriberOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = RingConfig::new(Format::Nv12, 1920, 1080).slots(8);
//! let mut publisher = Publisher::create("/tmp/cam1.sock", cfg)?;
//! let mut sub = Subscriber::connect("/tmp/cam1.sock", SubscriberOptions::default())?;
//! let mut slot = publisher.loan(Duration::from_millis(100))?;
//! slot.plane_mut(0)?.fill(128);
//! slot.publish(Default::default())?;
//! let frame = sub.next(Duration::from_secs(1))?;
//! assert_eq!(frame.seq(), 1);
//! # Ok(()) }
//! ```
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod error;
mod format;
pub mod frame;
pub mod inspect;
pub(crate) mod layout;
pub(crate) mod lifecycle;
pub(crate) mod memory;
#[cfg(feature = "nvdec")]
pub mod nvdec;
pub mod packet;
pub(crate) mod ring;
#[doc(hidden)]
pub mod seam;
pub(crate) mod shm;
pub(crate) mod socket;
pub(crate) mod sync;
pub(crate) mod time;

/// The CUDA backend as a user sees it: which GPUs can hold a ring, and how
/// a CUDA ring commits frames.
pub mod cuda {
    pub use crate::memory::cuda::{
        cuda_usable, format_uuid, probe, CommitGraph, DeviceInfo, DeviceSelector, COMMIT_GRAPH_WITHIN,
    };
    pub use crate::memory::view::{DeviceView, DeviceViewMut, Stream};
}

pub use error::{Error, Refusal, Result};
pub use format::{Format, Geometry, Plane};
pub use frame::{
    BackendChoice, Borrow, CommitMode, Delivery, Frame, FrameHold, FrameMeta, Mode, Policy, Publisher, PullAccess,
    PullStart, RingConfig, RingInfo, SlotMut, Subscriber, SubscriberOptions, SubscriberStats,
};
pub use memory::{BackendKind, WriteCompletion};
pub use ring::{
    AttachRate, ClientConfig, ClientOptions, LosslessBackoff, PublisherStats, ServeConfig, ServeOptions, UidAccess,
    WaitStrategy,
};
pub use socket::AccessPolicy;
pub use time::monotonic_ns;

/// The README's code blocks, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
