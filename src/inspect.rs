//! Read-only snapshots of a live ring, for inspection tools (the `vramring`
//! command's `ls`, `inspect` and `top`) and for monitoring code.
//!
//! [`Inspector::connect`] attaches to a publisher's socket the way any
//! subscriber does (the same Hello, the same allow-list and file-mode
//! checks, one entry of the subscriber table for as long as it lives), but it
//! is the least a subscriber can be: not lossless (the publisher never waits
//! for it), no write access. To a frame ring it sends a push Hello
//! (`HELLO_PUSH`), so the publisher never hands it the slot pool (no import,
//! no CUDA context, no GPU memory; it connects even under
//! [`PullAccess::Nobody`](crate::PullAccess::Nobody)); it never sends push
//! buffers, so no frame is ever copied for it. To a packet ring it sends a
//! plain packet Hello. Either Welcome carries three descriptors: the control
//! region (or the packet ring) and the subscriber table, both sealed and
//! mapped **read-only**, and the inspector's own client region, mapped
//! read-write like every subscriber's but never written. It reads no frame
//! or packet and writes no shared memory.
//! [`Inspector::status`] then copies what a subscriber may read into a plain
//! [`RingStatus`]: the ring's description, the producer line, the slot or
//! packet-record descriptors and every used entry of the subscriber table.
//!
//! A live publisher keeps changing these words while they are copied: each
//! value is one atomic load (slot and record descriptors are re-checked
//! under their seqlock and marked when they changed), but a status is not a
//! consistent cut of the whole ring. It is for people and dashboards, not
//! for synchronisation.
//!
//! Every read of the shared layout for inspection is in this module, so a
//! change of the subscriber table's layout changes this file only.
//! [`Subscriber::ring_status`](crate::Subscriber::ring_status) and
//! [`PacketSubscriber::ring_status`](crate::packet::PacketSubscriber::ring_status)
//! give the same snapshot from a subscriber that is connected already.
//!
//! # Examples
//! ```no_run
//! use vramring::inspect::{InspectOptions, Inspector};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut ins = Inspector::connect("/run/vramring/cam0.sock", InspectOptions::default())?;
//! let st = ins.status()?;
//! println!("{} ring, {} published, {} subscribers", st.kind().name(), st.producer.published, st.subscriber_count());
//! for row in st.subscribers.iter().filter(|r| !r.is_self) {
//!     println!("  {} {}: {} delivered, {} dropped", row.index, row.name, row.delivered, row.dropped);
//! }
//! # Ok(()) }
//! ```

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::layout::{
    ProducerLine, RingHeader, RingInfo, SlotDesc, SubEntry, BACKEND_CUDA, BACKEND_HOST, LAYOUT_VERSION,
    PRODUCER_CLOSED, PRODUCER_INIT, PRODUCER_LIVE, SEQ_WRITING, SUBF_LOSSLESS, SUBF_PUSH, SUBF_SEQUENTIAL, SUBF_WRITE,
    SUB_ACTIVE, SUB_EVICTED, SUB_FREE,
};
use crate::packet::layout::{PacketRecord, PACKET_LAYOUT_VERSION, PACKET_WRITING};
use crate::packet::{PacketReader, PacketRingInfo};
use crate::ring::lease::{self as client, Lease};
use crate::shm::Region;
use crate::socket::msg::{self, Hello, PROTOCOL_VERSION};
use crate::sync::atomic::{fence, Ordering};
use crate::time::monotonic_ns;

/// Packet records a [`PacketRingStatus`] copies: the newest ones.
pub const RECENT_RECORDS: u64 = 64;

/// Which kind of ring a socket serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingKind {
    /// Decoded frames ([`crate::Publisher`]).
    Frames,
    /// Encoded packets ([`crate::packet::PacketPublisher`]).
    Packets,
}

impl RingKind {
    /// `"frames"` or `"packets"`.
    pub const fn name(self) -> &'static str {
        match self {
            RingKind::Frames => "frames",
            RingKind::Packets => "packets",
        }
    }
}

/// The publisher's state word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProducerState {
    /// Being created.
    Init,
    /// Publishing.
    Live,
    /// Closed in order; no more frames will come.
    Closed,
    /// A code this build does not know.
    Unknown(u32),
}

impl ProducerState {
    fn from_code(c: u32) -> Self {
        match c {
            PRODUCER_INIT => ProducerState::Init,
            PRODUCER_LIVE => ProducerState::Live,
            PRODUCER_CLOSED => ProducerState::Closed,
            other => ProducerState::Unknown(other),
        }
    }
    /// `"init"`, `"live"`, `"closed"` or `"unknown"`.
    pub const fn name(self) -> &'static str {
        match self {
            ProducerState::Init => "init",
            ProducerState::Live => "live",
            ProducerState::Closed => "closed",
            ProducerState::Unknown(_) => "unknown",
        }
    }
}

/// The producer line: state and counters the publisher keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerStatus {
    /// The state word.
    pub state: ProducerState,
    /// `CLOCK_MONOTONIC` ns of the publisher's last service wakeup (at
    /// least once a second while it lives).
    pub heartbeat_ns: u64,
    /// Frames (or packets) published.
    pub published: u64,
    /// Lossless subscribers evicted so far.
    pub evictions: u64,
    /// Subscribers that connected so far (this inspector included).
    pub connects: u64,
    /// Subscriber connections that closed so far.
    pub disconnects: u64,
}

/// State of a subscriber-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    /// Assigned to a connected subscriber.
    Active,
    /// Evicted; the publisher no longer waits for it.
    Evicted,
    /// A code this build does not know.
    Unknown(u32),
}

impl EntryState {
    /// `"active"`, `"evicted"` or `"unknown"`.
    pub const fn name(self) -> &'static str {
        match self {
            EntryState::Active => "active",
            EntryState::Evicted => "evicted",
            EntryState::Unknown(_) => "unknown",
        }
    }
}

/// One used entry of the subscriber table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriberRow {
    /// Table index.
    pub index: u32,
    /// Entry state.
    pub state: EntryState,
    /// Times the entry was assigned.
    pub generation: u32,
    /// The name from the subscriber's Hello.
    pub name: String,
    /// `SUBF_*` flags granted by the publisher.
    pub flags: u32,
    /// A lossless subscriber's cursor as the publisher holds it: the newest
    /// seq it is done with, clamped to what was published (the start cursor
    /// the publisher gave it, for other subscribers).
    pub released_seq: u64,
    /// Frames (packets) handed to the subscriber's user.
    pub delivered: u64,
    /// Frames (packets) never delivered: gaps and resyncs.
    pub dropped: u64,
    /// Reads discarded because the publisher overwrote the slot mid-read.
    pub overruns: u64,
    /// `CLOCK_MONOTONIC` ns of the subscriber's last read.
    pub heartbeat_ns: u64,
    /// Push buffers the publisher has mapped (0: pull delivery).
    pub push_buffers: u32,
    /// This entry is the inspector's (or subscriber's) own.
    pub is_self: bool,
}

impl SubscriberRow {
    /// The publisher waits for this subscriber.
    pub fn lossless(&self) -> bool {
        self.flags & SUBF_LOSSLESS != 0
    }
    /// Reads every frame in order.
    pub fn sequential(&self) -> bool {
        self.flags & SUBF_SEQUENTIAL != 0
    }
    /// Push delivery was granted.
    pub fn push(&self) -> bool {
        self.flags & SUBF_PUSH != 0
    }
    /// Write access to the pool was granted.
    pub fn write(&self) -> bool {
        self.flags & SUBF_WRITE != 0
    }
    /// The read mode: `"lossless"`, `"sequential"` or `"latest"`.
    pub fn mode_name(&self) -> &'static str {
        if self.lossless() {
            "lossless"
        } else if self.sequential() {
            "sequential"
        } else {
            "latest"
        }
    }
    /// How frames reach it: `"push"` (granted, whether asked or chosen
    /// because pull was refused) or `"pull"`.
    pub fn delivery_name(&self) -> &'static str {
        if self.push() {
            "push"
        } else {
            "pull"
        }
    }
    /// How far a lossless subscriber's cursor is behind `newest`; `None`
    /// for the others, which publish no cursor.
    pub fn lag(&self, newest: u64) -> Option<u64> {
        self.lossless().then(|| newest.saturating_sub(self.released_seq))
    }
}

/// One slot descriptor of a frame ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotStatus {
    /// Slot index.
    pub index: u32,
    /// Seq of the frame in the slot (0: never written).
    pub seq: u64,
    /// Being written now (or it changed while it was copied; then the
    /// other fields may be of two frames).
    pub writing: bool,
    /// Presentation timestamp.
    pub pts: i64,
    /// `CLOCK_MONOTONIC` ns of the commit.
    pub commit_ns: u64,
    /// `FRAME_*` flags.
    pub flags: u32,
}

/// What is particular to a frame ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameRingStatus {
    /// The validated immutable description (format, geometry, backend,
    /// policy, GPU UUID).
    pub info: RingInfo,
    /// `CLOCK_REALTIME` ns when the ring was created.
    pub created_realtime_ns: u64,
    /// Newest committed seq.
    pub global_seq: u64,
    /// Every slot descriptor, by index.
    pub slots: Vec<SlotStatus>,
}

impl FrameRingStatus {
    /// `"host"`, `"cuda"` or `"unknown"`.
    pub fn backend_name(&self) -> &'static str {
        match self.info.backend {
            BACKEND_HOST => "host",
            BACKEND_CUDA => "cuda",
            _ => "unknown",
        }
    }
    /// `"overwrite"` or `"lossless"`.
    pub fn policy_name(&self) -> &'static str {
        if self.info.policy == crate::layout::POLICY_LOSSLESS {
            "lossless"
        } else {
            "overwrite"
        }
    }
    /// The GPU holding the pool (`GPU-xxxxxxxx-...`), `None` for host rings.
    pub fn gpu_uuid(&self) -> Option<String> {
        (self.info.backend == BACKEND_CUDA).then(|| crate::memory::cuda::format_uuid(&self.info.device_uuid))
    }
}

/// One packet record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRecordStatus {
    /// Packet seq.
    pub seq: u64,
    /// Free-running byte position of its first byte.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
    /// `PACKET_*` flags.
    pub flags: u32,
    /// Presentation timestamp.
    pub pts: i64,
    /// Decode timestamp.
    pub dts: i64,
    /// Codec of the packet.
    pub codec: u32,
    /// `CLOCK_MONOTONIC` ns of the commit.
    pub commit_ns: u64,
}

impl PacketRecordStatus {
    /// A keyframe.
    pub fn is_key(&self) -> bool {
        self.flags & crate::packet::PACKET_KEY != 0
    }
}

/// What is particular to a packet ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PacketRingStatus {
    /// The validated immutable description.
    pub info: PacketRingInfo,
    /// Newest committed packet.
    pub write_seq: u64,
    /// Lowest byte position still intact.
    pub tail: u64,
    /// Byte position after the newest packet.
    pub head: u64,
    /// Newest keyframe (0: none yet).
    pub keyframe_seq: u64,
    /// Version of the codec parameters (0: never set).
    pub params_version: u64,
    /// The codec parameters (SPS/PPS/VPS or extradata).
    pub params: Vec<u8>,
    /// The newest committed records (at most [`RECENT_RECORDS`]), in seq
    /// order; a record that changed while it was copied is left out.
    pub records: Vec<PacketRecordStatus>,
}

impl PacketRingStatus {
    /// The codec FourCC as text when it is printable (`"H264"`), else its
    /// number.
    pub fn codec_name(&self) -> String {
        let b = self.info.codec.to_le_bytes();
        if self.info.codec != 0 && b.iter().all(|c| c.is_ascii_graphic()) {
            b.iter().map(|&c| c as char).collect()
        } else {
            self.info.codec.to_string()
        }
    }
}

/// The kind-specific part of a [`RingStatus`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RingDetail {
    /// A frame ring.
    Frames(FrameRingStatus),
    /// A packet ring.
    Packets(PacketRingStatus),
}

/// A plain copy of what a subscriber may read of a ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingStatus {
    /// The socket path.
    pub path: PathBuf,
    /// The publisher instance.
    pub epoch: u64,
    /// The shared layout's version (frame or packet layout).
    pub layout_version: u32,
    /// The socket protocol's version.
    pub protocol_version: u32,
    /// The producer line.
    pub producer: ProducerStatus,
    /// Frames or packets.
    pub detail: RingDetail,
    /// Every used entry of the subscriber table, by index.
    pub subscribers: Vec<SubscriberRow>,
    /// Entries in the table.
    pub max_subscribers: u32,
    /// `CLOCK_MONOTONIC` ns when the copy was made.
    pub sampled_ns: u64,
}

impl RingStatus {
    /// Frames or packets.
    pub fn kind(&self) -> RingKind {
        match self.detail {
            RingDetail::Frames(_) => RingKind::Frames,
            RingDetail::Packets(_) => RingKind::Packets,
        }
    }
    /// Newest committed seq.
    pub fn newest_seq(&self) -> u64 {
        match &self.detail {
            RingDetail::Frames(f) => f.global_seq,
            RingDetail::Packets(p) => p.write_seq,
        }
    }
    /// Active subscribers other than this status's own entry.
    pub fn subscriber_count(&self) -> usize {
        self.subscribers
            .iter()
            .filter(|r| r.state == EntryState::Active && !r.is_self)
            .count()
    }
    /// `(seq, commit_ns)` of the committed frames or packets in the ring.
    fn commits(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = match &self.detail {
            RingDetail::Frames(f) => f
                .slots
                .iter()
                .filter(|s| s.seq != 0 && !s.writing)
                .map(|s| (s.seq, s.commit_ns))
                .collect(),
            RingDetail::Packets(p) => p.records.iter().map(|r| (r.seq, r.commit_ns)).collect(),
        };
        v.sort_unstable();
        v
    }
    /// `CLOCK_MONOTONIC` ns of the newest commit still in the ring.
    pub fn newest_commit_ns(&self) -> Option<u64> {
        self.commits().last().map(|&(_, ns)| ns)
    }
    /// The publish rate over the frames (packets) still in the ring, in
    /// Hz, from their commit times: no waiting needed. `Some(0.0)` when the
    /// newest is older than 2 s and than 3 mean intervals (the publisher is
    /// idle); `None` with fewer than two commits.
    pub fn recent_rate_hz(&self) -> Option<f64> {
        let c = self.commits();
        let (&(s0, t0), &(s1, t1)) = (c.first()?, c.last()?);
        if s1 <= s0 || t1 <= t0 {
            return None;
        }
        let interval = (t1 - t0) as f64 / (s1 - s0) as f64;
        let age = self.sampled_ns.saturating_sub(t1) as f64;
        if age > 2e9 && age > 3.0 * interval {
            return Some(0.0);
        }
        Some(1e9 / interval)
    }
}

/// How an [`Inspector`] connects.
#[derive(Debug, Clone)]
pub struct InspectOptions {
    /// Name shown in the publisher's subscriber table.
    pub name: String,
    /// How long the handshake may take (a publisher that accepts but never
    /// answers is reported as [`Error::Timeout`] after this).
    pub timeout: Duration,
}

impl Default for InspectOptions {
    fn default() -> Self {
        InspectOptions {
            name: "vramring-inspect".into(),
            timeout: Duration::from_secs(1),
        }
    }
}

enum Ring {
    Frames { control: Region, info: RingInfo },
    Packets { reader: PacketReader },
}

/// A read-only view of one ring through an ordinary subscriber connection.
/// See the [module docs](self).
pub struct Inspector {
    path: PathBuf,
    ring: Ring,
    lease: Lease,
}

impl std::fmt::Debug for Inspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspector")
            .field("path", &self.path)
            .field("kind", &self.kind())
            .field("index", &self.lease.index())
            .finish()
    }
}

impl Inspector {
    /// Connects to the publisher at `path`, whichever kind of ring it
    /// serves: a frame Hello first (a packet Hello first when the file name
    /// contains `packets`, the naming convention of `cam0.packets.sock`),
    /// then the other kind's when the publisher answers that it serves the
    /// other kind ([`msg::REJECT_KIND`]).
    ///
    /// # Errors
    /// [`Error::Io`] when nothing listens (`ConnectionRefused`: a stale
    /// socket; `NotFound`; `PermissionDenied` by the socket's file mode);
    /// [`Error::Refused`] (code [`msg::REJECT_PERMISSION`]: not on the
    /// allow-list; [`msg::REJECT_FULL`]); [`Error::VersionMismatch`];
    /// [`Error::Timeout`]; [`Error::LayoutMismatch`] / [`Error::BadMessage`]
    /// for a malformed answer.
    pub fn connect(path: impl AsRef<Path>, opts: InspectOptions) -> Result<Inspector> {
        let path = path.as_ref().to_owned();
        let packets_first = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains("packets"));
        let first = if packets_first {
            Self::connect_packets(path.clone(), opts.clone())
        } else {
            Self::connect_frames(path.clone(), opts.clone())
        };
        match first {
            Err(Error::Refused { code, .. }) if code == msg::REJECT_KIND => {
                if packets_first {
                    Self::connect_frames(path, opts)
                } else {
                    Self::connect_packets(path, opts)
                }
            }
            other => other,
        }
    }

    fn connect_frames(path: PathBuf, opts: InspectOptions) -> Result<Inspector> {
        // A push Hello: the publisher hands a push subscriber no pool, so
        // the inspector never holds it (and works with `PullAccess::Nobody`);
        // it never sends push buffers, so nothing is ever copied for it.
        let hello = Hello {
            flags: msg::HELLO_PUSH,
            backends: (1 << BACKEND_HOST) | (1 << BACKEND_CUDA),
            name: opts.name,
            device_uuid: [0; 16],
        };
        let (sock, welcome, fds) = client::request(&path, hello, opts.timeout)?;
        let mut fds = fds.into_iter();
        let (Some(control_fd), Some(subs_fd), Some(client_fd), None) = (fds.next(), fds.next(), fds.next(), fds.next())
        else {
            return Err(Error::BadMessage(
                "a push Welcome must carry exactly 3 descriptors".into(),
            ));
        };
        let (control, info, subs, client) =
            crate::ring::attach::map_frame_ring(&welcome, control_fd.as_fd(), &subs_fd, &client_fd)?;
        let lease = Lease::new(sock, subs, client, &welcome, info.max_subscribers, info.epoch)?;
        Ok(Inspector {
            path,
            ring: Ring::Frames { control, info },
            lease,
        })
    }

    fn connect_packets(path: PathBuf, opts: InspectOptions) -> Result<Inspector> {
        let hello = Hello {
            flags: msg::HELLO_PACKETS,
            backends: 1 << BACKEND_HOST,
            name: opts.name,
            device_uuid: [0; 16],
        };
        let (sock, welcome, fds) = client::request(&path, hello, opts.timeout)?;
        let mut fds = fds.into_iter();
        let (Some(ring_fd), Some(subs_fd), Some(client_fd), None) = (fds.next(), fds.next(), fds.next(), fds.next())
        else {
            return Err(Error::BadMessage(
                "a packet Welcome must carry exactly 3 descriptors".into(),
            ));
        };
        let (subs, client, max) = crate::ring::attach::map_packet_table(&welcome, &subs_fd, &client_fd)?;
        let lease = Lease::new(sock, subs, client, &welcome, max, welcome.epoch)?;
        // A reader that is never read from: it maps and validates the ring
        // read-only, and reads the codec parameters under their seqlock.
        let reader = PacketReader::open(ring_fd.as_fd())?;
        if reader.info().epoch != welcome.epoch {
            return Err(Error::LayoutMismatch(
                "Welcome disagrees with the packet ring's header".into(),
            ));
        }
        Ok(Inspector {
            path,
            ring: Ring::Packets { reader },
            lease,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Frames or packets.
    pub fn kind(&self) -> RingKind {
        match self.ring {
            Ring::Frames { .. } => RingKind::Frames,
            Ring::Packets { .. } => RingKind::Packets,
        }
    }

    /// Copies the ring's current status.
    ///
    /// # Errors
    /// [`Error::ProducerGone`] once the publisher closed or died (the
    /// connection is the lease; re-connect to follow a new instance);
    /// [`Error::Evicted`].
    pub fn status(&mut self) -> Result<RingStatus> {
        self.lease.check()?;
        let own = Some(self.lease.index());
        Ok(match &self.ring {
            Ring::Frames { control, info } => frame_status(&self.path, control, info, self.lease.table(), own),
            Ring::Packets { reader } => packet_status(&self.path, reader, self.lease.table(), own),
        })
    }
}

impl Drop for Inspector {
    fn drop(&mut self) {
        self.lease.bye();
    }
}

fn producer_status(p: &ProducerLine) -> ProducerStatus {
    // SYNC: producer-state — Acquire pairs with the publisher's Release on close.
    let state = ProducerState::from_code(p.state.load(Ordering::Acquire));
    // Relaxed: informational counters, each a single writer's.
    ProducerStatus {
        state,
        heartbeat_ns: p.heartbeat_ns.load(Ordering::Relaxed),
        published: p.published.load(Ordering::Relaxed),
        evictions: p.evictions.load(Ordering::Relaxed),
        connects: p.connects.load(Ordering::Relaxed),
        disconnects: p.disconnects.load(Ordering::Relaxed),
    }
}

/// Copies every used entry of a subscriber table.
fn table_rows(table: &[SubEntry], own: Option<usize>) -> Vec<SubscriberRow> {
    let mut rows = Vec::new();
    for (i, e) in table.iter().enumerate() {
        // SYNC: sub-state — Acquire pairs with the publisher's Release when
        // it assigns or releases the entry: the fields it set before are
        // visible (the subscriber's own counters are informational).
        let state = e.state.load(Ordering::Acquire);
        let state = match state {
            SUB_FREE => continue,
            SUB_ACTIVE => EntryState::Active,
            SUB_EVICTED => EntryState::Evicted,
            other => EntryState::Unknown(other),
        };
        // Relaxed: informational copies of words their single writers keep
        // changing.
        rows.push(SubscriberRow {
            index: i as u32,
            state,
            generation: e.generation.load(Ordering::Relaxed),
            name: e.name(),
            flags: e.flags.load(Ordering::Relaxed),
            released_seq: e.released_seq.load(Ordering::Relaxed),
            delivered: e.delivered.load(Ordering::Relaxed),
            dropped: e.dropped.load(Ordering::Relaxed),
            overruns: e.overruns.load(Ordering::Relaxed),
            heartbeat_ns: e.heartbeat_ns.load(Ordering::Relaxed),
            push_buffers: e.push_count.load(Ordering::Relaxed),
            is_self: own == Some(i),
        });
    }
    rows
}

/// The status of a frame ring, from its control region and table.
pub(crate) fn frame_status(
    path: &Path,
    control: &Region,
    info: &RingInfo,
    table: &[SubEntry],
    own: Option<usize>,
) -> RingStatus {
    let h = control.at::<RingHeader>(0);
    // Relaxed: immutable after the ready word, which `validate` Acquired.
    let created_realtime_ns = h.info.created_realtime_ns.load(Ordering::Relaxed);
    let producer = producer_status(&h.producer);
    // SYNC: global-seq — Acquire pairs with the publisher's Release.
    let global_seq = h.seq.global_seq.load(Ordering::Acquire);
    let descs = control.slice::<SlotDesc>(std::mem::size_of::<RingHeader>(), info.slot_count as usize);
    let slots = descs
        .iter()
        .enumerate()
        .map(|(k, d)| {
            // SYNC: slot-seq — Acquire, then the fields, then an Acquire
            // fence and a re-check (the seqlock rule of `protocol`).
            let s1 = d.seq.load(Ordering::Acquire);
            let pts = d.pts.load(Ordering::Relaxed) as i64;
            let commit_ns = d.commit_ns.load(Ordering::Relaxed);
            let flags = d.flags.load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            let s2 = d.seq.load(Ordering::Relaxed);
            SlotStatus {
                index: k as u32,
                seq: s1 & !SEQ_WRITING,
                writing: s1 & SEQ_WRITING != 0 || s1 != s2,
                pts,
                commit_ns,
                flags,
            }
        })
        .collect();
    RingStatus {
        path: path.to_owned(),
        epoch: info.epoch,
        layout_version: LAYOUT_VERSION,
        protocol_version: PROTOCOL_VERSION,
        producer,
        detail: RingDetail::Frames(FrameRingStatus {
            info: *info,
            created_realtime_ns,
            global_seq,
            slots,
        }),
        subscribers: table_rows(table, own),
        max_subscribers: table.len() as u32,
        sampled_ns: monotonic_ns(),
    }
}

/// Copies the record of `seq` under its seqlock; `None` when it holds
/// another packet or changed during the copy.
fn record_status(r: &PacketRecord, seq: u64) -> Option<PacketRecordStatus> {
    // SYNC: packet-record — Acquire, the fields, an Acquire fence, re-check.
    let s1 = r.seq.load(Ordering::Acquire);
    if s1 != seq || s1 & PACKET_WRITING != 0 {
        return None;
    }
    let st = PacketRecordStatus {
        seq,
        offset: r.offset.load(Ordering::Relaxed),
        len: r.len.load(Ordering::Relaxed),
        flags: r.flags.load(Ordering::Relaxed),
        pts: r.pts.load(Ordering::Relaxed) as i64,
        dts: r.dts.load(Ordering::Relaxed) as i64,
        codec: r.codec.load(Ordering::Relaxed),
        commit_ns: r.commit_ns.load(Ordering::Relaxed),
    };
    fence(Ordering::Acquire);
    (r.seq.load(Ordering::Relaxed) == s1).then_some(st)
}

/// The status of a packet ring, from its reader's mapping and the table.
pub(crate) fn packet_status(path: &Path, reader: &PacketReader, table: &[SubEntry], own: Option<usize>) -> RingStatus {
    let info = *reader.info();
    let h = reader.header_for_wait();
    let producer = producer_status(&h.producer);
    // SYNC: packet-write-seq — Acquire pairs with the writer's Release.
    let write_seq = h.seq.write_seq.load(Ordering::Acquire);
    // Relaxed: informational positions.
    let tail = h.tail.tail.load(Ordering::Relaxed);
    let head = h.tail.head.load(Ordering::Relaxed);
    // SYNC: packet-keyframe — Acquire pairs with the writer's Release.
    let keyframe_seq = h.tail.keyframe_seq.load(Ordering::Acquire);
    let mut params = Vec::new();
    // A parameter set being rewritten without pause reads as none.
    let params_version = reader.codec_params(&mut params).unwrap_or_else(|_| {
        params.clear();
        0
    });
    let first = write_seq
        .saturating_sub(RECENT_RECORDS.min(u64::from(info.record_count)) - 1)
        .max(1);
    let records = (first..=write_seq)
        .filter_map(|s| record_status(reader.record(s), s))
        .collect();
    RingStatus {
        path: path.to_owned(),
        epoch: info.epoch,
        layout_version: PACKET_LAYOUT_VERSION,
        protocol_version: PROTOCOL_VERSION,
        producer,
        detail: RingDetail::Packets(PacketRingStatus {
            info,
            write_seq,
            tail,
            head,
            keyframe_seq,
            params_version,
            params,
            records,
        }),
        subscribers: table_rows(table, own),
        max_subscribers: table.len() as u32,
        sampled_ns: monotonic_ns(),
    }
}
