//! The packet ring's seqlock, reader side (the writer's half is in
//! [`super::writer`]): look at a record (Acquire load of its seq, then its
//! meta), re-check it after the copy (Acquire fence, then the record seq and
//! the tail), and read the codec parameters under their own seq. The
//! orderings are listed in the [`super`] module docs.

use super::layout::{PacketHeader, PacketRecord, ParamsArea, PACKET_WRITING, PARAMS_BYTES};
use crate::error::{Error, Result};
use crate::sync::atomic::{fence, Ordering};

/// What a reader finds in a record.
pub(crate) type Look = crate::ring::Look<Snap>;

/// A record's meta as read between the two loads of its seq.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Snap {
    pub(crate) seq: u64,
    pub(crate) offset: u64,
    pub(crate) len: u32,
    pub(crate) flags: u32,
    pub(crate) pts: u64,
    pub(crate) dts: u64,
    pub(crate) codec: u32,
    pub(crate) commit_ns: u64,
}

/// Reads the record `rec` of `want`: its seq (Acquire), meta, and a
/// re-check.
pub(crate) fn look(header: &PacketHeader, rec: &PacketRecord, want: u64) -> Look {
    // SYNC: packet-record — Acquire pairs with the writer's Release commit.
    let s = rec.seq.load(Ordering::Acquire);
    if s != want {
        return if s & PACKET_WRITING != 0 || s > want {
            Look::Overwritten
        } else {
            Look::NotYet
        };
    }
    // Relaxed: guarded by the seqlock; checked by the re-check below and
    // again after the copy.
    let snap = Snap {
        seq: want,
        offset: rec.offset.load(Ordering::Relaxed),
        len: rec.len.load(Ordering::Relaxed),
        flags: rec.flags.load(Ordering::Relaxed),
        pts: rec.pts.load(Ordering::Relaxed),
        dts: rec.dts.load(Ordering::Relaxed),
        codec: rec.codec.load(Ordering::Relaxed),
        commit_ns: rec.commit_ns.load(Ordering::Relaxed),
    };
    if intact(header, rec, &snap) {
        Look::Ready(snap)
    } else {
        Look::Overwritten
    }
}

/// Whether `rec` still holds `snap.seq` and no byte of it has been
/// overwritten: the seqlock re-check, after the meta read or the copy.
pub(crate) fn intact(header: &PacketHeader, rec: &PacketRecord, snap: &Snap) -> bool {
    // SYNC: packet-record / packet-tail — Acquire fence pairs with the
    // writer's SeqCst fence after its tail store and invalidate: if
    // anything read before this fence came from a write after that fence,
    // the reloads below see the invalidation or the raised tail.
    fence(Ordering::Acquire);
    // Relaxed: ordered by the fence above.
    rec.seq.load(Ordering::Relaxed) == snap.seq && header.tail.tail.load(Ordering::Relaxed) <= snap.offset
}

/// One attempt at a consistent copy of the codec parameters into `out`:
/// their version, or `None` when the writer was changing them.
///
/// # Errors
/// [`Error::LayoutMismatch`] for a length beyond the area.
pub(crate) fn read_params(p: &ParamsArea, out: &mut Vec<u8>) -> Result<Option<u64>> {
    // SYNC: params-seq — Acquire pairs with the writer's Release commit.
    let s1 = p.seq.load(Ordering::Acquire);
    if s1 & PACKET_WRITING != 0 {
        return Ok(None);
    }
    // Relaxed: guarded by the seqlock, re-checked below.
    let len = p.len.load(Ordering::Relaxed) as usize;
    out.clear();
    for w in p.data.iter().take(len.min(PARAMS_BYTES).div_ceil(8)) {
        out.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    // SYNC: params-seq — Acquire fence pairs with the writer's SeqCst fence
    // after its invalidate.
    fence(Ordering::Acquire);
    if p.seq.load(Ordering::Relaxed) != s1 {
        return Ok(None);
    }
    if len > PARAMS_BYTES {
        out.clear();
        return Err(Error::LayoutMismatch(format!(
            "packet ring: codec parameters of {len} bytes exceed the {PARAMS_BYTES}-byte area"
        )));
    }
    out.truncate(len);
    Ok(Some(s1))
}
