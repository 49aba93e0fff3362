//! How a frame ring is made: its configuration (`RingConfig` and the
//! policies it picks from) and what a publish attaches to a frame (`FrameMeta`).

use super::*;

/// What the producer does when a slot it wants to reuse is still held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Never wait: slow readers lose frames and are told (live video).
    #[default]
    Overwrite,
    /// Wait for lossless subscribers (bounded by the loan timeout), evicting
    /// every one still holding the frame a lease after the producer began
    /// to wait for it.
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
    /// commit on the CPU: every publish blocks for the frame's writes and
    /// every push copy.
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
/// a pull subscriber of a CUDA ring could write every frame every other
/// subscriber reads. A subscriber refused pull is served by push delivery,
/// which never hands the pool out (by default it asks for that itself,
/// [`Delivery::Auto`](crate::Delivery::Auto)).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PullAccess {
    /// The default: on the host backend every subscriber may pull; on the
    /// CUDA backend only the publisher's own (effective) uid, since the
    /// driver cannot hand the pool out read-only.
    #[default]
    Auto,
    /// Every subscriber may pull (on a CUDA ring: every subscriber can
    /// write the pool, docs/SECURITY.md).
    Anyone,
    /// Only subscribers with these uids (`SO_PEERCRED`) may pull; the
    /// others must ask for push delivery.
    Uids(Vec<u32>),
    /// Nobody pulls: push delivery only.
    Nobody,
}

impl PullAccess {
    /// Whether a peer with `uid` may receive the pool of a ring on
    /// `backend`.
    pub fn allows(&self, uid: u32, backend: BackendKind) -> bool {
        match self {
            PullAccess::Auto => backend == BackendKind::Host || uid == rustix::process::geteuid().as_raw(),
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
    /// policy, automatic backend, pull as [`PullAccess::Auto`] allows
    /// (anyone on the host backend, the publisher's own uid on CUDA), nobody
    /// writes.
    pub fn new(format: Format, width: u32, height: u32) -> Self {
        RingConfig {
            format,
            width,
            height,
            slots: 8,
            policy: Policy::Overwrite,
            backend: BackendChoice::Auto,
            allow_write: false,
            pull: PullAccess::Auto,
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

    pub(super) fn validate(&self) -> Result<Geometry> {
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

    pub(super) fn to_commit(self) -> CommitMeta {
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
