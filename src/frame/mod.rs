//! The frame ring: fixed-size slots of decoded video in one pool (a CUDA
//! VMM allocation or a host memfd).
//!
//! * [`Publisher`] creates the ring, loans a slot ([`SlotMut`]), commits it
//!   (and copies it into push subscribers' own buffers).
//! * [`Subscriber`] imports the pool once (pull delivery) or receives frames
//!   in its own buffers (push delivery), and proves each copy was not torn.
//! * [`RingInfo`]: what a ring is, as both sides read it from its header.

pub(crate) mod layout;
pub(crate) mod protocol;
mod publisher;
mod subscriber;

pub use crate::layout::{RingInfo, FRAME_DISCONTINUITY, FRAME_KEY};
pub use publisher::{BackendChoice, CommitMode, FrameMeta, Policy, Publisher, PullAccess, RingConfig, SlotMut};
pub use subscriber::{
    Borrow, Delivery, Frame, FrameHold, Mode, PullStart, Subscriber, SubscriberOptions, SubscriberStats,
};
