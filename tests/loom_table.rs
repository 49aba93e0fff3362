//! Model checks of the subscriber-entry lifecycle (`src/ring/table.rs`,
//! protocol v2) under loom: assign, live, holder, with_client, evict, free,
//! reap and wake_parked, run by the service, the producer, a subscriber and
//! a hostile reader at once.
//!
//! The models drive the table's own code through the `cfg(loom)`-only
//! wrappers in `vramring::seam::ring::loom_table` (`src/ring/table.rs`,
//! `loom_api`): the table and every client region are real memfds, mapped
//! by the publisher and (read-only for the table) by the subscriber as in a
//! Welcome; their atomics and the table's per-entry mutexes are loom's.
//! The subscriber's liveness check is `Lease::still_ours`
//! (`src/ring/lease.rs`), restated here over its read-only mapping.
//!
//! * a hostile reader writing anything to its own client region (the
//!   cursor past the newest seq and back, `parked` flapping, a garbage
//!   `push_held`) never moves the producer's clamped view past `newest` or
//!   back, rings no other subscriber's doorbell, and gets no push buffer
//!   index out of range;
//! * an eviction decided for generation `g` never lands on the entry after
//!   the service freed it and gave it to a newcomer, and a later reap of
//!   that eviction never frees the newcomer (no double free);
//! * a subscriber sees its eviction or its free at its next check, and
//!   never sees its lease come back; the producer never reads a client
//!   region after the service freed it (`with_client`/`holder` run their
//!   closure only while the entry still holds that client), and an entry
//!   freed while it was being evicted ends FREE, not leaked.
//!
//! Deliberate mutants, each caught (the `_is_caught` tests below run the
//! first two; the rest were checked by hand by editing `table.rs`, running
//! this file and reverting):
//! * evict without the generation check (a bare ACTIVE -> EVICTED CAS):
//!   evicts the newcomer; `an_evict_without_the_generation_check_is_caught`;
//! * evict with the generation check and the CAS but not under the entry's
//!   lock (the table as of eb22d0f): the check and the CAS are two steps,
//!   and a free + reassign between them is an ABA that evicts the newcomer;
//!   `an_evict_whose_check_and_cas_are_apart_is_caught`;
//! * `holder` without the clamp to `newest` ("view past newest");
//! * `holder` without the `max` with its previous view ("view moved back");
//! * `with_client` without its generation filter ("handed over another
//!   subscriber's region" in the reassign model).
//!
//! Run with `.ci/loom.sh`. `LOOM_MAX_PREEMPTIONS` overrides each model's
//! preemption bound.
#![cfg(loom)]

use std::cell::Cell;
use std::os::fd::AsFd;

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

use vramring::seam::layout::{SubEntry, EVICT_LEASE, PUSH_BUFFERS, SUBF_LOSSLESS, SUB_ACTIVE, SUB_EVICTED, SUB_FREE};
use vramring::seam::protocol::push;
use vramring::seam::ring::loom_table::{LoomTable, Mapped};

fn model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(preemptions);
    }
    b.check(f);
}

/// `Lease::still_ours`: the subscriber's two loads of its own entry.
fn still_ours(e: &SubEntry, generation: u32) -> bool {
    // SYNC: sub-state — Acquire, as in `Lease::still_ours`.
    e.state.load(Ordering::Acquire) == SUB_ACTIVE && e.generation.load(Ordering::Relaxed) == generation
}

/// An eviction as the producer's lossless gate makes it: `Table::evict`, or
/// one of the mutants, which call `between` just before their CAS.
type Evict = fn(&LoomTable, usize, u32, &dyn Fn()) -> bool;

fn evict_real(t: &LoomTable, index: usize, generation: u32, _between: &dyn Fn()) -> bool {
    t.evict(index, generation, EVICT_LEASE)
}

/// Mutant: no generation check, only the ACTIVE -> EVICTED CAS.
fn evict_without_generation(t: &LoomTable, index: usize, _generation: u32, between: &dyn Fn()) -> bool {
    let e = t.entry(index);
    between();
    e.evict_code.store(EVICT_LEASE, Ordering::Relaxed);
    e.state
        .compare_exchange(SUB_ACTIVE, SUB_EVICTED, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
}

/// Mutant: `Table::evict` as of eb22d0f: the generation check, then the
/// CAS, with nothing holding the entry between them.
fn evict_check_then_cas(t: &LoomTable, index: usize, generation: u32, between: &dyn Fn()) -> bool {
    let e = t.entry(index);
    if e.generation.load(Ordering::Relaxed) != generation {
        return false;
    }
    between();
    e.evict_code.store(EVICT_LEASE, Ordering::Relaxed);
    e.state
        .compare_exchange(SUB_ACTIVE, SUB_EVICTED, Ordering::AcqRel, Ordering::Relaxed)
        .is_ok()
}

/// The service frees the entry of a closed connection and gives it to a
/// newcomer, while the producer, which found the first subscriber holding
/// it up (`holder`), evicts the generation it saw. Afterwards the service
/// reaps an eviction of the first subscriber (its connection is gone), as
/// `handle_evictions` does. The newcomer is never evicted or freed by what
/// was decided about its predecessor.
///
/// `mutant`: the eviction is one of the mutants above, whose CAS is not
/// under the entry's lock. It then races the plain store of FREE in
/// `Table::free`, and for such a race loom also generates executions that
/// no C++/Rust memory model allows (the store lands between the CAS's read
/// and its write; tokio-rs/loom#254, #389), which would "catch" a mutant
/// for the wrong reason. So a mutant's producer waits, between its check
/// and its CAS, until the service has freed and reassigned the entry (or
/// has nothing to wait for): the ABA window, opened on purpose, with every
/// store to `state` ordered before the CAS. The table's own `evict` runs
/// unsteered over every interleaving.
fn eviction_vs_reassign(evict: Evict, mutant: bool) {
    model(3, move || {
        let table = Arc::new(LoomTable::create(1));
        let a1 = table.assign(SUBF_LOSSLESS, 0).expect("a free entry");
        let (k, g1) = (a1.index, a1.generation);
        // Each subscriber marks its own region (`reading_seq`, a word it
        // owns), so the producer can tell whose region it was handed.
        let mark = |g: u32| 100 + u64::from(g);
        // Relaxed: spawning orders it before the producer's loads.
        Mapped::client(a1.as_fd())
            .line()
            .reading_seq
            .store(mark(g1), Ordering::Relaxed);
        drop(a1);
        let reassigned = Arc::new(AtomicBool::new(false));
        let service = {
            let (table, reassigned) = (Arc::clone(&table), Arc::clone(&reassigned));
            thread::spawn(move || {
                table.free(k);
                let Some(a2) = table.assign(SUBF_LOSSLESS, 0) else {
                    let state = table.entry(k as usize).state.load(Ordering::Relaxed);
                    panic!("no free entry after the free: state {state}");
                };
                assert_eq!(a2.index, k);
                // SYNC: the model's steering edge for mutants (see above).
                reassigned.store(true, Ordering::Release);
                a2.generation
            })
        };
        let producer = {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                let between = || {
                    while mutant && !reassigned.load(Ordering::Acquire) {
                        thread::yield_now();
                    }
                };
                let b = table.holder(0, |_| true)?;
                if b.generation == g1 {
                    let m = table.with_client(b.index, g1, |_, c| c.reading_seq.load(Ordering::Relaxed));
                    assert!(
                        m.is_none_or(|m| m == mark(g1)),
                        "with_client for generation {g1} handed over another subscriber's region (mark {m:?})"
                    );
                }
                Some((b.generation, evict(&table, b.index, b.generation, &between)))
            })
        };
        let g2 = service.join().unwrap();
        let seen = producer.join().unwrap();
        assert_ne!(g1, g2);
        let evicted = match seen {
            Some((g, true)) => Some(g),
            _ => None,
        };
        let e = table.entry(k as usize);
        assert_eq!(e.generation.load(Ordering::Relaxed), g2);
        let state = e.state.load(Ordering::Relaxed);
        if evicted == Some(g2) {
            assert_eq!(state, SUB_EVICTED, "the newcomer's eviction was lost");
        } else {
            assert_eq!(
                state, SUB_ACTIVE,
                "an eviction decided for generation {g1} hit the entry reassigned as {g2} (saw {seen:?})"
            );
        }
        if evicted == Some(g1) {
            // handle_evictions: no connection is left for g1; reap it.
            table.reap(k, g1);
            assert!(
                table.live(k as usize, g2),
                "reaping generation {g1}'s eviction freed the newcomer {g2} (double free)"
            );
        }
    });
}

#[test]
fn an_eviction_never_hits_a_reassigned_entry() {
    eviction_vs_reassign(evict_real, false);
}

#[test]
#[should_panic(expected = "hit the entry reassigned")]
fn an_evict_without_the_generation_check_is_caught() {
    eviction_vs_reassign(evict_without_generation, true);
}

#[test]
#[should_panic(expected = "hit the entry reassigned")]
fn an_evict_whose_check_and_cas_are_apart_is_caught() {
    eviction_vs_reassign(evict_check_then_cas, true);
}

/// A hostile lossless reader writes its client region as it likes while
/// the producer scans (`holder`), rings doorbells (`wake_parked`) and
/// claims a push buffer (`claim_buffer`, which compares `push_held`); an
/// honest subscriber that never parks shares the table. The producer's view
/// stays in `start..=newest` and never moves back, the honest doorbell
/// never rings, and the claimed buffer is in range.
#[test]
fn a_hostile_reader_moves_the_view_neither_past_newest_nor_back() {
    model(3, || {
        let table = Arc::new(LoomTable::create(2));
        let hostile = table.assign(SUBF_LOSSLESS, 1).expect("entry 0");
        let honest = table.assign(0, 0).expect("entry 1");
        let region = Mapped::client(hostile.as_fd());
        let (hk, hg) = (hostile.index as usize, hostile.generation);
        let reader = thread::spawn(move || {
            let l = region.line();
            // Relaxed: a hostile reader orders nothing on purpose.
            l.released_seq.store(7, Ordering::Relaxed);
            l.parked.store(1, Ordering::Relaxed);
            l.push_held.store(u32::MAX, Ordering::Relaxed);
            l.released_seq.store(0, Ordering::Release);
            l.parked.store(0, Ordering::Relaxed);
            l.released_seq.store(u64::MAX, Ordering::Release);
            region
        });
        let view = Cell::new(1u64);
        for newest in [2u64, 3] {
            let b = table.holder(newest, |released| {
                assert!(released <= newest, "view {released} past newest {newest}");
                assert!(
                    released >= view.get(),
                    "view moved back from {} to {released}",
                    view.get()
                );
                view.set(released);
                true
            });
            let b = b.expect("the hostile entry is a lossless holder");
            assert_eq!((b.index, b.generation, b.released), (hk, hg, view.get()));
            table.wake_parked();
            let k = table
                .with_client(hk, hg, |e, c| push::claim_buffer(e, c, None, newest))
                .expect("the hostile entry is assigned");
            assert!(k.is_none_or(|k| k < PUSH_BUFFERS), "claimed push buffer {k:?}");
        }
        let region = reader.join().unwrap();
        let rang = table
            .with_client(honest.index as usize, honest.generation, |_, c| {
                c.doorbell.load(Ordering::Relaxed)
            })
            .expect("the honest entry is assigned");
        assert_eq!(
            rang, 0,
            "a hostile reader's parked flag rang another subscriber's doorbell"
        );
        // Its own doorbell rang at most once per wake_parked.
        assert!(region.line().doorbell.load(Ordering::Relaxed) <= 2);
    });
}

/// The service frees a subscriber's entry (its connection closed) while
/// the producer, finding it a lossless holder, evicts it; the subscriber
/// checks its lease meanwhile, writing a garbage cursor. The subscriber's
/// lease, once lost, never comes back, and is lost at its first check
/// after the free or the eviction; the producer never runs a closure on the
/// client region after the free; the entry ends FREE (after the reap the
/// service does for an eviction that landed on a closed connection).
#[test]
fn a_subscriber_sees_its_eviction_and_a_freed_region_is_never_read() {
    model(3, || {
        let table = Arc::new(LoomTable::create(1));
        let a = table.assign(SUBF_LOSSLESS, 0).expect("a free entry");
        let (k, g) = (a.index, a.generation);
        let subs = Mapped::table(table.fd(), 1);
        let client = Mapped::client(a.as_fd());
        drop(a);
        let freed = Arc::new(AtomicBool::new(false));
        let evicted = Arc::new(AtomicBool::new(false));
        let service = {
            let (table, freed) = (Arc::clone(&table), Arc::clone(&freed));
            thread::spawn(move || {
                table.free(k);
                // SYNC: the model's "free done" edge (the subscriber's
                // EOF/notice stands for it).
                freed.store(true, Ordering::Release);
            })
        };
        let producer = {
            let (table, freed, evicted) = (Arc::clone(&table), Arc::clone(&freed), Arc::clone(&evicted));
            thread::spawn(move || {
                let not_freed = || assert!(!freed.load(Ordering::Acquire), "read a freed client region");
                let Some(b) = table.holder(0, |_| {
                    not_freed();
                    true
                }) else {
                    return false;
                };
                let ok = table.evict(b.index, b.generation, EVICT_LEASE);
                if ok {
                    evicted.store(true, Ordering::Release);
                }
                table.wake_parked();
                let _ = table.with_client(b.index, b.generation, |_, _| not_freed());
                ok
            })
        };
        // Hostile write to its own region: the cursor past anything published.
        client.line().released_seq.store(u64::MAX, Ordering::Release);
        let mut lost = false;
        for _ in 0..2 {
            let told = freed.load(Ordering::Acquire) || evicted.load(Ordering::Acquire);
            let ours = still_ours(subs.entry(k as usize), g);
            assert!(!(lost && ours), "the lease came back after it was lost");
            assert!(!(told && ours), "the subscriber missed its free or eviction");
            lost |= !ours;
        }
        service.join().unwrap();
        let was_evicted = producer.join().unwrap();
        if was_evicted {
            table.reap(k, g);
        }
        assert!(!still_ours(subs.entry(k as usize), g));
        assert_eq!(
            table.entry(k as usize).state.load(Ordering::Relaxed),
            SUB_FREE,
            "the entry leaked"
        );
        assert!(table.with_client(k as usize, g, |_, _| ()).is_none());
    });
}
