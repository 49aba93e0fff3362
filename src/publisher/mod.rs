//! The publisher: creates the ring, serves subscribers on a socket, loans
//! slots and commits frames.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering as StdOrdering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::format::{Format, Geometry};
use crate::layout::{
    self, DoorbellLine, ProducerLine, RingHeader, RingInfo, SlotDesc, SubEntry, SubsHeader, DEFAULT_MAX_SUBSCRIBERS,
    MAX_SLOTS, MAX_SUBSCRIBERS_LIMIT, MIN_SLOTS, POLICY_LOSSLESS, POLICY_OVERWRITE, PRODUCER_CLOSED, PRODUCER_LIVE,
    SUBF_LOSSLESS, SUBF_PUSH, SUBF_SEQUENTIAL, SUBF_WRITE, SUB_ACTIVE, USER_META_BYTES, USER_META_WORDS,
};
use crate::lifecycle::{ExitPhase, ExitWorker};
use crate::memory::{BackendKind, ExportedPool, WriteCompletion};
use crate::protocol::{self, CommitMeta};
use crate::shm::{Region, SEALS_FIXED_SIZE, SEALS_READ_ONLY};
use crate::socket::msg::{self, Attach, Hello, Welcome};
use crate::socket::service::{Served, ServiceState};
use crate::socket::transport::{AccessPolicy, Listener};
use crate::time::{monotonic_ns, realtime_ns};

pub(crate) mod lossless;
use lossless::{Holder, LosslessGate};

/// What the producer does when a slot it wants to reuse is still held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Never wait: slow readers lose frames and are told (live video).
    #[default]
    Overwrite,
    /// Wait for lossless subscribers (bounded by the loan timeout), evicting
    /// one that holds a frame longer than the lease.
    Lossless,
}

/// Which memory the ring lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// Host shared memory.
    Host,
    /// CUDA device memory on the GPU with this ordinal (as this process sees it).
    Cuda(u32),
    /// CUDA device 0 when a usable GPU is present, host memory otherwise.
    #[default]
    Auto,
}

impl std::str::FromStr for BackendChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "host" => Ok(BackendChoice::Host),
            "cuda" => Ok(BackendChoice::Cuda(0)),
            "auto" => Ok(BackendChoice::Auto),
            other => match other.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
                Some(n) => Ok(BackendChoice::Cuda(n)),
                None => Err(Error::Config(format!(
                    "unknown backend {other:?}: use host, cuda, cuda:N or auto"
                ))),
            },
        }
    }
}

/// The shape and behaviour of a ring.
#[derive(Debug, Clone)]
pub struct RingConfig {
    /// Pixel format.
    pub format: Format,
    /// Width in pixels (bytes for raw).
    pub width: u32,
    /// Height in rows.
    pub height: u32,
    /// Slots, a power of two in 2..=1024.
    pub slots: u32,
    /// Producer policy.
    pub policy: Policy,
    /// Memory backend.
    pub backend: BackendChoice,
    /// Subscriber table entries.
    pub max_subscribers: u32,
    /// File mode of the socket (default `0o660`).
    pub socket_mode: u32,
    /// uid/gid allow-list checked with `SO_PEERCRED`.
    pub access: AccessPolicy,
    /// Whether subscribers that ask for write access to the pool get it.
    pub allow_write: bool,
    /// A lossless subscriber that holds the frame the producer needs for
    /// longer than this is evicted.
    pub lossless_lease: Duration,
    /// How long a connecting subscriber has to send its Hello.
    pub handshake_timeout: Duration,
}

impl RingConfig {
    /// A ring of 8 slots of `width`×`height` frames of `format`, overwrite
    /// policy, automatic backend.
    pub fn new(format: Format, width: u32, height: u32) -> Self {
        RingConfig {
            format,
            width,
            height,
            slots: 8,
            policy: Policy::Overwrite,
            backend: BackendChoice::Auto,
            max_subscribers: DEFAULT_MAX_SUBSCRIBERS,
            socket_mode: 0o660,
            access: AccessPolicy::default(),
            allow_write: false,
            lossless_lease: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(2),
        }
    }
    /// Sets the slot count.
    pub fn slots(mut self, n: u32) -> Self {
        self.slots = n;
        self
    }
    /// Sets the policy.
    pub fn policy(mut self, p: Policy) -> Self {
        self.policy = p;
        self
    }
    /// Sets the backend.
    pub fn backend(mut self, b: BackendChoice) -> Self {
        self.backend = b;
        self
    }
    /// Sets the subscriber table size.
    pub fn max_subscribers(mut self, n: u32) -> Self {
        self.max_subscribers = n;
        self
    }
    /// Sets the socket's file mode.
    pub fn socket_mode(mut self, mode: u32) -> Self {
        self.socket_mode = mode;
        self
    }
    /// Sets the uid/gid allow-list.
    pub fn access(mut self, a: AccessPolicy) -> Self {
        self.access = a;
        self
    }
    /// Grants write access to subscribers that ask for it.
    pub fn allow_write(mut self, yes: bool) -> Self {
        self.allow_write = yes;
        self
    }
    /// Sets the lossless lease.
    pub fn lossless_lease(mut self, d: Duration) -> Self {
        self.lossless_lease = d;
        self
    }

    fn validate(&self) -> Result<Geometry> {
        if !self.slots.is_power_of_two() || !(MIN_SLOTS..=MAX_SLOTS).contains(&self.slots) {
            return Err(Error::Config(format!(
                "slot count {} is not a power of two in {MIN_SLOTS}..={MAX_SLOTS}",
                self.slots
            )));
        }
        if self.max_subscribers == 0 || self.max_subscribers > MAX_SUBSCRIBERS_LIMIT {
            return Err(Error::Config(format!(
                "max_subscribers {} not in 1..={MAX_SUBSCRIBERS_LIMIT}",
                self.max_subscribers
            )));
        }
        Geometry::new(self.format, self.width, self.height)
    }
}

/// Per-frame metadata a publisher attaches at commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameMeta {
    /// Presentation timestamp, in the caller's units.
    pub pts: i64,
    /// `FRAME_*` flags (see [`crate::layout`]).
    pub flags: u32,
    user_len: u32,
    user: [u8; USER_META_BYTES],
}

impl Default for FrameMeta {
    fn default() -> Self {
        FrameMeta {
            pts: 0,
            flags: 0,
            user_len: 0,
            user: [0; USER_META_BYTES],
        }
    }
}

impl FrameMeta {
    /// Metadata with a pts.
    pub fn pts(pts: i64) -> Self {
        FrameMeta {
            pts,
            ..Default::default()
        }
    }

    /// Attaches up to 64 bytes of user metadata.
    ///
    /// # Errors
    /// [`Error::TooLarge`] past 64 bytes.
    pub fn with_user(mut self, bytes: &[u8]) -> Result<Self> {
        if bytes.len() > USER_META_BYTES {
            return Err(Error::TooLarge {
                len: bytes.len(),
                max: USER_META_BYTES,
            });
        }
        self.user = [0; USER_META_BYTES];
        self.user[..bytes.len()].copy_from_slice(bytes);
        self.user_len = bytes.len() as u32;
        Ok(self)
    }

    /// Sets flags.
    pub fn with_flags(mut self, flags: u32) -> Self {
        self.flags = flags;
        self
    }

    fn to_commit(self) -> CommitMeta {
        let mut user = [0u64; USER_META_WORDS];
        for (w, c) in user.iter_mut().zip(self.user.chunks_exact(8)) {
            *w = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
        }
        CommitMeta {
            pts: self.pts,
            flags: self.flags,
            commit_ns: monotonic_ns(),
            user_len: self.user_len,
            user,
        }
    }
}

/// Counters of a publisher.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Frames committed.
    pub published: u64,
    /// Subscribers connected now.
    pub subscribers: u32,
    /// Subscribers that connected so far.
    pub connects: u64,
    /// Subscribers whose connection closed so far.
    pub disconnects: u64,
    /// Lossless subscribers evicted.
    pub evictions: u64,
    /// Loans that had to wait for a lossless subscriber.
    pub lossless_waits: u64,
}

/// What the producer and the socket service share.
pub(crate) struct Shared {
    pub(crate) control: Region,
    pub(crate) subs: Region,
    pub(crate) control_fd: OwnedFd,
    pub(crate) subs_fd: OwnedFd,
    pub(crate) pool_fd: OwnedFd,
    pub(crate) info: RingInfo,
    pub(crate) cfg: RingConfig,
    /// Push buffers sent by subscribers; the producer maps them.
    pub(crate) attach_requests: Mutex<Vec<AttachRequest>>,
    /// Evictions, the service's waker, lossless-wait count.
    pub(crate) state: ServiceState,
}

/// A subscriber's push buffers, received by the service, mapped by the
/// producer thread (which owns the pool).
pub(crate) struct AttachRequest {
    pub(crate) index: u32,
    pub(crate) generation: u32,
    pub(crate) fd: OwnedFd,
    pub(crate) attach: crate::socket::Attach,
}

/// A push subscriber's buffers as mapped by the producer.
#[derive(Debug)]
struct PushTarget {
    index: usize,
    generation: u32,
    id: u64,
    stride: u64,
    newest: Option<usize>,
    pending: Option<usize>,
    dead: bool,
}

impl Shared {
    pub(crate) fn header(&self) -> &RingHeader {
        self.control.at::<RingHeader>(0)
    }
    pub(crate) fn slots(&self) -> &[SlotDesc] {
        self.control
            .slice::<SlotDesc>(std::mem::size_of::<RingHeader>(), self.info.slot_count as usize)
    }
    pub(crate) fn entries(&self) -> &[SubEntry] {
        self.subs
            .slice::<SubEntry>(std::mem::size_of::<SubsHeader>(), self.info.max_subscribers as usize)
    }
}

impl Served for Shared {
    fn producer(&self) -> &ProducerLine {
        &self.header().producer
    }
    fn doorbell(&self) -> &DoorbellLine {
        &self.header().doorbell
    }
    fn entries(&self) -> &[SubEntry] {
        Shared::entries(self)
    }
    fn access(&self) -> &AccessPolicy {
        &self.cfg.access
    }
    fn handshake_timeout(&self) -> Duration {
        self.cfg.handshake_timeout
    }
    fn state(&self) -> &ServiceState {
        &self.state
    }

    fn refuse(&self, hello: &Hello) -> Option<(u32, String)> {
        let info = &self.info;
        if hello.flags & msg::HELLO_PACKETS != 0 {
            return Some((
                msg::REJECT_KIND,
                "this socket serves a frame ring; connect a PacketSubscriber to a packet ring's socket".into(),
            ));
        }
        if hello.backends & (1 << info.backend) == 0 {
            let name = BackendKind::from_code(info.backend).map_or("?", |b| b.name());
            return Some((
                msg::REJECT_BACKEND,
                format!("the ring is on the {name} backend, which this subscriber cannot import"),
            ));
        }
        if hello.flags & msg::HELLO_LOSSLESS != 0 && info.policy == POLICY_OVERWRITE {
            return Some((
                msg::REJECT_POLICY,
                "lossless asked of a publisher with the overwrite policy".into(),
            ));
        }
        if hello.flags & msg::HELLO_WRITE != 0 && !self.cfg.allow_write {
            return Some((
                msg::REJECT_WRITE_DENIED,
                "write access to the pool is not granted by this publisher".into(),
            ));
        }
        None
    }

    fn entry_flags(&self, hello: &Hello) -> u32 {
        let mut flags = 0;
        for (h, f) in [
            (msg::HELLO_LOSSLESS, SUBF_LOSSLESS),
            (msg::HELLO_SEQUENTIAL, SUBF_SEQUENTIAL),
            (msg::HELLO_WRITE, SUBF_WRITE),
            (msg::HELLO_PUSH, SUBF_PUSH),
        ] {
            if hello.flags & h != 0 {
                flags |= f;
            }
        }
        flags
    }

    fn lossless_start(&self) -> u64 {
        // SYNC: global-seq — Acquire: the lossless cursor starts at the
        // newest committed frame, so the producer never waits for frames
        // published before this subscriber joined.
        self.header().seq.global_seq.load(StdOrdering::Acquire)
    }

    fn welcome(&self, index: u32, generation: u32, hello: &Hello) -> (Welcome, Vec<BorrowedFd<'_>>) {
        let info = &self.info;
        let welcome = Welcome {
            index,
            generation,
            epoch: info.epoch,
            backend: info.backend,
            granted: hello.flags & (msg::HELLO_LOSSLESS | msg::HELLO_SEQUENTIAL | msg::HELLO_WRITE | msg::HELLO_PUSH),
            control_bytes: self.control.len() as u64,
            subs_bytes: self.subs.len() as u64,
            pool_bytes: info.pool_bytes,
            device_uuid: info.device_uuid,
        };
        (
            welcome,
            vec![self.control_fd.as_fd(), self.subs_fd.as_fd(), self.pool_fd.as_fd()],
        )
    }

    /// Checks a subscriber's push buffers against the ring and hands them
    /// to the producer thread, which maps them. Bad ones are dropped (the
    /// subscriber stays on pull delivery).
    fn attach(&self, index: u32, a: Attach, fds: Vec<OwnedFd>) {
        let Some(e) = Shared::entries(self).get(index as usize) else {
            return;
        };
        // Relaxed: written by the service thread, which calls us.
        let push = e.flags.load(StdOrdering::Relaxed) & SUBF_PUSH != 0;
        let frame = self.info.geometry.frame_bytes;
        let ok = push
            && fds.len() == 1
            && a.count as usize == layout::PUSH_BUFFERS
            && a.stride >= frame
            && a.stride
                .checked_mul(u64::from(a.count))
                .is_some_and(|need| need <= a.bytes);
        let Some(fd) = fds.into_iter().next().filter(|_| ok) else {
            tracing::warn!(index, ?a, "ignoring a malformed Attach");
            return;
        };
        let generation = e.generation.load(StdOrdering::Relaxed);
        if let Ok(mut q) = self.attach_requests.lock() {
            q.push(AttachRequest {
                index,
                generation,
                fd,
                attach: a,
            });
        }
    }
}

/// The producer side of a ring.
///
/// # Examples
/// ```no_run
/// use std::time::Duration;
/// use vramring::{Format, FrameMeta, Publisher, RingConfig};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut p = Publisher::create("/tmp/cam.sock", RingConfig::new(Format::Gray8, 640, 480))?;
/// let mut slot = p.loan(Duration::from_millis(50))?;
/// slot.plane_mut(0)?.fill(0x80);
/// slot.publish(FrameMeta::pts(0))?;
/// # Ok(()) }
/// ```
pub struct Publisher {
    shared: Arc<Shared>,
    pool: Box<dyn ExportedPool>,
    service: Option<ExitWorker>,
    next_seq: u64,
    /// The wait for lossless readers.
    gate: LosslessGate,
    targets: Vec<PushTarget>,
    path: PathBuf,
    closed: bool,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("path", &self.path)
            .field("epoch", &format_args!("{:#018x}", self.shared.info.epoch))
            .field("backend", &self.pool.kind())
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

pub(crate) fn random_epoch() -> u64 {
    let mut b = [0u8; 8];
    if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).is_err() {
        // Fall back to time and pid; the epoch only needs to differ between
        // publisher instances at one path.
        return realtime_ns() ^ (u64::from(std::process::id()) << 32);
    }
    u64::from_le_bytes(b) | 1
}

pub(crate) fn create_pool(choice: BackendChoice, bytes: u64) -> Result<Box<dyn ExportedPool>> {
    match choice {
        BackendChoice::Host => Ok(Box::new(crate::memory::host::HostPool::create(bytes)?)),
        BackendChoice::Cuda(ordinal) => crate::memory::cuda::create_pool(ordinal, bytes),
        BackendChoice::Auto => {
            if crate::memory::cuda::cuda_usable() {
                crate::memory::cuda::create_pool(0, bytes)
            } else {
                Ok(Box::new(crate::memory::host::HostPool::create(bytes)?))
            }
        }
    }
}

impl Publisher {
    /// Creates a ring and starts serving subscribers at `path`.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad configuration, [`Error::AddressInUse`]
    /// when a live publisher owns `path`, backend errors (e.g.
    /// [`Error::OutOfDeviceMemory`]), [`Error::Io`].
    pub fn create(path: impl AsRef<Path>, cfg: RingConfig) -> Result<Publisher> {
        let path = path.as_ref().to_owned();
        let geometry = cfg.validate()?;
        // Bind first: a second publisher at a live path fails before it
        // allocates anything.
        let listener = Listener::bind(&path, cfg.socket_mode)?;
        let pool_bytes = geometry
            .slot_stride
            .checked_mul(u64::from(cfg.slots))
            .ok_or_else(|| Error::Config("ring size overflows".into()))?;
        let mut pool = create_pool(cfg.backend, pool_bytes)?;
        match Self::build(listener, &mut pool, &path, cfg, geometry) {
            Ok((shared, service)) => Ok(Publisher {
                shared,
                pool,
                service: Some(service),
                next_seq: 1,
                gate: LosslessGate::default(),
                targets: Vec::new(),
                path,
                closed: false,
            }),
            Err(e) => {
                if let Err(close_err) = pool.close() {
                    tracing::warn!(error = %close_err, "closing the pool after a failed create");
                }
                Err(e)
            }
        }
    }

    fn build(
        listener: Listener,
        pool: &mut Box<dyn ExportedPool>,
        path: &Path,
        cfg: RingConfig,
        geometry: Geometry,
    ) -> Result<(Arc<Shared>, ExitWorker)> {
        let epoch = random_epoch();
        let info = RingInfo {
            epoch,
            slot_count: cfg.slots,
            backend: pool.kind().code(),
            policy: if cfg.policy == Policy::Lossless {
                POLICY_LOSSLESS
            } else {
                POLICY_OVERWRITE
            },
            geometry,
            pool_bytes: pool.pool_bytes(),
            device_uuid: pool.device_uuid(),
            max_subscribers: cfg.max_subscribers,
            control_bytes: layout::control_bytes(cfg.slots),
        };
        let (control, control_fd) = Region::create("vramring-control", info.control_bytes)?;
        info.write_to(control.at::<RingHeader>(0), realtime_ns());
        let (subs, subs_fd) = Region::create("vramring-subs", layout::subs_bytes(cfg.max_subscribers))?;
        subs.at::<SubsHeader>(0).init(cfg.max_subscribers, epoch);
        Region::seal(control_fd.as_fd(), SEALS_READ_ONLY)?;
        Region::seal(subs_fd.as_fd(), SEALS_FIXED_SIZE)?;
        let pool_fd = pool.export_fd()?;
        let header = control.at::<RingHeader>(0);
        // SYNC: producer-state — Release: the ring is ready before any
        // subscriber can connect (the service starts below).
        header
            .producer
            .state
            .store(PRODUCER_LIVE, std::sync::atomic::Ordering::Release);
        let shared = Arc::new(Shared {
            control,
            subs,
            control_fd,
            subs_fd,
            pool_fd,
            info,
            cfg,
            attach_requests: Mutex::new(Vec::new()),
            state: ServiceState::new()?,
        });
        let svc_shared = Arc::clone(&shared);
        // The service thread registers with the process-exit registry: a
        // `std::process::exit` with a live publisher stops and joins it (it
        // marks the ring closed and says Bye) before CUDA's exit handlers.
        let service = ExitWorker::builder(format!("vramring-service:{}", path.display()), ExitPhase::Service)
            .spawn(move |stop| crate::socket::service::run(svc_shared, listener, stop))?;
        Ok((shared, service))
    }

    /// The ring's immutable description.
    pub fn info(&self) -> &RingInfo {
        &self.shared.info
    }

    /// The slot geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.shared.info.geometry
    }

    /// The backend in use.
    pub fn backend(&self) -> BackendKind {
        self.pool.kind()
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The seq the next published frame will carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Address of the pool in this process (host pointer or `CUdeviceptr`).
    pub fn pool_base(&self) -> u64 {
        self.pool.base_addr()
    }

    /// Loans the next slot for writing, marking it invalid first.
    ///
    /// Under [`Policy::Lossless`] this waits, at most `timeout`, until every
    /// lossless subscriber has released the frame the slot still holds; a
    /// subscriber that holds it past the lease is evicted.
    ///
    /// # Errors
    /// [`Error::LosslessBlocked`] when the wait runs out; [`Error::Closed`].
    pub fn loan(&mut self, timeout: Duration) -> Result<SlotMut<'_>> {
        if self.closed {
            return Err(Error::Closed);
        }
        let seq = self.next_seq;
        let n = u64::from(self.shared.info.slot_count);
        let index = (seq & self.shared.info.mask()) as usize;
        if self.shared.cfg.policy == Policy::Lossless && seq > n {
            self.wait_lossless(seq - n, timeout)?;
        }
        protocol::invalidate(&self.shared.slots()[index], seq);
        Ok(SlotMut {
            publisher: self,
            seq,
            index,
        })
    }

    fn wait_lossless(&mut self, held_seq: u64, timeout: Duration) -> Result<()> {
        let sh = &*self.shared;
        self.gate.wait(sh, sh.cfg.lossless_lease, timeout, || {
            protocol::lossless_holder(sh.entries(), held_seq).map(|(k, _)| Holder {
                index: k,
                generation: sh.entries()[k].generation.load(StdOrdering::Relaxed),
                key: held_seq,
                held_seq,
            })
        })
    }

    /// Maps push buffers that subscribers sent, and unmaps those of
    /// subscribers that left. Runs on the producer thread, which owns the pool.
    fn sync_targets(&mut self) {
        let requests = match self.shared.attach_requests.lock() {
            Ok(mut q) if !q.is_empty() => std::mem::take(&mut *q),
            _ => Vec::new(),
        };
        let entries = self.shared.entries();
        let live = |index: usize, generation: u32| {
            let e = &entries[index];
            // SYNC: sub-state — Acquire.
            e.state.load(std::sync::atomic::Ordering::Acquire) == SUB_ACTIVE
                && e.generation.load(std::sync::atomic::Ordering::Relaxed) == generation
        };
        for r in requests {
            let index = r.index as usize;
            if index >= entries.len() || !live(index, r.generation) {
                continue;
            }
            match self.pool.attach_target(&r.fd, r.attach.bytes) {
                Ok(id) => {
                    let e = &entries[index];
                    for w in &e.push_seq {
                        // Relaxed: published by the Release of push_count.
                        w.store(0, std::sync::atomic::Ordering::Relaxed);
                    }
                    // SYNC: push-seq — Release; the subscriber switches to
                    // push delivery when it sees the count.
                    e.push_count
                        .store(layout::PUSH_BUFFERS as u32, std::sync::atomic::Ordering::Release);
                    self.targets.push(PushTarget {
                        index,
                        generation: r.generation,
                        id,
                        stride: r.attach.stride,
                        newest: None,
                        pending: None,
                        dead: false,
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, index, "could not map a subscriber's push buffers; it stays on pull delivery")
                }
            }
        }
        for t in &mut self.targets {
            if !t.dead && !live(t.index, t.generation) {
                t.dead = true;
            }
        }
        let pool = &mut self.pool;
        self.targets.retain(|t| {
            if !t.dead {
                return true;
            }
            match pool.detach_target(t.id) {
                Ok(()) => false,
                Err(e) => {
                    tracing::warn!(error = %e, "unmapping a departed subscriber's push buffers failed; retrying at the next publish");
                    true
                }
            }
        });
    }

    fn commit(&mut self, seq: u64, index: usize, meta: FrameMeta, completion: WriteCompletion) -> Result<()> {
        self.sync_targets();
        let g = self.shared.info.geometry;
        let slot_offset = index as u64 * g.slot_stride;
        let entries = self.shared.entries();
        for t in self.targets.iter_mut().filter(|t| !t.dead) {
            t.pending = protocol::push::claim_buffer(&entries[t.index], t.newest, seq);
            if let Some(k) = t.pending {
                let dst = k as u64 * t.stride;
                if let Err(e) = self.pool.push_copy(t.id, dst, slot_offset, g.frame_bytes, completion) {
                    tracing::warn!(error = %e, index = t.index, "push copy failed; the subscriber sees a gap");
                    t.pending = None;
                }
            }
        }
        // One synchronisation covers the user's writes and every push copy.
        self.pool.complete_writes(completion)?;
        let sh = &self.shared;
        protocol::commit_slot(&sh.slots()[index], seq, &meta.to_commit());
        for t in &mut self.targets {
            if let Some(k) = t.pending.take() {
                protocol::push::complete_buffer(&entries[t.index], k, seq);
                t.newest = Some(k);
            }
        }
        if protocol::publish_global(sh.header(), seq, entries) {
            protocol::ring_doorbell(sh.header());
        }
        self.next_seq = seq + 1;
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> PublisherStats {
        let p = &self.shared.header().producer;
        let r = std::sync::atomic::Ordering::Relaxed;
        PublisherStats {
            published: p.published.load(r),
            subscribers: self
                .shared
                .entries()
                .iter()
                .filter(|e| e.state.load(r) == SUB_ACTIVE)
                .count() as u32,
            connects: p.connects.load(r),
            disconnects: p.disconnects.load(r),
            evictions: p.evictions.load(r),
            lossless_waits: self.shared.state.lossless_waits.load(r),
        }
    }

    /// Stops serving, tells subscribers the ring is closed, and releases
    /// the pool. Retryable after an error; idempotent after success.
    ///
    /// # Errors
    /// The backend's release error; the pool stays reachable for a retry.
    pub fn close(&mut self) -> Result<()> {
        if !self.closed {
            let header = self.shared.header();
            // SYNC: producer-state — Release; subscribers Acquire it and
            // report `ProducerGone` promptly.
            header
                .producer
                .state
                .store(PRODUCER_CLOSED, std::sync::atomic::Ordering::Release);
            protocol::ring_doorbell(header);
            if let Some(worker) = self.service.take() {
                let outcome = worker.stop();
                tracing::debug!(?outcome, "socket service stopped");
            }
            self.closed = true;
        }
        self.pool.close()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, path = %self.path.display(), "publisher close failed in drop");
        }
    }
}

/// A loaned slot: write the frame, then [`SlotMut::publish`].
///
/// Dropping it without publishing leaves the slot invalid and the seq
/// unused; the next loan reuses both.
pub struct SlotMut<'p> {
    publisher: &'p mut Publisher,
    seq: u64,
    index: usize,
}

impl std::fmt::Debug for SlotMut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotMut")
            .field("seq", &self.seq)
            .field("index", &self.index)
            .finish()
    }
}

impl SlotMut<'_> {
    /// The seq this frame will carry.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The slot index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The slot geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.publisher.shared.info.geometry
    }

    /// The ring's backend: whether [`SlotMut::addr`] is a host pointer or a
    /// `CUdeviceptr`.
    pub fn backend(&self) -> BackendKind {
        self.publisher.pool.kind()
    }

    /// Address of the slot's first byte (host pointer or `CUdeviceptr`).
    pub fn addr(&self) -> u64 {
        self.publisher.pool.base_addr() + self.index as u64 * self.geometry().slot_stride
    }

    /// Address of plane `k` (host pointer or `CUdeviceptr`); write it on
    /// your own CUDA stream and pass that stream to
    /// [`SlotMut::publish_cuda`].
    ///
    /// # Errors
    /// [`Error::Config`] for a plane the format does not have.
    pub fn plane_addr(&self, k: usize) -> Result<u64> {
        let g = self.geometry();
        let p = g
            .planes()
            .get(k)
            .ok_or_else(|| Error::Config(format!("{} has no plane {k}", g.format.name())))?;
        Ok(self.addr() + p.offset)
    }

    /// The whole slot (`frame_bytes`) as bytes, host backend only.
    ///
    /// # Errors
    /// [`Error::WrongBackend`] on a GPU ring.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        let len = self.geometry().frame_bytes as usize;
        self.host_range(0, len)
    }

    /// Plane `k` (`pitch * rows` bytes), host backend only.
    ///
    /// # Errors
    /// [`Error::WrongBackend`] on a GPU ring, [`Error::Config`] for a
    /// plane the format does not have.
    pub fn plane_mut(&mut self, k: usize) -> Result<&mut [u8]> {
        let g = *self.geometry();
        let p = *g
            .planes()
            .get(k)
            .ok_or_else(|| Error::Config(format!("{} has no plane {k}", g.format.name())))?;
        self.host_range(p.offset as usize, p.span() as usize)
    }

    fn host_range(&mut self, offset: usize, len: usize) -> Result<&mut [u8]> {
        if self.publisher.pool.kind() != BackendKind::Host {
            return Err(Error::WrongBackend {
                what: "CPU access to a slot",
                backend: self.publisher.pool.kind().name(),
            });
        }
        let ptr = (self.addr() as usize + offset) as *mut u8;
        // SAFETY: the range lies inside this slot of the publisher's own
        // read-write mapping (offset + len <= frame_bytes <= slot_stride, and
        // the pool holds slot_count strides); the slot was invalidated, so
        // this `&mut self` loan is its only writer in this process. Peers
        // only read it, unless granted write access, in which case they are
        // trusted not to write a slot they do not own.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    /// Commits a frame written by the CPU (host backend).
    ///
    /// # Errors
    /// [`Error::WrongBackend`] on a GPU ring (use [`SlotMut::publish_cuda`]).
    pub fn publish(self, meta: FrameMeta) -> Result<u64> {
        let seq = self.seq;
        let kind = self.publisher.pool.kind();
        if kind != BackendKind::Host {
            return Err(Error::WrongBackend {
                what: "publishing without a CUDA stream",
                backend: kind.name(),
            });
        }
        self.publisher.commit(seq, self.index, meta, WriteCompletion::Host)?;
        Ok(seq)
    }

    /// Commits a frame written on CUDA stream `stream`: synchronises the
    /// stream, then commits.
    ///
    /// # Safety
    /// `stream` must be a valid `CUstream` of the ring's CUDA context (or
    /// null for the legacy default stream) that stays valid for this call.
    ///
    /// # Errors
    /// The driver's error from `cuStreamSynchronize`; the slot stays
    /// invalid and the seq unused.
    pub unsafe fn publish_cuda(self, meta: FrameMeta, stream: crate::memory::RawCuStream) -> Result<u64> {
        let seq = self.seq;
        self.publisher
            .commit(seq, self.index, meta, WriteCompletion::CudaStream(stream))?;
        Ok(seq)
    }
}
