//! The subscriber table (publisher-written, sealed, shared by every
//! subscriber) and each subscriber's client region: the layout both ring
//! kinds share, mirrored by `proto/vramring.h`.

use crate::error::{Error, Result};
use crate::layout::LAYOUT_VERSION;
use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Magic of the subscriber table: the bytes `VRSUBTAB`.
pub const SUBS_MAGIC: u64 = u64::from_le_bytes(*b"VRSUBTAB");

/// Default size of the subscriber table.
pub const DEFAULT_MAX_SUBSCRIBERS: u32 = 64;

/// Largest subscriber table accepted.
pub const MAX_SUBSCRIBERS_LIMIT: u32 = 1024;

/// Bytes of a subscriber's name in its table entry.
pub const NAME_BYTES: usize = 32;

/// Buffers of a latest push subscriber (triple buffering: one held by the
/// reader, one newest, one being written).
pub const PUSH_BUFFERS: usize = 3;

/// Fewest buffers of a queued push subscriber (sequential or lossless):
/// one it holds, one the publisher fills.
pub const PUSH_QUEUE_MIN: usize = 2;

/// Most push buffers of one subscriber, and the `push_seq` words of its
/// entry.
pub const PUSH_MAX_BUFFERS: usize = 16;

/// `SubEntry.state`: free.
pub const SUB_FREE: u32 = 0;

/// `SubEntry.state`: assigned to a connected subscriber.
pub const SUB_ACTIVE: u32 = 1;

/// `SubEntry.state`: evicted; the publisher no longer waits for it.
pub const SUB_EVICTED: u32 = 2;

/// `SubEntry.evict_code` (and the Evicted notice's code): held a frame or packet past the lossless lease.
pub const EVICT_LEASE: u32 = 16;

/// `SubEntry.evict_code`: broke the protocol (an unexpected message, a
/// second Attach, buffers that do not fit the ring).
pub const EVICT_PROTOCOL: u32 = 18;

/// `SubEntry.evict_code`: its push buffers could not be mapped.
pub const EVICT_PUSH: u32 = 17;

/// `SubEntry.flags`: lossless (the producer waits for its cursor).
pub const SUBF_LOSSLESS: u32 = 1;

/// `SubEntry.flags`: reads every frame in order.
pub const SUBF_SEQUENTIAL: u32 = 2;

/// `SubEntry.flags`: granted write access to the pool.
pub const SUBF_WRITE: u32 = 4;

/// `SubEntry.flags`: push delivery (the publisher copies each frame into
/// the subscriber's own buffers).
pub const SUBF_PUSH: u32 = 8;

/// The head of the subscriber table.
#[repr(C, align(128))]
#[cfg_attr(loom, derive(Default))]
pub struct SubsHeader {
    /// [`SUBS_MAGIC`].
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`]; 0 until ready. SYNC: subs-ready.
    pub layout_version: AtomicU32,
    /// Entries in the table.
    pub max_subscribers: AtomicU32,
    /// Same as the ring's epoch.
    pub epoch: AtomicU64,
    /// `size_of::<SubEntry>()`.
    pub entry_bytes: AtomicU32,
    /// `size_of::<SubsHeader>()`: byte offset of entry 0.
    pub entries_offset: AtomicU32,
    /// Reserved, zero.
    pub reserved: [AtomicU64; 28],
}

/// One subscriber's entry in the subscriber table. Written by the
/// publisher alone (`ring::table` is its one writer); subscribers
/// map the table read-only and read their own entry to learn whether their
/// lease still holds.
#[repr(C, align(128))]
#[cfg_attr(loom, derive(Default))]
pub struct SubEntry {
    /// `SUB_*`.
    /// SYNC: sub-state (Release by the publisher's table, Acquire by the
    /// publisher's producer path and by the subscriber).
    pub state: AtomicU32,
    /// `SUBF_*`.
    pub flags: AtomicU32,
    /// Incremented at each assignment of this entry.
    pub generation: AtomicU32,
    /// Push delivery: buffers attached (0: none yet; [`PUSH_BUFFERS`] for a
    /// latest reader, [`PUSH_QUEUE_MIN`]..=[`PUSH_MAX_BUFFERS`] for a queued
    /// one), once the publisher has mapped them.
    /// SYNC: push-seq (Release by publisher, Acquire by the subscriber).
    pub push_count: AtomicU32,
    /// `EVICT_*` reason of the last eviction, stored before the state
    /// becomes `SUB_EVICTED` and kept when the entry is freed; 0 again at
    /// the next assignment.
    pub evict_code: AtomicU32,
    /// Reserved, zero.
    pub reserved0: AtomicU32,
    /// The publisher's view of this subscriber's lossless cursor: the
    /// subscriber's `released_seq`, clamped to what was published and never
    /// moving back.
    pub released_seq: AtomicU64,
    /// Frames handed to the user, as last reported (informational, copied
    /// from the client region by the publisher).
    pub delivered: AtomicU64,
    /// Frames skipped, as last reported (informational).
    pub dropped: AtomicU64,
    /// Torn reads discarded, as last reported (informational).
    pub overruns: AtomicU64,
    /// `CLOCK_MONOTONIC` ns of the subscriber's last reported read.
    pub heartbeat_ns: AtomicU64,
    /// Name from the subscriber's Hello, NUL-padded UTF-8.
    pub name: [AtomicU64; NAME_BYTES / 8],
    /// Push delivery: seq of the frame in each of the subscriber's own
    /// buffers (`seq | SEQ_WRITING` while the publisher copies into it, 0
    /// empty); the first `push_count` are used.
    /// SYNC: push-seq (Release by publisher after the copy completed, Acquire
    /// by the subscriber).
    pub push_seq: [AtomicU64; PUSH_MAX_BUFFERS],
    /// Reserved, zero.
    pub reserved1: [AtomicU64; 4],
}

/// Bytes of a client region: one [`ClientLine`].
pub const CLIENT_BYTES: u64 = std::mem::size_of::<ClientLine>() as u64;

/// A subscriber's own region: a memfd made for one connection, mapped
/// read-write by that subscriber and by the publisher, and by nobody else.
/// The subscriber writes every field but `doorbell`; the publisher treats
/// each value it reads here as hostile (clamped, range-checked, never an
/// index or a size).
#[repr(C, align(128))]
#[cfg_attr(loom, derive(Default))]
pub struct ClientLine {
    /// The futex word this subscriber parks on; incremented by the
    /// publisher after a publish while `parked` is set.
    /// SYNC: doorbell (Release increment by publisher, Acquire load by waiter).
    pub doorbell: AtomicU32,
    /// Non-zero while the subscriber is parked (or about to park).
    /// SYNC: park (SeqCst fence on both sides, see `ring::wait`).
    pub parked: AtomicU32,
    /// Push delivery: `k + 1` while the subscriber reads its buffer `k`, 0
    /// when it holds none.
    /// SYNC: push-hold (SeqCst fences on both sides, see `frame::protocol::push`).
    pub push_held: AtomicU32,
    /// Reserved, zero.
    pub reserved0: AtomicU32,
    /// Lossless cursor: the newest seq this subscriber is done with.
    /// SYNC: release-cursor (Release by subscriber after its copy completes,
    /// Acquire by producer before reusing the slot).
    pub released_seq: AtomicU64,
    /// Seq being copied or borrowed now, 0 when none (informational).
    pub reading_seq: AtomicU64,
    /// Frames handed to the user.
    pub delivered: AtomicU64,
    /// Frames skipped (gaps).
    pub dropped: AtomicU64,
    /// Reads discarded because the producer overwrote the slot mid-read.
    pub overruns: AtomicU64,
    /// `CLOCK_MONOTONIC` ns of the subscriber's last read.
    pub heartbeat_ns: AtomicU64,
    /// Reserved, zero.
    pub reserved1: [AtomicU64; 8],
}

/// Bytes of a subscriber table with `max_subscribers` entries.
pub const fn subs_bytes(max_subscribers: u32) -> u64 {
    std::mem::size_of::<SubsHeader>() as u64 + max_subscribers as u64 * std::mem::size_of::<SubEntry>() as u64
}

impl SubsHeader {
    /// Writes the table head, then its ready word (Release).
    pub(crate) fn init(&self, max_subscribers: u32, epoch: u64) {
        // Relaxed: not shared yet; published by the Release below.
        self.magic.store(SUBS_MAGIC, Ordering::Relaxed);
        self.max_subscribers.store(max_subscribers, Ordering::Relaxed);
        self.epoch.store(epoch, Ordering::Relaxed);
        self.entry_bytes
            .store(std::mem::size_of::<SubEntry>() as u32, Ordering::Relaxed);
        self.entries_offset
            .store(std::mem::size_of::<SubsHeader>() as u32, Ordering::Relaxed);
        // SYNC: subs-ready — Release, paired with the Acquire in `validate`.
        self.layout_version.store(LAYOUT_VERSION, Ordering::Release);
    }

    /// Checks a subscriber table mapped from a peer against the ring it
    /// belongs to (its entry count and publisher instance).
    ///
    /// # Errors
    /// [`Error::LayoutMismatch`] naming the wrong field.
    pub fn validate(&self, max_subscribers: u32, ring_epoch: u64, region_bytes: u64) -> Result<()> {
        let (n, epoch) = self.validate_shape(region_bytes)?;
        if n != max_subscribers {
            return Err(Error::LayoutMismatch(format!(
                "subscriber table of {n} entries, the ring says {max_subscribers}"
            )));
        }
        if epoch != ring_epoch {
            return Err(Error::LayoutMismatch(
                "subscriber table belongs to another publisher instance".into(),
            ));
        }
        Ok(())
    }

    /// Checks a subscriber table's own fields for a mapping of
    /// `region_bytes`; returns its entry count and epoch.
    ///
    /// # Errors
    /// [`Error::LayoutMismatch`] naming the wrong field.
    pub fn validate_shape(&self, region_bytes: u64) -> Result<(u32, u64)> {
        // SYNC: subs-ready — Acquire.
        let version = self.layout_version.load(Ordering::Acquire);
        let bad = |what: String| Err(Error::LayoutMismatch(what));
        if self.magic.load(Ordering::Relaxed) != SUBS_MAGIC || version != LAYOUT_VERSION {
            return bad("subscriber table magic or version".into());
        }
        let n = self.max_subscribers.load(Ordering::Relaxed);
        if n == 0 || n > MAX_SUBSCRIBERS_LIMIT || subs_bytes(n) > region_bytes {
            return bad(format!("subscriber table of {n} entries in {region_bytes} bytes"));
        }
        if self.entry_bytes.load(Ordering::Relaxed) as usize != std::mem::size_of::<SubEntry>()
            || self.entries_offset.load(Ordering::Relaxed) as usize != std::mem::size_of::<SubsHeader>()
        {
            return bad("subscriber entry size or offset".into());
        }
        Ok((n, self.epoch.load(Ordering::Relaxed)))
    }
}

impl SubEntry {
    /// Stores `name` (truncated to [`NAME_BYTES`] at a char boundary).
    pub(crate) fn set_name(&self, name: &str) {
        let mut buf = [0u8; NAME_BYTES];
        let mut n = name.len().min(NAME_BYTES);
        while !name.is_char_boundary(n) {
            n -= 1;
        }
        buf[..n].copy_from_slice(&name.as_bytes()[..n]);
        for (w, chunk) in self.name.iter().zip(buf.chunks_exact(8)) {
            // Relaxed: informational; written before the entry's state is
            // stored with Release.
            w.store(
                u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8])),
                Ordering::Relaxed,
            );
        }
    }

    /// The stored name, lossily decoded.
    pub fn name(&self) -> String {
        let mut buf = [0u8; NAME_BYTES];
        for (w, chunk) in self.name.iter().zip(buf.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(NAME_BYTES);
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }
}

#[cfg(not(loom))]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<SubsHeader>() == 256);
    assert!(size_of::<SubEntry>() == 256);
    assert!(offset_of!(SubEntry, push_count) == 12);
    assert!(offset_of!(SubEntry, evict_code) == 16);
    assert!(offset_of!(SubEntry, released_seq) == 24);
    assert!(offset_of!(SubEntry, heartbeat_ns) == 56);
    assert!(offset_of!(SubEntry, name) == 64);
    assert!(offset_of!(SubEntry, push_seq) == 96);
    assert!(offset_of!(SubEntry, reserved1) == 224);
    assert!(size_of::<ClientLine>() == 128);
    assert!(offset_of!(ClientLine, parked) == 4);
    assert!(offset_of!(ClientLine, push_held) == 8);
    assert!(offset_of!(ClientLine, released_seq) == 16);
    assert!(offset_of!(ClientLine, heartbeat_ns) == 56);
};
