//! Model checks of the ring protocol (`vramring::seam::protocol`) under loom.
//!
//! Run with `.ci/loom.sh` (`RUSTFLAGS="--cfg loom" cargo test --release
//! --test loom`). Under `--cfg loom` the shared layout is built from loom's
//! atomics (`src/sync.rs`), so these models drive the crate's own
//! `invalidate`, `commit`, `pick`, `SlotSnapshot::{look, still_valid}` and
//! `wait_for_seq`, unchanged, and the subscriber table's own `assign`,
//! `holder` (the lossless check) and `wake_parked` (the doorbells), through
//! the `cfg(loom)`-only `vramring::seam::ring::loom_table` wrappers: the one
//! subscriber's cursor, `parked` flag and doorbell live in its own client
//! region, a real memfd that it maps as `Subscriber` does (protocol v2).
//!
//! A slot's pixel bytes are modelled as [`WORDS`] `AtomicU64`s per slot,
//! written and read `Relaxed` like plain CPU stores into and copies out of
//! the host pool: the protocol's fences, not the bytes' own orderings, must
//! keep a copy whole. Word `k` of frame `s` holds [`pattern`]`(s, k)`, and
//! every commit stores `pts = s`, so a torn frame or torn meta is visible.
//!
//! Two things differ under loom, both `cfg(loom)` only: the user-metadata
//! area is one word (`layout::USER_META_WORDS`), and `wait_for_seq`'s park
//! blocks until the doorbell moves, with no timeout slice.
//!
//! What loom cannot check: it never lets a load read a store that executes
//! after it (load buffering), so the release-cursor pair (the lossless
//! reader's Release store, `Table::holder`'s Acquire load) passes these
//! models even when weakened to `Relaxed`; that pair is argued, not checked.
//!
//! Deliberate mutations the models catch (checked by hand on protocol v2:
//! edit, run, revert): no `SeqCst` fence after `invalidate`'s store (model
//! (a): "accepted frame 1 holds a word of another frame"); no `SeqCst`
//! fence in `publish_seq` after the seq store, and none in `wait_on`
//! between `parked = 1` and its loads (model (d): the parked subscriber is
//! never woken, "Model exceeded maximum number of branches").
//!
//! Model (e), the pending pair of stream-order commits (a publisher that
//! rings parked subscribers when it announces its GPU commit, without
//! waiting for it to land, ADR 0017), is written in the protocol's steps
//! over plain atomics: the publisher's CUDA path and the GPU's store cannot
//! run under loom, and the subscriber's wait for a commit in flight ends in
//! timed naps, which loom does not model. Its three should-panic twins, a
//! publisher without its fence, a subscriber that does not load
//! `pending_seq` and one whose doorbell load is Relaxed, are caught leaving
//! it asleep.
//!
//! `LOOM_MAX_PREEMPTIONS` overrides each model's preemption bound.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use vramring::seam::layout::{ClientLine, RingHeader, SlotDesc, SUBF_LOSSLESS, SUBF_SEQUENTIAL};
use vramring::seam::protocol::{self, CommitMeta, Look, Mode, SlotSnapshot, WaitOutcome};
use vramring::seam::ring::loom_table::{LoomTable, Mapped};

/// Words of pixel data per slot.
const WORDS: usize = 2;

/// The value of word `k` of frame `seq`.
fn pattern(seq: u64, k: usize) -> u64 {
    (seq << 8) | k as u64
}

/// A control region and a pool in process memory, and a subscriber table
/// of one entry with its subscriber's client region (memfds).
struct Ring {
    header: RingHeader,
    slots: Vec<SlotDesc>,
    table: LoomTable,
    /// The subscriber's own mapping of its client region.
    client: Mapped,
    pool: Vec<[AtomicU64; WORDS]>,
}

impl Ring {
    /// A ring of `slot_count` slots whose one subscriber entry the table
    /// assigned with `flags` (cursor at 0), as the publisher's service does
    /// at connect; the subscriber has mapped its client region.
    fn new(slot_count: usize, flags: u32) -> Arc<Ring> {
        let table = LoomTable::create(1);
        let a = table.assign(flags, 0).expect("a free entry");
        let client = Mapped::client(a.client_fd.as_fd());
        Arc::new(Ring {
            header: RingHeader::default(),
            slots: (0..slot_count).map(|_| SlotDesc::default()).collect(),
            table,
            client,
            pool: (0..slot_count).map(|_| Default::default()).collect(),
        })
    }

    /// The subscriber's client line (its own mapping).
    fn line(&self) -> &ClientLine {
        self.client.line()
    }

    fn index(&self, seq: u64) -> usize {
        (seq & (self.slots.len() as u64 - 1)) as usize
    }

    fn slot(&self, seq: u64) -> &SlotDesc {
        &self.slots[self.index(seq)]
    }

    /// One publish, as `Publisher::loan` + `SlotMut::publish` do it:
    /// invalidate, write the bytes, commit, ring the doorbells of parked
    /// subscribers.
    fn publish(&self, seq: u64) {
        let slot = self.slot(seq);
        protocol::invalidate(slot, seq);
        for (k, w) in self.pool[self.index(seq)].iter().enumerate() {
            // Relaxed: a plain CPU store into the pool.
            w.store(pattern(seq, k), Ordering::Relaxed);
        }
        let meta = CommitMeta {
            pts: seq as i64,
            ..CommitMeta::default()
        };
        protocol::commit(&self.header, slot, seq, &meta);
        self.table.wake_parked();
    }

    /// Under the lossless policy, before publishing `seq`:
    /// `Publisher::wait_lossless` (the table's `holder` with the newest seq
    /// published and "released below the frame the slot holds") with the
    /// lease and timeout left out (an eviction would end the model early).
    fn wait_lossless(&self, seq: u64) {
        let n = self.slots.len() as u64;
        if seq > n {
            let held = seq - n;
            while self.table.holder(seq - 1, |released| released < held).is_some() {
                thread::yield_now();
            }
        }
    }

    /// The subscriber's copy of frame `seq` out of the pool.
    fn copy(&self, seq: u64) -> [u64; WORDS] {
        // Relaxed: a plain CPU copy; `still_valid` decides whether it counts.
        let words = &self.pool[self.index(seq)];
        std::array::from_fn(|k| words[k].load(Ordering::Relaxed))
    }

    /// `global_seq`, as a subscriber reads it.
    fn global(&self) -> u64 {
        // SYNC: global-seq — Acquire, as in `wait_for_seq`.
        self.header.seq.global_seq.load(Ordering::Acquire)
    }
}

/// Asserts that an accepted frame is whole: every word and the meta are
/// those of its own seq.
fn assert_whole(snap: &SlotSnapshot, words: &[u64; WORDS]) {
    for (k, w) in words.iter().enumerate() {
        assert_eq!(
            *w,
            pattern(snap.seq, k),
            "accepted frame {} holds a word of another frame: {words:x?}",
            snap.seq
        );
    }
    assert_eq!(
        snap.pts, snap.seq as i64,
        "accepted frame {} carries the meta of another frame",
        snap.seq
    );
}

/// One read of `want`, as `Subscriber::next` does it: look, copy, validate
/// after the copy; a frame that passes must be whole. `Some(true)`
/// delivered, `Some(false)` overrun mid-copy, `None` overwritten (or not
/// there yet) before the copy started.
fn read(ring: &Ring, want: u64) -> Option<bool> {
    let Look::Ready(snap) = SlotSnapshot::look(ring.slot(want), want) else {
        return None;
    };
    let words = ring.copy(want);
    if !snap.still_valid(ring.slot(want)) {
        return Some(false);
    }
    assert_whole(&snap, &words);
    Some(true)
}

fn model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(preemptions);
    }
    b.check(f);
}

/// (a) A 2-slot ring holding frame 1; the producer publishes frames 2 and
/// 3 (3 rewrites frame 1's slot) while a reader reads frame 1 and then the
/// newest frame. Whatever the interleaving, a frame the reader accepts is
/// whole: an invalidation during its copy is always seen by the validation
/// after it.
#[test]
fn reader_never_accepts_a_frame_invalidated_during_its_copy() {
    model(3, || {
        let ring = Ring::new(2, 0);
        ring.publish(1);
        let producer = {
            let ring = ring.clone();
            thread::spawn(move || {
                ring.publish(2);
                ring.publish(3);
            })
        };
        read(&ring, 1);
        let g = ring.global();
        if let Some(p) = protocol::pick(Mode::Latest, 1, g, protocol::safe_window(2, false)) {
            read(&ring, p.seq);
        }
        producer.join().unwrap();
    });
}

/// (a') As (a), but the reader finds frames by their slot seq alone, without
/// `global_seq` (as `proto/PROTOCOL.md` allows a reader to): it reads
/// frames 2 and 3 while the producer commits them. The slot seq's
/// Release/Acquire alone must make an accepted frame whole.
#[test]
fn reader_trusting_the_slot_seq_alone_never_accepts_a_torn_frame() {
    model(3, || {
        let ring = Ring::new(2, 0);
        ring.publish(1);
        let producer = {
            let ring = ring.clone();
            thread::spawn(move || {
                ring.publish(2);
                ring.publish(3);
            })
        };
        read(&ring, 2);
        read(&ring, 3);
        producer.join().unwrap();
    });
}

/// (b) Frames `1..=before` are published; the producer publishes the rest
/// up to `frames` while a reader loops as `Subscriber::next` does (pick →
/// look → copy → validate, gaps counted) until it has the last frame. The
/// seqs it accepts strictly increase, every accepted frame is whole, a seq
/// at or below the `global_seq` it loaded is never "not there yet", and
/// delivered + dropped accounts for every frame.
fn reader_seqs_only_increase(mode: Mode, slot_count: u32, before: u64, frames: u64, preemptions: usize) {
    model(preemptions, move || {
        let ring = Ring::new(
            slot_count as usize,
            if mode == Mode::Sequential { SUBF_SEQUENTIAL } else { 0 },
        );
        for seq in 1..=before {
            ring.publish(seq);
        }
        let producer = {
            let ring = ring.clone();
            thread::spawn(move || {
                for seq in before + 1..=frames {
                    ring.publish(seq);
                }
            })
        };
        let (mut last, mut delivered, mut dropped) = (0, 0, 0);
        while last < frames {
            let g = ring.global();
            let Some(p) = protocol::pick(mode, last, g, protocol::safe_window(slot_count, false)) else {
                thread::yield_now();
                continue;
            };
            assert!(
                p.seq > last && p.seq <= g,
                "pick({mode:?}, {last}, {g}) chose {}",
                p.seq
            );
            let slot = ring.slot(p.seq);
            match SlotSnapshot::look(slot, p.seq) {
                Look::Ready(snap) => {
                    let words = ring.copy(p.seq);
                    if snap.still_valid(slot) {
                        assert_whole(&snap, &words);
                        assert!(snap.seq > last, "accepted frame {} after frame {last}", snap.seq);
                        delivered += 1;
                        dropped += p.skipped;
                        last = snap.seq;
                    } else if mode == Mode::Sequential {
                        // As `Subscriber::next`: an overrun is a gap.
                        dropped += p.skipped + 1;
                        last = p.seq;
                    }
                }
                Look::Overwritten => {
                    if mode == Mode::Sequential {
                        dropped += p.skipped + 1;
                        last = p.seq;
                    }
                }
                Look::NotYet => panic!("frame {} is not in its slot although global_seq is {g}", p.seq),
            }
        }
        assert_eq!(
            delivered + dropped,
            frames,
            "{delivered} delivered and {dropped} dropped of {frames} frames"
        );
        producer.join().unwrap();
    });
}

#[test]
fn latest_reader_seqs_only_increase() {
    reader_seqs_only_increase(Mode::Latest, 2, 0, 3, 3);
}

#[test]
fn sequential_reader_seqs_only_increase() {
    reader_seqs_only_increase(Mode::Sequential, 2, 0, 3, 2);
}

/// With 4 slots the sequential window (3 frames) is narrower than the ring:
/// the reader starts behind, may jump, and frame 5 rewrites frame 1's slot.
#[test]
fn sequential_reader_seqs_only_increase_when_it_falls_behind() {
    reader_seqs_only_increase(Mode::Sequential, 4, 2, 5, 2);
}

/// (c) Lossless policy, 2 slots, 4 frames: the producer waits on the
/// table's `holder` before it invalidates a slot; the lossless reader
/// reads the frame after the one it released, copies it, and releases it
/// (Release, in its client region). The reader never finds its frame overwritten or invalidated
/// mid-copy, and receives every seq in order.
#[test]
fn lossless_producer_never_overwrites_a_held_slot() {
    model(3, || {
        let ring = Ring::new(2, SUBF_LOSSLESS | SUBF_SEQUENTIAL);
        let producer = {
            let ring = ring.clone();
            thread::spawn(move || {
                for seq in 1..=4 {
                    ring.wait_lossless(seq);
                    ring.publish(seq);
                }
            })
        };
        let mut last = 0;
        while last < 4 {
            let want = last + 1;
            if ring.global() < want {
                thread::yield_now();
                continue;
            }
            let slot = ring.slot(want);
            let snap = match SlotSnapshot::look(slot, want) {
                Look::Ready(snap) => snap,
                other => panic!("lossless reader found frame {want} {other:?}"),
            };
            let words = ring.copy(want);
            assert!(
                snap.still_valid(slot),
                "the producer invalidated frame {want} under a lossless reader"
            );
            assert_whole(&snap, &words);
            // SYNC: release-cursor — Release after the copy, as `Subscriber::deliver`.
            ring.line().released_seq.store(want, Ordering::Release);
            last = want;
        }
        producer.join().unwrap();
    });
}

/// (c') The same, with the reader choosing its frame as `Subscriber::next`
/// does for a lossless subscriber: `pick(Sequential, ..)` over the lossless
/// `safe_window`. Here the producer can be a whole ring ahead of the reader,
/// and the reader must still not skip.
#[test]
fn lossless_sequential_reader_gets_every_frame() {
    model(2, || {
        let ring = Ring::new(2, SUBF_LOSSLESS | SUBF_SEQUENTIAL);
        let producer = {
            let ring = ring.clone();
            thread::spawn(move || {
                for seq in 1..=4 {
                    ring.wait_lossless(seq);
                    ring.publish(seq);
                }
            })
        };
        let mut last = 0;
        while last < 4 {
            let g = ring.global();
            let Some(p) = protocol::pick(Mode::Sequential, last, g, protocol::safe_window(2, true)) else {
                thread::yield_now();
                continue;
            };
            assert_eq!(
                p,
                protocol::Pick {
                    seq: last + 1,
                    skipped: 0
                },
                "lossless reader after frame {last} with global_seq {g}"
            );
            let slot = ring.slot(p.seq);
            let snap = match SlotSnapshot::look(slot, p.seq) {
                Look::Ready(snap) => snap,
                other => panic!("lossless reader found frame {} {other:?}", p.seq),
            };
            let words = ring.copy(p.seq);
            assert!(
                snap.still_valid(slot),
                "the producer invalidated frame {} under a lossless reader",
                p.seq
            );
            assert_whole(&snap, &words);
            // SYNC: release-cursor — Release after the copy.
            ring.line().released_seq.store(p.seq, Ordering::Release);
            last = p.seq;
        }
        producer.join().unwrap();
    });
}

/// (d) The park handshake never loses a wakeup: a subscriber in
/// `wait_for_seq` (no spin, so it parks at once) against a producer
/// publishing 2 frames. Under loom `wait_for_seq`'s park blocks until the
/// doorbell moves, with no timeout slice, so a missed doorbell is a waiter
/// that never returns, which loom reports (max branches exceeded).
#[test]
fn parked_subscriber_is_always_woken() {
    model(3, || {
        let ring = Ring::new(2, 0);
        let producer = {
            let ring = ring.clone();
            thread::spawn(move || {
                ring.publish(1);
                ring.publish(2);
            })
        };
        // Far enough that it never passes, so every execution replays alike.
        let deadline = Instant::now() + Duration::from_secs(24 * 3600);
        let mut after = 0;
        while after < 2 {
            match protocol::wait_for_seq(
                &ring.header,
                ring.line(),
                after,
                deadline,
                Duration::ZERO,
                Duration::from_millis(1),
                || true,
            ) {
                WaitOutcome::Advanced(g) => {
                    assert!(g > after, "woken with global_seq {g} after {after}");
                    after = g;
                }
                other => panic!("wait_for_seq returned {other:?}"),
            }
        }
        producer.join().unwrap();
    });
}

/// The words of the pending pair (PROTOCOL.md §10.1 step 8′, §12 steps
/// 3c–3d′): the ring's `pending_seq` and `global_seq`, one subscriber's
/// `parked` and `doorbell`.
struct Pending {
    pending: AtomicU64,
    global: AtomicU64,
    parked: AtomicU64,
    doorbell: AtomicU64,
}

impl Pending {
    fn zeroed() -> Arc<Pending> {
        Arc::new(Pending {
            pending: AtomicU64::new(0),
            global: AtomicU64::new(0),
            parked: AtomicU64::new(0),
            doorbell: AtomicU64::new(0),
        })
    }
}

/// How the modelled subscriber's second park ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parked {
    /// It saw the commit landed.
    Landed,
    /// It saw the commit in flight: it waits for it without sleeping.
    InFlight,
    /// It sleeps on its doorbell, which read this value.
    Asleep(u64),
}

/// Which step [`pending_model`] leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PendingMutant {
    /// None: the protocol as specified.
    None,
    /// The subscriber's park does not load `pending_seq` (step 3d′).
    SubscriberIgnoresPending,
    /// The publisher does not fence between its `pending_seq` store and its
    /// `parked` loads (step 6′).
    PublisherWithoutFence,
    /// The subscriber loads its doorbell Relaxed, so seeing the ring's
    /// value does not make the announcement before it visible.
    RelaxedDoorbellLoad,
}

/// One stream-order commit of frame 1 against a subscriber that parks
/// (before or after the publisher looks), wakes (a ring, a cadence wait's
/// timer or a park slice) and parks again. The publisher announces the
/// commit, fences, and rings the subscriber at once if it sees it parked,
/// without waiting for the GPU's store (step 8′, ADR 0017); the subscriber
/// that finds the commit in flight waits for it itself. `mutant` takes one
/// step of the argument out.
fn pending_model(mutant: PendingMutant) {
    let checks_pending = mutant != PendingMutant::SubscriberIgnoresPending;
    let fenced = mutant != PendingMutant::PublisherWithoutFence;
    let bell_order = if mutant == PendingMutant::RelaxedDoorbellLoad {
        Ordering::Relaxed
    } else {
        Ordering::Acquire
    };
    model(3, move || {
        let w = Pending::zeroed();
        let sub = {
            let w = w.clone();
            thread::spawn(move || {
                for round in 0..2 {
                    w.parked.store(1, Ordering::Relaxed);
                    // SYNC: park / pending — the subscriber's fence.
                    loom::sync::atomic::fence(Ordering::SeqCst);
                    // SYNC: doorbell — Acquire pairs with the ring's Release.
                    let bell = w.doorbell.load(bell_order);
                    // SYNC: global-seq — Acquire pairs with the GPU's store.
                    if w.global.load(Ordering::Acquire) >= 1 {
                        w.parked.store(0, Ordering::Relaxed);
                        return Parked::Landed;
                    }
                    if checks_pending && w.pending.load(Ordering::Relaxed) >= 1 {
                        w.parked.store(0, Ordering::Relaxed);
                        return Parked::InFlight;
                    }
                    if round == 1 {
                        // No timer this time: only a ring wakes it.
                        return Parked::Asleep(bell);
                    }
                    // Woken (a ring or its timer) before the commit landed.
                    w.parked.store(0, Ordering::Relaxed);
                }
                unreachable!()
            })
        };
        let gpu = {
            let w = w.clone();
            // SYNC: global-seq — the GPU's commit store (Release).
            thread::spawn(move || w.global.store(1, Ordering::Release))
        };
        // Publisher: announce, fence, ring whoever is parked, return.
        w.pending.store(1, Ordering::Relaxed);
        if fenced {
            // SYNC: pending — the publisher's fence.
            loom::sync::atomic::fence(Ordering::SeqCst);
        }
        if w.parked.load(Ordering::Relaxed) != 0 {
            // SYNC: doorbell — Release increment.
            w.doorbell.fetch_add(1, Ordering::Release);
        }
        gpu.join().unwrap();
        if let Parked::Asleep(bell) = sub.join().unwrap() {
            assert_ne!(
                w.doorbell.load(Ordering::Acquire),
                bell,
                "the subscriber sleeps through a landed commit that nobody rang"
            );
        }
    });
}

/// (e) A publisher that rings parked subscribers when it announces a
/// stream-order commit, without waiting for the GPU, leaves nobody asleep:
/// a subscriber that parks again sees the commit in flight (`pending_seq`)
/// or landed, or was seen parked and rung (every interleaving within 3
/// preemptions).
#[test]
fn a_publisher_that_rings_before_its_commit_lands_leaves_nobody_asleep() {
    pending_model(PendingMutant::None);
}

/// The model can fail on the publisher's side: without its fence between
/// the `pending_seq` store and the `parked` load, it can miss a subscriber
/// that misses the announcement.
#[test]
#[should_panic(expected = "sleeps through a landed commit")]
fn a_publisher_without_its_pending_fence_is_caught() {
    pending_model(PendingMutant::PublisherWithoutFence);
}

/// And on the subscriber's: without step 3d′'s `pending_seq` load, a
/// subscriber rung before the commit landed parks again and sleeps through
/// it (and one that parks after the publisher looked at its flag too: the
/// pending pair of ADR 0009 itself).
#[test]
#[should_panic(expected = "sleeps through a landed commit")]
fn a_subscriber_that_ignores_pending_seq_is_caught_asleep() {
    pending_model(PendingMutant::SubscriberIgnoresPending);
}

/// And on the step the early ring adds to the argument: a subscriber rung
/// before the commit landed that reads the ring's doorbell value must then
/// see the announcement. With a Relaxed doorbell load it can read the ring
/// and a stale `pending_seq`, and sleep on the new value with nobody to
/// ring it again.
#[test]
#[should_panic(expected = "sleeps through a landed commit")]
fn a_subscriber_whose_doorbell_load_is_relaxed_is_caught_asleep() {
    pending_model(PendingMutant::RelaxedDoorbellLoad);
}

/// (f) A CPU commit against a queued reader that waits on `pending_seq`
/// (a queued pull waits for the announcement, not the landing: PROTOCOL.md
/// §11, ADR 0010). The publisher must store `pending_seq` before the
/// fence that orders its `parked` loads (step 7): stored after it, the
/// store can sit in the store buffer while the publisher reads the flag as
/// 0, and the reader, fenced after setting it, reads the old
/// `pending_seq` and sleeps with nobody to ring it.
fn cpu_commit_model(pending_before_fence: bool) {
    model(3, move || {
        let w = Pending::zeroed();
        let reader = {
            let w = w.clone();
            thread::spawn(move || {
                w.parked.store(1, Ordering::Relaxed);
                // SYNC: park / pending — the subscriber's fence.
                loom::sync::atomic::fence(Ordering::SeqCst);
                // SYNC: doorbell — Acquire pairs with the ring's Release.
                let bell = w.doorbell.load(Ordering::Acquire);
                if w.pending.load(Ordering::Relaxed) >= 1 {
                    w.parked.store(0, Ordering::Relaxed);
                    return None;
                }
                Some(bell)
            })
        };
        // Publisher, CPU commit of frame 1 (steps 6–8).
        if pending_before_fence {
            w.pending.store(1, Ordering::Relaxed);
        }
        // SYNC: global-seq — Release, then the park fence (`publish_seq`).
        w.global.store(1, Ordering::Release);
        loom::sync::atomic::fence(Ordering::SeqCst);
        if !pending_before_fence {
            w.pending.store(1, Ordering::Relaxed);
        }
        if w.parked.load(Ordering::Relaxed) != 0 {
            // SYNC: doorbell — Release increment.
            w.doorbell.fetch_add(1, Ordering::Release);
        }
        if let Some(bell) = reader.join().unwrap() {
            assert_ne!(
                w.doorbell.load(Ordering::Acquire),
                bell,
                "the queued reader sleeps through an announced frame that nobody rang"
            );
        }
    });
}

#[test]
fn a_cpu_commit_announces_before_its_park_fence_and_wakes_a_queued_reader() {
    cpu_commit_model(true);
}

/// The order before the fix (2026-12-03): `pending_seq` stored after the
/// fence can be missed by both sides.
#[test]
#[should_panic(expected = "sleeps through an announced frame")]
fn a_cpu_commit_that_announces_after_its_fence_is_caught() {
    cpu_commit_model(false);
}
