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
//! * [`packet`]: the encoded side of a camera (H.264/H.265 access units) in
//!   a CPU shared-memory packet ring, served over the same handshake:
//!   keyframe join, overrun resync, codec parameters, lossless recorders.
//!
//! The protocol is in [`protocol`]; the shared layout in [`layout`] and, for
//! other languages, in `proto/vramring.h` and `proto/PROTOCOL.md`.
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

pub mod error;
pub mod format;
pub mod layout;
pub mod lifecycle;
pub mod memory;
#[cfg(feature = "nvdec")]
pub mod nvdec;
pub mod packet;
pub mod protocol;
pub mod publisher;
pub(crate) mod shm;
pub mod socket;
mod subscriber;
pub(crate) mod sync;
pub mod testpattern;
pub mod time;

pub use error::{Error, Result};
pub use format::{Format, Geometry, Plane};
pub use memory::{BackendKind, WriteCompletion};
pub use publisher::{BackendChoice, FrameMeta, Policy, Publisher, PublisherStats, RingConfig, SlotMut};
pub use subscriber::{Borrow, Frame, Mode, Subscriber, SubscriberOptions, SubscriberStats};

/// The README's code blocks, compiled as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
