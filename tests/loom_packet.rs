//! Model checks of the packet ring (`vramring::packet`) under loom: the
//! real `PacketWriter` and `PacketReader` over a real (tiny) memfd ring.
//!
//! loom cannot see plain memory, so each packet's bytes are shadowed by one
//! `AtomicU64` per 1 KiB chunk of the 4 KiB data area, written `Relaxed` by
//! the writer's `fill` (where it writes the bytes) and read `Relaxed` by the
//! reader between `try_borrow` and `release` (where it reads them). The
//! data area is 4 KiB-aligned in the mapping, so a packet's chunk is its
//! address modulo 4096, divided by 1024, in either process's mapping.
//!
//! * a reader never accepts a packet whose bytes a later write began to
//!   overwrite (records recycled, bytes lapped), and seqs only increase;
//! * a lossless reader behind the writer's gate (`would_overwrite` against
//!   the reader's `done_through`, Release/Acquire) gets every packet whole,
//!   and the writer never overwrites one it still needs.
//!
//! Deliberate mutations the models catch (checked by hand): no tail
//! re-check, no record re-check, no Acquire fence before the re-checks, no
//! SeqCst fence after the writer's invalidate, the lossless gate switched
//! off (the first two rechecked on protocol v2, eb22d0f). Not caught, and rightly: a Relaxed record commit, because this
//! reader always Acquire-loads `write_seq` (stored Release after the
//! commit) before it reads a record, so the commit's Release is a second
//! edge (kept for readers that poll records directly, as the C sketch in
//! PROTOCOL.md §17 may).
//!
//! Run with `.ci/loom.sh`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

use vramring::packet::{PacketMeta, PacketReader, PacketRingConfig, PacketWriter, PACKET_KEY};
use vramring::Error;

const CHUNK: usize = 1024;
const DATA: u64 = 4096;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        // Each packet write and read is a dozen or more modelled atomics;
        // one preemption keeps the models to seconds.
        b.preemption_bound = Some(1);
    }
    b.check(f);
}

fn chunk(ptr: *const u8) -> usize {
    (ptr as usize % DATA as usize) / CHUNK
}

fn key() -> PacketMeta {
    PacketMeta {
        flags: PACKET_KEY,
        ..PacketMeta::default()
    }
}

/// Writes packet `seq` of `len` bytes, its shadow chunk(s) set to `seq`.
fn write(w: &mut PacketWriter, shadow: &[AtomicU64; 4], len: usize) -> u64 {
    let seq = w.seq() + 1;
    w.write_with(len, key(), |dst| {
        let first = chunk(dst.as_ptr());
        for s in &shadow[first..first + len / CHUNK] {
            // Relaxed: the bytes' plain stores, between the writer's
            // invalidate fence and its Release commit.
            s.store(seq, Ordering::Relaxed);
        }
    })
    .expect("write")
}

/// Borrows the next packet if any, reads its shadow chunks, releases.
/// `Some(Ok(seq))` for an intact packet (its shadow checked), `Some(Err)`
/// for an overrun, `None` when nothing new.
fn read(r: &mut PacketReader, shadow: &[AtomicU64; 4], len: usize) -> Option<Result<u64, Error>> {
    let b = match r.try_borrow() {
        Ok(Some(b)) => b,
        Ok(None) => return None,
        Err(e) => return Some(Err(e)),
    };
    let first = chunk(b.as_ptr());
    let seen: Vec<u64> = shadow[first..first + b.len() / CHUNK]
        .iter()
        // Relaxed: the copy's plain loads, validated by `release`.
        .map(|s| s.load(Ordering::Relaxed))
        .collect();
    match b.release() {
        Ok(p) => {
            assert_eq!(p.len, len, "packet {} accepted with a wrong length", p.seq);
            assert!(
                seen.iter().all(|&v| v == p.seq),
                "packet {} accepted with bytes of packets {seen:?}",
                p.seq
            );
            Some(Ok(p.seq))
        }
        Err(e) => Some(Err(e)),
    }
}

/// The writer writes 3 packets of `len` bytes into a ring of `records`
/// records while the reader tries twice.
fn race(records: u32, len: usize) {
    let mut w = PacketWriter::create("loom-packets", PacketRingConfig::new(DATA, records, 2048)).unwrap();
    let mut r = PacketReader::open(w.fd()).unwrap();
    let shadow = Arc::new([(); 4].map(|_| AtomicU64::new(0)));
    let sw = Arc::clone(&shadow);
    let writer = thread::spawn(move || {
        for _ in 0..3 {
            write(&mut w, &sw, len);
        }
        w
    });
    let mut last = 0;
    for _ in 0..2 {
        match read(&mut r, &shadow, len) {
            Some(Ok(seq)) => {
                assert!(seq > last, "seq {seq} after {last}");
                last = seq;
            }
            Some(Err(Error::PacketOverrun { .. })) | None => {}
            Some(Err(e)) => panic!("{e}"),
        }
    }
    drop(writer.join().unwrap());
}

#[test]
fn a_reader_never_accepts_a_packet_whose_bytes_were_lapped() {
    // 4 records, 2 KiB packets in 4 KiB: packet 3 overwrites the bytes of
    // packet 1 (the tail check) but not its record.
    model(|| race(4, 2 * CHUNK));
}

#[test]
fn a_reader_never_accepts_a_packet_whose_record_was_recycled() {
    // 2 records, 1 KiB packets: packet 3 takes the record of packet 1 (the
    // record-seq check) but not its bytes.
    model(|| race(2, CHUNK));
}

#[test]
fn a_lossless_reader_behind_the_gate_gets_every_packet_whole() {
    model(|| {
        // 2 KiB packets in 4 KiB: every write after the second laps the
        // packet two before it, and recycles its record.
        let mut w = PacketWriter::create("loom-lossless", PacketRingConfig::new(DATA, 2, 2048)).unwrap();
        let mut r = PacketReader::open(w.fd()).unwrap();
        let shadow = Arc::new([(); 4].map(|_| AtomicU64::new(0)));
        let acked = Arc::new(AtomicU64::new(0));
        let (sw, aw) = (Arc::clone(&shadow), Arc::clone(&acked));
        let writer = thread::spawn(move || {
            for _ in 0..3 {
                loop {
                    let p = w.placement(2 * CHUNK);
                    // SYNC: release-cursor — Acquire pairs with the reader's
                    // Release below (as in `PacketPublisher`).
                    if !w.would_overwrite(&p, aw.load(Ordering::Acquire)) {
                        break;
                    }
                    thread::yield_now();
                }
                write(&mut w, &sw, 2 * CHUNK);
            }
            w
        });
        for want in 1..=3 {
            loop {
                match read(&mut r, &shadow, 2 * CHUNK) {
                    Some(Ok(seq)) => {
                        assert_eq!(seq, want);
                        // SYNC: release-cursor — Release after the read.
                        acked.store(r.done_through(), Ordering::Release);
                        break;
                    }
                    Some(Err(e)) => panic!("a lossless reader lost packet {want}: {e}"),
                    None => thread::yield_now(),
                }
            }
        }
        drop(writer.join().unwrap());
    });
}
