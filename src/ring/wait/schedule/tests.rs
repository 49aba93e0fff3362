//! The wait schedule on real threads and futexes, with hang-only bounds,
//! and its in-flight rule on the pure state machine.

use super::*;
use crate::layout::{ClientLine, RingHeader, CLIENT_BYTES};
use crate::ring::wait::{publish_seq, wake_if_parked};
use crate::shm::Region;

fn regions() -> (Region, Region) {
    let (ring, _) = Region::create("wait-test-ring", std::mem::size_of::<RingHeader>() as u64).unwrap();
    let (client, _) = Region::create("wait-test-client", CLIENT_BYTES).unwrap();
    (ring, client)
}

/// A frame ring's doorbell words, `pending_seq` included.
fn ring_bell(h: &RingHeader) -> Bell<'_> {
    Bell {
        seq: &h.seq.global_seq,
        producer: &h.producer,
        pending: Some(&h.seq.pending_seq),
        push: None,
        loaned: None,
    }
}

/// A ring whose frame 1 is announced (`pending_seq`) but not committed,
/// a subscriber's client region, and the time.
fn in_flight() -> (Region, Region, Instant) {
    let (ring, client) = regions();
    ring.at::<RingHeader>(0).seq.pending_seq.store(1, Ordering::Relaxed);
    (ring, client, Instant::now())
}

/// Waits for frame 1 from `t`, with no first spin and 5 s for the
/// deadline and the park slice (only the in-flight rule or a ring ends
/// it early).
fn wait_long(bell: Bell<'_>, line: &ClientLine, t: Instant) -> WaitOutcome {
    wait_on(
        bell,
        line,
        0,
        t + Duration::from_secs(5),
        Duration::ZERO,
        Duration::from_secs(5),
        || true,
    )
}

/// The publisher's GPU stores `global_seq` and rings nobody: the
/// subscriber saw the commit in flight (`pending_seq`) and must not be
/// parked when it lands.
#[test]
fn a_commit_seen_in_flight_is_waited_for_without_parking() {
    let (ring, client, t) = in_flight();
    let h = ring.at::<RingHeader>(0);
    let line = client.at::<ClientLine>(0);
    let bell = ring_bell(h);
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            // Later than the CPU spin: found by a nap, not a park slice.
            std::thread::sleep(Duration::from_millis(10));
            h.seq.global_seq.store(1, Ordering::Release);
        });
        wait_long(bell, line, t)
    });
    assert_eq!(outcome, WaitOutcome::Advanced(1));
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "parked through an in-flight commit: {:?}",
        t.elapsed()
    );
    assert_eq!(line.parked.load(Ordering::Relaxed), 0, "left parked");
}

/// A commit seen in flight is spun for once; while it stays in flight
/// it is looked at after naps that double up to their longest; nothing
/// newer than what the waiter waits for in flight means a plain park.
#[test]
fn a_commit_in_flight_is_spun_for_once_then_napped_for_with_growing_naps() {
    let mut f = InFlight::default();
    assert_eq!(f.step(0, 0), InFlightStep::Park);
    assert_eq!(f.step(3, 3), InFlightStep::Park, "not newer than what it waits for");
    assert_eq!(f.step(1, 0), InFlightStep::Spin);
    let naps: Vec<InFlightStep> = (0..9).map(|_| f.step(1, 0)).collect();
    let ms = |us: u64| InFlightStep::Nap(Duration::from_micros(us));
    assert_eq!(
        naps,
        [
            ms(200),
            ms(400),
            ms(800),
            ms(1_600),
            ms(3_200),
            ms(6_400),
            ms(12_800),
            ms(20_000),
            ms(20_000)
        ]
    );
    // A newer commit announced meanwhile is spun for too.
    assert_eq!(f.step(2, 0), InFlightStep::Spin);
    // Once it landed, what the waiter waits for has moved past it.
    assert_eq!(f.step(2, 2), InFlightStep::Park);
}

/// A commit withdrawn after its enqueue failed and announced again (the
/// publisher's retry of the same seq, rung at its announcement like any
/// other) is spun for again, and its naps start over: it is not left to
/// the naps of the first announcement (which by then last 20 ms).
#[test]
fn a_commit_announced_again_after_a_withdrawal_is_spun_for_afresh() {
    let mut f = InFlight::default();
    assert_eq!(f.step(1, 0), InFlightStep::Spin);
    for _ in 0..8 {
        f.step(1, 0);
    }
    assert_eq!(f.step(1, 0), InFlightStep::Nap(IN_FLIGHT_NAP_MAX));
    // Withdrawn: nothing in flight, the waiter parks.
    assert_eq!(f.step(0, 0), InFlightStep::Park);
    // Announced again: spun for, then the shortest nap.
    assert_eq!(f.step(1, 0), InFlightStep::Spin);
    assert_eq!(f.step(1, 0), InFlightStep::Nap(IN_FLIGHT_NAP_MIN));
}

/// The same withdrawal and announcement again with a real waiter: the
/// commit that lands after it ends the wait (the rule itself is the
/// test above; the bound here only catches a hang).
#[test]
fn a_commit_announced_again_after_a_withdrawal_is_found_when_it_lands() {
    let (ring, client, t) = in_flight();
    let h = ring.at::<RingHeader>(0);
    let line = client.at::<ClientLine>(0);
    let bell = ring_bell(h);
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            // After the first spin (2 ms) and naps grown to 12.8 ms.
            std::thread::sleep(Duration::from_millis(20));
            h.seq.pending_seq.store(0, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
            h.seq.pending_seq.store(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            wake_if_parked(line);
            std::thread::sleep(Duration::from_micros(500));
            h.seq.global_seq.store(1, Ordering::Release);
        });
        wait_long(bell, line, t)
    });
    assert_eq!(outcome, WaitOutcome::Advanced(1));
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "parked through the commit: {:?}",
        t.elapsed()
    );
}

/// Without `pending_seq` ahead, the same silent store is only found when
/// the park slice ends: the test above fails without the in-flight rule.
#[test]
fn without_a_commit_in_flight_a_silent_store_waits_for_the_slice() {
    let (ring, client) = regions();
    let h = ring.at::<RingHeader>(0);
    let line = client.at::<ClientLine>(0);
    let bell = ring_bell(h);
    let slice = Duration::from_millis(300);
    let t = Instant::now();
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            // Store once the waiter is parked, so a late start of the waiter
            // cannot let it find the store before it parks.
            while line.parked.load(Ordering::Relaxed) == 0 && t.elapsed() < Duration::from_secs(5) {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(20));
            h.seq.global_seq.store(1, Ordering::Release);
        });
        wait_on(bell, line, 0, t + Duration::from_secs(5), Duration::ZERO, slice, || {
            true
        })
    });
    assert_eq!(outcome, WaitOutcome::Advanced(1));
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "woke without a doorbell: {:?}",
        t.elapsed()
    );
}

/// A commit that never lands (a stuck GPU) is spun for once, then looked
/// at after growing naps: the wait ends at its deadline, not spinning
/// throughout.
#[test]
fn a_commit_that_never_lands_is_not_spun_for_forever() {
    let (ring, client, _) = in_flight();
    let h = ring.at::<RingHeader>(0);
    let line = client.at::<ClientLine>(0);
    let bell = ring_bell(h);
    let cpu = || {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
    };
    let (t, c) = (Instant::now(), cpu());
    let outcome = wait_on(
        bell,
        line,
        0,
        t + Duration::from_millis(200),
        Duration::ZERO,
        Duration::from_millis(50),
        || true,
    );
    assert_eq!(outcome, WaitOutcome::TimedOut);
    let used = cpu() - c;
    assert!(used < Duration::from_millis(100), "spun {used:?} of a 200 ms wait");
}

use crate::layout::ProducerLine;
use std::sync::atomic::AtomicU64;

/// The words of one ring and one subscriber, zeroed, in this process.
struct Words {
    seq: AtomicU64,
    producer: Box<ProducerLine>,
    client: Box<ClientLine>,
}

fn words() -> Words {
    // SAFETY: both are `repr(C)` structs of atomic integers only, for
    // which all-zero bits are a valid value (a fresh memfd's contents).
    let (producer, client) = unsafe {
        (
            Box::new(std::mem::MaybeUninit::<ProducerLine>::zeroed().assume_init()),
            Box::new(std::mem::MaybeUninit::<ClientLine>::zeroed().assume_init()),
        )
    };
    Words {
        seq: AtomicU64::new(0),
        producer,
        client,
    }
}

impl Words {
    fn bell(&self) -> Bell<'_> {
        Bell {
            seq: &self.seq,
            producer: &self.producer,
            pending: None,
            push: None,
            loaned: None,
        }
    }

    /// [`wait_on`] `bell` for a seq after `after`, for at most `ms`:
    /// a 100 µs spin, then park slices of 5 ms.
    fn wait_briefly(&self, bell: Bell<'_>, after: u64, ms: u64) -> WaitOutcome {
        wait_on(
            bell,
            &self.client,
            after,
            Instant::now() + Duration::from_millis(ms),
            Duration::from_micros(100),
            Duration::from_millis(5),
            || true,
        )
    }

    /// [`wait_with`] for any seq after 0, no spin, park slices of
    /// `slice`, following `plan`.
    fn wait_planned(&self, deadline: Instant, slice: Duration, plan: &mut Fixed) -> WaitOutcome {
        wait_with(
            self.bell(),
            &self.client,
            0,
            deadline,
            Duration::ZERO,
            slice,
            plan,
            || true,
        )
    }
}

#[test]
fn a_pushed_frame_ends_the_wait_before_global_seq_moves_but_one_being_written_does_not() {
    let w = words();
    let push = [AtomicU64::new(3), AtomicU64::new(0), AtomicU64::new(0)];
    let wait = |w: &Words, after: u64, ms: u64| {
        w.wait_briefly(
            Bell {
                push: Some(&push),
                ..w.bell()
            },
            after,
            ms,
        )
    };
    w.seq.store(3, Ordering::Release);
    // Buffer 1 is being written for frame 4: not a frame yet.
    push[1].store(4 | SEQ_WRITING, Ordering::Release);
    assert_eq!(wait(&w, 3, 30), WaitOutcome::TimedOut);
    // Its copy is done: the wait ends at 4, global_seq still 3.
    push[1].store(4, Ordering::Release);
    assert_eq!(wait(&w, 3, 1000), WaitOutcome::Advanced(4));
    // global_seq ahead of every push word still counts.
    w.seq.store(9, Ordering::Release);
    assert_eq!(wait(&w, 4, 1000), WaitOutcome::Advanced(9));
}

#[test]
fn a_loan_of_the_next_frames_slot_ends_a_queued_pull_wait_and_nothing_else_in_that_slot_does() {
    let w = words();
    let slot_seq = AtomicU64::new(0);
    let wait = |w: &Words, after: u64, ms: u64| {
        w.wait_briefly(
            Bell {
                loaned: Some((&slot_seq, 5)),
                ..w.bell()
            },
            after,
            ms,
        )
    };
    w.seq.store(4, Ordering::Release);
    // The slot still holds the frame of the last lap (5 - 4 slots).
    slot_seq.store(1, Ordering::Relaxed);
    assert_eq!(wait(&w, 4, 30), WaitOutcome::TimedOut);
    // Loaned for another seq (a reader that fell a lap behind): not ours.
    slot_seq.store(9 | SEQ_WRITING, Ordering::Relaxed);
    assert_eq!(wait(&w, 4, 30), WaitOutcome::TimedOut);
    // Loaned for 5: the wait ends at 5 while global_seq is still 4.
    slot_seq.store(5 | SEQ_WRITING, Ordering::Relaxed);
    assert_eq!(wait(&w, 4, 1000), WaitOutcome::Advanced(5));
    // A loan seen while parked ends the wait at the next look (here
    // the park slice), though nobody rings the doorbell for a loan.
    slot_seq.store(1, Ordering::Relaxed);
    let t = Instant::now();
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            slot_seq.store(5 | SEQ_WRITING, Ordering::Relaxed);
        });
        wait(&w, 4, 2000)
    });
    assert_eq!(outcome, WaitOutcome::Advanced(5));
    assert!(t.elapsed() < Duration::from_millis(1000), "{:?}", t.elapsed());
    // A loan left unpublished when the publisher closed is not a frame.
    w.producer.state.store(PRODUCER_CLOSED, Ordering::Release);
    assert_eq!(wait(&w, 4, 1000), WaitOutcome::ProducerClosed);
}

/// A plan whose one window is `from..until`.
fn window(from: Instant, until: Instant) -> Fixed {
    Fixed(Some(SpinWindow { from, until }), 0, 0, 0, 0)
}

/// A fixed window, counting the timer reports (noting the thread's
/// timer slack at the last one: the park that just ended ran on it), the
/// window's openings and the parks on the window's timer.
struct Fixed(Option<SpinWindow>, u32, u64, u32, u32);
impl WaitPlan for Fixed {
    fn window(&mut self) -> Option<SpinWindow> {
        self.0
    }
    fn timer_woke(&mut self, _late: Duration) {
        self.1 += 1;
        self.2 = rustix::thread::current_timer_slack().expect("PR_GET_TIMERSLACK");
    }
    fn window_opened(&mut self) {
        self.3 += 1;
    }
    fn parked_for_window(&mut self) {
        self.4 += 1;
    }
}

/// Parked before its window, rung (here: found at its first look) with
/// a commit in flight, the subscriber spins for the commit; once the
/// window's start passes during that spin, the spin is the window's:
/// the frame that lands then is reported to the plan as
/// spun for, not as an early frame (which the cadence would count as
/// early, and whose lateness after the window's start it would learn
/// as timer overshoot).
#[test]
fn an_in_flight_spin_that_reaches_the_window_is_the_windows_spin() {
    let w = words();
    let pending = AtomicU64::new(1);
    let start = Instant::now();
    let mut plan = window(start + Duration::from_micros(500), start + Duration::from_millis(100));
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            // Inside the in-flight spin, after the window's start. A
            // store that comes later (a loaded machine) is found by
            // the same spin, which the window's start extends to the
            // window's end; one whose wait starts past the window's
            // start is found by the window's own spin. Either way it
            // is the window's.
            std::thread::sleep(Duration::from_millis(1));
            w.seq.store(1, Ordering::Release);
        });
        wait_with(
            Bell {
                pending: Some(&pending),
                ..w.bell()
            },
            &w.client,
            0,
            start + Duration::from_secs(10),
            Duration::ZERO,
            Duration::from_secs(5),
            &mut plan,
            || true,
        )
    });
    assert_eq!(out, WaitOutcome::Advanced(1));
    // Loose: a park slice (5 s), not the spin or a nap, would end it later.
    assert!(start.elapsed() < Duration::from_secs(4), "{:?}", start.elapsed());
    assert_eq!(plan.3, 1, "the window's spin began inside the in-flight spin");
    assert_eq!(plan.1, 0, "no timer overshoot was reported");
    assert_eq!(plan.4, 0, "it never parked on the window's timer");
}

/// The window opens 200 ms in: only a thread held off the CPU that long
/// before its first park would reach it without the park's timer.
#[test]
fn the_window_timer_runs_without_slack_and_the_threads_own_is_put_back() {
    let own = std::num::NonZeroU64::new(123_456);
    rustix::thread::set_current_timer_slack(own).expect("PR_SET_TIMERSLACK");
    let w = words();
    let start = Instant::now();
    let mut plan = window(start + Duration::from_millis(200), start + Duration::from_millis(210));
    let out = w.wait_planned(start + Duration::from_millis(230), Duration::from_millis(20), &mut plan);
    assert_eq!(out, WaitOutcome::TimedOut);
    assert_eq!(plan.1, 1, "the park's timer ended at the window");
    assert!(plan.4 >= 1, "the park on the window's timer was not reported");
    assert_eq!(plan.2, 1, "the park to the window ran on a 1 ns slack");
    assert_eq!(rustix::thread::current_timer_slack().ok(), own.map(|n| n.get()));
    // A wait with no window leaves the slack alone throughout.
    let mut none = Fixed(None, 0, 0, 0, 0);
    let out = w.wait_planned(
        Instant::now() + Duration::from_millis(5),
        Duration::from_millis(2),
        &mut none,
    );
    assert_eq!(out, WaitOutcome::TimedOut);
    assert_eq!(none.4, 0, "no window, no park on its timer");
    assert_eq!(rustix::thread::current_timer_slack().ok(), own.map(|n| n.get()));
}

#[test]
fn a_frame_before_the_window_wakes_the_planned_wait_through_the_doorbell() {
    let w = words();
    let start = Instant::now();
    let mut plan = window(start + Duration::from_secs(20), start + Duration::from_secs(21));
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(30));
            publish_seq(&w.seq, 1);
            wake_if_parked(&w.client);
        });
        w.wait_planned(start + Duration::from_secs(30), Duration::from_secs(30), &mut plan)
    });
    assert_eq!(out, WaitOutcome::Advanced(1));
    // Loose: the doorbell, not the window 20 s away, ended the wait.
    assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
    assert_eq!(plan.1, 0, "no timer woke it");
    assert!(plan.4 >= 1, "it parked on the window's timer");
}

/// The window opens 200 ms in and the seq moves 200 ms after that:
/// only a 200 ms stall of the waiter, before its first park or after
/// its timer fired, could miss the timer's report.
#[test]
fn the_window_catches_a_frame_without_a_doorbell() {
    let w = words();
    let start = Instant::now();
    let mut plan = window(start + Duration::from_millis(200), start + Duration::from_secs(20));
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(400));
            // The seq moves but nobody rings: only a spinning waiter sees it.
            publish_seq(&w.seq, 7);
        });
        w.wait_planned(start + Duration::from_secs(30), Duration::from_secs(30), &mut plan)
    });
    assert_eq!(out, WaitOutcome::Advanced(7));
    assert!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
    assert_eq!(plan.1, 1, "the park's timer ended at the window");
}

#[test]
fn a_planned_wait_with_no_frame_ends_at_its_deadline() {
    let w = words();
    let start = Instant::now();
    let mut plan = window(start + Duration::from_millis(5), start + Duration::from_millis(15));
    let out = w.wait_planned(start + Duration::from_millis(60), Duration::from_millis(20), &mut plan);
    assert_eq!(out, WaitOutcome::TimedOut);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(60) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // It leaves no park flag set behind it.
    assert_eq!(w.client.parked.load(Ordering::Relaxed), 0);
}

#[test]
fn a_planned_wait_notices_a_closed_publisher() {
    let w = words();
    let start = Instant::now();
    let mut plan = window(start + Duration::from_secs(20), start + Duration::from_secs(21));
    w.producer.state.store(PRODUCER_CLOSED, Ordering::Release);
    let out = w.wait_planned(start + Duration::from_secs(30), Duration::from_millis(20), &mut plan);
    assert_eq!(out, WaitOutcome::ProducerClosed);
    assert!(start.elapsed() < Duration::from_secs(10));
}
