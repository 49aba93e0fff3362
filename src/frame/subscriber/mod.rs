//! The subscriber: connects, imports the pool once, and reads frames by
//! copying them into its own buffer and validating after the copy.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::protocol::push::PushRead;
pub use super::protocol::Mode;
use super::protocol::{self, Look, SlotSnapshot};
use crate::error::{Error, Result};
use crate::format::Geometry;
use crate::layout::{
    ClientLine, RingHeader, RingInfo, SlotDesc, SubEntry, BACKEND_CUDA, BACKEND_HOST, PRODUCER_CLOSED,
};
use crate::memory::view::DeviceView;
use crate::memory::{BackendKind, ImportedPool, OwnBuffer};
use crate::ring::attach::map_frame_ring;
use crate::ring::cadence::Cadence;
use crate::ring::lease::{self, Lease};
use crate::ring::{ClientConfig, ClientOptions};
use crate::shm::Region;
use crate::socket::msg::{self, Hello, Msg};
use crate::socket::transport;
use crate::sync::atomic::Ordering;
use crate::time::monotonic_ns;

mod hold;
mod options;
mod push;
mod queued;
mod views;
mod wait;

pub use hold::FrameHold;
use hold::Holds;
pub use options::{Delivery, PullStart, SubscriberOptions, SubscriberStats};
use queued::InFlight;
pub use views::{Borrow, Frame};

/// The consumer side of a ring.
///
/// # Examples
/// ```no_run
/// use std::time::Duration;
/// use vramring::{Mode, Subscriber, SubscriberOptions};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut sub = Subscriber::connect("/tmp/cam.sock", SubscriberOptions::default().mode(Mode::Sequential))?;
/// let frame = sub.next(Duration::from_secs(1))?;
/// println!("frame {} pts {}", frame.seq(), frame.pts());
/// # Ok(()) }
/// ```
pub struct Subscriber {
    lease: Lease,
    control: Region,
    pool: Box<dyn ImportedPool>,
    info: RingInfo,
    opts: SubscriberOptions,
    last: u64,
    stats: SubscriberStats,
    path: PathBuf,
    /// `ProducerGone` has been reported (the drain is over).
    drained: bool,
    /// Push delivery was granted: this subscriber's buffers, as its reads
    /// look at them (`None`: pull).
    push: Option<protocol::push::Buffers>,
    /// Push delivery: the publisher has mapped our buffers (its
    /// `push_count` said so once). The words stay ours until the lease
    /// ends, and a publisher that closes frees our entry (`push_count` 0)
    /// while frames it pushed are still to be drained.
    push_mapped: bool,
    /// Push delivery: the first pushed frame has been delivered. The
    /// stream of a push subscriber starts there (the frames before its
    /// buffers were mapped were never offered to it, as for a subscriber
    /// that joined later), so gaps are counted from then on.
    push_started: bool,
    /// Frames counted in `stats.dropped` since the last delivered frame
    /// that passed `last` without being delivered (overwritten before or
    /// during their copy, or not pushed to us). The next frame's
    /// `skipped` reports them: it counts every frame lost since the one
    /// delivered before it.
    unreported: u64,
    /// Push delivery: since when the wait has kept ending on a push word
    /// that `global_seq` has not reached (see `nothing_pushed`).
    ahead_since: Option<Instant>,
    /// The publisher's cadence, for [`WaitStrategy::Cadence`](crate::WaitStrategy::Cadence).
    cadence: Cadence,
    /// A queued copy not finished yet. One whose commit had not come by
    /// its call's deadline stays queued and the next call resumes it; it is
    /// set aside only when it cannot finish (the publisher gone, eviction,
    /// a failed query, a commit whose gate never opened, or this
    /// subscriber's close), after a bounded wait for it.
    in_flight: Option<InFlight>,
    /// Queued copies may start at the loan (ADR 0014): the ring has a gate
    /// line and its publisher is not in this process (whose context a
    /// publisher's `cuCtxSynchronize` would share with the copy).
    loan_trigger: bool,
    /// Push frames kept past the next read ([`Frame::hold`]), shared with
    /// their holds.
    holds: std::sync::Arc<Holds>,
    /// A close parked the pool with kept frames: the hold stays where it is
    /// for good (a later close must not free the kept buffers).
    parked: bool,
    /// A read under a kept frame left the hold on it (see `catch_up_hold`).
    hold_behind: bool,
    /// A queued push reader: the frame in the buffer its `push_held` names
    /// (0: none yet). Its lossless cursor never passes it.
    hold_seq: u64,
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("path", &self.path)
            .field("index", &self.lease.index())
            .field("epoch", &format_args!("{:#018x}", self.info.epoch))
            .field("last", &self.last)
            .finish()
    }
}

/// The descriptor of the slot that holds `seq` (a free function, so a
/// caller may hold it beside a mutable borrow of another field).
fn slot_of<'c>(control: &'c Region, info: &RingInfo, seq: u64) -> &'c SlotDesc {
    let k = (seq & info.mask()) as usize;
    control
        .slice::<SlotDesc>(std::mem::size_of::<RingHeader>(), info.slot_count as usize)
        .get(k)
        .expect("masked index is below slot_count")
}

/// Imports the pool (pull delivery), or with no descriptor (push
/// delivery: the pool is never handed out) sets up only what the push
/// buffers need.
fn import_pool(info: &RingInfo, fd: Option<OwnedFd>, writable: bool) -> Result<Box<dyn ImportedPool>> {
    match (info.backend, fd) {
        (BACKEND_HOST, Some(fd)) => Ok(Box::new(crate::memory::host::HostImport::import(
            fd,
            info.pool_bytes,
            writable,
        )?)),
        (BACKEND_HOST, None) => Ok(Box::new(crate::memory::host::HostImport::push_only())),
        (BACKEND_CUDA, Some(fd)) => crate::memory::cuda::import_pool(fd, info.pool_bytes, info.device_uuid, writable),
        (BACKEND_CUDA, None) => crate::memory::cuda::push_only(info.device_uuid),
        (other, _) => Err(Error::LayoutMismatch(format!("backend code {other}"))),
    }
}

impl Subscriber {
    /// Connects to the publisher at `path` and imports its ring.
    ///
    /// # Errors
    /// [`Error::Io`] when nothing listens; [`Error::Refused`] or
    /// [`Error::VersionMismatch`] when the publisher says no;
    /// [`Error::Timeout`]; [`Error::LayoutMismatch`] / [`Error::BadMessage`]
    /// for a malformed answer; backend import errors.
    pub fn connect(path: impl AsRef<Path>, opts: SubscriberOptions) -> Result<Subscriber> {
        let path = path.as_ref().to_owned();
        let mut backends = 0u32;
        for b in &opts.backends {
            backends |= 1 << b.code();
        }
        let mut flags = 0;
        if opts.client.lossless {
            flags |= msg::HELLO_LOSSLESS;
        }
        if opts.mode == Mode::Sequential {
            flags |= msg::HELLO_SEQUENTIAL;
        }
        if opts.write {
            flags |= msg::HELLO_WRITE;
        }
        match opts.delivery {
            Delivery::Push if opts.write => {
                return Err(Error::Config(
                    "push delivery hands out no pool, so it cannot be written: ask for write access with pull delivery"
                        .into(),
                ))
            }
            Delivery::Push => flags |= msg::HELLO_PUSH,
            // A writer needs the pool: push is no choice for it.
            Delivery::Auto if !opts.write => flags |= msg::HELLO_PUSH_OK,
            Delivery::Auto | Delivery::Pull => {}
        }
        let hello = Hello {
            flags,
            backends,
            name: opts.client.name.clone(),
            device_uuid: [0; 16],
        };
        let (sock, welcome, fds) = lease::request(&path, hello, opts.client.connect_timeout)?;
        let push = welcome.granted & msg::HELLO_PUSH != 0;
        if opts.delivery == Delivery::Push && !push {
            return Err(Error::Refused {
                code: msg::REJECT_BAD_HELLO,
                reason: "push delivery not granted".into(),
            });
        }
        if push && flags & (msg::HELLO_PUSH | msg::HELLO_PUSH_OK) == 0 {
            return Err(Error::BadMessage(
                "the publisher granted push delivery, which was not asked for".into(),
            ));
        }
        // A publisher leaves out of `granted` the flags it does not know
        // (PROTOCOL.md §3.2): reading as lossless without the grant would
        // count on frames nobody holds for us.
        if opts.client.lossless && welcome.granted & msg::HELLO_LOSSLESS == 0 {
            return Err(Error::Refused {
                code: msg::REJECT_POLICY,
                reason: "the publisher did not grant lossless delivery".into(),
            });
        }
        // A push subscriber receives no pool: control, table, client region.
        let want = if push { 3 } else { 4 };
        if fds.len() != want {
            return Err(Error::BadMessage(format!(
                "Welcome must carry exactly {want} descriptors, it carries {}",
                fds.len()
            )));
        }
        let mut fds = fds.into_iter();
        let (Some(control_fd), Some(subs_fd), Some(client_fd)) = (fds.next(), fds.next(), fds.next()) else {
            return Err(Error::BadMessage("Welcome descriptors missing".into()));
        };
        let pool_fd = fds.next();
        let (control, info, subs, client) = map_frame_ring(&welcome, control_fd.as_fd(), &subs_fd, &client_fd)?;
        let lease = Lease::new(sock, subs, client, &welcome, info.max_subscribers, info.epoch)?;
        let writable = welcome.granted & msg::HELLO_WRITE != 0;
        if opts.write && !writable {
            return Err(Error::Refused {
                code: msg::REJECT_WRITE_DENIED,
                reason: "write access not granted".into(),
            });
        }
        let kind = BackendKind::from_code(info.backend).ok_or(Error::LayoutMismatch("backend".into()))?;
        if !opts.backends.contains(&kind) {
            return Err(Error::WrongBackend {
                what: "importing this ring",
                backend: kind.name(),
            });
        }
        let pool = import_pool(&info, pool_fd, writable)?;
        let mut sub = Subscriber {
            lease,
            control,
            pool,
            info,
            opts,
            last: 0,
            stats: SubscriberStats::default(),
            path,
            drained: false,
            push: None,
            push_mapped: false,
            push_started: false,
            unreported: 0,
            ahead_since: None,
            cadence: Cadence::new(),
            in_flight: None,
            loan_trigger: false,
            holds: Holds::new(None),
            parked: false,
            hold_behind: false,
            hold_seq: 0,
        };
        sub.loan_trigger = sub.info.gate_offset().is_some() && !super::publisher::published_here(sub.info.epoch);
        if !push && sub.opts.pull_start != PullStart::AfterCommit {
            let only_mps = sub.opts.pull_start == PullStart::Auto;
            // The pool's gate word in device memory (ADR 0011) where the
            // ring keeps one; `global_seq` in host memory (ADR 0010) else.
            let control_bytes = sub.control.len() as u64;
            let word = std::ptr::from_ref(&sub.header().seq.global_seq) as u64 - sub.control.as_ptr() as u64;
            if let Some(q) = sub.pool.queued() {
                match sub.info.gate_offset() {
                    Some(off) => q.enable_pool_gate(off, only_mps)?,
                    None => q.enable_gate(control_fd.as_fd(), control_bytes, word, only_mps)?,
                };
            }
        }
        // The service stored our cursor before it sent the Welcome
        // (sendmsg/recvmsg order it); nobody else writes it.
        let last = if sub.opts.client.lossless {
            sub.client().released_seq.load(Ordering::Relaxed)
        } else {
            // SYNC: global-seq — Acquire.
            sub.header().seq.global_seq.load(Ordering::Acquire).saturating_sub(1)
        };
        sub.last = last;
        if push {
            sub.attach_push()?;
            if sub.push_queued() && sub.opts.client.lossless {
                // A lossless publisher may wait on a kept frame's buffer:
                // its release wakes this subscriber (`Holds::released`).
                sub.holds = Holds::new(Some(sub.lease.client_ref()));
            }
        }
        sub.stats.delivery = if push { Delivery::Push } else { Delivery::Pull };
        Ok(sub)
    }

    fn header(&self) -> &RingHeader {
        self.control.at::<RingHeader>(0)
    }

    fn slot(&self, seq: u64) -> &SlotDesc {
        slot_of(&self.control, &self.info, seq)
    }

    fn entry(&self) -> &SubEntry {
        self.lease.entry()
    }

    fn client(&self) -> &ClientLine {
        self.lease.client()
    }

    fn slot_addr(&self, seq: u64) -> u64 {
        self.pool.base_addr() + (seq & self.info.mask()) * self.info.geometry.slot_stride
    }

    /// The ring's description.
    pub fn info(&self) -> &RingInfo {
        &self.info
    }

    /// The slot geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.info.geometry
    }

    /// The backend of the ring.
    pub fn backend(&self) -> BackendKind {
        self.pool.kind()
    }

    /// The publisher instance this subscriber is attached to.
    pub fn epoch(&self) -> u64 {
        self.info.epoch
    }

    /// Whether pull copies are queued on the GPU behind the commit
    /// ([`PullStart::Queued`], or [`PullStart::Auto`] under MPS).
    pub fn pull_queued(&self) -> bool {
        self.pool.gate_enabled()
    }

    /// Whether the publisher has mapped this subscriber's push buffers, so
    /// frames now arrive by push delivery. Mapping happens at the
    /// publisher's next publish after the handshake.
    pub fn push_active(&self) -> bool {
        // SYNC: push-seq — Acquire, as in `read_pushed`.
        self.push
            .is_some_and(|b| self.push_mapped || self.entry().push_count.load(Ordering::Acquire) as usize == b.count)
    }

    /// How frames reach this subscriber, as the publisher granted:
    /// [`Delivery::Pull`] or [`Delivery::Push`].
    pub fn delivery(&self) -> Delivery {
        self.stats.delivery
    }

    /// Counters.
    pub fn stats(&self) -> SubscriberStats {
        self.stats
    }

    /// What the cadence wait ([`WaitStrategy::Cadence`](crate::WaitStrategy::Cadence)) knows of the
    /// publisher's cadence: the locked interval, the spin window's margin
    /// and tolerance, windows planned, hit and missed.
    pub fn cadence(&self) -> crate::ring::cadence::CadenceState {
        self.cadence.state()
    }

    /// A read-only snapshot of the ring this subscriber is attached to:
    /// producer state and counters, slot descriptors and the subscriber
    /// table (this subscriber's own entry marked `is_self`). See
    /// [`crate::inspect`].
    pub fn ring_status(&self) -> crate::inspect::RingStatus {
        crate::inspect::frame_status(
            &self.path,
            &self.control,
            &self.info,
            self.lease.table(),
            Some(self.lease.index()),
        )
    }

    /// The seq to read next (per the mode and the safe window) when the
    /// newest is `g`; `None` when nothing is new.
    fn pick(&self, g: u64) -> Option<protocol::Pick> {
        let window = protocol::safe_window(self.info.slot_count, self.opts.client.lossless);
        protocol::pick(self.opts.mode, self.last, g, window)
    }

    /// Picks the next frame and its snapshot, counting gaps; `None` when a
    /// retry is needed.
    fn next_snapshot(&mut self, g: u64) -> Option<(SlotSnapshot, u64)> {
        let pick = self.pick(g)?;
        match SlotSnapshot::look(self.slot(pick.seq), pick.seq) {
            Look::Ready(snap) => Some((snap, pick.skipped)),
            Look::Overwritten => {
                // Gone before we started: a gap, not a torn read.
                if self.opts.mode == Mode::Sequential {
                    self.lost(pick.skipped + 1);
                    self.last = pick.seq;
                    self.publish_counters();
                }
                None
            }
            Look::NotYet => None,
        }
    }

    fn publish_counters(&self) {
        let e = self.client();
        // Relaxed: own counters, single writer (this subscriber).
        e.delivered.store(self.stats.delivered, Ordering::Relaxed);
        e.dropped.store(self.stats.dropped, Ordering::Relaxed);
        e.overruns.store(self.stats.overruns, Ordering::Relaxed);
        e.heartbeat_ns.store(monotonic_ns(), Ordering::Relaxed);
    }

    /// After a frame lost or given up, before looking again: `Timeout` once
    /// `deadline` has passed, unless the publisher's end is being drained
    /// (the next look reports that instead).
    fn keep_deadline(&self, deadline: Instant, timeout: Duration) -> Result<()> {
        if Instant::now() >= deadline && !self.lease.draining() {
            return Err(Error::Timeout(timeout, "the next frame"));
        }
        Ok(())
    }

    /// Frames lost without a frame delivered: counted now, and reported by
    /// the next delivered frame's `skipped`.
    fn lost(&mut self, n: u64) {
        self.stats.dropped += n;
        self.unreported += n;
    }

    /// Counts the gap `skipped` just before `snap` and returns every frame
    /// lost since the last delivered one (what the frame's `skipped` says);
    /// `deliver` then records the delivery.
    fn gap_before(&mut self, skipped: u64) -> u64 {
        self.stats.dropped += skipped;
        skipped + std::mem::take(&mut self.unreported)
    }

    /// Records the delivery of `snap`, counts the gap `skipped` before it,
    /// and returns the frames lost since the previous delivered frame.
    fn deliver(&mut self, snap: &SlotSnapshot, skipped: u64) -> u64 {
        self.cadence.observe_deferred(snap.seq, snap.commit_ns, monotonic_ns());
        let skipped = self.gap_before(skipped);
        self.stats.delivered += 1;
        self.stats.last_seq = snap.seq;
        self.last = snap.seq;
        if self.opts.client.lossless {
            // SYNC: release-cursor — Release after the copy completed, paired
            // with the producer's Acquire in `Table::holder`.
            self.client()
                .released_seq
                .store(self.release_cursor(snap.seq), Ordering::Release);
        }
        self.client().reading_seq.store(0, Ordering::Relaxed);
        self.publish_counters();
        skipped
    }

    /// Waits for the next frame (per the mode), copies it into this
    /// subscriber's own buffer, and returns it once the copy is proven whole.
    /// `Duration::MAX` waits for ever (a closed or dead publisher still ends
    /// the wait). A queued pull copy whose commit has landed may take up to
    /// 20 ms past `timeout` to finish.
    ///
    /// # Errors
    /// [`Error::Timeout`] when no frame came in time; [`Error::ProducerGone`]
    /// when the publisher closed or died; [`Error::Evicted`]; backend errors.
    pub fn next(&mut self, timeout: Duration) -> Result<Frame<'_>> {
        let deadline = crate::time::deadline_after(Instant::now(), timeout);
        self.reconnect_if_gone(deadline, timeout)?;
        self.lease.ensure_or_drain()?;
        self.release_kept();
        loop {
            if let Some(f) = self.in_flight {
                // A copy an earlier call queued, whose commit had not come
                // by that call's deadline: it resumes first, unless a latest
                // reader now has a newer frame to read (then the copy, whose
                // commit has landed, is let finish and dropped uncounted).
                // SYNC: global-seq — Acquire pairs with the commit's store.
                let landed = self.header().seq.global_seq.load(Ordering::Acquire);
                if self.opts.mode == Mode::Latest && landed > f.pick.seq {
                    self.settle_in_flight()?;
                    continue;
                }
                match self.finish_queued(f, deadline, timeout)? {
                    Some((snap, skipped)) => {
                        return Ok(Frame {
                            sub: self,
                            snap,
                            skipped,
                            push: None,
                        })
                    }
                    None => {
                        self.keep_deadline(deadline, timeout)?;
                        continue;
                    }
                }
            }
            let mut g = self.wait(deadline, timeout, true)?;
            if self.pull_queued() {
                // `g` is the loaned or announced seq; what has landed is
                // `global_seq`.
                // SYNC: global-seq — Acquire pairs with the commit's store.
                let landed = self.header().seq.global_seq.load(Ordering::Acquire);
                if let Some(pick) = self.pick(g).filter(|p| p.seq > landed) {
                    match self.queued_copy(pick, deadline, timeout)? {
                        Some((snap, skipped)) => {
                            return Ok(Frame {
                                sub: self,
                                snap,
                                skipped,
                                push: None,
                            })
                        }
                        None => {
                            self.keep_deadline(deadline, timeout)?;
                            continue;
                        }
                    }
                }
                g = landed;
            }
            if self.push.is_some() {
                // `g` may be a pushed frame's seq whose commit has not
                // stored the slot's seq yet (the wait saw its push word
                // first): only committed frames are taken or counted as a
                // gap (PROTOCOL.md §16.7).
                match self.read_pushed(g, true) {
                    PushRead::Took(k, _, snap) => {
                        let skipped = self.push_gap(snap.seq);
                        self.stats.pushed += 1;
                        let skipped = self.deliver(&snap, skipped);
                        return Ok(Frame {
                            sub: self,
                            snap,
                            skipped,
                            push: Some(k),
                        });
                    }
                    PushRead::NotPushed(upto) => {
                        self.nothing_pushed(g, upto, deadline, timeout)?;
                        continue;
                    }
                    PushRead::Lost(seq) => {
                        self.push_lost(seq);
                        self.keep_deadline(deadline, timeout)?;
                        continue;
                    }
                }
            }
            let Some((snap, skipped)) = self.next_snapshot(g) else {
                if self.lease.draining() {
                    // No publisher will finish what is not readable now.
                    return Err(self.drain_over());
                }
                if Instant::now() >= deadline {
                    return Err(Error::Timeout(timeout, "the next frame"));
                }
                continue;
            };
            // Relaxed: informational.
            self.client().reading_seq.store(snap.seq, Ordering::Relaxed);
            let offset = (snap.seq & self.info.mask()) * self.info.geometry.slot_stride;
            self.pool.copy_out(offset, self.info.geometry.frame_bytes)?;
            self.pool.complete()?;
            if !snap.still_valid(self.slot(snap.seq)) {
                // The frame and the gap before it are lost, in either mode.
                self.stats.overruns += 1;
                self.lost(skipped + 1);
                self.last = snap.seq;
                self.publish_counters();
                // Overrun after overrun (a publisher that laps this
                // reader's copies): the timeout still holds.
                self.keep_deadline(deadline, timeout)?;
                continue;
            }
            let skipped = self.deliver(&snap, skipped);
            return Ok(Frame {
                sub: self,
                snap,
                skipped,
                push: None,
            });
        }
    }

    /// Waits for the next frame and lends it in place, without a copy.
    /// Under the lossless policy the slot stays pinned until the borrow ends.
    ///
    /// A push subscriber lends its newest pushed buffer without holding it:
    /// the buffer held by the last [`Subscriber::next`] stays held (so a
    /// frame of it that the caller still reads stays whole), and the
    /// publisher may rewrite the lent one, which [`Borrow::release`] reports
    /// as [`Error::Overrun`].
    ///
    /// # Errors
    /// As [`Subscriber::next`].
    pub fn borrow(&mut self, timeout: Duration) -> Result<Borrow<'_>> {
        let deadline = crate::time::deadline_after(Instant::now(), timeout);
        self.reconnect_if_gone(deadline, timeout)?;
        self.lease.ensure_or_drain()?;
        self.release_kept();
        loop {
            let g = self.wait(deadline, timeout, false)?;
            if let Some(bufs) = self.push {
                // As in `next`; a latest reader leaves its hold where it
                // is, a queued one moves it (the publisher spares only the
                // frames it has not read, and those it holds).
                let hold = bufs.order == protocol::push::Order::Oldest || self.opts.client.lossless;
                match self.read_pushed(g, hold) {
                    PushRead::Took(k, _, snap) => {
                        let skipped = self.push_gap(snap.seq);
                        let skipped = self.gap_before(skipped);
                        return Ok(Borrow {
                            sub: self,
                            snap,
                            skipped,
                            released: false,
                            push: Some(k),
                        });
                    }
                    PushRead::NotPushed(upto) => {
                        self.nothing_pushed(g, upto, deadline, timeout)?;
                        continue;
                    }
                    PushRead::Lost(seq) => {
                        self.push_lost(seq);
                        self.keep_deadline(deadline, timeout)?;
                        continue;
                    }
                }
            }
            if let Some((snap, skipped)) = self.next_snapshot(g) {
                let skipped = self.gap_before(skipped);
                // Relaxed: informational.
                self.client().reading_seq.store(snap.seq, Ordering::Relaxed);
                return Ok(Borrow {
                    sub: self,
                    snap,
                    skipped,
                    released: false,
                    push: None,
                });
            }
            if self.lease.draining() {
                return Err(self.drain_over());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout(timeout, "the next frame"));
            }
        }
    }

    /// With [`SubscriberOptions::reconnect`], replaces a subscriber whose
    /// publisher is gone by a fresh connection to the same path. The old
    /// import is released (in its owning context) when the old state drops.
    fn reconnect_if_gone(&mut self, deadline: Instant, timeout: Duration) -> Result<()> {
        if !self.opts.reconnect || !self.drained {
            return Ok(());
        }
        loop {
            // The Welcome wait is bounded by what is left of this call's
            // timeout too: a publisher that accepts but never answers (frozen,
            // or still starting) must not hold `next` for `connect_timeout`.
            let mut opts = self.opts.clone();
            opts.client.connect_timeout = opts
                .client
                .connect_timeout
                .min(deadline.saturating_duration_since(Instant::now()));
            match Subscriber::connect(&self.path, opts) {
                Ok(mut fresh) => {
                    fresh.opts = self.opts.clone();
                    let mut stats = self.stats;
                    stats.reconnects += 1;
                    fresh.stats = SubscriberStats {
                        last_seq: fresh.stats.last_seq,
                        delivery: fresh.stats.delivery,
                        ..stats
                    };
                    // Frames lost while draining the old publisher are
                    // reported by the first frame of the new one.
                    fresh.unreported = self.unreported;
                    tracing::info!(
                        old = self.info.epoch,
                        new = fresh.info.epoch,
                        "reconnected to a new publisher instance"
                    );
                    drop(std::mem::replace(self, fresh));
                    return Ok(());
                }
                Err(e) => {
                    if Instant::now() >= deadline {
                        tracing::debug!(error = %e, "reconnect attempt failed");
                        return Err(Error::Timeout(timeout, "a new publisher instance to reconnect to"));
                    }
                    std::thread::sleep(Duration::from_millis(10).min(deadline - Instant::now()));
                }
            }
        }
    }

    /// Ends a borrow of `snap` that reported `skipped` frames lost before
    /// it: a delivery if it is still whole, else a loss, and then the
    /// frames it reported are reported again by the next delivered frame.
    fn finish_borrow(&mut self, snap: &SlotSnapshot, push: Option<usize>, skipped: u64) -> Result<()> {
        let whole = match push {
            Some(k) => protocol::push::still_complete(self.entry(), k, snap.seq),
            None => snap.still_valid(self.slot(snap.seq)),
        };
        if whole {
            if push.is_some() {
                self.stats.pushed += 1;
            }
            // The borrow counted and took its gap when it began; nothing can
            // be lost while it holds the subscriber.
            let reported = self.deliver(snap, 0);
            debug_assert_eq!(reported, 0);
            Ok(())
        } else {
            // The gap before it was counted when the borrow began; no frame
            // was delivered, so the next one reports it, and this frame.
            self.stats.overruns += 1;
            self.lost(1);
            self.unreported += skipped;
            self.last = snap.seq;
            self.client().reading_seq.store(0, Ordering::Relaxed);
            self.publish_counters();
            Err(Error::Overrun { seq: snap.seq })
        }
    }

    /// Says goodbye to the publisher and releases the imported pool (in its
    /// owning context for the CUDA backend). Retryable after an error.
    /// Frames still kept by a [`FrameHold`] stay whole: their buffers stay
    /// mapped (and spared) until the last hold drops.
    ///
    /// # Errors
    /// The backend's release error.
    pub fn close(&mut self) -> Result<()> {
        if self.parked || self.park_if_kept() {
            return Ok(());
        }
        self.settle_in_flight()?;
        protocol::push::release_hold(self.client());
        self.lease.bye();
        self.pool.close()
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, "subscriber close failed in drop");
        }
    }
}
