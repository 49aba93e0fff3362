//! Push delivery on the subscriber's side: its buffers sent to the
//! publisher, and frames taken from them in order of their seqs.

use super::*;
use crate::layout::{PUSH_BUFFERS, PUSH_MAX_BUFFERS, PUSH_QUEUE_MIN};

/// How long a push word may stay ahead of `global_seq` before the reader
/// checks that its publisher still lives (a commit lands within
/// microseconds; a publisher killed between the two stores never lands
/// it).
const AHEAD_CHECK: Duration = Duration::from_millis(1);

/// The push buffers a subscriber with `opts` attaches to a ring of
/// `slots` slots: 3 for a latest reader, which takes the newest frame; a
/// queue for a sequential or lossless one, which takes the oldest (a
/// lossless latest reader the newest), of `push_buffers` clamped to what
/// the publisher accepts and to one more than the ring's slots (a frame's
/// meta is read from its slot, so a reader a ring behind loses it anyway).
pub(super) fn push_buffers(opts: &SubscriberOptions, slots: u32) -> protocol::push::Buffers {
    use protocol::push::{Buffers, Order};
    let order = if opts.mode == Mode::Sequential {
        Order::Oldest
    } else {
        Order::Newest
    };
    if opts.mode == Mode::Latest && !opts.client.lossless {
        return Buffers {
            count: PUSH_BUFFERS,
            order,
        };
    }
    let most = PUSH_MAX_BUFFERS.min(slots as usize + 1);
    let count = (opts.push_buffers as usize).clamp(PUSH_QUEUE_MIN, most.max(PUSH_QUEUE_MIN));
    Buffers { count, order }
}

impl Subscriber {
    /// Makes this subscriber's push buffers and sends them to the publisher.
    ///
    /// # Errors
    /// The backend's allocation error, or the socket's: a push subscriber
    /// has no pool to fall back on.
    pub(super) fn attach_push(&mut self) -> Result<()> {
        let stride = self
            .info
            .geometry
            .frame_bytes
            .next_multiple_of(crate::format::SLOT_ALIGN);
        let bufs = push_buffers(&self.opts, self.info.slot_count);
        let (fd, bytes) = self.pool.alloc_push(bufs.count as u32, stride)?;
        let a = msg::Attach {
            count: bufs.count as u32,
            stride,
            bytes,
        };
        transport::send(self.lease.sock().as_fd(), &Msg::Attach(a).encode(), &[fd.as_fd()])?;
        self.push = Some(bufs);
        Ok(())
    }
    /// Push delivery, when the publisher has mapped our buffers: the newest
    /// pushed frame newer than `last` with its meta, held (`hold`, for
    /// `next`) or read in place (for `borrow`; see
    /// [`protocol::push::peek_newest`]).
    pub(super) fn read_pushed(&mut self, g: u64, hold: bool) -> PushRead<SlotSnapshot> {
        let bufs = self.push.expect("read_pushed is for push subscribers");
        // SYNC: push-seq — Acquire pairs with the publisher's Release of
        // `push_count` after it mapped our buffers.
        self.push_mapped |= self.entry().push_count.load(Ordering::Acquire) as usize == bufs.count;
        if !self.push_mapped {
            // Not mapped yet: nothing reaches us; what has landed is a gap.
            // SYNC: global-seq — Acquire pairs with the commit's store.
            return PushRead::NotPushed(g.min(self.header().seq.global_seq.load(Ordering::Acquire)));
        }
        let kept = if hold { self.read_under_kept() } else { None };
        let how = match kept {
            Some(under) => under,
            None if hold => protocol::push::Take::Hold(self.lease.client()),
            None => protocol::push::Take::Peek,
        };
        let holding = matches!(how, protocol::push::Take::Hold(_));
        let entry = self.entry();
        let header = self.header();
        let read = protocol::push::read_pushed(entry, how, bufs, &header.seq.global_seq, self.last, g, |_, seq| {
            // The meta lives in the ring's slot; read it under the seqlock.
            // If the slot moved on already, a newer frame has been pushed
            // too.
            let slot = slot_of(&self.control, &self.info, seq);
            match SlotSnapshot::look(slot, seq) {
                Look::Ready(snap) if snap.still_valid(slot) => Some(snap),
                _ => None,
            }
        });
        if let (true, PushRead::Took(_, seq, _) | PushRead::Lost(seq)) = (holding, &read) {
            // The take moved the hold to this frame's buffer.
            self.hold_seq = *seq;
        }
        read
    }
    /// The frames between `last` and pushed frame `seq`, which a push
    /// subscriber never gets (none before its first pushed frame: it had
    /// not joined the push stream yet); marks the stream started.
    pub(super) fn push_gap(&mut self, seq: u64) -> u64 {
        let skipped = if self.push_started { seq - self.last - 1 } else { 0 };
        self.push_started = true;
        skipped
    }
    /// A queued push subscriber's oldest pushed frame `seq` lost its meta
    /// (its slot was reused): it and the frames before it are a counted
    /// gap, and the stream has started.
    pub(super) fn push_lost(&mut self, seq: u64) {
        let n = if self.push_started { seq - self.last } else { 1 };
        self.push_started = true;
        self.lost(n);
        self.last = seq;
        self.release_lost();
        self.publish_counters();
    }

    /// A lossless push reader that counted frames up to `last` as lost
    /// (a failed push copy, a reused slot) is done with them: its cursor
    /// moves there, or the publisher, whose window counts from the cursor,
    /// would wait for a frame that never comes and evict it at the lease.
    fn release_lost(&self) {
        if self.opts.client.lossless && self.push_started {
            // SYNC: release-cursor — Release, as in `deliver`; paired with
            // the producer's Acquire in `Table::holder`.
            self.client()
                .released_seq
                .store(self.release_cursor(self.last), Ordering::Release);
        }
    }

    /// Push delivery found nothing pushed past `last` although the ring
    /// moved on to `g`: those frames were not pushed to us (all buffers
    /// held, or not mapped yet). A push subscriber has no pool to pull them
    /// from: once its stream has started they are a counted gap; before, it
    /// had not joined yet. `Err` ends the read (drained, or past the
    /// deadline); `Ok` waits again.
    ///
    /// `woke` is what ended the wait: a push word past `g` (what has
    /// landed) is a commit in flight, and the next wait returns at once
    /// until it lands. A publisher killed between that word and
    /// `global_seq` never lands it, and a wait that returns at once never
    /// looks at the socket: past [`AHEAD_CHECK`] the lease is checked here
    /// (one non-blocking poll), so the reader learns "producer gone".
    pub(super) fn nothing_pushed(&mut self, woke: u64, g: u64, deadline: Instant, timeout: Duration) -> Result<()> {
        if woke > g {
            let now = Instant::now();
            match self.ahead_since {
                Some(t) if now.duration_since(t) >= AHEAD_CHECK => {
                    self.ahead_since = Some(now);
                    self.lease.check_or_drain()?;
                }
                Some(_) => {}
                None => self.ahead_since = Some(now),
            }
        } else {
            self.ahead_since = None;
        }
        if g > self.last {
            if self.push_started {
                self.lost(g - self.last);
            }
            self.last = g;
            self.release_lost();
            self.publish_counters();
        }
        if self.lease.draining() {
            return Err(self.drain_over());
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout(timeout, "the next frame"));
        }
        Ok(())
    }
}
