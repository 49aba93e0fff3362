//! The subscriber: connects, imports the pool once, and reads frames by
//! copying them into its own buffer and validating after the copy.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::protocol::push::PushRead;
pub use super::protocol::Mode;
use super::protocol::{self, Look, SlotSnapshot, WaitOutcome};
use crate::error::{Error, Result};
use crate::format::Geometry;
use crate::layout::{
    ClientLine, RingHeader, RingInfo, SlotDesc, SubEntry, BACKEND_CUDA, BACKEND_HOST, PRODUCER_CLOSED, PUSH_BUFFERS,
};
use crate::memory::view::DeviceView;
use crate::memory::{BackendKind, ImportedPool, OwnBuffer};
use crate::ring::attach::map_frame_ring;
use crate::ring::cadence::{wait_by, Cadence, WaitStrategy};
use crate::ring::lease::{self, Lease};
use crate::ring::Bell;
use crate::shm::Region;
use crate::socket::msg::{self, Hello, Msg};
use crate::socket::transport;
use crate::sync::atomic::Ordering;
use crate::time::monotonic_ns;

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
fn queued_wait_end(deadline: Instant, landed: bool) -> Instant {
    if landed {
        crate::time::deadline_after(deadline, QUEUED_LANDED_GRACE)
    } else {
        deadline
    }
}

/// A copy queued on the GPU behind a commit (ADR 0010, 0014) whose frame
/// is neither delivered nor given up yet.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    pick: protocol::Pick,
    /// Queued at the publisher's loan, before the commit was announced.
    at_loan: bool,
    /// When it was queued: the spin budget counts from here, across calls.
    queued: Instant,
}

/// How to subscribe.
#[derive(Debug, Clone)]
pub struct SubscriberOptions {
    /// `Latest` (default) or `Sequential`.
    pub mode: Mode,
    /// Ask to be a lossless reader (the publisher must use the lossless policy).
    pub lossless: bool,
    /// Ask for write access to the pool (mapped read-only otherwise).
    pub write: bool,
    /// Name shown by the publisher and the CLI.
    pub name: String,
    /// How long to wait for the publisher's Welcome.
    pub connect_timeout: Duration,
    /// How to wait for the next frame: [`WaitStrategy::Cadence`] (the
    /// default) learns the publisher's frame interval and wakes just
    /// before each frame is due, spinning only then;
    /// [`WaitStrategy::Park`] spins for `spin`, then parks on the futex;
    /// [`WaitStrategy::Spin`] busy-polls (one core). Cadence falls back to
    /// Park (with `spin`) whenever the source is irregular or paused.
    pub wait: WaitStrategy,
    /// How long to spin before parking on the futex, for
    /// [`WaitStrategy::Park`] and [`WaitStrategy::Cadence`] (whose window
    /// comes on top of it): a very long spin busy-polls.
    pub spin: Duration,
    /// Longest single futex sleep; bounds how late a dead publisher is noticed.
    pub park_slice: Duration,
    /// Which backends this subscriber may import (default: host and CUDA).
    pub backends: Vec<BackendKind>,
    /// Push delivery (`Latest` mode only): the publisher copies each frame
    /// into buffers this subscriber owns, in the publisher's GPU context, so
    /// receiving a frame costs this process no GPU work. Until the publisher
    /// has mapped the buffers (at its next publish), frames are pulled.
    pub push: bool,
    /// Reconnect to the next publisher instance at the same path after the
    /// current one is gone. `next()` reports [`Error::ProducerGone`] once;
    /// later calls reconnect (within their timeout) and continue with the
    /// new instance's frames.
    pub reconnect: bool,
    /// When a pull subscriber's copy of a CUDA frame starts (see
    /// [`PullStart`]; default [`PullStart::Auto`]).
    pub pull_start: PullStart,
}

/// When a pull subscriber on a CUDA ring starts copying a frame (ADR 0010).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PullStart {
    /// [`PullStart::Queued`] when the GPU is shared through MPS (the
    /// device says so), [`PullStart::AfterCommit`] otherwise: without
    /// MPS a copy waiting on the GPU keeps a context of its own ready to
    /// run beside the publisher's, which costs the GPU a context switch
    /// per frame anyway.
    #[default]
    Auto,
    /// As soon as the publisher has loaned the next frame's slot (ADR
    /// 0014, on a ring with a gate line; a waiter that is spinning sees it
    /// at once, a parked one only at its next look, usually after the
    /// commit) or
    /// announced the frame (its commit is enqueued on the GPU but may not
    /// have run): the copy is enqueued behind a GPU wait on the pool's gate
    /// word (device memory, ADR 0011; on a ring without a gate line, on
    /// `global_seq` in host memory) and starts the moment the commit lands,
    /// with no CPU wake in between; the frame is then validated as always.
    /// A copy whose commit has not come by the call's deadline stays
    /// queued, and the next call resumes it. Falls back to `AfterCommit`
    /// where the device cannot wait on memory (no 64-bit stream memory
    /// operations; for the host word, no read-only host registration).
    Queued,
    /// After the commit has landed and this process has seen it (the v3
    /// behaviour).
    AfterCommit,
}

impl Default for SubscriberOptions {
    fn default() -> Self {
        SubscriberOptions {
            mode: Mode::Latest,
            lossless: false,
            write: false,
            name: format!("sub-{}", std::process::id()),
            connect_timeout: Duration::from_secs(5),
            wait: WaitStrategy::Cadence,
            spin: Duration::from_micros(50),
            park_slice: Duration::from_millis(20),
            backends: vec![BackendKind::Host, BackendKind::Cuda],
            push: false,
            reconnect: false,
            pull_start: PullStart::Auto,
        }
    }
}

impl SubscriberOptions {
    /// Sets the read mode.
    pub fn mode(mut self, m: Mode) -> Self {
        self.mode = m;
        self
    }
    /// Asks to be lossless (implies `Sequential`).
    pub fn lossless(mut self, yes: bool) -> Self {
        self.lossless = yes;
        if yes {
            self.mode = Mode::Sequential;
        }
        self
    }
    /// Asks for write access.
    pub fn write(mut self, yes: bool) -> Self {
        self.write = yes;
        self
    }
    /// Sets the name.
    pub fn name(mut self, n: impl Into<String>) -> Self {
        self.name = n.into();
        self
    }
    /// Restricts the backends this subscriber imports.
    pub fn backends(mut self, b: &[BackendKind]) -> Self {
        self.backends = b.to_vec();
        self
    }
    /// Asks for push delivery (implies `Latest`).
    pub fn push(mut self, yes: bool) -> Self {
        self.push = yes;
        if yes {
            self.mode = Mode::Latest;
        }
        self
    }
    /// Reconnects by itself to the next publisher instance at the same path.
    pub fn reconnect(mut self, yes: bool) -> Self {
        self.reconnect = yes;
        self
    }
    /// Sets the spin time before parking (see [`SubscriberOptions::spin`]).
    pub fn spin(mut self, d: Duration) -> Self {
        self.spin = d;
        self
    }
    /// Sets how to wait for frames (see [`WaitStrategy`]).
    pub fn wait(mut self, w: WaitStrategy) -> Self {
        self.wait = w;
        self
    }
    /// Sets when a pull copy of a CUDA frame starts (see [`PullStart`]).
    pub fn pull_start(mut self, p: PullStart) -> Self {
        self.pull_start = p;
        self
    }
}

/// Counters of a subscriber.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubscriberStats {
    /// Frames handed to the user.
    pub delivered: u64,
    /// Frames skipped and never delivered (gaps).
    pub dropped: u64,
    /// Reads discarded because the producer overwrote the slot during the copy.
    pub overruns: u64,
    /// Seq of the last frame delivered.
    pub last_seq: u64,
    /// Times this subscriber reconnected to a new publisher instance.
    pub reconnects: u64,
    /// Frames received by push delivery (no GPU work in this process).
    pub pushed: u64,
    /// Frames pulled by a copy queued on the GPU before their commit
    /// landed ([`PullStart::Queued`]).
    pub queued: u64,
    /// Of `queued`, the copies queued as soon as the publisher loaned the
    /// frame's slot, before it announced the commit (ADR 0014).
    pub queued_at_loan: u64,
    /// Queued copies given up on because the commit they waited for never
    /// landed: the publisher was gone (died with the frame loaned or in
    /// flight), or the subscriber closed with the copy still waiting.
    pub abandoned: u64,
}

/// A frame copied into the subscriber's own buffer. Valid until the next
/// call on the subscriber.
pub struct Frame<'s> {
    sub: &'s Subscriber,
    snap: SlotSnapshot,
    skipped: u64,
    /// The push buffer holding the frame, or `None` when it was pulled into
    /// the subscriber's copy buffer.
    push: Option<usize>,
}

impl std::fmt::Debug for Frame<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("seq", &self.snap.seq)
            .field("pts", &self.snap.pts)
            .finish()
    }
}

impl Frame<'_> {
    /// The frame's seq.
    pub fn seq(&self) -> u64 {
        self.snap.seq
    }
    /// Presentation timestamp.
    pub fn pts(&self) -> i64 {
        self.snap.pts
    }
    /// Flags.
    pub fn flags(&self) -> u32 {
        self.snap.flags
    }
    /// `CLOCK_MONOTONIC` ns when the publisher committed the frame.
    pub fn commit_ns(&self) -> u64 {
        self.snap.commit_ns
    }
    /// Frames skipped between the previous delivered frame and this one.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }
    /// User metadata.
    pub fn user(&self) -> Vec<u8> {
        self.snap.user_bytes()
    }
    /// Format and plane layout; planes sit at the same offsets in the copy.
    pub fn geometry(&self) -> &Geometry {
        &self.sub.info.geometry
    }
    /// The ring's description (backend, device, geometry) of the publisher
    /// instance this frame came from.
    pub fn info(&self) -> &RingInfo {
        &self.sub.info
    }
    /// The copy, when it is host memory.
    pub fn host_bytes(&self) -> Option<&[u8]> {
        match self.push {
            Some(k) => self.sub.pool.push_host(k, self.len() as usize),
            None => self.sub.pool.dest_host(),
        }
    }
    /// The copy as device memory in the subscriber's own context, when the
    /// ring is a CUDA ring (`None` for host memory: see
    /// [`Frame::host_bytes`]).
    pub fn device(&self) -> Option<DeviceView<'_>> {
        let addr = match self.push {
            Some(k) => self.sub.pool.push_addr(k),
            None => self.sub.pool.dest_addr(),
        };
        (self.sub.backend() == BackendKind::Cuda).then(|| DeviceView::new(addr, self.len()))
    }
    /// Copies the frame (`len()` bytes, planes at the offsets of
    /// [`Frame::geometry`]) into host memory `dst`, whatever the backend:
    /// a `memcpy` for a host ring, a synchronous device-to-host copy in the
    /// subscriber's own CUDA context for a CUDA ring. It reads the
    /// subscriber's own copy of the frame (or its push buffer), never the
    /// ring, so the bytes are the whole frame [`Subscriber::next`] proved.
    ///
    /// # Errors
    /// [`Error::TooLarge`] when `dst` is shorter than the frame; backend
    /// errors ([`Error::Driver`]).
    ///
    /// # Examples
    /// ```no_run
    /// use std::time::Duration;
    /// use vramring::{Subscriber, SubscriberOptions};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut sub = Subscriber::connect("/run/vramring/cam0.sock", SubscriberOptions::default())?;
    /// let frame = sub.next(Duration::from_secs(1))?;
    /// let mut pixels = vec![0u8; frame.len() as usize];
    /// frame.copy_to_host(&mut pixels)?; // host or CUDA ring alike
    /// # Ok(()) }
    /// ```
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        let len = usize::try_from(self.len()).map_err(|_| Error::TooLarge {
            len: usize::MAX,
            max: dst.len(),
        })?;
        if dst.len() < len {
            return Err(Error::TooLarge { len, max: dst.len() });
        }
        let buf = match self.push {
            Some(k) => OwnBuffer::Push(k),
            None => OwnBuffer::Dest,
        };
        self.sub.pool.read_own(buf, &mut dst[..len])
    }
    /// Whether the frame arrived by push delivery.
    pub fn pushed(&self) -> bool {
        self.push.is_some()
    }
    /// Bytes of the copy.
    pub fn len(&self) -> u64 {
        self.sub.info.geometry.frame_bytes
    }
    /// Whether the frame is empty (never: frames have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A frame read in place (zero copy). Call [`Borrow::release`] to learn
/// whether it stayed intact while you read it.
///
/// A pull subscriber reads the ring's slot; a push subscriber reads its
/// newest pushed buffer without holding it (the buffer it holds, if any,
/// stays held), so the publisher may rewrite it meanwhile, which `release`
/// then reports.
pub struct Borrow<'s> {
    sub: &'s mut Subscriber,
    snap: SlotSnapshot,
    skipped: u64,
    released: bool,
    /// The push buffer read in place, or `None` for the ring's slot.
    push: Option<usize>,
}

impl std::fmt::Debug for Borrow<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Borrow").field("seq", &self.snap.seq).finish()
    }
}

impl Borrow<'_> {
    /// The frame's seq.
    pub fn seq(&self) -> u64 {
        self.snap.seq
    }
    /// Presentation timestamp.
    pub fn pts(&self) -> i64 {
        self.snap.pts
    }
    /// `CLOCK_MONOTONIC` ns of the commit.
    pub fn commit_ns(&self) -> u64 {
        self.snap.commit_ns
    }
    /// Flags.
    pub fn flags(&self) -> u32 {
        self.snap.flags
    }
    /// Frames skipped between the previous delivered frame and this one.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }
    /// User metadata (as [`Frame::user`]).
    pub fn user(&self) -> Vec<u8> {
        self.snap.user_bytes()
    }
    /// Format and plane layout of the slot.
    pub fn geometry(&self) -> &Geometry {
        &self.sub.info.geometry
    }
    /// The ring's description (backend, device, geometry) of the publisher
    /// instance this frame came from.
    pub fn info(&self) -> &RingInfo {
        &self.sub.info
    }
    fn addr(&self) -> u64 {
        match self.push {
            Some(k) => self.sub.pool.push_addr(k),
            None => self.sub.slot_addr(self.snap.seq),
        }
    }
    /// The slot in this process's mapping (for a push subscriber, the push
    /// buffer holding the frame) as device memory, when the ring is a CUDA
    /// ring. The publisher may overwrite it while it is read:
    /// [`Borrow::release`] says whether it did.
    pub fn device(&self) -> Option<DeviceView<'_>> {
        (self.sub.backend() == BackendKind::Cuda).then(|| DeviceView::new(self.addr(), self.len()))
    }
    /// The slot (or push buffer) in this process's mapping, when the ring is
    /// a host ring: shared memory the publisher may overwrite while it is
    /// read, so no `&[u8]` is made over it. Read it with volatile or
    /// byte-wise copies (as [`Borrow::copy_to`] does), then
    /// [`Borrow::release`] says whether it was overwritten.
    pub fn host_ptr(&self) -> Option<*const u8> {
        (self.sub.backend() == BackendKind::Host).then(|| self.addr() as *const u8)
    }
    /// Whether the frame is read from a push buffer.
    pub fn pushed(&self) -> bool {
        self.push.is_some()
    }
    /// Bytes of the frame.
    pub fn len(&self) -> u64 {
        self.sub.info.geometry.frame_bytes
    }
    /// Whether the frame is empty (never).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies the slot's bytes into `dst` (host backend). The copy may be
    /// torn if the producer overwrote the slot; [`Borrow::release`] says.
    ///
    /// # Errors
    /// [`Error::WrongBackend`] on a GPU ring; [`Error::TooLarge`] if `dst`
    /// is shorter than the frame.
    pub fn copy_to(&self, dst: &mut [u8]) -> Result<()> {
        if self.sub.pool.kind() != BackendKind::Host {
            return Err(Error::WrongBackend {
                what: "CPU reads of a borrowed slot",
                backend: self.sub.pool.kind().name(),
            });
        }
        let len = self.len() as usize;
        if dst.len() < len {
            return Err(Error::TooLarge { len, max: dst.len() });
        }
        // SAFETY: the slot lies inside the mapped pool (validated geometry:
        // slot_count * slot_stride <= pool_bytes == mapped bytes), or push
        // buffer `k < PUSH_BUFFERS` inside our push mapping (each buffer
        // holds frame_bytes rounded up); `dst` holds `len` bytes and is
        // private memory, so no overlap. Bytes may change under the copy;
        // `release` detects that.
        unsafe { std::ptr::copy_nonoverlapping(self.addr() as *const u8, dst.as_mut_ptr(), len) };
        Ok(())
    }
    /// Ends the borrow. `Ok(())` when the frame stayed intact the whole time.
    ///
    /// # Errors
    /// [`Error::Overrun`] when the producer began overwriting the slot.
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        self.sub.finish_borrow(&self.snap, self.push, self.skipped)
    }
}

impl Drop for Borrow<'_> {
    fn drop(&mut self) {
        if !self.released {
            let _ = self.sub.finish_borrow(&self.snap, self.push, self.skipped);
        }
    }
}

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
    /// The publisher's cadence, for [`WaitStrategy::Cadence`].
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
        if opts.lossless {
            flags |= msg::HELLO_LOSSLESS;
        }
        if opts.mode == Mode::Sequential {
            flags |= msg::HELLO_SEQUENTIAL;
        }
        if opts.write {
            flags |= msg::HELLO_WRITE;
        }
        if opts.push {
            if opts.mode != Mode::Latest || opts.lossless {
                return Err(Error::Config(
                    "push delivery supports the Latest mode without lossless only".into(),
                ));
            }
            flags |= msg::HELLO_PUSH;
        }
        let hello = Hello {
            flags,
            backends,
            name: opts.name.clone(),
            device_uuid: [0; 16],
        };
        let (sock, welcome, fds) = lease::request(&path, hello, opts.connect_timeout)?;
        let push = welcome.granted & msg::HELLO_PUSH != 0;
        if opts.push && !push {
            return Err(Error::Refused {
                code: msg::REJECT_BAD_HELLO,
                reason: "push delivery not granted".into(),
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
            push_started: false,
            unreported: 0,
            cadence: Cadence::new(),
            in_flight: None,
            loan_trigger: false,
        };
        sub.loan_trigger = sub.info.gate_offset().is_some() && !super::publisher::published_here(sub.info.epoch);
        if !push && sub.opts.pull_start != PullStart::AfterCommit {
            let only_mps = sub.opts.pull_start == PullStart::Auto;
            // The pool's gate word in device memory (ADR 0011) where the
            // ring keeps one; `global_seq` in host memory (ADR 0010) else.
            match sub.info.gate_offset() {
                Some(off) => sub.pool.enable_pool_gate(off, only_mps)?,
                None => {
                    let header = sub.header();
                    let word = std::ptr::from_ref(&header.seq.global_seq) as u64 - sub.control.as_ptr() as u64;
                    sub.pool
                        .enable_gate(control_fd.as_fd(), sub.control.len() as u64, word, only_mps)?
                }
            };
        }
        // The service stored our cursor before it sent the Welcome
        // (sendmsg/recvmsg order it); nobody else writes it.
        let last = if sub.opts.lossless {
            sub.client().released_seq.load(Ordering::Relaxed)
        } else {
            // SYNC: global-seq — Acquire.
            sub.header().seq.global_seq.load(Ordering::Acquire).saturating_sub(1)
        };
        sub.last = last;
        if push {
            sub.attach_push()?;
        }
        Ok(sub)
    }

    /// Makes this subscriber's push buffers and sends them to the publisher.
    ///
    /// # Errors
    /// The backend's allocation error, or the socket's: a push subscriber
    /// has no pool to fall back on.
    fn attach_push(&mut self) -> Result<()> {
        let stride = self
            .info
            .geometry
            .frame_bytes
            .next_multiple_of(crate::format::SLOT_ALIGN);
        let (fd, bytes) = self.pool.alloc_push(PUSH_BUFFERS as u32, stride)?;
        let a = msg::Attach {
            count: PUSH_BUFFERS as u32,
            stride,
            bytes,
        };
        transport::send(self.lease.sock().as_fd(), &Msg::Attach(a).encode(), &[fd.as_fd()])
    }

    /// Push delivery, when the publisher has mapped our buffers: the newest
    /// pushed frame newer than `last` with its meta, held (`hold`, for
    /// `next`) or read in place (for `borrow`; see
    /// [`protocol::push::peek_newest`]).
    fn read_pushed(&mut self, g: u64, hold: bool) -> PushRead<SlotSnapshot> {
        let entry = self.entry();
        // SYNC: push-seq — Acquire pairs with the publisher's Release of
        // `push_count` after it mapped our buffers.
        if entry.push_count.load(Ordering::Acquire) as usize != PUSH_BUFFERS {
            // Not mapped yet: nothing reaches us; what has landed is a gap.
            // SYNC: global-seq — Acquire pairs with the commit's store.
            return PushRead::NotPushed(g.min(self.header().seq.global_seq.load(Ordering::Acquire)));
        }
        let how = if hold {
            protocol::push::Take::Hold(self.lease.client())
        } else {
            protocol::push::Take::Peek
        };
        let header = self.header();
        protocol::push::read_pushed(entry, how, &header.seq.global_seq, self.last, g, |_, seq| {
            // The meta lives in the ring's slot; read it under the seqlock.
            // If the slot moved on already, a newer frame has been pushed
            // too.
            let slot = slot_of(&self.control, &self.info, seq);
            match SlotSnapshot::look(slot, seq) {
                Look::Ready(snap) if snap.still_valid(slot) => Some(snap),
                _ => None,
            }
        })
    }

    /// The frames between `last` and pushed frame `seq`, which a push
    /// subscriber never gets (none before its first pushed frame: it had
    /// not joined the push stream yet); marks the stream started.
    fn push_gap(&mut self, seq: u64) -> u64 {
        let skipped = if self.push_started { seq - self.last - 1 } else { 0 };
        self.push_started = true;
        skipped
    }

    /// Push delivery found nothing pushed past `last` although the ring
    /// moved on to `g`: those frames were not pushed to us (all buffers
    /// held, or not mapped yet). A push subscriber has no pool to pull them
    /// from: once its stream has started they are a counted gap; before, it
    /// had not joined yet. `Err` ends the read (drained, or past the
    /// deadline); `Ok` waits again.
    fn nothing_pushed(&mut self, g: u64, deadline: Instant, timeout: Duration) -> Result<()> {
        if g > self.last {
            if self.push_started {
                self.lost(g - self.last);
            }
            self.last = g;
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
        self.opts.push && self.entry().push_count.load(Ordering::Acquire) as usize == PUSH_BUFFERS
    }

    /// Counters.
    pub fn stats(&self) -> SubscriberStats {
        self.stats
    }

    /// What the cadence wait ([`WaitStrategy::Cadence`]) knows of the
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

    /// Two loads per call: whether our entry is still ours. If not (evicted,
    /// or freed because the publisher saw us go), finds out why.
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
    fn drain_over(&mut self) -> Error {
        self.drained = true;
        self.lease.end(Error::ProducerGone { epoch: self.info.epoch })
    }

    /// Waits until `global_seq` passes `last` (or, with `announced` on a
    /// queued-pull subscriber, until `pending_seq` does: a commit has been
    /// enqueued; with `announced` on a push subscriber whose buffers are
    /// attached, until `global_seq` or one of its `push_seq` words does,
    /// which may be ahead of `global_seq`) and returns it.
    fn wait(&mut self, deadline: Instant, timeout: Duration, announced: bool) -> Result<u64> {
        if self.lease.draining() {
            return self.drain_next();
        }
        let slice = self.opts.park_slice;
        let outcome = {
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
                let attached = entry.push_count.load(Ordering::Acquire) as usize == PUSH_BUFFERS;
                Bell {
                    seq: &header.seq.global_seq,
                    producer: &header.producer,
                    pending: Some(&header.seq.pending_seq),
                    push: (announced && self.opts.push && attached).then_some(&entry.push_seq),
                    loaned: None,
                }
            };
            let lease = &self.lease;
            let alive = || lease.quiet();
            wait_by(
                self.opts.wait,
                &mut self.cadence,
                bell,
                lease.client(),
                self.last,
                deadline,
                self.opts.spin,
                slice,
                alive,
            )
        };
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

    /// The seq to read next (per the mode and the safe window) when the
    /// newest is `g`; `None` when nothing is new.
    fn pick(&self, g: u64) -> Option<protocol::Pick> {
        let window = protocol::safe_window(self.info.slot_count, self.opts.lossless);
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
        if self.opts.lossless {
            // SYNC: release-cursor — Release after the copy completed, paired
            // with the producer's Acquire in `Table::holder`.
            self.client().released_seq.store(snap.seq, Ordering::Release);
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
            if self.opts.push {
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
                        self.nothing_pushed(upto, deadline, timeout)?;
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

    /// Queued pull of `pick`, whose slot is loaned or whose commit is
    /// announced, but which has not landed: enqueues a GPU wait on the
    /// commit and the copy behind it, then finishes it as
    /// [`Subscriber::finish_queued`] does.
    fn queued_copy(
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
        self.pool
            .copy_out_gated(pick.seq, offset, self.info.geometry.frame_bytes)?;
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
    fn finish_queued(
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
                match self.pool.poll_complete() {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => {
                        // Never leave the wait on the stream `close` syncs.
                        self.in_flight = None;
                        self.stats.abandoned += 1;
                        if let Err(ae) = self.pool.abandon_copies() {
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
                    self.opts.park_slice,
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
    fn settle_in_flight(&mut self) -> Result<()> {
        if self.in_flight.take().is_none() {
            return Ok(());
        }
        let until = Instant::now() + QUEUED_CLOSE_WAIT;
        loop {
            match self.pool.poll_complete() {
                Ok(true) => return Ok(()),
                Ok(false) if Instant::now() < until => std::thread::sleep(Duration::from_micros(100)),
                _ => break,
            }
        }
        self.stats.abandoned += 1;
        self.pool.abandon_copies()
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
        loop {
            let g = self.wait(deadline, timeout, false)?;
            if self.opts.push {
                // As in `next`, without taking a hold.
                match self.read_pushed(g, false) {
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
                        self.nothing_pushed(upto, deadline, timeout)?;
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
            opts.connect_timeout = opts
                .connect_timeout
                .min(deadline.saturating_duration_since(Instant::now()));
            match Subscriber::connect(&self.path, opts) {
                Ok(mut fresh) => {
                    fresh.opts = self.opts.clone();
                    let mut stats = self.stats;
                    stats.reconnects += 1;
                    fresh.stats = SubscriberStats {
                        last_seq: fresh.stats.last_seq,
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
    ///
    /// # Errors
    /// The backend's release error.
    pub fn close(&mut self) -> Result<()> {
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
