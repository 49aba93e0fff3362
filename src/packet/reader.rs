//! The reader's half: join at a keyframe, copy or borrow packets with
//! validate-after-the-copy, resync at a keyframe after an overrun.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use super::layout::{PacketHeader, PacketRecord, PacketRingInfo, PACKET_KEY, PACKET_WRITING};
use super::protocol::{self, Look, Snap};
use crate::error::{Error, IoContext, Result};
use crate::layout::PRODUCER_CLOSED;
use crate::ring::lease::ClientRef;
use crate::shm::{Region, SEALS_READ_ONLY};
use crate::sync::atomic::Ordering;

/// A packet handed to the user; its bytes went to the caller's buffer (or
/// stay in place, for a [`PacketBorrow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// Seq of the packet.
    pub seq: u64,
    /// Bytes of the packet.
    pub len: usize,
    /// Presentation timestamp.
    pub pts: i64,
    /// Decode timestamp.
    pub dts: i64,
    /// `PACKET_*` flags.
    pub flags: u32,
    /// Codec of the packet.
    pub codec: u32,
    /// `CLOCK_MONOTONIC` ns when the writer committed it.
    pub commit_ns: u64,
    /// Packets between the previous one delivered to this reader and this
    /// one that were never delivered (0 for the first packet after open).
    pub skipped: u64,
}

impl Packet {
    /// Whether the packet is a keyframe.
    pub fn is_key(&self) -> bool {
        self.flags & PACKET_KEY != 0
    }
}

/// A reader's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketReaderStats {
    /// Packets delivered.
    pub delivered: u64,
    /// Packets never delivered (sum of [`Packet::skipped`]).
    pub skipped: u64,
    /// Overruns returned.
    pub overruns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cursor {
    /// Read this seq next.
    At(u64),
    /// Find the first intact keyframe with a seq above this one.
    Resync { after: u64 },
}

/// A reader of a packet ring, over a read-only mapping of its memfd.
///
/// Used alone, it is the in-process reader (it waits by a bounded poll);
/// [`super::PacketSubscriber`] wraps one with a socket lease, futex wakeups
/// and the lossless cursor.
#[derive(Debug)]
pub struct PacketReader {
    region: Region,
    info: PacketRingInfo,
    cursor: Cursor,
    /// Seq of the last packet delivered (0: none).
    last: u64,
    stats: PacketReaderStats,
    /// The subscriber entry where progress is published (socket readers).
    entry: Option<Progress>,
}

/// Where a socket reader publishes its progress.
#[derive(Debug)]
struct Progress {
    entry: ClientRef,
    lossless: bool,
    /// The last value stored in `released_seq`.
    acked: u64,
}

impl PacketReader {
    /// Maps a packet ring read-only, validates its header, and positions the
    /// reader at the most recent keyframe (or, if there is none yet, at the
    /// first keyframe to come).
    ///
    /// # Errors
    /// [`Error::LayoutMismatch`] when the memfd is not sealed against writes
    /// and resizing, or its header is invalid; [`Error::Io`] when it cannot
    /// be mapped.
    pub fn open(fd: BorrowedFd<'_>) -> Result<Self> {
        Self::open_inner(fd, None)
    }

    /// Opens a reader for a socket subscriber. A lossless one starts after
    /// `acked` (the cursor the publisher's service gave it): at the newest
    /// keyframe if that is newer, else at the first keyframe after `acked`.
    pub(crate) fn open_for(fd: BorrowedFd<'_>, entry: ClientRef, lossless: bool) -> Result<Self> {
        // Relaxed: the service stored the cursor before it sent the region
        // (sendmsg/recvmsg order it); nobody else writes it.
        let acked = entry.get().released_seq.load(Ordering::Relaxed);
        let mut r = Self::open_inner(fd, Some(Progress { entry, lossless, acked }))?;
        if lossless {
            // The first keyframe after the service's cursor, not the newest
            // one: packets written between the assignment and this mapping
            // are ours, and the lossless gate keeps them in the ring.
            r.cursor = Cursor::Resync { after: acked };
        }
        Ok(r)
    }

    fn open_inner(fd: BorrowedFd<'_>, entry: Option<Progress>) -> Result<Self> {
        Region::require_seals(fd, SEALS_READ_ONLY)?;
        let st = rustix::fs::fstat(fd).ctx(|| "fstat of a packet ring".into())?;
        let size = st.st_size as u64;
        let min = std::mem::size_of::<PacketHeader>() as u64;
        if size < min {
            return Err(Error::LayoutMismatch(format!(
                "packet ring: region of {size} bytes is smaller than its {min}-byte header"
            )));
        }
        let region = Region::map(fd, size, false)?;
        let info = PacketRingInfo::validate(region.at(0), region.len() as u64)?;
        let mut reader = PacketReader {
            region,
            info,
            cursor: Cursor::Resync { after: 0 },
            last: 0,
            stats: PacketReaderStats::default(),
            entry,
        };
        // SYNC: packet-keyframe — Acquire pairs with the writer's Release
        // store after the keyframe's record commit.
        let key = reader.header().tail.keyframe_seq.load(Ordering::Acquire);
        if key & PACKET_WRITING != 0 {
            return Err(Error::LayoutMismatch(format!(
                "packet ring: keyframe seq {key:#x} is out of range"
            )));
        }
        if key != 0 {
            reader.cursor = Cursor::At(key);
        }
        Ok(reader)
    }

    /// The ring's validated layout.
    pub fn info(&self) -> &PacketRingInfo {
        &self.info
    }

    /// Counters.
    pub fn stats(&self) -> PacketReaderStats {
        self.stats
    }

    fn header(&self) -> &PacketHeader {
        self.region.at(0)
    }

    pub(crate) fn record(&self, seq: u64) -> &PacketRecord {
        // `record_at` masks the seq with `record_count - 1` (validated).
        self.region.at(self.info.record_at(seq))
    }

    pub(crate) fn header_for_wait(&self) -> &PacketHeader {
        self.header()
    }

    /// The seq this reader is done with, and with every one before it
    /// (delivered, lost to an overrun, or skipped while resyncing); also
    /// the seq `write_seq` must pass for it to make progress. A lossless
    /// reader publishes it (see [`PacketWriter::would_overwrite`]).
    ///
    /// [`PacketWriter::would_overwrite`]: super::PacketWriter::would_overwrite
    pub fn done_through(&self) -> u64 {
        match self.cursor {
            Cursor::At(s) => s - 1,
            Cursor::Resync { after } => after,
        }
    }

    /// Publishes progress into the subscriber entry: counters, heartbeat,
    /// and for a lossless reader its cursor (it is done with every packet up
    /// to `done_through()`: delivered, lost to an overrun, or skipped while
    /// resyncing).
    fn publish_progress(&mut self) {
        let done = self.done_through();
        let Some(p) = &mut self.entry else { return };
        let e = p.entry.get();
        if p.lossless && done > p.acked {
            p.acked = done;
            // SYNC: release-cursor — Release after the copy (or the release
            // of a borrow) completed, paired with the writer's Acquire in
            // `PacketPublisher`'s lossless gate.
            e.released_seq.store(done, Ordering::Release);
        }
        // Relaxed: informational counters, single writer (this reader).
        e.delivered.store(self.stats.delivered, Ordering::Relaxed);
        e.dropped.store(self.stats.skipped, Ordering::Relaxed);
        e.overruns.store(self.stats.overruns, Ordering::Relaxed);
        e.heartbeat_ns.store(crate::time::monotonic_ns(), Ordering::Relaxed);
    }

    /// Whether the writer has closed the ring.
    pub(crate) fn writer_closed(&self) -> bool {
        // SYNC: producer-state — Acquire pairs with the writer's Release on close.
        self.header().producer.state.load(Ordering::Acquire) == PRODUCER_CLOSED
    }

    fn look(&self, want: u64) -> Look {
        protocol::look(self.header(), self.record(want), want)
    }

    fn intact(&self, snap: &Snap) -> bool {
        protocol::intact(self.header(), self.record(snap.seq), snap)
    }

    fn newest(&self) -> u64 {
        // SYNC: packet-write-seq — Acquire pairs with the writer's Release.
        self.header().seq.write_seq.load(Ordering::Acquire)
    }

    /// Region byte offset of a validated snapshot's first byte, after
    /// bounds-checking its length and position against the layout.
    fn data_range(&self, snap: &Snap) -> Result<usize> {
        let off = snap.offset & self.info.data_mask();
        if snap.len > self.info.max_packet || off + u64::from(snap.len) > self.info.data_bytes {
            return Err(Error::LayoutMismatch(format!(
                "packet ring: record of packet {} claims {} bytes at data offset {off} (max packet {}, data area {})",
                snap.seq, snap.len, self.info.max_packet, self.info.data_bytes
            )));
        }
        Ok((self.info.data_offset + off) as usize)
    }

    fn overrun(&mut self, seq: u64) -> Error {
        self.cursor = Cursor::Resync { after: seq };
        self.stats.overruns += 1;
        self.publish_progress();
        Error::PacketOverrun {
            seq,
            newest: self.newest(),
            overruns: self.stats.overruns,
        }
    }

    /// Finds the next packet to read, committed and (so far) intact.
    fn poll(&mut self) -> Result<Option<Snap>> {
        let newest = self.newest();
        if newest & PACKET_WRITING != 0 {
            // Honest seqs stay below 2^63 (the top bit marks a record being
            // written); refusing larger ones keeps every `seq + 1` in range.
            return Err(Error::LayoutMismatch(format!(
                "packet ring: write_seq {newest:#x} is out of range"
            )));
        }
        let want = match self.cursor {
            Cursor::At(s) => {
                if s > newest {
                    return Ok(None);
                }
                s
            }
            Cursor::Resync { after } => match self.find_keyframe(after, newest) {
                Some(k) => {
                    self.cursor = Cursor::At(k);
                    k
                }
                None => {
                    self.cursor = Cursor::Resync {
                        after: after.max(newest),
                    };
                    if newest > after {
                        // A lossless reader is done with what it skipped.
                        self.publish_progress();
                    }
                    return Ok(None);
                }
            },
        };
        match self.look(want) {
            Look::Ready(snap) => {
                self.data_range(&snap)?;
                Ok(Some(snap))
            }
            Look::Overwritten => Err(self.overrun(want)),
            // A record not yet committed at or below `write_seq`: only a
            // misbehaving writer does that; wait for it.
            Look::NotYet => Ok(None),
        }
    }

    /// The oldest intact keyframe with seq in `after + 1..=newest`.
    fn find_keyframe(&self, after: u64, newest: u64) -> Option<u64> {
        let oldest = newest.saturating_sub(u64::from(self.info.record_count) - 1).max(1);
        (after.saturating_add(1).max(oldest)..=newest)
            .find(|&s| matches!(self.look(s), Look::Ready(snap) if snap.flags & PACKET_KEY != 0))
    }

    fn deliver(&mut self, snap: &Snap) -> Packet {
        let skipped = if self.last == 0 { 0 } else { snap.seq - self.last - 1 };
        self.last = snap.seq;
        self.cursor = Cursor::At(snap.seq + 1);
        self.stats.delivered += 1;
        self.stats.skipped += skipped;
        self.publish_progress();
        Packet {
            seq: snap.seq,
            len: snap.len as usize,
            pts: snap.pts as i64,
            dts: snap.dts as i64,
            flags: snap.flags,
            codec: snap.codec,
            commit_ns: snap.commit_ns,
            skipped,
        }
    }

    /// Copies the next packet into `buf` (resized to the packet) if one is
    /// committed; `Ok(None)` when there is nothing new.
    ///
    /// # Errors
    /// [`Error::PacketOverrun`] when the next packet was overwritten before
    /// or during the copy (the next call resumes at a keyframe);
    /// [`Error::LayoutMismatch`] when the writer published a record out of
    /// bounds.
    pub fn try_next_copy(&mut self, buf: &mut Vec<u8>) -> Result<Option<Packet>> {
        let Some(snap) = self.poll()? else {
            return Ok(None);
        };
        let src = self.data_range(&snap)?;
        let len = snap.len as usize;
        buf.clear();
        buf.reserve(len);
        // SAFETY: `src + len` lies inside the data area, inside the mapping
        // (`data_range` bounds-checked it against the validated layout, and
        // the mapping covers `region_bytes`); `buf` has capacity `len` and is
        // private memory, so no overlap. The writer may change the bytes
        // during the copy; `intact` below detects that, and the bytes are
        // plain `u8`, valid for any value.
        unsafe {
            std::ptr::copy_nonoverlapping(self.region.as_ptr().add(src), buf.as_mut_ptr(), len);
            buf.set_len(len);
        }
        if !self.intact(&snap) {
            buf.clear();
            return Err(self.overrun(snap.seq));
        }
        Ok(Some(self.deliver(&snap)))
    }

    /// Copies the next packet into `buf`, waiting up to `timeout` for one.
    ///
    /// Waiting is a bounded poll (spin, then 50 µs sleeps): a bare reader
    /// has no client region to park on. A
    /// [`PacketSubscriber`](crate::packet::PacketSubscriber) waits on its
    /// futex doorbell instead.
    ///
    /// # Errors
    /// As [`PacketReader::try_next_copy`], and [`Error::Timeout`].
    pub fn next_copy(&mut self, buf: &mut Vec<u8>, timeout: Duration) -> Result<Packet> {
        let mut w = Waiter::new(timeout);
        loop {
            if let Some(p) = self.try_next_copy(buf)? {
                return Ok(p);
            }
            self.wait_poll(&mut w)?;
        }
    }

    fn wait_poll(&self, w: &mut Waiter) -> Result<()> {
        if self.writer_closed() && self.newest() <= self.done_through() {
            return Err(Error::ProducerGone { epoch: self.info.epoch });
        }
        w.wait()
    }

    /// Whether a committed packet is ready to read (resyncing first if
    /// needed).
    pub(crate) fn has_next(&mut self) -> Result<bool> {
        // `poll` is idempotent apart from moving a resync cursor to the
        // keyframe it found, which the next read would do anyway.
        Ok(self.poll()?.is_some())
    }

    /// Borrows the next packet in place if one is committed.
    ///
    /// # Errors
    /// As [`PacketReader::try_next_copy`].
    pub fn try_borrow(&mut self) -> Result<Option<PacketBorrow<'_>>> {
        Ok(self.poll()?.map(|snap| PacketBorrow {
            reader: self,
            snap,
            released: false,
        }))
    }

    /// Borrows the next packet in place, waiting up to `timeout` for one.
    ///
    /// # Errors
    /// As [`PacketReader::next_copy`].
    pub fn borrow(&mut self, timeout: Duration) -> Result<PacketBorrow<'_>> {
        let mut w = Waiter::new(timeout);
        let snap = loop {
            if let Some(snap) = self.poll()? {
                break snap;
            }
            self.wait_poll(&mut w)?;
        };
        Ok(PacketBorrow {
            reader: self,
            snap,
            released: false,
        })
    }

    /// Version of the current codec parameters (0: never set), for cheap
    /// change detection.
    pub fn codec_params_version(&self) -> u64 {
        // SYNC: params-seq — Acquire pairs with the writer's Release commit.
        self.header().params.seq.load(Ordering::Acquire) & !PACKET_WRITING
    }

    /// Copies the codec parameters into `out` (resized); returns their
    /// version (0 and empty: never set). Never returns a mix of two versions.
    ///
    /// # Errors
    /// [`Error::Timeout`] when no consistent copy could be made within
    /// 100 ms (a writer rewriting them without pause, or one that died
    /// mid-update); [`Error::LayoutMismatch`] for a length beyond the area.
    pub fn codec_params(&self, out: &mut Vec<u8>) -> Result<u64> {
        let p = &self.header().params;
        let mut w = Waiter::new(Duration::from_millis(100));
        loop {
            if let Some(version) = protocol::read_params(p, out)? {
                return Ok(version);
            }
            w.wait()
                .map_err(|_| Error::Timeout(w.timeout, "a consistent read of the codec parameters"))?;
        }
    }
}

/// A packet read in place. Its bytes may be overwritten while it is held;
/// [`PacketBorrow::release`] says whether they stayed intact, and only then
/// may the caller trust what it read.
pub struct PacketBorrow<'r> {
    reader: &'r mut PacketReader,
    snap: Snap,
    released: bool,
}

impl std::fmt::Debug for PacketBorrow<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketBorrow").field("seq", &self.snap.seq).finish()
    }
}

impl PacketBorrow<'_> {
    /// The packet's seq.
    pub fn seq(&self) -> u64 {
        self.snap.seq
    }

    /// Bytes of the packet.
    pub fn len(&self) -> usize {
        self.snap.len as usize
    }

    /// Whether the packet is empty.
    pub fn is_empty(&self) -> bool {
        self.snap.len == 0
    }

    /// Whether the packet is a keyframe.
    pub fn is_key(&self) -> bool {
        self.snap.flags & PACKET_KEY != 0
    }

    /// `CLOCK_MONOTONIC` ns when the writer committed it.
    pub fn commit_ns(&self) -> u64 {
        self.snap.commit_ns
    }

    /// First byte of the packet in this process's read-only mapping; the
    /// packet is contiguous, [`PacketBorrow::len`] bytes. The bytes may
    /// change under the caller (read them with raw-pointer reads, never
    /// through a `&[u8]`); valid until the borrow ends.
    pub fn as_ptr(&self) -> *const u8 {
        // Bounds-checked when the borrow was made (`poll` -> `data_range`).
        let off = self.reader.info.data_offset + (self.snap.offset & self.reader.info.data_mask());
        self.reader.region.as_ptr().wrapping_add(off as usize)
    }

    /// Copies the packet's bytes into `dst`. The copy may be torn;
    /// [`PacketBorrow::release`] says.
    ///
    /// # Errors
    /// [`Error::TooLarge`] if `dst` is shorter than the packet.
    pub fn copy_to(&self, dst: &mut [u8]) -> Result<()> {
        let len = self.len();
        if dst.len() < len {
            return Err(Error::TooLarge { len, max: dst.len() });
        }
        // SAFETY: the packet lies inside the mapping (bounds-checked against
        // the validated layout when the borrow was made); `dst` holds `len`
        // bytes of private memory, so no overlap. Bytes may change under the
        // copy; `release` detects that.
        unsafe { std::ptr::copy_nonoverlapping(self.as_ptr(), dst.as_mut_ptr(), len) };
        Ok(())
    }

    /// Ends the borrow: the packet's meta when its bytes stayed intact the
    /// whole time.
    ///
    /// # Errors
    /// [`Error::PacketOverrun`] when the writer began overwriting it (the
    /// reader then resumes at a keyframe).
    pub fn release(mut self) -> Result<Packet> {
        self.released = true;
        self.finish()
    }

    fn finish(&mut self) -> Result<Packet> {
        if self.reader.intact(&self.snap) {
            Ok(self.reader.deliver(&self.snap))
        } else {
            Err(self.reader.overrun(self.snap.seq))
        }
    }
}

impl Drop for PacketBorrow<'_> {
    fn drop(&mut self) {
        if !self.released {
            let _ = self.finish();
        }
    }
}

/// A bounded spin-then-sleep poll.
struct Waiter {
    start: Instant,
    timeout: Duration,
    spins: u32,
}

impl Waiter {
    fn new(timeout: Duration) -> Self {
        Waiter {
            start: Instant::now(),
            timeout,
            spins: 0,
        }
    }

    fn wait(&mut self) -> Result<()> {
        if self.start.elapsed() >= self.timeout {
            return Err(Error::Timeout(self.timeout, "a packet"));
        }
        if self.spins < 200 {
            self.spins += 1;
            crate::sync::spin_hint();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }
}
