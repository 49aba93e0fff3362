//! The writer's half: create the region, write packets, set codec parameters.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::layout::{
    PacketHeader, PacketRecord, PacketRingInfo, PACKET_KEY, PACKET_WRITING, PARAMS_BYTES, PARAMS_WORDS,
};
use crate::error::{Error, Result};
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

/// The single writer of a packet ring. Owns the region and its memfd.
#[derive(Debug)]
pub struct PacketWriter {
    region: Region,
    fd: OwnedFd,
    info: PacketRingInfo,
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
            crate::publisher::random_epoch(),
        )?;
        let (region, fd) = Region::create(name, info.region_bytes)?;
        info.write_to(region.at::<PacketHeader>(0));
        // Our mapping stays writable; later mappings (readers) cannot be.
        Region::seal(fd.as_fd(), SEALS_READ_ONLY)?;
        Ok(PacketWriter {
            region,
            fd,
            info,
            seq: 0,
            head: 0,
            tail: 0,
            params_version: 0,
        })
    }

    /// The region's memfd, to hand to readers.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
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
        &self.region
    }

    fn header(&self) -> &PacketHeader {
        self.region.at(0)
    }

    /// Copies `data` into the ring as the next packet and commits it.
    /// Returns its seq (the first is 1).
    ///
    /// # Errors
    /// [`Error::TooLarge`] when `data` is longer than the ring's max packet;
    /// nothing is written then.
    pub fn write(&mut self, data: &[u8], meta: PacketMeta) -> Result<u64> {
        let max = self.info.max_packet as usize;
        if data.len() > max {
            return Err(Error::TooLarge { len: data.len(), max });
        }
        let len = data.len() as u64;
        let size = self.info.data_bytes;
        let mut pos = self.head;
        let off = pos & self.info.data_mask();
        if off + len > size {
            // Pad to the start of the data area: packets never wrap.
            pos += size - off;
        }
        let end = pos + len;
        let seq = self.seq + 1;
        let h = self.header();
        let rec = self.region.at::<PacketRecord>(self.info.record_at(seq));

        let new_tail = end.saturating_sub(size);
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
        debug_assert!(dst_off + len <= self.region.len() as u64);
        // SAFETY: `dst_off + len` is within the mapping (data area bounds,
        // above); the mapping is writable (we created it) and `data` is
        // private memory, so the ranges do not overlap. Readers may read
        // these bytes concurrently; they discard what they read unless the
        // seqlock re-check passes.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.region.as_ptr().add(dst_off as usize), data.len());
        }

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
        // SYNC: packet-write-seq — Release after the record commit.
        h.seq.write_seq.store(seq, Ordering::Release);

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
}
