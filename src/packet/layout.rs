//! The packet ring's shared layout: [`PacketHeader`], then `record_count`
//! [`PacketRecord`]s, then the byte data area (page aligned).
//!
//! Only the writer writes the region; it is sealed with
//! `F_SEAL_FUTURE_WRITE | F_SEAL_SHRINK | F_SEAL_GROW` before a reader maps
//! it, so readers map it read-only and it cannot shrink under them.

use crate::error::{Error, Result};
use crate::layout::{DoorbellLine, ProducerLine};
use crate::shm::SharedPlain;
use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Magic of a packet ring: the bytes `VRPACKET`.
pub const PACKET_MAGIC: u64 = u64::from_le_bytes(*b"VRPACKET");
/// Version of the packet-ring layout. Any change to a struct below bumps it.
pub const PACKET_LAYOUT_VERSION: u32 = 1;

/// Bytes of the codec-parameters area (SPS/PPS/VPS or extradata).
///
/// Under `--cfg loom` the area is 64 bytes: each loom atomic is a modelled
/// object, and the models need only a few.
pub const PARAMS_BYTES: usize = if cfg!(loom) { 64 } else { 4096 };
/// Words of the codec-parameters area.
pub const PARAMS_WORDS: usize = PARAMS_BYTES / 8;

/// Fewest records a ring may have.
pub const MIN_RECORDS: u32 = 2;
/// Most records a ring may have.
pub const MAX_RECORDS: u32 = 1 << 20;
/// Smallest data area.
pub const MIN_DATA_BYTES: u64 = 4096;
/// Largest data area (4 GiB).
pub const MAX_DATA_BYTES: u64 = 1 << 32;
/// Alignment of the data area inside the region.
pub const DATA_ALIGN: u64 = 4096;

/// Record flag: the packet is a keyframe (IDR / IRAP): a decoder can start here.
pub const PACKET_KEY: u32 = 1;
/// Record flag: a discontinuity precedes this packet.
pub const PACKET_DISCONTINUITY: u32 = 2;

/// Record / params seq bit: being written for the seq in the low bits.
pub const PACKET_WRITING: u64 = 1 << 63;

/// Immutable description, written once by the creator before
/// `layout_version` (the ready word) is stored with Release.
#[repr(C, align(128))]
#[cfg_attr(loom, derive(Default))]
pub struct PacketInfo {
    /// [`PACKET_MAGIC`].
    pub magic: AtomicU64,
    /// [`PACKET_LAYOUT_VERSION`]; 0 until the region is ready.
    /// SYNC: packet-ready (Release by creator, Acquire by `validate`).
    pub layout_version: AtomicU32,
    /// `size_of::<PacketHeader>()`.
    pub header_bytes: AtomicU32,
    /// Bytes of the whole region.
    pub region_bytes: AtomicU64,
    /// Random per writer instance.
    pub epoch: AtomicU64,
    /// Byte offset of the data area.
    pub data_offset: AtomicU64,
    /// Bytes of the data area, a power of two.
    pub data_bytes: AtomicU64,
    /// Byte offset of record 0 (`size_of::<PacketHeader>()`).
    pub records_offset: AtomicU64,
    /// Records, a power of two.
    pub record_count: AtomicU32,
    /// `size_of::<PacketRecord>()`.
    pub record_bytes: AtomicU32,
    /// Largest packet accepted; `2 * max_packet <= data_bytes`.
    pub max_packet: AtomicU32,
    /// Codec of the stream (user-defined code, e.g. a FourCC).
    pub codec: AtomicU32,
    /// [`PARAMS_BYTES`].
    pub params_capacity: AtomicU32,
    /// Reserved, zero.
    pub reserved0: AtomicU32,
    /// Reserved, zero.
    pub reserved: [AtomicU64; 6],
}

/// The newest committed packet, alone on its cache lines (readers poll it).
#[repr(C, align(128))]
#[cfg_attr(loom, derive(Default))]
pub struct PacketSeqLine {
    /// Newest committed seq (0: none yet).
    /// SYNC: packet-write-seq (Release by writer after the record commit,
    /// Acquire by readers).
    pub write_seq: AtomicU64,
}

/// Byte-ring positions and the newest keyframe.
#[repr(C, align(128))]
#[cfg_attr(loom, derive(Default))]
pub struct PacketTailLine {
    /// Lowest free-running byte position whose bytes are still intact;
    /// raised before the bytes below it are overwritten.
    /// SYNC: packet-tail (Relaxed store + SeqCst fence by writer before its
    /// byte writes, Acquire fence + Relaxed reload by readers after a copy).
    pub tail: AtomicU64,
    /// Free-running byte position after the newest packet (informational).
    pub head: AtomicU64,
    /// Newest committed keyframe seq (0: none yet).
    /// SYNC: packet-keyframe (Release by writer after the record commit,
    /// Acquire by a joining reader).
    pub keyframe_seq: AtomicU64,
}

/// Codec parameters under their own seqlock.
#[repr(C, align(128))]
#[cfg_attr(loom, derive(Default))]
pub struct ParamsArea {
    /// Version of the parameters (0: never set); `v | PACKET_WRITING` while
    /// being rewritten.
    /// SYNC: params-seq (Release by writer at commit, Acquire by reader before
    /// the copy; SeqCst fence after the invalidate, Acquire fence before the
    /// re-check).
    pub seq: AtomicU64,
    /// Bytes in use, at most [`PARAMS_BYTES`].
    pub len: AtomicU32,
    /// Reserved, zero.
    pub reserved0: AtomicU32,
    /// Reserved, zero.
    pub reserved: [AtomicU64; 14],
    /// The bytes, little-endian packed into words.
    pub data: [AtomicU64; PARAMS_WORDS],
}

/// The head of a packet-ring region.
#[repr(C, align(128))]
#[cfg_attr(loom, derive(Default))]
pub struct PacketHeader {
    /// Immutable description.
    pub info: PacketInfo,
    /// `write_seq`.
    pub seq: PacketSeqLine,
    /// `tail`, `head`, `keyframe_seq`.
    pub tail: PacketTailLine,
    /// Producer state, heartbeat and counters: the frame ring's
    /// [`ProducerLine`], with `published` counting packets.
    pub producer: ProducerLine,
    /// Reserved (zero): the frame ring's [`DoorbellLine`]. Readers park on
    /// the doorbell of their own client region
    /// ([`crate::layout::ClientLine`]).
    pub doorbell: DoorbellLine,
    /// Codec parameters.
    pub params: ParamsArea,
}

/// One packet's record, at index `seq & (record_count - 1)`. Written only by
/// the writer, under the seqlock rule in [`crate::packet`].
#[repr(C, align(64))]
#[cfg_attr(loom, derive(Default))]
pub struct PacketRecord {
    /// Seq of the packet; `seq | PACKET_WRITING` while being written; 0 never.
    /// SYNC: packet-record (Release by writer at commit, Acquire by reader
    /// before the copy; SeqCst fence after the invalidate, Acquire fence
    /// before the re-check).
    pub seq: AtomicU64,
    /// Free-running byte position of the packet's first byte; the packet is
    /// contiguous in the data area at `offset & (data_bytes - 1)`.
    pub offset: AtomicU64,
    /// Bytes of the packet.
    pub len: AtomicU32,
    /// `PACKET_*` flags.
    pub flags: AtomicU32,
    /// Presentation timestamp (i64 bits).
    pub pts: AtomicU64,
    /// Decode timestamp (i64 bits).
    pub dts: AtomicU64,
    /// Codec of this packet.
    pub codec: AtomicU32,
    /// Reserved, zero.
    pub reserved0: AtomicU32,
    /// `CLOCK_MONOTONIC` ns when the packet was committed.
    pub commit_ns: AtomicU64,
    /// Reserved, zero.
    pub reserved: AtomicU64,
}

// SAFETY: #[repr(C)] of atomics (and arrays and structs of them) only; every
// bit pattern, all zeroes included, is a valid value. (Under `--cfg loom`
// the atomics are loom's modelled objects, which `PacketWriter::create`
// constructs in place before any use.)
unsafe impl SharedPlain for PacketHeader {}
// SAFETY: as above.
unsafe impl SharedPlain for PacketRecord {}

#[cfg(not(loom))]
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<PacketInfo>() == 128);
    assert!(offset_of!(PacketInfo, layout_version) == 8);
    assert!(offset_of!(PacketInfo, region_bytes) == 16);
    assert!(offset_of!(PacketInfo, epoch) == 24);
    assert!(offset_of!(PacketInfo, data_offset) == 32);
    assert!(offset_of!(PacketInfo, data_bytes) == 40);
    assert!(offset_of!(PacketInfo, records_offset) == 48);
    assert!(offset_of!(PacketInfo, record_count) == 56);
    assert!(offset_of!(PacketInfo, record_bytes) == 60);
    assert!(offset_of!(PacketInfo, max_packet) == 64);
    assert!(offset_of!(PacketInfo, codec) == 68);
    assert!(offset_of!(PacketInfo, params_capacity) == 72);
    assert!(offset_of!(PacketInfo, reserved) == 80);
    assert!(size_of::<PacketSeqLine>() == 128);
    assert!(size_of::<PacketTailLine>() == 128);
    assert!(offset_of!(PacketTailLine, keyframe_seq) == 16);
    assert!(offset_of!(ParamsArea, len) == 8);
    assert!(offset_of!(ParamsArea, data) == 128);
    assert!(size_of::<ParamsArea>() == 128 + PARAMS_BYTES);
    assert!(offset_of!(PacketHeader, seq) == 128);
    assert!(offset_of!(PacketHeader, tail) == 256);
    assert!(offset_of!(PacketHeader, producer) == 384);
    assert!(offset_of!(PacketHeader, doorbell) == 512);
    assert!(offset_of!(PacketHeader, params) == 640);
    assert!(size_of::<PacketHeader>() == 4864);
    assert!(align_of::<PacketHeader>() == 128);
    assert!(size_of::<PacketRecord>() == 64);
    assert!(align_of::<PacketRecord>() == 64);
    assert!(offset_of!(PacketRecord, offset) == 8);
    assert!(offset_of!(PacketRecord, len) == 16);
    assert!(offset_of!(PacketRecord, flags) == 20);
    assert!(offset_of!(PacketRecord, pts) == 24);
    assert!(offset_of!(PacketRecord, dts) == 32);
    assert!(offset_of!(PacketRecord, codec) == 40);
    assert!(offset_of!(PacketRecord, commit_ns) == 48);
};

const HEADER_BYTES: u64 = std::mem::size_of::<PacketHeader>() as u64;
const RECORD_BYTES: u64 = std::mem::size_of::<PacketRecord>() as u64;

/// The validated, immutable description of a packet ring, copied out once.
/// Nothing here is re-read from shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRingInfo {
    /// The writer instance.
    pub epoch: u64,
    /// Bytes of the data area, a power of two.
    pub data_bytes: u64,
    /// Records, a power of two.
    pub record_count: u32,
    /// Largest packet.
    pub max_packet: u32,
    /// Codec of the stream.
    pub codec: u32,
    /// Byte offset of record 0.
    pub records_offset: u64,
    /// Byte offset of the data area.
    pub data_offset: u64,
    /// Bytes of the region.
    pub region_bytes: u64,
}

impl PacketRingInfo {
    /// The layout for a ring of `data_bytes` bytes, `record_count` records
    /// and packets of at most `max_packet` bytes.
    ///
    /// # Errors
    /// [`Error::Config`] when a size is out of range or not a power of two,
    /// or `2 * max_packet > data_bytes` (a padded packet must fit).
    pub fn new(data_bytes: u64, record_count: u32, max_packet: u32, codec: u32, epoch: u64) -> Result<Self> {
        check_sizes(data_bytes, record_count, max_packet).map_err(Error::Config)?;
        let records_offset = HEADER_BYTES;
        let data_offset = (records_offset + u64::from(record_count) * RECORD_BYTES).next_multiple_of(DATA_ALIGN);
        Ok(PacketRingInfo {
            epoch,
            data_bytes,
            record_count,
            max_packet,
            codec,
            records_offset,
            data_offset,
            region_bytes: data_offset + data_bytes,
        })
    }

    /// `data_bytes - 1`.
    pub const fn data_mask(&self) -> u64 {
        self.data_bytes - 1
    }

    /// `record_count - 1`.
    pub const fn record_mask(&self) -> u64 {
        self.record_count as u64 - 1
    }

    /// Byte offset in the region of the record for `seq`.
    pub const fn record_at(&self, seq: u64) -> usize {
        (self.records_offset + (seq & self.record_mask()) * RECORD_BYTES) as usize
    }

    /// Writes every immutable field into `h`, then the ready word (Release).
    pub(crate) fn write_to(&self, h: &PacketHeader) {
        let i = &h.info;
        // Relaxed: the region is not shared yet; the Release store of
        // `layout_version` below publishes all of these.
        i.magic.store(PACKET_MAGIC, Ordering::Relaxed);
        i.header_bytes.store(HEADER_BYTES as u32, Ordering::Relaxed);
        i.region_bytes.store(self.region_bytes, Ordering::Relaxed);
        i.epoch.store(self.epoch, Ordering::Relaxed);
        i.data_offset.store(self.data_offset, Ordering::Relaxed);
        i.data_bytes.store(self.data_bytes, Ordering::Relaxed);
        i.records_offset.store(self.records_offset, Ordering::Relaxed);
        i.record_count.store(self.record_count, Ordering::Relaxed);
        i.record_bytes.store(RECORD_BYTES as u32, Ordering::Relaxed);
        i.max_packet.store(self.max_packet, Ordering::Relaxed);
        i.codec.store(self.codec, Ordering::Relaxed);
        i.params_capacity.store(PARAMS_BYTES as u32, Ordering::Relaxed);
        // SYNC: packet-ready — Release: every field above happens-before a
        // validator's Acquire load that sees the version.
        i.layout_version.store(PACKET_LAYOUT_VERSION, Ordering::Release);
    }

    /// Checks every immutable field of a header read from an untrusted peer,
    /// for a mapping of `mapped_len` bytes, and copies it out.
    ///
    /// # Errors
    /// [`Error::LayoutMismatch`] naming the first field that is wrong.
    pub fn validate(h: &PacketHeader, mapped_len: u64) -> Result<Self> {
        let i = &h.info;
        let bad = |what: String| Err(Error::LayoutMismatch(format!("packet ring: {what}")));
        // SYNC: packet-ready — Acquire pairs with the creator's Release store.
        let version = i.layout_version.load(Ordering::Acquire);
        // Relaxed: immutable after the ready word, published by it.
        let magic = i.magic.load(Ordering::Relaxed);
        if magic != PACKET_MAGIC {
            return bad(format!("magic {magic:#018x} is not VRPACKET"));
        }
        if version != PACKET_LAYOUT_VERSION {
            return bad(format!(
                "layout version {version}, this build reads {PACKET_LAYOUT_VERSION} (0: not ready)"
            ));
        }
        let header_bytes = u64::from(i.header_bytes.load(Ordering::Relaxed));
        if header_bytes != HEADER_BYTES {
            return bad(format!("header of {header_bytes} bytes, expected {HEADER_BYTES}"));
        }
        let record_bytes = u64::from(i.record_bytes.load(Ordering::Relaxed));
        if record_bytes != RECORD_BYTES {
            return bad(format!("record of {record_bytes} bytes, expected {RECORD_BYTES}"));
        }
        let params = i.params_capacity.load(Ordering::Relaxed);
        if params as usize != PARAMS_BYTES {
            return bad(format!(
                "codec-parameters area of {params} bytes, expected {PARAMS_BYTES}"
            ));
        }
        if i.reserved0.load(Ordering::Relaxed) != 0 || i.reserved.iter().any(|w| w.load(Ordering::Relaxed) != 0) {
            return bad("reserved words are not zero".into());
        }
        let data_bytes = i.data_bytes.load(Ordering::Relaxed);
        let record_count = i.record_count.load(Ordering::Relaxed);
        let max_packet = i.max_packet.load(Ordering::Relaxed);
        if let Err(e) = check_sizes(data_bytes, record_count, max_packet) {
            return bad(e);
        }
        let want = Self::new(
            data_bytes,
            record_count,
            max_packet,
            i.codec.load(Ordering::Relaxed),
            i.epoch.load(Ordering::Relaxed),
        )?;
        let records_offset = i.records_offset.load(Ordering::Relaxed);
        if records_offset != want.records_offset {
            return bad(format!("records at {records_offset}, expected {}", want.records_offset));
        }
        let data_offset = i.data_offset.load(Ordering::Relaxed);
        if data_offset != want.data_offset {
            return bad(format!("data area at {data_offset}, expected {}", want.data_offset));
        }
        let region_bytes = i.region_bytes.load(Ordering::Relaxed);
        if region_bytes != want.region_bytes {
            return bad(format!(
                "region of {region_bytes} bytes, expected {}",
                want.region_bytes
            ));
        }
        if region_bytes > mapped_len {
            return bad(format!("region of {region_bytes} bytes, only {mapped_len} are mapped"));
        }
        Ok(want)
    }
}

fn check_sizes(data_bytes: u64, record_count: u32, max_packet: u32) -> std::result::Result<(), String> {
    if !data_bytes.is_power_of_two() || !(MIN_DATA_BYTES..=MAX_DATA_BYTES).contains(&data_bytes) {
        return Err(format!(
            "data area of {data_bytes} bytes is not a power of two in {MIN_DATA_BYTES}..={MAX_DATA_BYTES}"
        ));
    }
    if !record_count.is_power_of_two() || !(MIN_RECORDS..=MAX_RECORDS).contains(&record_count) {
        return Err(format!(
            "{record_count} records is not a power of two in {MIN_RECORDS}..={MAX_RECORDS}"
        ));
    }
    if max_packet == 0 || 2 * u64::from(max_packet) > data_bytes {
        return Err(format!(
            "max packet of {max_packet} bytes must be non-zero and at most half the {data_bytes}-byte data area"
        ));
    }
    Ok(())
}
