//! Model check of queued push delivery's handshake (sequential and lossless
//! readers, `vramring::seam::protocol::push::{claim_queued, take}`) under
//! loom: the publisher never writes a buffer whose frame the reader has not
//! read or still holds, the reader takes frames oldest first and whole, and
//! every frame the publisher pushed is delivered (a frame it could not push
//! is the only gap). Buffers are modelled as in `tests/loom_push.rs`: word
//! `i` of frame `s` holds `s * 16 + i`. Run with `.ci/loom.sh`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

use vramring::seam::layout::{ClientLine, SubEntry, SEQ_WRITING};
use vramring::seam::protocol::push::{self, Order};

const WORDS: usize = 2;

struct Target {
    entry: SubEntry,
    client: ClientLine,
    buffers: Vec<[AtomicU64; WORDS]>,
    /// Bit `s` set: the publisher pushed frame `s` (its claim succeeded).
    pushed: AtomicU64,
}

fn model(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(bound);
    }
    b.check(f);
}

fn target(count: usize) -> Arc<Target> {
    Arc::new(Target {
        entry: SubEntry::default(),
        client: ClientLine::default(),
        buffers: (0..count).map(|_| Default::default()).collect(),
        pushed: AtomicU64::new(0),
    })
}

/// The publisher's side of one frame into buffer `k` it claimed: copy,
/// complete, and note it pushed.
fn fill(t: &Target, k: usize, seq: u64) {
    for (i, w) in t.buffers[k].iter().enumerate() {
        // Relaxed: the copy's plain stores.
        w.store(seq * 16 + i as u64, Ordering::Relaxed);
    }
    push::complete_buffer(&t.entry, k, seq);
    // Relaxed: read after the join.
    t.pushed.fetch_or(1 << seq, Ordering::Relaxed);
}

/// Takes the oldest pushed frame past `last`, checks it whole twice while
/// held, and returns its seq.
fn take_checked(t: &Target, count: usize, last: u64) -> Option<u64> {
    let (k, seq) = push::take(&t.entry, &t.client, Order::Oldest, count, last, u64::MAX)?;
    assert!(seq > last, "frames come in order");
    for _ in 0..2 {
        for (i, w) in t.buffers[k].iter().enumerate() {
            assert_eq!(w.load(Ordering::Relaxed), seq * 16 + i as u64, "buffer {k} torn");
        }
    }
    Some(seq)
}

/// A sequential reader beside a publisher that pushes what fits: every
/// frame pushed is delivered, in order and whole; `claim` is the
/// publisher's choice of buffer.
fn sequential(claim: fn(&Target, usize, u64) -> Option<usize>) {
    model(3, move || {
        let count = 3;
        let t = target(count);
        let p = Arc::clone(&t);
        let publisher = thread::spawn(move || {
            for seq in 1..=4 {
                if let Some(k) = claim(&p, count, seq) {
                    fill(&p, k, seq);
                }
            }
        });
        let mut delivered = 0u64;
        let mut last = 0;
        for _ in 0..2 {
            if let Some(seq) = take_checked(&t, count, last) {
                delivered |= 1 << seq;
                last = seq;
            }
        }
        publisher.join().unwrap();
        // The publisher is done: what is left in the queue is read now.
        while let Some(seq) = take_checked(&t, count, last) {
            delivered |= 1 << seq;
            last = seq;
        }
        push::release_hold(&t.client);
        assert_eq!(delivered, t.pushed.load(Ordering::Relaxed), "a pushed frame was lost");
    });
}

fn claim_queued(t: &Target, count: usize, seq: u64) -> Option<usize> {
    push::claim_queued(&t.entry, &t.client, count, 0, seq)
}

#[test]
fn a_queued_reader_gets_every_pushed_frame_in_order_and_whole() {
    sequential(claim_queued);
}

/// The model can fail: a publisher that claims a queued reader's buffers
/// by the latest rule (sparing only the newest and the held one) is caught
/// overwriting a frame the reader had not read.
#[test]
#[should_panic(expected = "lost")]
fn a_publisher_that_claims_by_the_latest_rule_is_caught_losing_queued_frames() {
    sequential(|t, _, seq| {
        let newest = (0..3).max_by_key(|&k| t.entry.push_seq[k].load(Ordering::Relaxed) & !SEQ_WRITING);
        let newest = newest.filter(|&k| t.entry.push_seq[k].load(Ordering::Relaxed) != 0);
        push::claim_buffer(&t.entry, &t.client, newest, seq)
    });
}

/// A lossless reader: before each frame the publisher waits, as its
/// lossless gate does, until the reader's released frame is at most
/// `count − 1` behind it; then a claim must find a buffer, and every frame
/// reaches the reader in order and whole. The waits use a mutex and a
/// condition variable (the gate's polling, without the spinning loom
/// cannot bound); the claim and the take still race on the push words.
#[test]
fn a_lossless_queued_reader_gets_every_frame_when_the_publisher_waits_for_room() {
    model(2, || {
        let count = 2usize;
        let t = target(count);
        // (newest frame filled, newest frame released by the reader).
        let gate = Arc::new((Mutex::new((0u64, 0u64)), Condvar::new()));
        let (p, pg) = (Arc::clone(&t), Arc::clone(&gate));
        let publisher = thread::spawn(move || {
            let (m, cv) = &*pg;
            for seq in 1..=3u64 {
                let mut g = m.lock().unwrap();
                while g.1 + (count as u64 - 1) < seq {
                    g = cv.wait(g).unwrap();
                }
                drop(g);
                let k = claim_queued(&p, count, seq).expect("the gate saw room, so a buffer is free");
                fill(&p, k, seq);
                m.lock().unwrap().0 = seq;
                cv.notify_all();
            }
        });
        let (m, cv) = &*gate;
        let mut last = 0;
        while last < 3 {
            let mut g = m.lock().unwrap();
            while g.0 <= last {
                g = cv.wait(g).unwrap();
            }
            drop(g);
            let seq = take_checked(&t, count, last).expect("a filled frame is there to take");
            assert_eq!(seq, last + 1, "a lossless reader misses no frame");
            last = seq;
            m.lock().unwrap().1 = seq;
            cv.notify_all();
        }
        publisher.join().unwrap();
    });
}

/// Checks buffer `k` still holds frame `seq` whole.
fn assert_whole(t: &Target, k: usize, seq: u64, what: &str) {
    for (i, w) in t.buffers[k].iter().enumerate() {
        assert_eq!(
            w.load(Ordering::Relaxed),
            seq * 16 + i as u64,
            "{what}: buffer {k} rewritten"
        );
    }
}

/// A reader that keeps frames (`Frame::hold`): it holds frame 1, keeps
/// it, reads newer frames in place under that hold (`Take::Peek`), then
/// moves the hold forward to a newer kept frame (`keep_hold`). `how` is
/// how it reads the newer frames. The kept frames stay whole throughout,
/// and every frame it reads is whole.
fn keeping(how: fn(&ClientLine) -> push::Take<'_>) {
    model(3, move || {
        let count = 3;
        let t = target(count);
        let global = Arc::new(AtomicU64::new(0));
        // Frame 1 pushed and taken before the race: the reader keeps it.
        let k1 = claim_queued(&t, count, 1).unwrap();
        fill(&t, k1, 1);
        global.store(1, Ordering::Release);
        let (k1, _) = push::take(&t.entry, &t.client, Order::Oldest, count, 0, 1).unwrap();
        let (p, pg) = (Arc::clone(&t), Arc::clone(&global));
        let publisher = thread::spawn(move || {
            for seq in 2..=4 {
                if let Some(k) = claim_queued(&p, count, seq) {
                    fill(&p, k, seq);
                }
                pg.store(seq, Ordering::Release);
            }
        });
        let bufs = push::Buffers {
            count,
            order: Order::Oldest,
        };
        let read = |last: u64| {
            let landed = global.load(Ordering::Acquire);
            match push::read_pushed(&t.entry, how(&t.client), bufs, &global, last, landed, |k, s| {
                Some((k, s))
            }) {
                push::PushRead::Took(_, _, (k, s)) => Some((k, s)),
                _ => None,
            }
        };
        let mut last = 1;
        let mut newer_kept = None;
        for _ in 0..2 {
            if let Some((k, s)) = read(last) {
                assert_whole(&t, k, s, "a frame read in place");
                assert_whole(&t, k1, 1, "the kept frame");
                last = s;
                newer_kept.get_or_insert((k, s));
            }
        }
        assert_whole(&t, k1, 1, "the kept frame");
        if let Some((k, s)) = newer_kept {
            // Frame 1 is let go; the hold moves to the next kept frame.
            assert!(
                push::keep_hold(&t.entry, &t.client, k, s),
                "the newer kept frame was still there"
            );
            if let Some((k2, s2)) = read(last) {
                assert_whole(&t, k2, s2, "a frame read in place");
            }
            assert_whole(&t, k, s, "the newer kept frame");
        }
        publisher.join().unwrap();
    });
}

#[test]
fn a_kept_frame_stays_whole_while_the_reader_reads_newer_frames_in_place() {
    keeping(|_| push::Take::Peek);
}

/// The model can fail: a reader that moves its hold to each frame it
/// reads while it still keeps an older one is caught with the kept buffer
/// rewritten.
#[test]
#[should_panic(expected = "rewritten")]
fn a_reader_that_holds_what_it_reads_while_keeping_an_older_frame_is_caught() {
    keeping(|c| push::Take::Hold(c));
}
