//! Queued pull: a copy enqueued on the GPU behind a wait for the frame's
//! commit, finished, kept across calls or set aside.

use super::*;

/// A queued copy is polled in a spin this long (its commit normally lands
/// within microseconds), then with naps doubling between these bounds.
const QUEUED_SPIN: Duration = Duration::from_millis(2);
const QUEUED_NAP_MIN: Duration = Duration::from_micros(50);
const QUEUED_NAP_MAX: Duration = Duration::from_millis(5);
/// Past the deadline, a copy whose commit has landed is still waited for
/// this long (it finishes within microseconds) rather than left queued.
/// Short: a copy that never runs (the publisher's gate store failed) costs
/// each call this much past its timeout.
const QUEUED_LANDED_GRACE: Duration = Duration::from_millis(20);
/// Wherever a queued copy is given up, it is first given this long to
/// finish (its commit normally follows the loan within
/// microseconds, and a publisher that closed in order opened the gate for
/// it) before it is set aside.
const QUEUED_CLOSE_WAIT: Duration = Duration::from_millis(20);

/// When a queued copy's wait ends: at the call's deadline, or, once its
/// commit has landed (the copy then finishes within microseconds),
/// [`QUEUED_LANDED_GRACE`] after it.
pub(super) fn queued_wait_end(deadline: Instant, landed: bool) -> Instant {
    if landed {
        crate::time::deadline_after(deadline, QUEUED_LANDED_GRACE)
    } else {
        deadline
    }
}

/// A copy queued on the GPU behind a commit (ADR 0010, 0014) whose frame
/// is neither delivered nor given up yet.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    pub(super) pick: protocol::Pick,
    /// Queued at the publisher's loan, before the commit was announced.
    pub(super) at_loan: bool,
    /// When it was queued: the spin budget counts from here, across calls.
    pub(super) queued: Instant,
}

impl Subscriber {
    /// Queued pull of `pick`, whose slot is loaned or whose commit is
    /// announced, but which has not landed: enqueues a GPU wait on the
    /// commit and the copy behind it, then finishes it as
    /// [`Subscriber::finish_queued`] does.
    pub(super) fn queued_copy(
        &mut self,
        pick: protocol::Pick,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Option<(SlotSnapshot, u64)>> {
        // Relaxed: informational.
        self.client().reading_seq.store(pick.seq, Ordering::Relaxed);
        let offset = (pick.seq & self.info.mask()) * self.info.geometry.slot_stride;
        // SYNC: pending — Relaxed: only says whether the copy starts at the
        // loan (a counter); nothing is read on the strength of it.
        let at_loan = self.header().seq.pending_seq.load(Ordering::Relaxed) < pick.seq;
        let len = self.info.geometry.frame_bytes;
        self.pool
            .queued()
            .ok_or(Error::WrongBackend {
                what: "a copy queued behind a GPU wait",
                backend: BackendKind::Host.name(),
            })?
            .copy_out_gated(pick.seq, offset, len)?;
        let f = InFlight {
            pick,
            at_loan,
            queued: Instant::now(),
        };
        self.in_flight = Some(f);
        self.finish_queued(f, deadline, timeout)
    }

    /// Polls the queued copy `f` until its commit has landed and the copy
    /// is done, then validates the frame as every pull does, and returns it
    /// with the frames skipped before it. `None` when the frame was
    /// overwritten (counted), already delivered, or the copy was settled
    /// because the publisher is gone (the caller's loop then reports the
    /// publisher's end). At the deadline, a copy whose commit has not come
    /// stays queued for the next call: [`Error::Timeout`].
    pub(super) fn finish_queued(
        &mut self,
        f: InFlight,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Option<(SlotSnapshot, u64)>> {
        if f.pick.seq <= self.last {
            // Delivered meanwhile (a borrow). Its gate may still be on its
            // way (a CPU commit stores it after `global_seq`): the copy is
            // let finish, within a bound, before the stream is used again.
            self.settle_in_flight()?;
            return Ok(None);
        }
        // The gap before it, from what was delivered since it was queued
        // (a borrow may have delivered frames in between).
        let pick = protocol::Pick {
            seq: f.pick.seq,
            skipped: f.pick.seq - self.last - 1,
        };
        let mut nap = QUEUED_NAP_MIN;
        loop {
            // SYNC: global-seq — Acquire: the commit has landed, so the GPU's
            // wait is released and the copy finishes within microseconds.
            // Until then only this load is polled: a driver call per spin
            // (`cuStreamQuery`) would contend with every other thread of
            // the process on the context's lock.
            let landed = self.header().seq.global_seq.load(Ordering::Acquire) >= pick.seq;
            if landed {
                match self.poll_queued() {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => {
                        // Never leave the wait on the stream `close` syncs.
                        self.in_flight = None;
                        self.stats.abandoned += 1;
                        if let Err(ae) = self.abandon_queued() {
                            tracing::warn!(error = %ae, "setting aside a queued copy after a failed query");
                        }
                        return Err(e);
                    }
                }
            }
            let now = Instant::now();
            let end = queued_wait_end(deadline, landed);
            let expired = now >= end;
            // SYNC: producer-state — Acquire pairs with the publisher's
            // Release at close (after it opened the gate).
            let closed = self.header().producer.state.load(Ordering::Acquire) == PRODUCER_CLOSED;
            let gone = now >= f.queued + QUEUED_SPIN
                && (closed
                    || !self.lease.quiet() && {
                        if let Err(e) = self.lease.check_or_drain() {
                            // Evicted, or the socket failed: the copy is
                            // settled and the caller hears why.
                            self.client().reading_seq.store(0, Ordering::Relaxed);
                            self.settle_in_flight()?;
                            return Err(e);
                        }
                        self.lease.draining()
                    });
            if gone {
                self.client().reading_seq.store(0, Ordering::Relaxed);
                // A publisher that closed in order opened the gate for every
                // queued copy before it said so: such a copy runs within
                // microseconds. One that died may never commit this frame:
                // the copy is then set aside with what it uses.
                self.settle_in_flight()?;
                self.lease.ensure_or_drain()?;
                return Ok(None);
            }
            if expired {
                if landed {
                    // Committed, yet the copy has not run within the grace
                    // after the deadline (its gate store failed): set it
                    // aside; the next call copies the frame after the commit.
                    self.settle_in_flight()?;
                }
                // Otherwise the publisher lives, and the commit has not come
                // (a loan it has not published yet, or a GPU far behind):
                // the copy stays queued and the next call resumes it.
                return Err(Error::Timeout(timeout, "the next frame"));
            }
            // SYNC: pending — Relaxed: whether the commit was announced
            // only picks how to wait for it.
            let announced = self.header().seq.pending_seq.load(Ordering::Relaxed) >= pick.seq;
            if now < f.queued + QUEUED_SPIN {
                std::hint::spin_loop();
            } else if !announced {
                // Queued at a loan that is still not published: wait parked
                // (the publisher rings parked subscribers when it announces
                // the commit, and the wait then spins for it to land, ADR
                // 0017) rather than nap past it. Every outcome is looked at
                // again above.
                let lease = &self.lease;
                protocol::wait_for_seq(
                    self.control.at::<RingHeader>(0),
                    lease.client(),
                    pick.seq - 1,
                    deadline,
                    Duration::ZERO,
                    self.opts.client.park_slice,
                    || lease.quiet(),
                );
            } else {
                // Up to the wait's end, which for a landed commit lies past
                // the deadline: napping only to the deadline would spin
                // through the grace.
                std::thread::sleep(
                    nap.min(end.saturating_duration_since(now))
                        .max(Duration::from_micros(1)),
                );
                nap = (nap * 2).min(QUEUED_NAP_MAX);
            }
        }
        self.in_flight = None;
        let slot = self.slot(pick.seq);
        let whole = match SlotSnapshot::look(slot, pick.seq) {
            Look::Ready(snap) if snap.still_valid(slot) => Some(snap),
            // The GPU saw the commit, so the slot cannot still be older;
            // validate again on the next pass rather than trust it.
            Look::NotYet => return Ok(None),
            _ => None,
        };
        let Some(snap) = whole else {
            // Overwritten before or during the copy: lost, in either mode.
            self.stats.overruns += 1;
            self.lost(pick.skipped + 1);
            self.last = pick.seq;
            self.publish_counters();
            return Ok(None);
        };
        self.stats.queued += 1;
        if f.at_loan {
            self.stats.queued_at_loan += 1;
        }
        let skipped = self.deliver(&snap, pick.skipped);
        Ok(Some((snap, skipped)))
    }

    /// Wherever a queued copy is given up (its frame delivered or passed
    /// over, the publisher gone, an error, this subscriber's close): lets
    /// it finish (for at most [`QUEUED_CLOSE_WAIT`]), or sets it aside, so
    /// that no one ever synchronises a stream whose wait may never open.
    pub(super) fn settle_in_flight(&mut self) -> Result<()> {
        if self.in_flight.take().is_none() {
            return Ok(());
        }
        let until = Instant::now() + QUEUED_CLOSE_WAIT;
        loop {
            match self.poll_queued() {
                Ok(true) => return Ok(()),
                Ok(false) if Instant::now() < until => std::thread::sleep(Duration::from_micros(100)),
                _ => break,
            }
        }
        self.stats.abandoned += 1;
        self.abandon_queued()
    }

    /// Whether every queued copy has completed, without waiting.
    pub(super) fn poll_queued(&mut self) -> Result<bool> {
        match self.pool.queued() {
            Some(q) => q.poll_complete(),
            None => self.pool.complete().map(|()| true),
        }
    }

    /// Gives up on the queued copies (see [`crate::memory::QueuedCopies::abandon_copies`]).
    pub(super) fn abandon_queued(&mut self) -> Result<()> {
        self.pool.queued().map_or(Ok(()), |q| q.abandon_copies())
    }
}

#[cfg(all(test, not(loom)))]
mod queued_wait_tests {
    use super::*;

    #[test]
    fn a_landed_commit_extends_the_wait_by_the_short_grace_only() {
        let d = Instant::now();
        assert_eq!(queued_wait_end(d, false), d);
        assert_eq!(queued_wait_end(d, true), d + QUEUED_LANDED_GRACE);
        assert!(
            QUEUED_LANDED_GRACE <= Duration::from_millis(50),
            "a call may overrun its timeout by the grace"
        );
    }
}
