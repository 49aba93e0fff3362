//! Every protocol-version-specific fact the hostile suite relies on, in one
//! place, so that a new protocol version only needs this file adapted:
//! byte offsets inside the shared regions, which Hello flags ask for what,
//! how the attacker finds its own writable words, and how a descriptor from
//! a Welcome is recognised (by its content, not by its index).
//!
//! Protocol v2: a pull Welcome carries four descriptors (control region,
//! subscriber table, the subscriber's own client region, pool), a push
//! Welcome three (no pool). The table is publisher-written and sealed
//! read-only; what a subscriber writes (cursor, `parked`, `push_held`, its
//! doorbell) is in its own client region. Under v1 the table held those
//! words and every subscriber mapped it writable, which is what the attacks
//! below still try.

#![allow(dead_code)]

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::map::Map;

/// Bytes at offset 0 of the control region.
pub const CONTROL_MAGIC: &[u8; 8] = b"VRAMRING";
/// Bytes at offset 0 of the subscriber table.
pub const TABLE_MAGIC: &[u8; 8] = b"VRSUBTAB";

/// `Hello.backends` bit of the host backend (`1 << BACKEND_HOST`).
pub const BACKENDS_HOST: u32 = 1 << 1;

// --- control region (`RingHeader`) ---------------------------------------
/// `info.slot_count()` (u32).
pub const CTRL_SLOT_COUNT: usize = 32;
/// `info.slots_offset` (u64): where `SlotDesc` 0 starts.
pub const CTRL_SLOTS_OFFSET: usize = 40;
/// `info.frame_bytes` (u64).
pub const CTRL_FRAME_BYTES: usize = 200;
/// `info.slot_stride` (u64).
pub const CTRL_SLOT_STRIDE: usize = 208;
/// Bytes of a `SlotDesc`; its `seq` (u64) is at offset 0.
pub const SLOT_DESC_BYTES: usize = 128;
/// Slot seq bit: being written.
pub const SEQ_WRITING: u64 = 1 << 63;
/// `producer.state` (u32).
pub const CTRL_PRODUCER_STATE: usize = 256;
/// `seq.global_seq` (u64).
pub const CTRL_GLOBAL_SEQ: usize = 384;
/// The v1 doorbell (u32), reserved and zero in v2.
pub const CTRL_DOORBELL: usize = 512;
/// `producer.state` value: closed in order.
pub const PRODUCER_CLOSED: u32 = 2;

// --- subscriber table (`SubsHeader`, then `SubEntry`s) ---------------------
/// `max_subscribers` (u32).
pub const TAB_MAX_SUBSCRIBERS: usize = 12;
/// `entry_bytes` (u32).
pub const TAB_ENTRY_BYTES: usize = 24;
/// `entries_offset` (u32).
pub const TAB_ENTRIES_OFFSET: usize = 28;

/// `SubEntry.state` (u32).
pub const ENTRY_STATE: usize = 0;
/// `SubEntry.flags` (u32).
pub const ENTRY_FLAGS: usize = 4;
/// `SubEntry.generation` (u32).
pub const ENTRY_GENERATION: usize = 8;
/// `SubEntry.push_count` (u32).
pub const ENTRY_PUSH_COUNT: usize = 12;
/// `SubEntry.released_seq` (u64): the publisher's clamped view.
pub const ENTRY_RELEASED_SEQ: usize = 24;
/// `SubEntry.push_seq[3]` (u64 each).
pub const ENTRY_PUSH_SEQ: usize = 96;

// --- client region (`ClientLine`), the subscriber's own ---------------------
/// Bytes of a client region.
pub const CLIENT_BYTES: u64 = 128;
/// `ClientLine.doorbell` (u32): the futex word this subscriber parks on.
pub const CLIENT_DOORBELL: usize = 0;
/// `ClientLine.parked` (u32).
pub const CLIENT_PARKED: usize = 4;
/// `ClientLine.push_held` (u32).
pub const CLIENT_PUSH_HELD: usize = 8;
/// `ClientLine.released_seq` (u64).
pub const CLIENT_RELEASED_SEQ: usize = 16;

/// `SubEntry.state` values.
pub const STATE_FREE: u32 = 0;
/// Assigned to a connected subscriber.
pub const STATE_ACTIVE: u32 = 1;
/// `SubEntry.flags`: lossless.
pub const FLAG_LOSSLESS: u32 = 1;
/// Push buffers per subscriber.
pub const PUSH_BUFFERS: u32 = 3;
/// Most push buffers of a queued (sequential or lossless) reader, v4.
pub const PUSH_MAX_BUFFERS: u32 = 16;
/// Fewest push buffers of a queued reader, v4.
pub const PUSH_QUEUE_MIN: u32 = 2;
/// Alignment of a push-buffer stride: `stride = round_up(frame_bytes,
/// VR_SLOT_ALIGN)` (PROTOCOL.md §16.2). It was 256 here until 2026-12-03,
/// which made every Attach of these attacks fail the publisher's checks.
pub const PUSH_STRIDE_ALIGN: u64 = 64 * 1024;

/// What a received descriptor is, told by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The control region (`VRAMRING`).
    Control,
    /// The subscriber table (`VRSUBTAB`).
    Table,
    /// The frame pool (the Welcome's `pool_bytes` long, no magic).
    Pool,
    /// The subscriber's own client region ([`CLIENT_BYTES`] long).
    Client,
    /// Anything else.
    Other,
}

impl Role {
    /// A short name for result files.
    pub fn name(self) -> &'static str {
        match self {
            Role::Control => "control",
            Role::Table => "table",
            Role::Pool => "pool",
            Role::Client => "client",
            Role::Other => "other",
        }
    }
}

/// Bytes of the file behind `fd`.
pub fn size_of_fd(fd: BorrowedFd<'_>) -> u64 {
    rustix::fs::fstat(fd).map_or(0, |st| st.st_size as u64)
}

/// Classifies a descriptor by its magic (read with `pread`, which works on
/// read-only descriptors too) and, for the pool, by its size.
pub fn classify(fd: BorrowedFd<'_>, pool_bytes: u64) -> Role {
    let mut head = [0u8; 8];
    let n = rustix::io::pread(fd, &mut head, 0).unwrap_or(0);
    if n == 8 && &head == CONTROL_MAGIC {
        Role::Control
    } else if n == 8 && &head == TABLE_MAGIC {
        Role::Table
    } else if size_of_fd(fd) == pool_bytes {
        Role::Pool
    } else if size_of_fd(fd) == CLIENT_BYTES {
        Role::Client
    } else {
        Role::Other
    }
}

/// The descriptors of a Welcome, sorted by role.
#[derive(Debug, Default)]
pub struct Fds {
    /// `(role, fd)` in the order received.
    pub all: Vec<(Role, OwnedFd)>,
}

impl Fds {
    /// Sorts `fds` by content.
    pub fn new(fds: Vec<OwnedFd>, pool_bytes: u64) -> Fds {
        Fds {
            all: fds
                .into_iter()
                .map(|fd| (classify(fd.as_fd(), pool_bytes), fd))
                .collect(),
        }
    }
    /// The first descriptor of `role`.
    pub fn get(&self, role: Role) -> Option<BorrowedFd<'_>> {
        self.all.iter().find(|(r, _)| *r == role).map(|(_, f)| f.as_fd())
    }
}

/// Where entry `index` starts in the table, read from the table's header.
pub fn entry_offset(table: &Map, index: u32) -> Option<usize> {
    let entry_bytes = u64::from(table.read32(TAB_ENTRY_BYTES)?);
    let entries_offset = u64::from(table.read32(TAB_ENTRIES_OFFSET)?);
    let off = entries_offset + u64::from(index) * entry_bytes;
    (entry_bytes >= 128 && off + entry_bytes <= table.len() as u64).then_some(off as usize)
}

/// Entries in the table.
pub fn entry_count(table: &Map) -> u32 {
    table.read32(TAB_MAX_SUBSCRIBERS).unwrap_or(0)
}

/// Where the attacker's lossless cursor lives: its own client region.
pub const OWN_RELEASED: (Role, usize) = (Role::Client, CLIENT_RELEASED_SEQ);
/// Where its push hold lives.
pub const OWN_PUSH_HELD: (Role, usize) = (Role::Client, CLIENT_PUSH_HELD);

/// The table offset of the attacker's own entry's generation (v1 let it
/// write there; v2 maps the table read-only).
pub fn own_generation(table: &Map, index: u32) -> Option<usize> {
    Some(entry_offset(table, index)? + ENTRY_GENERATION)
}
