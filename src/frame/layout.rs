//! The frame ring's control region: its header (`RingHeader`: the
//! immutable `SharedRingInfo`, the producer line, the seqs, the doorbell),
//! its slot descriptors, and `RingInfo`, the validated copy of the header
//! the rest of the crate reads. Mirrored by `proto/vramring.h`.

use crate::error::{Error, Result};
use crate::format::{Format, Geometry, Plane, MAX_PLANES, PITCH_ALIGN, PLANE_ALIGN, SLOT_ALIGN};
use crate::layout::LAYOUT_VERSION;
use crate::ring::layout::MAX_SUBSCRIBERS_LIMIT;
use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Magic of the control region: the bytes `VRAMRING`.
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"VRAMRING");

/// Fewest slots a ring may have.
pub const MIN_SLOTS: u32 = 2;

/// Most slots a ring may have.
pub const MAX_SLOTS: u32 = 1024;

/// Words of user metadata per frame (64 bytes).
///
/// One word under `--cfg loom`: the words are stored and loaded exactly like
/// `pts`, and loom branches on every relaxed load, so eight of them would
/// multiply each model's executions by 2^7 and prove nothing more.
pub const USER_META_WORDS: usize = if cfg!(loom) { 1 } else { 8 };

/// Bytes of user metadata per frame.
pub const USER_META_BYTES: usize = USER_META_WORDS * 8;

/// Slot seq bit: the slot is being written for the seq in the low bits.
pub const SEQ_WRITING: u64 = 1 << 63;

/// `backend` code: host memfd pool.
pub const BACKEND_HOST: u32 = 1;

/// `backend` code: CUDA VMM pool exported as a POSIX file descriptor.
pub const BACKEND_CUDA: u32 = 2;

/// `policy` code: the producer never waits.
pub const POLICY_OVERWRITE: u32 = 0;

/// `policy` code: the producer waits for lossless subscribers.
pub const POLICY_LOSSLESS: u32 = 1;

/// `producer.state`: being created.
pub const PRODUCER_INIT: u32 = 0;

/// `producer.state`: publishing.
pub const PRODUCER_LIVE: u32 = 1;

/// `producer.state`: closed in order; no more frames will come.
pub const PRODUCER_CLOSED: u32 = 2;

/// `SharedRingInfo.ring_flags`: the pool ends with a gate line (CUDA): the
/// publisher stores every committed seq into the 64-bit word at pool offset
/// `slot_count * slot_stride`, in device memory, once the frame's bytes are
/// complete (the commit kernel: before its host stores of the seqs; a CPU
/// commit: after `global_seq`). A queued pull makes its stream wait on that
/// word instead of on `global_seq` in host memory, because the GPU sees a
/// store to device memory sooner than one it must poll across the bus
/// (ADR 0011).
pub const RING_GATE: u32 = 1;

/// Every `RING_*` flag this build knows.
pub const RING_FLAGS_KNOWN: u32 = RING_GATE;

/// Bytes of the gate line at the end of a pool that has one.
pub const GATE_BYTES: u64 = 64;

/// Pool offset of the gate line: right after the last slot.
pub const fn gate_line_offset(slot_count: u32, slot_stride: u64) -> u64 {
    slot_count as u64 * slot_stride
}

/// `SlotDesc.flags`: user flag, the frame is a keyframe / scene start.
pub const FRAME_KEY: u32 = 1;

/// `SlotDesc.flags`: user flag, a discontinuity precedes this frame.
pub const FRAME_DISCONTINUITY: u32 = 2;

/// Immutable description of the ring, written once by the publisher before
/// `layout_version` (the ready word) is stored with Release.
#[repr(C, align(128))]
#[cfg_attr(loom, derive(Default))]
pub struct SharedRingInfo {
    /// [`RING_MAGIC`].
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`]; 0 until the region is ready.
    /// SYNC: ring-ready (Release by creator, Acquire by opener).
    pub layout_version: AtomicU32,
    /// `size_of::<RingHeader>()`.
    pub header_bytes: AtomicU32,
    /// Bytes of the whole control region.
    pub control_bytes: AtomicU64,
    /// Random per publisher instance.
    pub epoch: AtomicU64,
    /// Slots in the ring, a power of two.
    pub slot_count: AtomicU32,
    /// `size_of::<SlotDesc>()`.
    pub slot_desc_bytes: AtomicU32,
    /// Byte offset of the first [`SlotDesc`] in the control region.
    pub slots_offset: AtomicU64,
    /// `BACKEND_*`.
    pub backend: AtomicU32,
    /// [`Format::code`].
    pub format: AtomicU32,
    /// Width in pixels.
    pub width: AtomicU32,
    /// Height in rows.
    pub height: AtomicU32,
    /// Planes in use.
    pub plane_count: AtomicU32,
    /// `POLICY_*`.
    pub policy: AtomicU32,
    /// Byte offset of each plane inside a slot.
    pub plane_offset: [AtomicU64; MAX_PLANES],
    /// Pitch of each plane.
    pub plane_pitch: [AtomicU64; MAX_PLANES],
    /// Rows of each plane.
    pub plane_rows: [AtomicU64; MAX_PLANES],
    /// Bytes of pixel data per row of each plane.
    pub plane_row_bytes: [AtomicU64; MAX_PLANES],
    /// Bytes from slot start to the end of the last plane.
    pub frame_bytes: AtomicU64,
    /// Bytes between slots in the pool.
    pub slot_stride: AtomicU64,
    /// Bytes of the pool allocation (what a subscriber maps).
    pub pool_bytes: AtomicU64,
    /// UUID of the GPU holding the pool (zero for the host backend).
    pub device_uuid: [AtomicU64; 2],
    /// Entries in the subscriber table.
    pub max_subscribers: AtomicU32,
    /// `RING_*` flags. Unknown bits make a reader refuse the ring.
    pub ring_flags: AtomicU32,
    /// `CLOCK_REALTIME` at creation, ns.
    pub created_realtime_ns: AtomicU64,
}

/// Producer state, on its own cache lines.
#[repr(C, align(128))]
#[cfg_attr(loom, derive(Default))]
pub struct ProducerLine {
    /// `PRODUCER_*`.
    /// SYNC: producer-state (Release by publisher on close, Acquire by readers).
    pub state: AtomicU32,
    /// Reserved, zero.
    pub reserved0: AtomicU32,
    /// `CLOCK_MONOTONIC` ns of the last service wakeup (at least once a
    /// second; informational).
    pub heartbeat_ns: AtomicU64,
    /// Frames published (equals `global_seq`; kept for inspection tools).
    pub published: AtomicU64,
    /// Lossless subscribers evicted so far.
    pub evictions: AtomicU64,
    /// Subscribers that connected so far.
    pub connects: AtomicU64,
    /// Subscribers whose connection closed so far.
    pub disconnects: AtomicU64,
}

/// The newest published sequence number, alone on its cache lines.
#[repr(C, align(128))]
#[cfg_attr(loom, derive(Default))]
pub struct SeqLine {
    /// Newest committed seq (0: none yet). On a CUDA ring with stream-order
    /// commits the GPU stores it, behind the frame's writes.
    /// SYNC: global-seq (Release by publisher after the slot seq, Acquire by subscribers).
    pub global_seq: AtomicU64,
    /// Newest seq whose commit the publisher has *enqueued* (stream-order
    /// commit) or made (CPU commit); `pending_seq > global_seq` means a
    /// commit is in flight on the GPU. A subscriber about to park that sees
    /// it in flight spins instead, because nobody rings when the commit
    /// lands: the publisher rings the subscribers it sees parked when it
    /// announces the commit (ADR 0017).
    /// SYNC: pending (publisher store + SeqCst fence, then `parked` loads;
    /// subscriber `parked` store + SeqCst fence, then this load).
    pub pending_seq: AtomicU64,
}

/// Reserved cache lines (zero). Subscribers park on the doorbell of their
/// own [`ClientLine`](crate::ring::layout::ClientLine), which no other subscriber can reach.
#[repr(C, align(128))]
#[cfg_attr(loom, derive(Default))]
pub struct DoorbellLine {
    /// Reserved, zero.
    pub reserved: AtomicU32,
}

/// The head of the control region.
#[repr(C, align(128))]
#[cfg_attr(loom, derive(Default))]
pub struct RingHeader {
    /// Immutable description.
    pub info: SharedRingInfo,
    /// Producer state.
    pub producer: ProducerLine,
    /// `global_seq`.
    pub seq: SeqLine,
    /// Reserved (zero).
    pub doorbell: DoorbellLine,
}

/// One slot's descriptor. Written only by the publisher, under the seqlock
/// rule in `frame/protocol/`.
#[repr(C, align(128))]
#[cfg_attr(loom, derive(Default))]
pub struct SlotDesc {
    /// Seq of the frame in the slot; `seq | SEQ_WRITING` while being written;
    /// 0 never written.
    /// SYNC: slot-seq (Release by publisher at commit, Acquire by reader before the copy).
    pub seq: AtomicU64,
    /// Presentation timestamp (i64 bits), user units.
    pub pts: AtomicU64,
    /// `CLOCK_MONOTONIC` ns when the frame was committed.
    pub commit_ns: AtomicU64,
    /// `FRAME_*` flags.
    pub flags: AtomicU32,
    /// Bytes of user metadata used (at most [`USER_META_BYTES`]).
    pub user_len: AtomicU32,
    /// Reserved, zero.
    pub reserved: [AtomicU64; 2],
    /// User metadata.
    pub user: [AtomicU64; USER_META_WORDS],
    /// Reserved, zero.
    pub reserved2: [AtomicU64; 2],
}

/// Bytes of a control region with `slot_count` slots.
pub const fn control_bytes(slot_count: u32) -> u64 {
    std::mem::size_of::<RingHeader>() as u64 + slot_count as u64 * std::mem::size_of::<SlotDesc>() as u64
}

/// The validated, immutable description of a ring, copied out of the control
/// region once. Nothing here is re-read from shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingInfo {
    /// The publisher instance.
    pub(crate) epoch: u64,
    /// Slots, a power of two in `MIN_SLOTS..=MAX_SLOTS`.
    pub(crate) slot_count: u32,
    /// `BACKEND_*`.
    pub(crate) backend: u32,
    /// `POLICY_*`.
    pub(crate) policy: u32,
    /// Format and plane layout.
    pub(crate) geometry: Geometry,
    /// Pool bytes to map.
    pub(crate) pool_bytes: u64,
    /// GPU UUID, zero for host.
    pub(crate) device_uuid: [u8; 16],
    /// Subscriber table entries.
    pub(crate) max_subscribers: u32,
    /// Bytes of the control region.
    pub(crate) control_bytes: u64,
    /// `RING_*` flags.
    pub(crate) flags: u32,
}

impl RingInfo {
    /// The publisher instance: a random number each `Publisher::create`
    /// draws, so that a subscriber can tell a restarted publisher apart.
    pub const fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Slots in the ring.
    pub const fn slot_count(&self) -> u32 {
        self.slot_count
    }

    /// Where the pool lives.
    pub fn backend(&self) -> crate::BackendKind {
        // Validated when the header was read: the code is a known one.
        crate::BackendKind::from_code(self.backend).unwrap_or(crate::BackendKind::Host)
    }

    /// Whether the publisher waits for lossless subscribers.
    pub fn policy(&self) -> crate::Policy {
        if self.policy == POLICY_LOSSLESS {
            crate::Policy::Lossless
        } else {
            crate::Policy::Overwrite
        }
    }

    /// The frames' format and plane layout.
    pub const fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Bytes of the slot pool.
    pub const fn pool_bytes(&self) -> u64 {
        self.pool_bytes
    }

    /// Bytes of the control region (the header and slot descriptors).
    pub const fn control_bytes(&self) -> u64 {
        self.control_bytes
    }

    /// UUID of the GPU that holds the pool; zero for a host ring.
    pub const fn device_uuid(&self) -> [u8; 16] {
        self.device_uuid
    }

    /// Entries of the subscriber table: the most subscribers at once.
    pub const fn max_subscribers(&self) -> u32 {
        self.max_subscribers
    }

    /// `slot_count - 1`, the mask for slot indices.
    pub const fn mask(&self) -> u64 {
        self.slot_count as u64 - 1
    }

    /// Pool offset of the gate word ([`RING_GATE`]), when the pool has one.
    pub const fn gate_offset(&self) -> Option<u64> {
        if self.flags & RING_GATE != 0 {
            Some(gate_line_offset(self.slot_count, self.geometry.slot_stride))
        } else {
            None
        }
    }

    /// Writes every immutable field into `h`, then the ready word (Release).
    pub(crate) fn write_to(&self, h: &RingHeader, created_realtime_ns: u64) {
        let i = &h.info;
        let g = &self.geometry;
        // Relaxed: the region is not shared yet; the Release store of
        // `layout_version` below publishes all of these.
        i.magic.store(RING_MAGIC, Ordering::Relaxed);
        i.header_bytes
            .store(std::mem::size_of::<RingHeader>() as u32, Ordering::Relaxed);
        i.control_bytes.store(self.control_bytes, Ordering::Relaxed);
        i.epoch.store(self.epoch, Ordering::Relaxed);
        i.slot_count.store(self.slot_count, Ordering::Relaxed);
        i.slot_desc_bytes
            .store(std::mem::size_of::<SlotDesc>() as u32, Ordering::Relaxed);
        i.slots_offset
            .store(std::mem::size_of::<RingHeader>() as u64, Ordering::Relaxed);
        i.backend.store(self.backend, Ordering::Relaxed);
        i.format.store(g.format.code(), Ordering::Relaxed);
        i.width.store(g.width, Ordering::Relaxed);
        i.height.store(g.height, Ordering::Relaxed);
        i.plane_count.store(g.plane_count as u32, Ordering::Relaxed);
        i.policy.store(self.policy, Ordering::Relaxed);
        for (k, p) in g.planes.iter().enumerate() {
            i.plane_offset[k].store(p.offset, Ordering::Relaxed);
            i.plane_pitch[k].store(p.pitch, Ordering::Relaxed);
            i.plane_rows[k].store(p.rows, Ordering::Relaxed);
            i.plane_row_bytes[k].store(p.row_bytes, Ordering::Relaxed);
        }
        i.frame_bytes.store(g.frame_bytes, Ordering::Relaxed);
        i.slot_stride.store(g.slot_stride, Ordering::Relaxed);
        i.pool_bytes.store(self.pool_bytes, Ordering::Relaxed);
        i.device_uuid[0].store(
            u64::from_le_bytes(self.device_uuid[..8].try_into().unwrap_or([0; 8])),
            Ordering::Relaxed,
        );
        i.device_uuid[1].store(
            u64::from_le_bytes(self.device_uuid[8..].try_into().unwrap_or([0; 8])),
            Ordering::Relaxed,
        );
        i.max_subscribers.store(self.max_subscribers, Ordering::Relaxed);
        i.ring_flags.store(self.flags, Ordering::Relaxed);
        i.created_realtime_ns.store(created_realtime_ns, Ordering::Relaxed);
        // SYNC: ring-ready — Release: every field above is visible to an
        // opener that Acquire-loads a non-zero version.
        i.layout_version.store(LAYOUT_VERSION, Ordering::Release);
    }

    /// Reads and validates the immutable description in `h`, a control region
    /// of `region_bytes` mapped bytes written by an untrusted peer.
    ///
    /// # Errors
    /// [`Error::LayoutMismatch`] naming the first field that is wrong.
    pub fn validate(h: &RingHeader, region_bytes: u64) -> Result<RingInfo> {
        let bad = |what: String| Err(Error::LayoutMismatch(what));
        let i = &h.info;
        // SYNC: ring-ready — Acquire pairs with the creator's Release store.
        let version = i.layout_version.load(Ordering::Acquire);
        let magic = i.magic.load(Ordering::Relaxed);
        if magic != RING_MAGIC {
            return bad(format!(
                "control region magic is {magic:#018x}, expected {RING_MAGIC:#018x}"
            ));
        }
        if version != LAYOUT_VERSION {
            return bad(format!(
                "control region layout version {version}, this build reads {LAYOUT_VERSION}"
            ));
        }
        let ld32 = |a: &AtomicU32| a.load(Ordering::Relaxed);
        let ld64 = |a: &AtomicU64| a.load(Ordering::Relaxed);
        if ld32(&i.header_bytes) as usize != std::mem::size_of::<RingHeader>() {
            return bad(format!(
                "header size {} != {}",
                ld32(&i.header_bytes),
                std::mem::size_of::<RingHeader>()
            ));
        }
        if ld32(&i.slot_desc_bytes) as usize != std::mem::size_of::<SlotDesc>() {
            return bad(format!("slot descriptor size {}", ld32(&i.slot_desc_bytes)));
        }
        if ld64(&i.slots_offset) != std::mem::size_of::<RingHeader>() as u64 {
            return bad(format!("slots offset {}", ld64(&i.slots_offset)));
        }
        let slot_count = ld32(&i.slot_count);
        if !slot_count.is_power_of_two() || !(MIN_SLOTS..=MAX_SLOTS).contains(&slot_count) {
            return bad(format!(
                "slot count {slot_count} is not a power of two in {MIN_SLOTS}..={MAX_SLOTS}"
            ));
        }
        let control = ld64(&i.control_bytes);
        if control != control_bytes(slot_count) || control > region_bytes {
            return bad(format!(
                "control region claims {control} bytes; {slot_count} slots need {}, {region_bytes} are mapped",
                control_bytes(slot_count)
            ));
        }
        let backend = ld32(&i.backend);
        if backend != BACKEND_HOST && backend != BACKEND_CUDA {
            return bad(format!("unknown backend code {backend}"));
        }
        let policy = ld32(&i.policy);
        if policy != POLICY_OVERWRITE && policy != POLICY_LOSSLESS {
            return bad(format!("unknown policy code {policy}"));
        }
        let max_subscribers = ld32(&i.max_subscribers);
        if max_subscribers == 0 || max_subscribers > MAX_SUBSCRIBERS_LIMIT {
            return bad(format!("subscriber table of {max_subscribers} entries"));
        }
        let code = ld32(&i.format);
        let Some(format) = Format::from_code(code) else {
            return bad(format!("unknown format code {code}"));
        };
        let expect = Geometry::new(format, ld32(&i.width), ld32(&i.height))
            .map_err(|e| Error::LayoutMismatch(format!("frame geometry: {e}")))?;
        let plane_count = ld32(&i.plane_count) as usize;
        if plane_count != expect.plane_count {
            return bad(format!(
                "{} needs {} planes, header says {plane_count}",
                format.name(),
                expect.plane_count
            ));
        }
        let frame_bytes = ld64(&i.frame_bytes);
        let slot_stride = ld64(&i.slot_stride);
        if frame_bytes > slot_stride || slot_stride % SLOT_ALIGN != 0 || slot_stride == 0 {
            return bad(format!("frame bytes {frame_bytes} / slot stride {slot_stride}"));
        }
        let mut planes = [Plane::default(); MAX_PLANES];
        for (k, slot) in planes.iter_mut().enumerate().take(plane_count) {
            let p = Plane {
                offset: ld64(&i.plane_offset[k]),
                pitch: ld64(&i.plane_pitch[k]),
                rows: ld64(&i.plane_rows[k]),
                row_bytes: ld64(&i.plane_row_bytes[k]),
            };
            let want = expect.planes[k];
            let end = p.pitch.checked_mul(p.rows).and_then(|s| s.checked_add(p.offset));
            if p.rows != want.rows
                || p.row_bytes != want.row_bytes
                || p.pitch < p.row_bytes
                || p.pitch % PITCH_ALIGN != 0
                || p.offset % PLANE_ALIGN != 0
                || end.is_none_or(|e| e > frame_bytes)
            {
                return bad(format!(
                    "plane {k} {p:?} does not fit a {}x{} {} frame of {frame_bytes} bytes",
                    expect.width,
                    expect.height,
                    format.name()
                ));
            }
            *slot = p;
        }
        let pool_bytes = ld64(&i.pool_bytes);
        let flags = ld32(&i.ring_flags);
        if flags & !RING_FLAGS_KNOWN != 0 {
            return bad(format!("unknown ring flags {flags:#x}"));
        }
        if flags & RING_GATE != 0 && backend != BACKEND_CUDA {
            return bad("a gate line on a pool that is not CUDA memory".into());
        }
        let gate = if flags & RING_GATE != 0 { GATE_BYTES } else { 0 };
        if (slot_count as u64)
            .checked_mul(slot_stride)
            .and_then(|slots| slots.checked_add(gate))
            .is_none_or(|need| need > pool_bytes)
        {
            return bad(format!(
                "pool of {pool_bytes} bytes cannot hold {slot_count} slots of {slot_stride}{}",
                if gate > 0 { " and the gate line" } else { "" }
            ));
        }
        let mut device_uuid = [0u8; 16];
        device_uuid[..8].copy_from_slice(&ld64(&i.device_uuid[0]).to_le_bytes());
        device_uuid[8..].copy_from_slice(&ld64(&i.device_uuid[1]).to_le_bytes());
        let geometry = Geometry {
            planes,
            frame_bytes,
            slot_stride,
            ..expect
        };
        Ok(RingInfo {
            epoch: ld64(&i.epoch),
            slot_count,
            backend,
            policy,
            geometry,
            pool_bytes,
            device_uuid,
            max_subscribers,
            control_bytes: control,
            flags,
        })
    }
}

#[cfg(not(loom))]
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<SharedRingInfo>() == 256);
    assert!(offset_of!(SharedRingInfo, layout_version) == 8);
    assert!(offset_of!(SharedRingInfo, epoch) == 24);
    assert!(offset_of!(SharedRingInfo, slot_count) == 32);
    assert!(offset_of!(SharedRingInfo, backend) == 48);
    assert!(offset_of!(SharedRingInfo, plane_offset) == 72);
    assert!(offset_of!(SharedRingInfo, plane_pitch) == 104);
    assert!(offset_of!(SharedRingInfo, plane_rows) == 136);
    assert!(offset_of!(SharedRingInfo, plane_row_bytes) == 168);
    assert!(offset_of!(SharedRingInfo, frame_bytes) == 200);
    assert!(offset_of!(SharedRingInfo, device_uuid) == 224);
    assert!(offset_of!(SharedRingInfo, ring_flags) == 244);
    assert!(offset_of!(SharedRingInfo, created_realtime_ns) == 248);
    assert!(size_of::<ProducerLine>() == 128);
    assert!(size_of::<SeqLine>() == 128);
    assert!(offset_of!(SeqLine, pending_seq) == 8);
    assert!(size_of::<DoorbellLine>() == 128);
    assert!(size_of::<RingHeader>() == 640);
    assert!(offset_of!(RingHeader, producer) == 256);
    assert!(offset_of!(RingHeader, seq) == 384);
    assert!(offset_of!(RingHeader, doorbell) == 512);
    assert!(align_of::<RingHeader>() == 128);
    assert!(size_of::<SlotDesc>() == 128);
    assert!(offset_of!(SlotDesc, user) == 48);
};
