//! The publisher: creates the ring, serves subscribers on a socket, loans
//! slots and commits frames.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::protocol::{self, CommitMeta};
use crate::error::{Error, Result};
use crate::format::{Format, Geometry};
use crate::layout::{
    self, ProducerLine, RingHeader, RingInfo, SlotDesc, EVICT_PUSH, MAX_SLOTS, MIN_SLOTS, POLICY_LOSSLESS,
    POLICY_OVERWRITE, PRODUCER_CLOSED, PRODUCER_LIVE, SUBF_LOSSLESS, SUBF_PUSH, SUBF_SEQUENTIAL, SUBF_WRITE,
    USER_META_BYTES, USER_META_WORDS,
};
use crate::lifecycle::{ExitPhase, ExitWorker};
use crate::memory::cuda::CommitGraph;
use crate::memory::view::{DeviceViewMut, Stream};
use crate::memory::{BackendKind, ExportedPool, MappedTarget, TargetMapper, WriteCompletion};
use crate::ring::lossless::{Holder, LosslessGate};
use crate::ring::serve::{self, Served, ServiceState};
use crate::ring::table::{Assigned, Table};
use crate::ring::{PublisherStats, ServeConfig, ServeOptions};
use crate::shm::{Region, SEALS_READ_ONLY};
use crate::socket::msg::{self, Attach, Hello, Welcome};
use crate::socket::transport::Listener;
use crate::socket::PeerFd;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::time::{monotonic_ns, realtime_ns};

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

/// How a frame written on a CUDA stream is committed
/// ([`SlotMut::publish_cuda`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CommitMode {
    /// Enqueue the push copies and the commit on the writer's stream,
    /// behind the frame's writes, and return at once: the GPU stores the
    /// seqs into the ring's shared memory when the frame is complete
    /// (ADR 0009, PROTOCOL.md §10.1). Falls back to [`CommitMode::Synchronous`]
    /// where the driver cannot register the ring's memory.
    #[default]
    Stream,
    /// Synchronise the writer's stream on the publisher's thread, then
    /// commit on the CPU (protocol 2's path; every publish blocks for the
    /// frame's writes and every push copy).
    Synchronous,
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

/// Who may receive the pool's descriptor (pull delivery).
///
/// A pull subscriber maps the slot pool itself. On the host backend its
/// descriptor is read-only and the pool sealed, so it can only read; a CUDA
/// VMM descriptor carries no access mode (the importer chooses its own), so
/// a publisher that does not trust its subscribers with the pool refuses
/// pull delivery and serves push delivery only, which never hands the pool
/// out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PullAccess {
    /// Every subscriber may pull.
    #[default]
    Anyone,
    /// Only subscribers with these uids (`SO_PEERCRED`) may pull; the
    /// others must ask for push delivery.
    Uids(Vec<u32>),
    /// Nobody pulls: push delivery only.
    Nobody,
}

impl PullAccess {
    /// Whether a peer with `uid` may receive the pool.
    pub fn allows(&self, uid: u32) -> bool {
        match self {
            PullAccess::Anyone => true,
            PullAccess::Uids(list) => list.contains(&uid),
            PullAccess::Nobody => false,
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
    /// Whether subscribers that ask for write access to the pool get it.
    pub allow_write: bool,
    /// Who may pull (receive the pool's descriptor).
    pub pull: PullAccess,
    /// How CUDA frames are committed.
    pub commit: CommitMode,
    /// When a CUDA ring's push commits replay the commit graph instead of
    /// launching the commit kernel.
    pub commit_graph: CommitGraph,
    /// The serving settings shared with the packet ring.
    pub serve: ServeConfig,
}

impl ServeOptions for RingConfig {
    fn serve_mut(&mut self) -> &mut ServeConfig {
        &mut self.serve
    }
}

impl RingConfig {
    /// A ring of 8 slots of `width`×`height` frames of `format`, overwrite
    /// policy, automatic backend, anyone may pull, nobody writes.
    pub fn new(format: Format, width: u32, height: u32) -> Self {
        RingConfig {
            format,
            width,
            height,
            slots: 8,
            policy: Policy::Overwrite,
            backend: BackendChoice::Auto,
            allow_write: false,
            pull: PullAccess::Anyone,
            commit: CommitMode::Stream,
            commit_graph: CommitGraph::AUTO,
            serve: ServeConfig::default(),
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
    /// Grants write access to subscribers that ask for it. The host pool is
    /// then not sealed against writes: any subscriber able to reopen its
    /// descriptor could write it (see `docs/SECURITY.md`).
    pub fn allow_write(mut self, yes: bool) -> Self {
        self.allow_write = yes;
        self
    }
    /// Sets who may pull.
    pub fn pull(mut self, p: PullAccess) -> Self {
        self.pull = p;
        self
    }
    /// Sets how CUDA frames are committed.
    pub fn commit(mut self, m: CommitMode) -> Self {
        self.commit = m;
        self
    }
    /// Sets when push commits replay the commit graph (CUDA rings).
    pub fn commit_graph(mut self, g: CommitGraph) -> Self {
        self.commit_graph = g;
        self
    }

    fn validate(&self) -> Result<Geometry> {
        if !self.slots.is_power_of_two() || !(MIN_SLOTS..=MAX_SLOTS).contains(&self.slots) {
            return Err(Error::Config(format!(
                "slot count {} is not a power of two in {MIN_SLOTS}..={MAX_SLOTS}",
                self.slots
            )));
        }
        self.serve.validate()?;
        Geometry::new(self.format, self.width, self.height)
    }
}

/// Per-frame metadata a publisher attaches at commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameMeta {
    /// Presentation timestamp, in the caller's units.
    pub pts: i64,
    /// Flags the subscribers see: [`FRAME_KEY`](crate::frame::FRAME_KEY),
    /// [`FRAME_DISCONTINUITY`](crate::frame::FRAME_DISCONTINUITY), or your
    /// own in the other bits.
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

/// What the producer and the socket service share.
pub(crate) struct Shared {
    pub(crate) control: Region,
    /// Read-only reopen of the sealed control memfd, sent in every Welcome.
    pub(crate) control_fd: OwnedFd,
    pub(crate) table: Table,
    /// The pool for pull subscribers without write access (read-only for
    /// host memory).
    pub(crate) pool_fd: OwnedFd,
    /// The pool for subscribers granted write access.
    pub(crate) pool_rw_fd: Option<OwnedFd>,
    pub(crate) info: RingInfo,
    pub(crate) cfg: RingConfig,
    /// Push buffers sent by subscribers (mapped already where the pool has
    /// a mapper), for the producer to take as targets.
    pub(crate) attach_requests: Mutex<Vec<AttachRequest>>,
    /// Maps and unmaps push buffers on the service thread instead of the
    /// producer's (CUDA, ADR 0018); `None`: the producer maps them (host).
    pub(crate) mapper: Option<Arc<dyn TargetMapper>>,
    /// Push buffers the producer let go of, for the service to unmap.
    pub(crate) unmaps: Mutex<Vec<MappedTarget>>,
    /// Evictions, the service's waker, counters.
    pub(crate) state: ServiceState,
}

/// A push subscriber's buffers as they reach the producer.
pub(crate) enum Buffers {
    /// The descriptor, for the producer to map (a pool without a mapper);
    /// dropped where its close cannot block ([`PeerFd`]).
    Received(PeerFd),
    /// Mapped by the service thread already.
    Mapped(MappedTarget),
}

/// A subscriber's push buffers, received (and, with a mapper, mapped) by
/// the service, taken as a target by the producer thread (which owns the
/// pool).
pub(crate) struct AttachRequest {
    pub(crate) index: u32,
    pub(crate) generation: u32,
    pub(crate) buffers: Buffers,
    pub(crate) attach: crate::socket::Attach,
    /// Stream-order commits: the newest seq enqueued when the producer
    /// first saw the request; the producer takes it once the GPU has
    /// committed that seq (`None` until seen).
    pub(crate) after: Option<u64>,
}

/// Push targets the producer takes per publish, at most, first come first
/// served: a peer that attaches and leaves in a loop adds a bounded amount
/// of work to a frame (with a mapper, taking a mapped target costs about a
/// microsecond; without one, the host `mmap` costs a few).
const ATTACHES_PER_PUBLISH: usize = 4;

/// A push subscriber's buffers as mapped by the producer.
#[derive(Debug)]
struct PushTarget {
    index: usize,
    generation: u32,
    id: u64,
    stride: u64,
    newest: Option<usize>,
    pending: Option<usize>,
    /// Stream-order commits: the seq last enqueued into each buffer (a
    /// buffer whose seq the GPU has not committed yet is not claimed).
    enqueued: [u64; layout::PUSH_BUFFERS],
    dead: bool,
}

/// Takes from `queue`, first come first served, at most
/// [`ATTACHES_PER_PUBLISH`] requests whose buffers may be mapped now:
/// every commit enqueued when the request was first seen (`newest` then)
/// has landed (`committed`). A newcomer may sit at the index of a
/// subscriber whose frames are still being committed on the GPU, which
/// stores into the entry's `push_seq` words; mapping clears them, so it
/// waits for those stores. The rest stay queued for a later publish.
fn take_ready(queue: &mut Vec<AttachRequest>, newest: u64, committed: u64) -> Vec<AttachRequest> {
    let mut ready = Vec::new();
    let mut i = 0;
    while i < queue.len() && ready.len() < ATTACHES_PER_PUBLISH {
        if *queue[i].after.get_or_insert(newest) <= committed {
            ready.push(queue.remove(i));
        } else {
            i += 1;
        }
    }
    ready
}

impl PushTarget {
    /// Whether every frame enqueued into the buffers has been committed
    /// (`committed`: `global_seq`): no copy into them is in flight, and
    /// they may be unmapped without waiting for the GPU.
    fn copies_landed(&self, committed: u64) -> bool {
        self.enqueued.iter().all(|&s| s <= committed)
    }
}

impl Shared {
    /// Evicts the push subscriber at `index`/`generation` whose buffers
    /// cannot be mapped (it has no pool to fall back on): marks the entry,
    /// counts it, and has the service tell it.
    fn evict_push(&self, index: usize, generation: u32) {
        if self.table.evict(index, generation, EVICT_PUSH) {
            // Relaxed: a counter for stats.
            self.header().producer.evictions.fetch_add(1, Ordering::Relaxed);
            self.state.request_eviction(index, generation, EVICT_PUSH);
        }
    }

    /// Removes from the attach queue `q` the requests of subscribers that
    /// left (their entry is no longer live with the same generation), and
    /// returns them for [`Shared::discard`]: the queue holds at most one
    /// request per live entry.
    fn take_departed(&self, q: &mut Vec<AttachRequest>) -> Vec<AttachRequest> {
        let (live, gone) = std::mem::take(q)
            .into_iter()
            .partition(|r| self.table.live(r.index as usize, r.generation));
        *q = live;
        gone
    }

    /// Lets go of push buffers no target will use: a received descriptor
    /// closes; mapped buffers go to the service to be unmapped (`now`: on
    /// the service thread, which unmaps them at once).
    fn discard(&self, b: Buffers, now: bool) {
        let Buffers::Mapped(mut t) = b else {
            return;
        };
        if now {
            if let Some(m) = &self.mapper {
                match m.unmap(&mut t) {
                    Ok(()) => return,
                    Err(e) => tracing::warn!(error = %e, "unmapping push buffers nobody uses; retrying"),
                }
            }
        }
        if let Ok(mut q) = self.unmaps.lock() {
            q.push(t);
        }
        if !now {
            self.state.waker.wake();
        }
    }

    /// Service thread: unmaps the push buffers the producer let go of;
    /// those that fail stay for the next round.
    fn unmap_released(&self) {
        let Some(m) = &self.mapper else {
            return;
        };
        let mut todo = match self.unmaps.lock() {
            Ok(mut q) if !q.is_empty() => std::mem::take(&mut *q),
            _ => return,
        };
        todo.retain_mut(|t| match m.unmap(t) {
            Ok(()) => false,
            Err(e) => {
                tracing::warn!(error = %e, "unmapping a departed subscriber's push buffers; retrying");
                true
            }
        });
        if let Ok(mut q) = self.unmaps.lock() {
            q.append(&mut todo);
        }
    }

    pub(crate) fn header(&self) -> &RingHeader {
        self.control.at::<RingHeader>(0)
    }
    pub(crate) fn slots(&self) -> &[SlotDesc] {
        self.control
            .slice::<SlotDesc>(std::mem::size_of::<RingHeader>(), self.info.slot_count as usize)
    }
    /// Bytes a push subscriber's buffer stride must be.
    fn push_stride(&self) -> u64 {
        self.info
            .geometry
            .frame_bytes
            .next_multiple_of(crate::format::SLOT_ALIGN)
    }
}

impl Served for Shared {
    fn producer(&self) -> &ProducerLine {
        &self.header().producer
    }
    fn table(&self) -> &Table {
        &self.table
    }
    fn serve_config(&self) -> &ServeConfig {
        &self.cfg.serve
    }
    fn state(&self) -> &ServiceState {
        &self.state
    }

    fn refuse(&self, hello: &Hello, uid: u32) -> Option<(u32, String)> {
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
        let push = hello.flags & msg::HELLO_PUSH != 0;
        if push && hello.flags & (msg::HELLO_LOSSLESS | msg::HELLO_SEQUENTIAL | msg::HELLO_WRITE) != 0 {
            return Some((
                msg::REJECT_BAD_HELLO,
                "push delivery is for latest readers without lossless or write access".into(),
            ));
        }
        if hello.flags & msg::HELLO_WRITE != 0 && !self.cfg.allow_write {
            return Some((
                msg::REJECT_WRITE_DENIED,
                "write access to the pool is not granted by this publisher".into(),
            ));
        }
        if !push && !self.cfg.pull.allows(uid) {
            return Some((
                msg::REJECT_PULL_DENIED,
                format!("this publisher does not hand its pool to uid {uid}; ask for push delivery"),
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
        self.header().seq.global_seq.load(Ordering::Acquire)
    }

    fn welcome(&self, a: &Assigned, hello: &Hello) -> (Welcome, BorrowedFd<'_>, Option<BorrowedFd<'_>>) {
        let info = &self.info;
        let welcome = Welcome {
            index: a.index,
            generation: a.generation,
            epoch: info.epoch,
            backend: info.backend,
            granted: hello.flags & (msg::HELLO_LOSSLESS | msg::HELLO_SEQUENTIAL | msg::HELLO_WRITE | msg::HELLO_PUSH),
            control_bytes: self.control.len() as u64,
            subs_bytes: 0,
            pool_bytes: info.pool_bytes,
            device_uuid: info.device_uuid,
            client_bytes: 0,
        };
        // A push subscriber never receives the pool.
        let pool = if hello.flags & msg::HELLO_PUSH != 0 {
            None
        } else if hello.flags & msg::HELLO_WRITE != 0 {
            self.pool_rw_fd.as_ref().map(|fd| fd.as_fd())
        } else {
            Some(self.pool_fd.as_fd())
        };
        (welcome, self.control_fd.as_fd(), pool)
    }

    /// Checks a subscriber's push buffers against the ring and hands them
    /// to the producer thread, which maps them.
    fn check_attach(&self, index: u32, a: &Attach, fds: usize) -> std::result::Result<(), String> {
        let push = self
            .table
            .entry(index as usize)
            // Relaxed: written by the service thread, which calls us.
            .is_some_and(|e| e.flags.load(Ordering::Relaxed) & SUBF_PUSH != 0);
        if !push {
            return Err("push delivery was not granted".into());
        }
        let stride = self.push_stride();
        let need = stride * layout::PUSH_BUFFERS as u64;
        // A CUDA allocation is rounded up to its granularity (2 MiB on
        // current GPUs); nothing else may exceed what the buffers need.
        let most = need + crate::memory::cuda::MAX_GRANULARITY;
        if fds != 1
            || a.count as usize != layout::PUSH_BUFFERS
            || a.stride != stride
            || a.bytes < need
            || a.bytes > most
        {
            return Err(format!(
                "{fds} descriptors, {} buffers of {} bytes in {} bytes; want 1 descriptor, {} buffers of {stride} bytes in {need}..={most}",
                a.count,
                a.stride,
                a.bytes,
                layout::PUSH_BUFFERS
            ));
        }
        Ok(())
    }

    fn attach(&self, index: u32, generation: u32, a: Attach, fds: Vec<PeerFd>) -> std::result::Result<(), String> {
        // The service checked already (before it spent a token); a check
        // here too keeps this call safe on its own.
        self.check_attach(index, &a, fds.len())?;
        let Some(fd) = fds.into_iter().next() else {
            return Err("no descriptor".into());
        };
        // With a mapper the buffers are mapped here, on the service thread:
        // the import costs a few hundred microseconds that a publish must
        // not pay (ADR 0018). The descriptor closes after it.
        let buffers = match &self.mapper {
            Some(m) => match m.map(&fd, a.bytes) {
                Ok(t) => Buffers::Mapped(t),
                Err(e) => {
                    tracing::warn!(error = %e, index, "could not map a subscriber's push buffers; evicting it");
                    self.evict_push(index as usize, generation);
                    return Ok(());
                }
            },
            None => Buffers::Received(fd),
        };
        let Ok(mut q) = self.attach_requests.lock() else {
            self.discard(buffers, true);
            return Err("attach queue poisoned".into());
        };
        // Requests of subscribers that left before the producer got to them
        // go now (descriptors close, mappings are unmapped below): the queue
        // holds at most one request per live entry, however often a peer
        // reconnects while the producer is idle. Only this thread frees
        // entries, so a live check here stays true until the next service
        // step.
        let gone = self.take_departed(&mut q);
        q.push(AttachRequest {
            index,
            generation,
            buffers,
            attach: a,
            after: None,
        });
        drop(q);
        for r in gone {
            self.discard(r.buffers, true);
        }
        Ok(())
    }

    fn tick(&self) {
        self.unmap_released();
    }
}

/// Runs `f` on the epochs of the frame publishers open in this process.
///
/// A queued-pull subscriber of one of them does not queue its copy at the
/// loan (ADR 0014): it shares the publisher's CUDA context (the device's
/// primary one), so a `cuCtxSynchronize` of the publisher (a CPU commit,
/// a departing push target, the close) would wait for that copy, and the
/// copy waits for this publisher's next gate store.
fn local_publishers<T>(f: impl FnOnce(&mut Vec<u64>) -> T) -> T {
    static EPOCHS: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());
    // A panic while the lock was held leaves a list that is still whole.
    let mut epochs = EPOCHS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    f(&mut epochs)
}

/// Whether the frame publisher of `epoch` is open in this process.
pub(crate) fn published_here(epoch: u64) -> bool {
    local_publishers(|epochs| epochs.contains(&epoch))
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
    /// Whether CUDA frames are committed in stream order.
    stream_commit: bool,
    /// The stream of the newest stream-order commit (as an integer).
    last_stream: Option<usize>,
    /// A publish failed after it may have enqueued push copies that no
    /// commit accounts for: the next unmapping synchronises the context
    /// instead of trusting `global_seq`.
    unsettled: bool,
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

pub(crate) fn create_pool(
    choice: BackendChoice,
    bytes: u64,
    peers_may_write: bool,
    graph: CommitGraph,
) -> Result<Box<dyn ExportedPool>> {
    let host = || -> Result<Box<dyn ExportedPool>> {
        Ok(Box::new(crate::memory::host::HostPool::create_with(
            bytes,
            peers_may_write,
        )?))
    };
    match choice {
        BackendChoice::Host => host(),
        BackendChoice::Cuda(ordinal) => crate::memory::cuda::create_pool(ordinal, bytes, graph),
        BackendChoice::Auto => {
            if crate::memory::cuda::cuda_usable() {
                crate::memory::cuda::create_pool(0, bytes, graph)
            } else {
                host()
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
        let listener = Listener::bind(&path, cfg.serve.socket_mode)?;
        let slots_bytes = geometry
            .slot_stride
            .checked_mul(u64::from(cfg.slots))
            .ok_or_else(|| Error::Config("ring size overflows".into()))?;
        // A CUDA pool ends with the gate line (ADR 0011); the allocation's
        // rounding to its granularity usually absorbs it.
        let gate_bytes = if matches!(cfg.backend, BackendChoice::Host) {
            0
        } else {
            layout::GATE_BYTES
        };
        let pool_bytes = slots_bytes
            .checked_add(gate_bytes)
            .ok_or_else(|| Error::Config("ring size overflows".into()))?;
        let mut pool = create_pool(cfg.backend, pool_bytes, cfg.allow_write, cfg.commit_graph)?;
        match Self::build(listener, &mut pool, &path, cfg, geometry) {
            Ok((shared, service)) => {
                let mut p = Publisher {
                    shared,
                    pool,
                    service: Some(service),
                    next_seq: 1,
                    gate: LosslessGate::default(),
                    targets: Vec::new(),
                    stream_commit: false,
                    last_stream: None,
                    unsettled: false,
                    path,
                    closed: false,
                };
                p.enable_stream_commit();
                local_publishers(|epochs| epochs.push(p.shared.info.epoch));
                Ok(p)
            }
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
        let epoch = crate::ring::random_epoch();
        let gate_offset = layout::gate_line_offset(cfg.slots, geometry.slot_stride);
        let gate = gate_offset + layout::GATE_BYTES <= pool.pool_bytes() && pool.enable_gate_line(gate_offset)?;
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
            max_subscribers: cfg.serve.max_subscribers,
            control_bytes: layout::control_bytes(cfg.slots),
            flags: if gate { layout::RING_GATE } else { 0 },
        };
        let (control, control_fd) = Region::create("vramring-control", info.control_bytes)?;
        info.write_to(control.at::<RingHeader>(0), realtime_ns());
        Region::seal(control_fd.as_fd(), SEALS_READ_ONLY)?;
        let control_fd = Region::reopen_read_only(control_fd.as_fd())?;
        let table = Table::create("vramring-subs", cfg.serve.max_subscribers, epoch)?;
        let pool_fd = pool.export_read_only_fd()?;
        let pool_rw_fd = if cfg.allow_write { Some(pool.export_fd()?) } else { None };
        let header = control.at::<RingHeader>(0);
        // SYNC: producer-state — Release: the ring is ready before any
        // subscriber can connect (the service starts below).
        header.producer.state.store(PRODUCER_LIVE, Ordering::Release);
        let shared = Arc::new(Shared {
            control,
            control_fd,
            table,
            pool_fd,
            pool_rw_fd,
            info,
            cfg,
            attach_requests: Mutex::new(Vec::new()),
            mapper: pool.target_mapper(),
            unmaps: Mutex::new(Vec::new()),
            state: ServiceState::new()?,
        });
        let svc_shared = Arc::clone(&shared);
        // The service thread registers with the process-exit registry: a
        // `std::process::exit` with a live publisher stops and joins it (it
        // marks the ring closed and says Bye) before CUDA's exit handlers.
        let service = ExitWorker::builder(format!("vramring-service:{}", path.display()), ExitPhase::Service)
            .spawn(move |stop| serve::run(svc_shared, listener, stop))?;
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
        if self.stream_commit && seq > n {
            // The slot's previous frame must have landed: its commit, still
            // in flight on the GPU, would otherwise store its seq over our
            // invalidation. In practice it landed long ago.
            self.wait_committed(seq - n, timeout)?;
            // SYNC: global-seq — SeqCst fence between seeing the GPU's
            // commit and reading the table (lossless holders below): the
            // Dekker pair of `Table::assign`'s fence and reload.
            crate::sync::atomic::fence(Ordering::SeqCst);
        }
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

    /// Stream-order commits: makes the GPU's stores possible (registers the
    /// control region and the table for them, loads the commit kernel). On
    /// failure the ring commits on the CPU, as protocol 2 did.
    fn enable_stream_commit(&mut self) {
        if self.shared.cfg.commit != CommitMode::Stream || self.pool.kind() != BackendKind::Cuda {
            return;
        }
        let sh = Arc::clone(&self.shared);
        let (table, table_len) = sh.table.mapping();
        let regions = [(sh.control.as_ptr(), sh.control.len()), (table, table_len)];
        let mut ok = true;
        for (ptr, len) in regions {
            // SAFETY: both are this publisher's own mappings, kept alive by
            // `self.shared` until after `self.pool.close()` (see `close`).
            match unsafe { self.pool.register_commit_memory(ptr, len) } {
                Ok(true) => {}
                Ok(false) => ok = false,
                Err(e) => {
                    tracing::warn!(error = %e, "stream-order commits unavailable; committing on the CPU");
                    ok = false;
                }
            }
            if !ok {
                break;
            }
        }
        self.stream_commit = ok;
        tracing::debug!(stream_commit = ok, "commit mode");
    }

    /// Whether CUDA frames are committed in stream order
    /// ([`CommitMode::Stream`] in effect).
    pub fn stream_commit(&self) -> bool {
        self.stream_commit
    }

    /// Stream-order commits: waits until the GPU has committed `seq`.
    fn wait_committed(&self, seq: u64, timeout: Duration) -> Result<()> {
        wait_landed(&self.shared.header().seq.global_seq, seq, timeout)
    }

    fn wait_lossless(&mut self, held_seq: u64, timeout: Duration) -> Result<()> {
        let sh = &*self.shared;
        let newest = self.next_seq - 1;
        self.gate.wait(sh, timeout, || {
            sh.table
                .holder(newest, |released| released < held_seq)
                .map(|blocker| Holder {
                    blocker,
                    key: held_seq,
                    held_seq,
                })
        })
    }

    /// Maps push buffers that subscribers sent, and unmaps those of
    /// subscribers that left. Runs on the producer thread, which owns the
    /// pool. A subscriber whose buffers cannot be mapped is evicted: it has
    /// no pool to fall back on.
    ///
    /// Nothing here waits for the GPU (ADR 0018): with stream-order commits
    /// a newcomer's buffers are taken, and a departed subscriber's let go
    /// of, only once `global_seq` shows that every commit that could touch
    /// them has landed; until then they wait for a later publish. With a
    /// mapper (CUDA) the service thread maps and unmaps them, so push
    /// subscribers that come and go in a loop cost the producer neither a
    /// driver call of the mapping nor a wait for its GPU work; without one
    /// (host) at most [`ATTACHES_PER_PUBLISH`] `mmap`s per frame.
    fn sync_targets(&mut self) {
        let newest = self.next_seq - 1;
        let committed = if self.stream_commit {
            // SYNC: global-seq — Acquire pairs with the commit kernel's
            // store: every copy and push-word store of a frame at or below
            // it has landed (PROTOCOL.md §10.1).
            self.shared.header().seq.global_seq.load(Ordering::Acquire)
        } else {
            // CPU commits complete every copy before the publish returns.
            u64::MAX
        };
        let sh = &*self.shared;
        let (ready, gone) = match sh.attach_requests.lock() {
            Ok(mut q) => {
                // Requests of connections already gone are dropped before
                // anything is done for them (descriptors close, mappings go
                // to the service to be unmapped).
                let gone = sh.take_departed(&mut q);
                (take_ready(&mut q, newest, committed), gone)
            }
            Err(_) => (Vec::new(), Vec::new()),
        };
        for r in gone {
            sh.discard(r.buffers, false);
        }
        let table = &sh.table;
        for r in ready {
            let index = r.index as usize;
            let taken = match r.buffers {
                Buffers::Received(fd) => self.pool.attach_target(&fd, r.attach.bytes),
                Buffers::Mapped(t) => self.pool.adopt_target(t),
            };
            match taken {
                Ok(id) => {
                    // Under the entry's lock and its generation: an entry
                    // freed and reassigned meanwhile never gets our count.
                    let counted = table.with_client(index, r.generation, |e, _| {
                        protocol::push::reset_buffers(e);
                        // SYNC: push-seq — Release; the subscriber starts
                        // taking pushed frames when it sees the count.
                        e.push_count.store(layout::PUSH_BUFFERS as u32, Ordering::Release);
                    });
                    if counted.is_none() {
                        // Nothing was ever copied into these buffers.
                        if let Err(e) = Self::let_go(&mut self.pool, sh, id) {
                            tracing::warn!(error = %e, "unmapping the push buffers of a subscriber that left");
                        }
                        continue;
                    }
                    self.targets.push(PushTarget {
                        index,
                        generation: r.generation,
                        id,
                        stride: r.attach.stride,
                        newest: None,
                        pending: None,
                        enqueued: [0; layout::PUSH_BUFFERS],
                        dead: false,
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, index, "could not map a subscriber's push buffers; evicting it");
                    sh.evict_push(index, r.generation);
                }
            }
        }
        tracing::trace!(target: "vramring::publish", "push buffers mapped");
        for t in &mut self.targets {
            if !t.dead && !table.live(t.index, t.generation) {
                t.dead = true;
            }
        }
        let (pool, unsettled) = (&mut self.pool, &mut self.unsettled);
        self.targets.retain(|t| {
            if !t.dead {
                return true;
            }
            let released = if *unsettled {
                // A failed publish may have left copies in flight that no
                // commit covers: synchronise once, then trust the seqs again.
                pool.detach_target(t.id).inspect(|()| *unsettled = false)
            } else if t.copies_landed(committed) {
                Self::let_go(pool, sh, t.id)
            } else {
                // Its last frames are still being copied: a later publish
                // unmaps it.
                return true;
            };
            match released {
                Ok(()) => false,
                Err(e) => {
                    tracing::warn!(error = %e, "unmapping a departed subscriber's push buffers failed; retrying at the next publish");
                    true
                }
            }
        });
    }

    /// Lets go of target `id`, whose copies have all landed: with a mapper
    /// the service unmaps it (it costs the producer's thread nothing),
    /// otherwise the pool unmaps it now.
    fn let_go(pool: &mut Box<dyn ExportedPool>, sh: &Shared, id: u64) -> Result<()> {
        if sh.mapper.is_some() {
            if let Some(t) = pool.disown_target(id) {
                sh.discard(Buffers::Mapped(t), false);
                return Ok(());
            }
        }
        pool.release_target(id)
    }

    fn commit(&mut self, seq: u64, index: usize, meta: FrameMeta, completion: WriteCompletion) -> Result<()> {
        if let (true, WriteCompletion::CudaStream(stream)) = (self.stream_commit, completion) {
            return self.commit_in_stream(seq, index, meta, stream);
        }
        self.sync_targets();
        let g = self.shared.info.geometry;
        let slot_offset = index as u64 * g.slot_stride;
        let table = &self.shared.table;
        for t in self.targets.iter_mut().filter(|t| !t.dead) {
            t.pending = table
                .with_client(t.index, t.generation, |e, c| {
                    protocol::push::claim_buffer(e, c, t.newest, seq)
                })
                .flatten();
            if let Some(k) = t.pending {
                let dst = k as u64 * t.stride;
                if let Err(e) = self.pool.push_copy(t.id, dst, slot_offset, g.frame_bytes, completion) {
                    tracing::warn!(error = %e, index = t.index, "push copy failed; the subscriber sees a gap");
                    t.pending = None;
                }
            }
        }
        // One synchronisation covers the user's writes and every push copy.
        if let Err(e) = self.pool.complete_writes(completion) {
            // The copies may still be queued: unmapping a target must not
            // trust that they completed.
            self.unsettled |= self.targets.iter().any(|t| t.pending.is_some());
            return Err(e);
        }
        let sh = &self.shared;
        protocol::commit_slot(&sh.slots()[index], seq, &meta.to_commit());
        for t in &mut self.targets {
            if let Some(k) = t.pending.take() {
                // Under the entry's lock and the target's generation: a
                // newcomer at the same index never sees a seq for a buffer
                // that was never copied into.
                table.with_client(t.index, t.generation, |e, _| {
                    protocol::push::complete_buffer(e, k, seq);
                });
                t.newest = Some(k);
            }
        }
        protocol::publish_global(sh.header(), seq);
        if let Some(off) = sh.info.gate_offset() {
            // Queued copies wait on the GPU for this word (ADR 0011); the
            // frame is committed in host memory already, so a failure here
            // only delays them (their deadline), it does not fail the publish.
            if let Err(e) = self.pool.write_gate(off, seq, completion) {
                tracing::warn!(error = %e, seq, "storing the gate word failed; queued pull copies wait for the next frame");
            }
        }
        table.wake_parked();
        self.next_seq = seq + 1;
        Ok(())
    }

    /// Stream-order commit of frame `seq` in slot `index`, written on
    /// `stream` (ADR 0009, PROTOCOL.md §10.1): claims push buffers, stores
    /// the slot's meta (the slot is still invalid), announces the commit in
    /// `pending_seq`, enqueues one kernel that copies the frame into every
    /// push buffer and then stores the seqs, rings every parked
    /// subscriber's doorbell, and returns without waiting for the GPU
    /// (ADR 0017).
    fn commit_in_stream(
        &mut self,
        seq: u64,
        index: usize,
        meta: FrameMeta,
        stream: crate::memory::RawCuStream,
    ) -> Result<()> {
        // Commits land in seq order: one written on another stream than the
        // last waits for the previous commit first.
        if self.last_stream.is_some_and(|s| s != stream as usize) {
            self.wait_committed(seq - 1, Duration::from_secs(5))?;
        }
        // Stage marks at TRACE (target `vramring::publish`): where a
        // publish spends its time, for a subscriber that timestamps them
        // (the `wake` bench's `--probe`); a static level check otherwise.
        tracing::trace!(target: "vramring::publish", "stream checked");
        self.sync_targets();
        tracing::trace!(target: "vramring::publish", "push targets synced");
        let sh = &self.shared;
        let g = sh.info.geometry;
        let table = &sh.table;
        let header = sh.header();
        // SYNC: global-seq — Acquire: what the GPU has committed; a buffer
        // whose frame is newer is still being copied into.
        let committed = header.seq.global_seq.load(Ordering::Acquire);
        let mut writes = Vec::new();
        let mut claimed = Vec::new();
        for (n, t) in self.targets.iter().enumerate().filter(|(_, t)| !t.dead) {
            let mut skip = t.newest.map_or(0, |k| 1u32 << k);
            for (k, &e) in t.enqueued.iter().enumerate() {
                if e > committed {
                    skip |= 1 << k;
                }
            }
            let k = table
                .with_client(t.index, t.generation, |e, c| {
                    protocol::push::claim_buffer_avoiding(e, c, skip, seq)
                })
                .flatten();
            let (Some(k), Some(e)) = (k, table.entry(t.index)) else {
                continue;
            };
            writes.push(crate::memory::PushWrite {
                id: t.id,
                dst_offset: k as u64 * t.stride,
                push_seq: &e.push_seq[k],
            });
            claimed.push((n, k));
        }
        tracing::trace!(target: "vramring::publish", "push buffers claimed");
        let slot = &sh.slots()[index];
        protocol::stage_meta(slot, &meta.to_commit());
        protocol::announce_pending(header, seq);
        tracing::trace!(target: "vramring::publish", "commit announced");
        let commit = crate::memory::StreamCommit {
            seq,
            src_offset: index as u64 * g.slot_stride,
            len: g.frame_bytes,
            targets: &writes,
            slot_seq: &slot.seq,
            global_seq: &header.seq.global_seq,
            gate: sh.info.gate_offset(),
        };
        let completion = WriteCompletion::CudaStream(stream);
        // SAFETY: every word of `commit` lies in the control region or the
        // table, both registered in `enable_stream_commit` and mapped by
        // `self.shared` until after `self.pool.close()`.
        if let Err(e) = unsafe { self.pool.enqueue_commit(&commit, completion) } {
            // Nothing of this frame will land: undo the announcement, so
            // no subscriber spins for it (the slot stays invalid, the seq
            // unused, as a failed publish promises). Back to the previous
            // frame's seq, not to `global_seq`: that frame's commit may
            // still be in flight, and a subscriber rung for it (ADR 0017)
            // must still see it announced when it parks again.
            protocol::withdraw_pending(header, seq);
            // Some launches (or copies) may have been enqueued before the
            // one that failed, into buffers no landed commit accounts for.
            self.unsettled |= !writes.is_empty();
            return Err(e);
        }
        tracing::trace!(target: "vramring::publish", "commit enqueued");
        // Ring every parked subscriber now, without waiting for the GPU
        // (ADR 0017): a woken subscriber that finds the commit still in
        // flight (`pending_seq` ahead of `global_seq`, PROTOCOL.md §12 step
        // 3d′) waits for it on its own CPU, so the publish never blocks on
        // a subscriber, however it waits or lies about it. After the
        // launch, so the GPU starts the commit as early as it can; the
        // `parked` loads are ordered after the `pending_seq` store by
        // `announce_pending`'s SeqCst fence (SYNC: pending).
        table.wake_parked();
        for (n, k) in claimed {
            let t = &mut self.targets[n];
            t.enqueued[k] = seq;
            t.newest = Some(k);
        }
        self.last_stream = Some(stream as usize);
        self.next_seq = seq + 1;
        tracing::trace!(target: "vramring::publish", "parked checked");
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> PublisherStats {
        serve::stats(&*self.shared, self.next_seq - 1)
    }

    /// Stops serving, tells subscribers the ring is closed, and releases
    /// the pool. Retryable after an error; idempotent after success.
    ///
    /// # Errors
    /// The backend's release error; the pool stays reachable for a retry.
    pub fn close(&mut self) -> Result<()> {
        if !self.closed {
            let gate = self.shared.info.gate_offset();
            let complete = |pool: &dyn ExportedPool| {
                if let Err(e) = pool.complete_writes(WriteCompletion::Host) {
                    tracing::warn!(error = %e, "waiting for the GPU's last commits at close");
                }
            };
            if self.stream_commit || gate.is_some() {
                // Commits still in flight land before the ring says closed
                // (a subscriber drains what is committed, then sees the
                // close), and before the gate opens below: a late commit's
                // gate store must not land over it.
                complete(&*self.pool);
            }
            if let Some(off) = gate {
                // Queued pull copies wait on the gate; one queued at a loan
                // that was never published (ADR 0014) would wait for good.
                // Opening the gate for every seq lets them run (their frames
                // fail validation, and the close follows) before the ring
                // says closed, so none has to be set aside.
                match self.pool.write_gate(off, u64::MAX, WriteCompletion::Host) {
                    Ok(()) => complete(&*self.pool),
                    Err(e) => {
                        tracing::warn!(error = %e, "opening the gate at close; copies queued at a loan are set aside")
                    }
                }
            }
            let header = self.shared.header();
            // SYNC: producer-state — Release; subscribers Acquire it and
            // report `ProducerGone` promptly.
            header.producer.state.store(PRODUCER_CLOSED, Ordering::Release);
            // The service rings every subscriber's doorbell as it stops.
            if let Some(worker) = self.service.take() {
                let outcome = worker.stop();
                tracing::debug!(?outcome, "socket service stopped");
            }
            // The service maps and unmaps no more: buffers it mapped that
            // no target took, and those waiting to be unmapped, are unmapped
            // here, while the pool still holds its context. No copy into
            // any of them is in flight (never adopted, or let go after
            // their copies landed).
            if let Ok(mut q) = self.shared.attach_requests.lock() {
                for r in q.drain(..) {
                    self.shared.discard(r.buffers, true);
                }
            }
            self.shared.unmap_released();
            self.closed = true;
            let epoch = self.shared.info.epoch;
            local_publishers(|epochs| epochs.retain(|&e| e != epoch));
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

    /// The ring's backend: whether the slot is written through
    /// [`SlotMut::bytes_mut`] (host) or [`SlotMut::device_mut`] (CUDA).
    pub fn backend(&self) -> BackendKind {
        self.publisher.pool.kind()
    }

    /// Address of the slot's first byte in this process.
    pub(crate) fn addr(&self) -> u64 {
        self.publisher.pool.base_addr() + self.index as u64 * self.geometry().slot_stride
    }

    /// The whole slot (`frame_bytes`) as device memory, CUDA backend only:
    /// write it on your own stream and pass that stream to
    /// [`SlotMut::publish_cuda`].
    ///
    /// # Errors
    /// [`Error::WrongBackend`] on a host ring.
    pub fn device_mut(&mut self) -> Result<DeviceViewMut<'_>> {
        self.require_cuda()?;
        Ok(DeviceViewMut::new(self.addr(), self.geometry().frame_bytes))
    }

    /// Plane `k` (`pitch * rows` bytes) as device memory, CUDA backend only.
    ///
    /// # Errors
    /// [`Error::WrongBackend`] on a host ring, [`Error::Config`] for a plane
    /// the format does not have.
    pub fn plane_device_mut(&mut self, k: usize) -> Result<DeviceViewMut<'_>> {
        self.require_cuda()?;
        let g = self.geometry();
        let p = g
            .planes()
            .get(k)
            .ok_or_else(|| Error::Config(format!("{} has no plane {k}", g.format.name())))?;
        Ok(DeviceViewMut::new(self.addr() + p.offset, p.pitch * p.rows))
    }

    /// Address of plane `k` in this process, whatever the backend.
    #[cfg(feature = "nvdec")]
    pub(crate) fn plane_addr(&self, k: usize) -> Result<u64> {
        let g = self.geometry();
        let p = g
            .planes()
            .get(k)
            .ok_or_else(|| Error::Config(format!("{} has no plane {k}", g.format.name())))?;
        Ok(self.addr() + p.offset)
    }

    fn require_cuda(&self) -> Result<()> {
        match self.backend() {
            BackendKind::Cuda => Ok(()),
            BackendKind::Host => Err(Error::WrongBackend {
                what: "device memory of a slot",
                backend: BackendKind::Host.name(),
            }),
        }
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

    /// Commits a frame written on CUDA stream `stream`.
    ///
    /// With [`CommitMode::Stream`] (the default, see
    /// [`Publisher::stream_commit`]) this enqueues, behind the frame's
    /// writes on `stream`, one kernel that copies the frame into every push
    /// subscriber's buffer and then stores the frame's seqs into the ring,
    /// and returns without waiting: subscribers see the frame when the GPU
    /// has finished it. Keep the slot's bytes untouched after this call, as
    /// always; to reuse `stream`'s other work, order it after the commit as
    /// usual (stream order). With [`CommitMode::Synchronous`] it
    /// synchronises `stream`, then commits on the CPU.
    ///
    /// A stream-order publish emits a TRACE event of target
    /// `vramring::publish` at each of its stages: stream checked, push
    /// targets synced, push buffers claimed, commit announced, context
    /// current, kernel launched (or graph replayed, ADR 0021; with no push
    /// subscriber: stores enqueued),
    /// commit enqueued, parked checked. A `tracing` subscriber that
    /// timestamps them shows where a publish spends its time
    /// (`benches/wake.rs --probe` does).
    ///
    /// # Safety
    /// `stream` must be a valid `CUstream` of the ring's CUDA context (or
    /// null for the legacy default stream) that stays valid for this call
    /// (destroying it afterwards is fine: the driver finishes its work).
    ///
    /// # Errors
    /// The driver's error from enqueueing the commit (or from
    /// `cuStreamSynchronize`); the slot stays invalid and the seq unused.
    /// [`Error::Timeout`] when `stream` differs from the previous frame's
    /// and the GPU has not committed that frame within 5 s.
    pub unsafe fn publish_cuda(self, meta: FrameMeta, stream: Stream<'_>) -> Result<u64> {
        let stream = stream.as_raw();
        let seq = self.seq;
        self.publisher
            .commit(seq, self.index, meta, WriteCompletion::CudaStream(stream))?;
        Ok(seq)
    }
}

/// Stream-order commits: spins (then yields) until the GPU's `global_seq`
/// reaches `seq`.
///
/// # Errors
/// [`Error::Timeout`] after `timeout`.
fn wait_landed(global: &AtomicU64, seq: u64, timeout: Duration) -> Result<()> {
    let start = std::time::Instant::now();
    let mut spins = 0u32;
    // SYNC: global-seq — Acquire pairs with the GPU's commit store (after
    // its system-scope fence).
    while global.load(Ordering::Acquire) < seq {
        if start.elapsed() >= timeout {
            return Err(Error::Timeout(timeout, "the GPU to commit an earlier frame"));
        }
        spins = spins.saturating_add(1);
        if spins < 1000 {
            crate::sync::spin_hint();
        } else {
            std::thread::yield_now();
        }
    }
    Ok(())
}

#[cfg(all(test, not(loom)))]
mod landing_tests {
    use super::*;

    #[test]
    fn the_wait_ends_when_the_commit_lands() {
        let g = AtomicU64::new(0);
        let got = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                g.store(3, Ordering::Release);
            });
            wait_landed(&g, 3, Duration::from_secs(5))
        });
        got.unwrap();
        assert!(g.load(Ordering::Relaxed) >= 3);
    }

    #[test]
    fn a_commit_that_never_lands_times_out_with_a_sentence() {
        let g = AtomicU64::new(0);
        let e = wait_landed(&g, 1, Duration::from_millis(30)).unwrap_err();
        assert!(matches!(e, Error::Timeout(..)), "{e:?}");
        assert!(e.to_string().contains("the GPU to commit"), "{e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(index: u32) -> AttachRequest {
        AttachRequest {
            index,
            generation: 1,
            buffers: Buffers::Received(PeerFd::new(std::fs::File::open("/dev/null").expect("/dev/null").into())),
            attach: crate::socket::Attach {
                count: layout::PUSH_BUFFERS as u32,
                stride: 4096,
                bytes: 4096 * layout::PUSH_BUFFERS as u64,
            },
            after: None,
        }
    }

    fn indices(q: &[AttachRequest]) -> Vec<u32> {
        q.iter().map(|r| r.index).collect()
    }

    #[test]
    fn an_attach_waits_for_the_commits_enqueued_when_it_came_without_blocking_and_a_few_go_per_publish() {
        let mut q = vec![request(3), request(1)];
        // Frame 9 enqueued, frame 8 landed: nothing may be mapped yet, and
        // each request remembers the commit it waits for.
        assert!(take_ready(&mut q, 9, 8).is_empty());
        assert_eq!(q.iter().map(|r| r.after).collect::<Vec<_>>(), [Some(9), Some(9)]);
        // A later request waits for the newer frame it saw.
        q.push(request(0));
        assert!(take_ready(&mut q, 10, 8).is_empty());
        assert_eq!(q[2].after, Some(10));
        // Frame 9 landed: the first two go, in order; the third waits for
        // frame 10.
        assert_eq!(indices(&take_ready(&mut q, 10, 9)), [3, 1]);
        assert!(take_ready(&mut q, 11, 9).is_empty());
        assert_eq!(indices(&take_ready(&mut q, 11, 10)), [0]);
        assert!(q.is_empty());
        // CPU commits: everything has landed; at most
        // ATTACHES_PER_PUBLISH per publish, first come first served.
        let mut q: Vec<_> = (0..ATTACHES_PER_PUBLISH as u32 + 1).map(request).collect();
        let first: Vec<u32> = (0..ATTACHES_PER_PUBLISH as u32).collect();
        assert_eq!(indices(&take_ready(&mut q, 4, u64::MAX)), first);
        assert_eq!(indices(&take_ready(&mut q, 5, u64::MAX)), [ATTACHES_PER_PUBLISH as u32]);
    }

    #[test]
    fn a_departed_target_is_unmapped_only_after_its_last_frame_landed() {
        let mut t = PushTarget {
            index: 0,
            generation: 1,
            id: 1,
            stride: 4096,
            newest: Some(1),
            pending: None,
            enqueued: [7, 9, 8],
            dead: true,
        };
        assert!(!t.copies_landed(8), "frame 9 is still being copied into buffer 1");
        assert!(t.copies_landed(9));
        t.enqueued = [0; layout::PUSH_BUFFERS];
        assert!(t.copies_landed(0), "a target never copied into is due at once");
    }
}
