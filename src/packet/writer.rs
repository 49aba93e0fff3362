//! The writer's half: create the region, write packets, set codec parameters.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::layout::{
    PacketHeader, PacketRecord, PacketRingInfo, PACKET_KEY, PACKET_WRITING, PARAMS_BYTES, PARAMS_WORDS,
};
use crate::error::{Error, Result};
use crate::layout::{PRODUCER_CLOSED, PRODUCER_LIVE};
use crate::shm::{Region, SEALS_READ_ONLY};
use crate::sync::atomic::{fence, Ordering};

/// Sizes of a packet ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketRingConfig {
    /// Bytes of the data area, a power of two, at least `2 * max_packet`.
    pub data_bytes: u64,
    /// Records (packets the ring can describe at once), a power of two.
    pub records: u32,
    /// Largest packet accepted.
    pub max_packet: u32,
    /// Codec of the stream (user-defined code, e.g. a FourCC).
    pub codec: u32,
}

impl PacketRingConfig {
    /// A ring of `data_bytes` bytes and `records` records for packets of at
    /// most `max_packet` bytes, codec 0.
    pub fn new(data_bytes: u64, records: u32, max_packet: u32) -> Self {
        PacketRingConfig {
            data_bytes,
            records,
            max_packet,
            codec: 0,
        }
    }

    /// Sets the stream's codec code.
    pub fn codec(mut self, codec: u32) -> Self {
        self.codec = codec;
        self
    }
}

/// What a packet carries besides its bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketMeta {
    /// Presentation timestamp, user units.
    pub pts: i64,
    /// Decode timestamp, user units.
    pub dts: i64,
    /// `PACKET_*` flags.
    pub flags: u32,
    /// Codec of this packet; 0 means the ring's codec.
    pub codec: u32,
}

/// The region and its memfd, shared by the writer and the socket service
/// of a [`super::PacketPublisher`].
#[derive(Debug)]
pub(crate) struct RingMem {
    pub(crate) region: Region,
    pub(crate) fd: OwnedFd,
}

impl RingMem {
    pub(crate) fn header(&self) -> &PacketHeader {
        self.region.at(0)
    }
}

/// Where the next packet of a given length would go: what a lossless gate
/// checks before the writer overwrites anything
/// ([`PacketWriter::would_overwrite`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Seq the packet would get.
    pub seq: u64,
    /// Free-running byte position of its first byte (after padding).
    pub pos: u64,
    /// The `tail` the write would raise to: every byte below it is lost.
    pub tail: u64,
}

/// The single writer of a packet ring. Owns the region and its memfd.
///
/// Used alone, it is the in-process (bring-your-own-transport) writer: hand
/// [`PacketWriter::fd`] to readers however you like. A
/// [`super::PacketPublisher`] wraps one and serves it over the socket.
#[derive(Debug)]
pub struct PacketWriter {
    mem: Arc<RingMem>,
    info: PacketRingInfo,
    /// Byte position of each packet still described by a record, indexed by
    /// `seq & (record_count - 1)`: the writer's own trusted copy, for the
    /// lossless gate.
    offsets: Vec<u64>,
    /// Seq of the newest committed packet (own counter).
    seq: u64,
    /// Free-running byte position after the newest packet.
    head: u64,
    /// Own copy of the shared `tail`.
    tail: u64,
    /// Version of the newest codec parameters.
    params_version: u64,
}

impl PacketWriter {
    /// Creates a sealed memfd region named `name` for `cfg`.
    ///
    /// # Errors
    /// [`Error::Config`] for bad sizes; [`Error::Io`] when the memfd cannot
    /// be created, sized or sealed.
    pub fn create(name: &str, cfg: PacketRingConfig) -> Result<Self> {
        let info = PacketRingInfo::new(
            cfg.data_bytes,
            cfg.records,
            cfg.max_packet,
            cfg.codec,
            crate::ring::random_epoch(),
        )?;
        let (region, fd) = Region::create(name, info.region_bytes)?;
        #[cfg(loom)]
        loom_construct(&region, &info);
        let h = region.at::<PacketHeader>(0);
        info.write_to(h);
        // SYNC: producer-state — Release; readers Acquire it while waiting.
        h.producer.state.store(PRODUCER_LIVE, Ordering::Release);
        // Our mapping stays writable; later mappings (readers) cannot be.
        Region::seal(fd.as_fd(), SEALS_READ_ONLY)?;
        Ok(PacketWriter {
            mem: Arc::new(RingMem { region, fd }),
            offsets: vec![0; info.record_count as usize],
            info,
            seq: 0,
            head: 0,
            tail: 0,
            params_version: 0,
        })
    }

    /// The region's memfd, to hand to readers.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.mem.fd.as_fd()
    }

    pub(crate) fn mem(&self) -> &Arc<RingMem> {
        &self.mem
    }

    /// The ring's layout.
    pub fn info(&self) -> &PacketRingInfo {
        &self.info
    }

    /// Seq of the newest committed packet (0: none).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The writable mapping, for tests that play a hostile writer.
    #[cfg(test)]
    pub(crate) fn region_for_tests(&self) -> &Region {
        &self.mem.region
    }

    fn header(&self) -> &PacketHeader {
        self.mem.header()
    }

    /// Where a packet of `len` bytes would go next.
    pub fn placement(&self, len: usize) -> Placement {
        let len = len as u64;
        let size = self.info.data_bytes;
        let mut pos = self.head;
        let off = pos & self.info.data_mask();
        if off + len > size {
            // Pad to the start of the data area: packets never wrap.
            pos += size - off;
        }
        Placement {
            seq: self.seq + 1,
            pos,
            tail: (pos + len).saturating_sub(size).max(self.tail),
        }
    }

    /// Whether writing at `p` would destroy a packet a lossless reader that
    /// is done with everything up to `acked` still needs: its record (the
    /// record of `p.seq` recycles that of `p.seq - record_count`) or its
    /// bytes (below `p.tail`).
    ///
    /// This is [`super::PacketPublisher`]'s lossless gate, public for
    /// in-process transports of your own: have each lossless reader store
    /// its [`PacketReader::done_through`](super::PacketReader::done_through)
    /// with `Release` after each read, load it with `Acquire`, and write
    /// only while this is `false` for every such reader.
    pub fn would_overwrite(&self, p: &Placement, acked: u64) -> bool {
        let next = acked.saturating_add(1);
        if next > self.seq {
            // Done with everything written so far (a value beyond our seq is
            // a peer's garbage and only hurts that peer).
            return false;
        }
        if next + u64::from(self.info.record_count) <= p.seq {
            return true;
        }
        // `next` is within the last `record_count` packets, so its offset is
        // still in `offsets`.
        self.offsets[(next & self.info.record_mask()) as usize] < p.tail
    }

    /// Copies `data` into the ring as the next packet and commits it.
    /// Returns its seq (the first is 1).
    ///
    /// # Errors
    /// [`Error::TooLarge`] when `data` is longer than the ring's max packet;
    /// nothing is written then.
    pub fn write(&mut self, data: &[u8], meta: PacketMeta) -> Result<u64> {
        self.write_with(data.len(), meta, |dst| dst.copy_from_slice(data))
    }

    /// Writes the next packet in place: `fill` gets the packet's `len` bytes
    /// in the ring (zero-copy), then the packet is committed. Returns its seq.
    ///
    /// # Errors
    /// [`Error::TooLarge`] when `len` is over the ring's max packet; nothing
    /// is written then.
    pub fn write_with(&mut self, len: usize, meta: PacketMeta, fill: impl FnOnce(&mut [u8])) -> Result<u64> {
        self.write_inner(len, meta, fill, || {})
    }

    /// The write itself; `wake` rings the doorbells of parked subscribers
    /// after the seq is published (nothing for an in-process writer, whose
    /// readers poll).
    pub(crate) fn write_inner(
        &mut self,
        len: usize,
        meta: PacketMeta,
        fill: impl FnOnce(&mut [u8]),
        wake: impl FnOnce(),
    ) -> Result<u64> {
        let max = self.info.max_packet as usize;
        if len > max {
            return Err(Error::TooLarge { len, max });
        }
        let Placement {
            seq,
            pos,
            tail: new_tail,
        } = self.placement(len);
        let end = pos + len as u64;
        let h = self.header();
        let rec = self.mem.region.at::<PacketRecord>(self.info.record_at(seq));

        if new_tail > self.tail {
            // SYNC: packet-tail — Relaxed store ordered before the byte
            // writes below by the SeqCst fence; pairs with the reader's
            // Acquire fence + reload after its copy.
            h.tail.tail.store(new_tail, Ordering::Relaxed);
        }
        // SYNC: packet-record — invalidate: Relaxed store + SeqCst fence, so
        // it is ordered before every write to the record's meta and the
        // bytes; pairs with the reader's Acquire fence + reload.
        rec.seq.store(seq | PACKET_WRITING, Ordering::Relaxed);
        fence(Ordering::SeqCst);

        let dst_off = self.info.data_offset + (pos & self.info.data_mask());
        // `off + len <= size` after padding, and data_offset + size ==
        // region_bytes == mapped length.
        debug_assert!(dst_off + len as u64 <= self.mem.region.len() as u64);
        // SAFETY: `dst_off + len` is within the mapping (data area bounds,
        // above), which is writable (we created it) and stays mapped while
        // `self.mem` lives. No other `&`/`&mut` to these bytes exists in this
        // process (readers here use raw-pointer copies, and the writer is
        // `&mut self`). Readers in other processes may read the bytes while
        // `fill` writes them; they discard what they read unless the seqlock
        // re-check passes.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.mem.region.as_ptr().add(dst_off as usize), len) };
        fill(dst);

        // Relaxed: published by the Release store of `rec.seq` below; read by
        // readers only between their two loads of `rec.seq`.
        rec.offset.store(pos, Ordering::Relaxed);
        rec.len.store(len as u32, Ordering::Relaxed);
        rec.flags.store(meta.flags, Ordering::Relaxed);
        rec.pts.store(meta.pts as u64, Ordering::Relaxed);
        rec.dts.store(meta.dts as u64, Ordering::Relaxed);
        let codec = if meta.codec == 0 { self.info.codec } else { meta.codec };
        rec.codec.store(codec, Ordering::Relaxed);
        rec.commit_ns.store(crate::time::monotonic_ns(), Ordering::Relaxed);
        // SYNC: packet-record — commit: Release; bytes and meta above
        // happen-before a reader's Acquire load that sees `seq`.
        rec.seq.store(seq, Ordering::Release);
        if meta.flags & PACKET_KEY != 0 {
            // SYNC: packet-keyframe — Release after the record commit.
            h.tail.keyframe_seq.store(seq, Ordering::Release);
        }
        // Relaxed: informational, single writer.
        h.tail.head.store(end, Ordering::Relaxed);
        h.producer.published.store(seq, Ordering::Relaxed);
        // SYNC: packet-write-seq — Release after the record commit (inside
        // `publish_seq`), then the park fence and the wakeups.
        crate::ring::publish_seq(&h.seq.write_seq, seq);
        wake();

        self.offsets[(seq & self.info.record_mask()) as usize] = pos;
        self.tail = self.tail.max(new_tail);
        self.seq = seq;
        self.head = end;
        Ok(seq)
    }

    /// Replaces the codec parameters (SPS/PPS/VPS or extradata) atomically:
    /// a reader sees either the old or the new bytes, never a mix. Returns
    /// the new version (the first is 1).
    ///
    /// # Errors
    /// [`Error::TooLarge`] when `params` is longer than [`PARAMS_BYTES`].
    pub fn set_codec_params(&mut self, params: &[u8]) -> Result<u64> {
        if params.len() > PARAMS_BYTES {
            return Err(Error::TooLarge {
                len: params.len(),
                max: PARAMS_BYTES,
            });
        }
        let version = self.params_version + 1;
        let p = &self.header().params;
        // SYNC: params-seq — invalidate: Relaxed store + SeqCst fence orders
        // it before the word stores; pairs with the reader's Acquire fence +
        // reload.
        p.seq.store(version | PACKET_WRITING, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        for (w, chunk) in p.data.iter().zip(params.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            // Relaxed: published by the Release commit below.
            w.store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
        debug_assert!(params.len().div_ceil(8) <= PARAMS_WORDS);
        // Relaxed: as above.
        p.len.store(params.len() as u32, Ordering::Relaxed);
        // SYNC: params-seq — commit: Release.
        p.seq.store(version, Ordering::Release);
        self.params_version = version;
        Ok(version)
    }

    /// Marks the ring closed: readers report [`Error::ProducerGone`] once
    /// they have read what is left (a [`super::PacketPublisher`]'s service
    /// also rings every subscriber's doorbell). Also done on drop.
    pub fn close(&mut self) {
        let h = self.header();
        // SYNC: producer-state — Release; readers Acquire it.
        h.producer.state.store(PRODUCER_CLOSED, Ordering::Release);
    }
}

impl Drop for PacketWriter {
    fn drop(&mut self) {
        self.close();
    }
}

/// Under loom the shared structs' atomics are modelled objects that must be
/// constructed before use: builds the header and every record in place.
#[cfg(loom)]
fn loom_construct(region: &Region, info: &PacketRingInfo) {
    let at = |offset: usize| region.as_ptr().wrapping_add(offset);
    // SAFETY: the region was just created, is mapped read-write, holds
    // `info.region_bytes` bytes (the header at 0 and `record_count` records
    // at `info.record_at(..)`, all in bounds and aligned by the layout), and
    // nothing else refers to it yet.
    unsafe {
        at(0).cast::<PacketHeader>().write(PacketHeader::default());
        for s in 0..u64::from(info.record_count) {
            at(info.record_at(s))
                .cast::<PacketRecord>()
                .write(PacketRecord::default());
        }
    }
}
