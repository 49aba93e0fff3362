//! The frame ring: fixed-size slots of decoded video in one pool (a CUDA
//! VMM allocation or a host memfd), the kind-specific layer over
//! [`crate::ring`].
//!
//! * [`publisher`]: [`Publisher`] creates the ring, loans a slot, commits it
//!   (and copies it into push subscribers' own buffers).
//! * [`subscriber`]: [`Subscriber`] imports the pool once (pull delivery) or
//!   receives frames in its own buffers (push delivery), and proves each
//!   copy was not torn.
//! * [`protocol`]: the lock-free slot protocol over the shared layout
//!   (publish, consume, push, wait), backend-agnostic and model-checked.

pub mod protocol;
pub mod publisher;
pub mod subscriber;

pub use publisher::{BackendChoice, CommitMode, FrameMeta, Policy, Publisher, PullAccess, RingConfig, SlotMut};
pub use subscriber::{Borrow, Frame, Mode, PullStart, Subscriber, SubscriberOptions, SubscriberStats};
