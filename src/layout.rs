//! The shared-memory layout: `#[repr(C)]` structs of fixed-width atomics,
//! pinned by compile-time asserts and mirrored by `proto/vramring.h`.
//!
//! Two memfds shared by every subscriber carry the layout:
//!
//! * the **control region**: [`RingHeader`] followed by `slot_count`
//!   [`SlotDesc`]s. Only the publisher writes it; it is sealed with
//!   `F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW` before it is sent,
//!   so subscribers can map it read-only only and a publisher cannot shrink
//!   it under them (no `SIGBUS`).
//! * the **subscriber table**: [`SubsHeader`] followed by `max_subscribers`
//!   [`SubEntry`]s. Only the publisher writes it; it is sealed like the
//!   control region and sent read-only.
//!
//! A third memfd is made for each connection: the subscriber's **client
//! region**, one [`ClientLine`] (its cursor, counters, `parked` flag, push
//! hold and its own doorbell), mapped by that subscriber and the publisher
//! only.
//!
//! Everything is little-endian, fixed-width, and reached through `&Atomic*`
//! only. Nothing read from a peer is trusted: [`RingInfo::validate`] checks
//! every immutable field once, copies it out, and the rest of the crate uses
//! the copy; every slot index is masked with `slot_count - 1`.

//!
//! The frame ring's control region is in `frame/layout.rs`; the subscriber
//! table and client regions, which both ring kinds share, in
//! `ring/layout.rs`. This module names both, as `proto/vramring.h` does.

pub use crate::frame::layout::*;
pub use crate::ring::layout::*;

/// Version of this shared layout. Any change to a struct below bumps it.
pub const LAYOUT_VERSION: u32 = 5;
