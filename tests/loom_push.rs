//! Model check of push delivery's buffer claim/hold handshake
//! (`vramring::seam::protocol::push`) under loom: the publisher never writes a
//! buffer the reader holds, and the reader never takes a buffer mid-write.
//!
//! The publisher's `push_seq` words live in the subscriber's table entry
//! ([`SubEntry`], publisher-written), the reader's `push_held` in its own
//! client region ([`ClientLine`], reader-written), as in protocol v2.
//!
//! Each push buffer's bytes are modelled as [`WORDS`] `AtomicU64`s written
//! and read `Relaxed` (the copy); word `k` of frame `s` holds `s * 16 + k`.
//! Run with `.ci/loom.sh`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

use vramring::seam::layout::{ClientLine, SubEntry, PUSH_BUFFERS};
use vramring::seam::protocol::push;

const WORDS: usize = 2;

struct Target {
    entry: SubEntry,
    client: ClientLine,
    buffers: Vec<[AtomicU64; WORDS]>,
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

/// A push reader's entry, client region and empty buffers.
fn target() -> Arc<Target> {
    Arc::new(Target {
        entry: SubEntry::default(),
        client: ClientLine::default(),
        buffers: (0..PUSH_BUFFERS).map(|_| Default::default()).collect(),
    })
}

/// The publisher's side of one frame: claim, copy, complete.
fn publish(t: &Target, newest: &mut Option<usize>, seq: u64) {
    let Some(k) = push::claim_buffer(&t.entry, &t.client, *newest, seq) else {
        return;
    };
    for (i, w) in t.buffers[k].iter().enumerate() {
        // Relaxed: the copy's plain stores.
        w.store(seq * 16 + i as u64, Ordering::Relaxed);
    }
    push::complete_buffer(&t.entry, k, seq);
    *newest = Some(k);
}

#[test]
fn a_held_push_buffer_is_never_written_and_a_taken_one_is_whole() {
    model(|| {
        let t = target();
        let p = Arc::clone(&t);
        let publisher = thread::spawn(move || {
            let mut newest = None;
            for seq in 1..=5 {
                publish(&p, &mut newest, seq);
            }
        });
        let mut last = 0;
        for _ in 0..2 {
            if let Some((k, seq)) = push::take_newest(&t.entry, &t.client, last, u64::MAX) {
                assert!(seq > last, "seqs only increase");
                // While held, the buffer must stay whole: read it twice.
                for _ in 0..2 {
                    for (i, w) in t.buffers[k].iter().enumerate() {
                        assert_eq!(w.load(Ordering::Relaxed), seq * 16 + i as u64, "buffer {k} torn");
                    }
                }
                last = seq;
            }
        }
        push::release_hold(&t.client);
        publisher.join().unwrap();
    });
}

/// The model can fail: a publisher that skips the hold check (writes any
/// buffer but the newest) is caught tearing a held buffer.
#[test]
#[should_panic(expected = "torn")]
fn a_publisher_that_ignores_the_hold_is_caught() {
    model(|| {
        let t = target();
        let p = Arc::clone(&t);
        let publisher = thread::spawn(move || {
            let mut newest: Option<usize> = None;
            for seq in 1..=5u64 {
                // Broken claim: the next buffer after the newest, no hold check.
                let k = newest.map_or(0, |n| (n + 1) % PUSH_BUFFERS);
                p.entry.push_seq[k].store(seq | vramring::seam::layout::SEQ_WRITING, Ordering::Relaxed);
                for (i, w) in p.buffers[k].iter().enumerate() {
                    w.store(seq * 16 + i as u64, Ordering::Relaxed);
                }
                push::complete_buffer(&p.entry, k, seq);
                newest = Some(k);
            }
        });
        if let Some((k, seq)) = push::take_newest(&t.entry, &t.client, 0, u64::MAX) {
            for _ in 0..2 {
                for (i, w) in t.buffers[k].iter().enumerate() {
                    assert_eq!(w.load(Ordering::Relaxed), seq * 16 + i as u64, "buffer {k} torn");
                }
            }
        }
        publisher.join().unwrap();
    });
}

/// A reader that reads in place without a hold (a push borrow): a read that
/// `still_complete` accepts is whole, while the publisher keeps writing.
#[test]
fn a_push_read_without_a_hold_is_whole_when_still_complete_says_so() {
    model(|| {
        let t = target();
        let p = Arc::clone(&t);
        let publisher = thread::spawn(move || {
            let mut newest = None;
            for seq in 1..=4 {
                publish(&p, &mut newest, seq);
            }
        });
        // The publisher goes first: a peek before any publish finds
        // nothing, and loom's search would not branch from there.
        thread::yield_now();
        if let Some((k, seq)) = push::peek_newest(&t.entry, 0, u64::MAX) {
            let words: Vec<u64> = t.buffers[k].iter().map(|w| w.load(Ordering::Relaxed)).collect();
            if push::still_complete(&t.entry, k, seq) {
                for (i, w) in words.iter().enumerate() {
                    assert_eq!(*w, seq * 16 + i as u64, "buffer {k} torn");
                }
            }
        }
        publisher.join().unwrap();
    });
}

/// The model can fail: a reader that trusts a peeked buffer without the
/// `still_complete` check is caught reading a torn one.
#[test]
#[should_panic(expected = "torn")]
fn a_push_read_without_the_check_is_caught_torn() {
    model(|| {
        let t = target();
        let p = Arc::clone(&t);
        let publisher = thread::spawn(move || {
            let mut newest = None;
            for seq in 1..=4 {
                publish(&p, &mut newest, seq);
            }
        });
        // The publisher goes first: a peek before any publish finds
        // nothing, and loom's search would not branch from there.
        thread::yield_now();
        if let Some((k, seq)) = push::peek_newest(&t.entry, 0, u64::MAX) {
            for (i, w) in t.buffers[k].iter().enumerate() {
                assert_eq!(w.load(Ordering::Relaxed), seq * 16 + i as u64, "buffer {k} torn");
            }
        }
        publisher.join().unwrap();
    });
}

/// The commit's words of one frame, as the stream-order commit kernel stores
/// them: the push word and the slot's seq behind one fence, `global_seq`
/// behind the next (PROTOCOL.md §10.1).
#[derive(Default)]
struct Commit {
    slot_seq: AtomicU64,
    global_seq: AtomicU64,
}

/// Publishes frame 1 to the reader's buffers and commits it, in the
/// kernel's order.
fn commit_one(t: &Target, c: &Commit) {
    let k = push::claim_buffer(&t.entry, &t.client, None, 1).expect("a free buffer");
    for (i, w) in t.buffers[k].iter().enumerate() {
        w.store(16 + i as u64, Ordering::Relaxed);
    }
    push::complete_buffer(&t.entry, k, 1);
    // Release: stands for the kernel's fenced stores.
    c.slot_seq.store(1, Ordering::Release);
    c.global_seq.store(1, Ordering::Release);
}

/// The reader's wait: returns once a push word shows frame 1.
fn wait_for_push_word(t: &Target) -> u64 {
    loop {
        // Acquire: as the wait's load of the push words.
        if t.entry.push_seq.iter().any(|w| w.load(Ordering::Acquire) == 1) {
            return 1;
        }
        thread::yield_now();
    }
}

/// A pushed frame whose commit lands while the reader reads (its push word
/// seen, its slot's seq not yet, then `global_seq` stored) is either taken
/// or left for the next read, never counted as a gap; `hold`: a take
/// (`next`), otherwise a read in place (`borrow`).
fn never_counted_lost(hold: bool) {
    model(move || {
        let t = target();
        let c = Arc::new(Commit::default());
        let (pt, pc) = (Arc::clone(&t), Arc::clone(&c));
        let gpu = thread::spawn(move || commit_one(&pt, &pc));
        let g = wait_for_push_word(&t);
        // Acquire: the slot seqlock's load in `look`.
        let look = |_, s| (c.slot_seq.load(Ordering::Acquire) == s).then_some(());
        let how = if hold {
            push::Take::Hold(&t.client)
        } else {
            push::Take::Peek
        };
        let bufs = push::Buffers {
            count: PUSH_BUFFERS,
            order: push::Order::Newest,
        };
        match push::read_pushed(&t.entry, how, bufs, &c.global_seq, 0, g, look) {
            push::PushRead::Took(_, seq, ()) => assert_eq!(seq, 1),
            push::PushRead::NotPushed(upto) => assert_eq!(upto, 0, "frame 1 was pushed, yet counted lost"),
            push::PushRead::Lost(seq) => panic!("a latest reader never loses a frame's meta alone ({seq})"),
        }
        gpu.join().unwrap();
    });
}

#[test]
fn a_pushed_frame_whose_commit_lands_during_the_read_is_never_counted_lost() {
    never_counted_lost(true);
}

#[test]
fn a_pushed_frame_whose_commit_lands_during_a_borrow_is_never_counted_lost() {
    never_counted_lost(false);
}

/// The model can fail: a reader that loads `global_seq` after the take (the
/// order before ADR 0015) counts the frame lost in some interleaving.
#[test]
#[should_panic(expected = "counted lost")]
fn a_reader_that_loads_global_seq_after_the_take_is_caught_counting_a_pushed_frame_lost() {
    model(|| {
        let t = target();
        let c = Arc::new(Commit::default());
        let (pt, pc) = (Arc::clone(&t), Arc::clone(&c));
        let gpu = thread::spawn(move || commit_one(&pt, &pc));
        let g = wait_for_push_word(&t);
        let taken = push::take_newest(&t.entry, &t.client, 0, u64::MAX)
            // Acquire: the slot seqlock's load.
            .filter(|&(_, s)| c.slot_seq.load(Ordering::Acquire) == s);
        if taken.is_none() {
            // Acquire: the old order's load of `global_seq`, after the take.
            let upto = g.min(c.global_seq.load(Ordering::Acquire));
            assert_eq!(upto, 0, "frame 1 was pushed, yet counted lost");
        }
        gpu.join().unwrap();
    });
}
