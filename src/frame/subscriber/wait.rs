//! How a subscriber waits for its next frame: on its doorbell by the
//! configured strategy, parked until just before the frame is due
//! (`park_until_due`), and through the publisher's end (the drain).

use std::time::{Duration, Instant};

use super::{slot_of, Subscriber};
use crate::error::{Error, Result};
use crate::frame::protocol::WaitOutcome;
use crate::layout::RingHeader;
use crate::ring::cadence::wait_by;
use crate::ring::{wait_with, Bell, Doze};
use crate::sync::atomic::Ordering;
use crate::time::monotonic_ns;

impl Subscriber {
    /// While draining: `global_seq` when a frame newer than `last` is left
    /// to read (per the mode), else the end of the stream.
    fn drain_next(&mut self) -> Result<u64> {
        // SYNC: global-seq — Acquire pairs with the publisher's Release.
        let g = self.header().seq.global_seq.load(Ordering::Acquire);
        if self.pick(g).is_some() {
            return Ok(g);
        }
        Err(self.drain_over())
    }

    /// Ends the drain: `ProducerGone`, now and on every later call (or, with
    /// `reconnect`, once).
    pub(super) fn drain_over(&mut self) -> Error {
        self.drained = true;
        self.lease.end(Error::ProducerGone { epoch: self.info.epoch })
    }

    /// Waits until `global_seq` passes `last` (or, with `announced` on a
    /// queued-pull subscriber, until `pending_seq` does: a commit has been
    /// enqueued; with `announced` on a push subscriber whose buffers are
    /// attached, until `global_seq` or one of its `push_seq` words does,
    /// which may be ahead of `global_seq`) and returns it.
    pub(super) fn wait(&mut self, deadline: Instant, timeout: Duration, announced: bool) -> Result<u64> {
        if self.lease.draining() {
            return self.drain_next();
        }
        let end = self.kept_wait_end(deadline);
        let outcome = self.ring_wait(end, announced, false);
        match outcome {
            WaitOutcome::Advanced(g) => Ok(g),
            WaitOutcome::ProducerClosed => {
                self.lease.on_producer_closed()?;
                self.drain_next()
            }
            WaitOutcome::TimedOut => {
                self.lease.check_or_drain()?;
                if self.lease.draining() {
                    return self.drain_next();
                }
                if Instant::now() < deadline {
                    // A shortened wait (`kept_wait_end`): look again.
                    return Ok(self.last);
                }
                Err(Error::Timeout(timeout, "the next frame"))
            }
            WaitOutcome::Stopped => {
                self.lease.check_or_drain()?;
                if self.lease.draining() {
                    return self.drain_next();
                }
                // Readable but not fatal (e.g. an ignored message): loop again.
                Ok(self.last)
            }
        }
    }

    /// Parks until `lead` before the default wait would start spinning for
    /// the next frame (the publisher's cadence says when it is due), or
    /// until there is something to read or to act on (a frame, the
    /// publisher's end, a kept frame let go), whichever comes first.
    /// Returns at once while the cadence is unknown (not locked, or another
    /// wait strategy), when that time is sooner or the configured spin
    /// would cover it, while a queued pull copy is in flight or the
    /// publisher's end is being drained, and when the publisher is gone or
    /// this subscriber evicted (the next read says so).
    /// It reads nothing: the next [`Subscriber::next`] or
    /// [`Subscriber::borrow`] does, as it would have.
    ///
    /// For a reader with work of its own before each frame (checking what
    /// it still holds, preparing a batch): done after this call, that work
    /// runs just before the frame comes, on warm caches, instead of a
    /// whole interval earlier, and so does the reader's handling of the
    /// frame once it comes. The Python binding's `next()` does this.
    /// Never parks past `timeout`.
    ///
    /// ```no_run
    /// # fn prepare() {}
    /// # fn handle(_: &vramring::Frame<'_>) {}
    /// use std::time::Duration;
    /// use vramring::{Subscriber, SubscriberOptions};
    ///
    /// let mut sub = Subscriber::connect("/tmp/cam0.sock", SubscriberOptions::default())?;
    /// let timeout = Duration::from_secs(5);
    /// for _ in 0..1000 {
    ///     sub.park_until_due(Duration::from_micros(500), timeout);
    ///     prepare(); // per-frame work that does not need the frame
    ///     let frame = sub.next(timeout)?;
    ///     handle(&frame);
    /// }
    /// # Ok::<(), vramring::Error>(())
    /// ```
    pub fn park_until_due(&mut self, lead: Duration, timeout: Duration) {
        if self.opts.client.wait != crate::WaitStrategy::Cadence
            || self.lease.draining()
            || self.in_flight.is_some()
            || !self.lease.quiet()
        {
            return;
        }
        // A kept frame let go since the last read moves the hold now, as
        // `next` would: the park must not keep it (and a lossless
        // publisher) waiting.
        self.release_kept();
        let lead = u64::try_from(lead.as_nanos()).unwrap_or(u64::MAX);
        let Some(wake) = self.cadence.prepare_at(lead) else {
            return;
        };
        // A wait told to spin that long spins through it anyway.
        let Some(ahead) = wake
            .checked_sub(monotonic_ns())
            .map(Duration::from_nanos)
            .filter(|&d| d > self.opts.client.spin)
        else {
            return;
        };
        let target = Instant::now() + ahead.min(timeout);
        loop {
            // A reader keeping frames looks at them every `KEPT_LOOK`, as
            // its reads do, and parks again.
            let at = self.kept_wait_end(target);
            match self.ring_wait(at, true, true) {
                WaitOutcome::TimedOut if Instant::now() < target => self.release_kept(),
                // Whatever else ended the park, the next read finds it.
                _ => return,
            }
        }
    }

    /// One wait on this subscriber's doorbell (see [`Subscriber::wait`]
    /// for what `announced` waits for) until `end`: by the configured
    /// strategy, or, with `doze`, parked until `end` (no spin first; a
    /// commit seen in flight is still waited for on the CPU, up to `end`).
    fn ring_wait(&mut self, end: Instant, announced: bool, doze: bool) -> WaitOutcome {
        let header = self.control.at::<RingHeader>(0);
        // A queued pull starts at the loan (ADR 0014): it waits for
        // the next frame's slot to be loaned for it, or for
        // `pending_seq`, and the GPU waits for the commit.
        let bell = if announced && self.pull_queued() {
            // Only where the commit opens a gate line, which a
            // publisher closing in order opens for good (a copy queued
            // at a loan it never publishes then still runs), and the
            // publisher is in another process (`loan_trigger`).
            let next = self.last + 1;
            let loaned = self
                .loan_trigger
                .then(|| (&slot_of(&self.control, &self.info, next).seq, next));
            Bell {
                seq: &header.seq.pending_seq,
                producer: &header.producer,
                pending: None,
                push: None,
                loaned,
            }
        } else {
            let entry = self.lease.entry();
            // SYNC: push-seq — Acquire, as in `read_pushed`.
            let count = entry.push_count.load(Ordering::Acquire) as usize;
            let words = self
                .push
                .filter(|b| announced && (self.push_mapped || b.count == count))
                .map(|b| &entry.push_seq[..b.count]);
            Bell {
                seq: &header.seq.global_seq,
                producer: &header.producer,
                pending: Some(&header.seq.pending_seq),
                push: words,
                loaned: None,
            }
        };
        let lease = &self.lease;
        let holds = &self.holds;
        // A kept frame let go on another thread ends the wait, so that
        // a lossless reader's cursor follows at once (`Holds::released`).
        let alive = || lease.quiet() && !holds.released();
        if doze {
            let slice = self.opts.client.park_slice;
            return wait_with(
                bell,
                lease.client(),
                self.last,
                end,
                Duration::ZERO,
                slice,
                &mut Doze(end),
                alive,
            );
        }
        wait_by(
            &self.opts.client,
            &mut self.cadence,
            bell,
            lease.client(),
            self.last,
            end,
            alive,
        )
    }
}
