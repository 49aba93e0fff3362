//! The ring core both ring kinds stand on: the subscriber table, the socket
//! service, the lossless gate, wakeups and the subscriber's lease.
//!
//! * `table`: subscriber entries (assign, serve, evict, free, reuse), the
//!   one writer of that state, and each subscriber's own client region.
//! * `serve`: the publisher's socket service (accept, handshake, per
//!   connection limits, eviction notices), generic over what a ring kind
//!   tells it.
//! * `lossless`: the producer's bounded wait for lossless readers, with
//!   eviction past the lease.
//! * [`wait`]: publishing a seq and waking parked subscribers; a
//!   subscriber's spin-then-park wait.
//! * [`cadence`]: the default wait's timing: learn the publisher's frame
//!   interval, park until just before the next frame, spin only then.
//! * `lease`: the subscriber's half: the handshake, liveness,
//!   `ProducerGone` after the drain, eviction.
//!
//! The frame ring ([`crate::frame`]) and the packet ring
//! ([`crate::packet`]) are thin layers over these: each says what its
//! Welcome carries and how its producer decides that a lossless reader
//! blocks it.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::layout::{DEFAULT_MAX_SUBSCRIBERS, MAX_SUBSCRIBERS_LIMIT};
use crate::socket::transport::AccessPolicy;

pub(crate) mod attach;
pub mod cadence;
mod client;
pub(crate) mod layout;
pub(crate) mod lease;
pub(crate) mod lossless;
pub(crate) mod serve;
pub(crate) mod table;
pub mod wait;

pub use cadence::WaitStrategy;
pub use client::{ClientConfig, ClientOptions};
#[cfg(loom)]
#[doc(hidden)]
pub use table::loom_api as loom_table;
pub use wait::{
    publish_seq, ring_doorbell, wait_on, wait_with, wake_if_parked, Bell, Doze, NoPlan, SpinWindow, WaitOutcome,
    WaitPlan,
};

/// What a reader finds when it looks for seq `want` in a slot or record
/// (the first of its two seqlock loads), for both ring kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look<T> {
    /// It holds `want`, committed; here is its meta.
    Ready(T),
    /// It already holds a newer seq or is being rewritten.
    Overwritten,
    /// It does not hold `want` yet (a racing or misbehaving producer).
    NotYet,
}

/// Default cap on connections that have not finished their handshake.
pub const DEFAULT_MAX_PENDING: u32 = 16;

/// The default bound on push attaches: this many at once, then
/// [`DEFAULT_ATTACHES_PER_SECOND`] a second.
pub const DEFAULT_ATTACH_BURST: u32 = 16;
/// See [`DEFAULT_ATTACH_BURST`].
pub const DEFAULT_ATTACHES_PER_SECOND: u32 = 8;

/// How many push attaches (a push subscriber's buffers, which the
/// publisher maps into its own address space and, on a CUDA ring, into its
/// GPU context) one publisher serves: a token bucket of `burst` tokens,
/// refilled at `per_second`. An Attach that fits (one that does not is
/// refused first, spending nothing) and finds no token, or others waiting,
/// waits, holding nothing but its connection and its descriptor, until one
/// comes; waiting Attaches are served in order of arrival. The bound keeps
/// a peer that connects and leaves in a loop from spending the publisher's
/// mapping work, and the GPU time it takes from every other subscriber's
/// frames, as fast as it can reconnect (ADR 0020). The default is [`DEFAULT_ATTACH_BURST`] then
/// [`DEFAULT_ATTACHES_PER_SECOND`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachRate {
    /// Tokens added each second (at least 1).
    pub per_second: u32,
    /// Most tokens held: the attaches served at once after a quiet spell
    /// (at least 1).
    pub burst: u32,
}

impl AttachRate {
    /// The default bound: 16 attaches at once, then 8 a second.
    pub const DEFAULT: AttachRate = AttachRate {
        per_second: DEFAULT_ATTACHES_PER_SECOND,
        burst: DEFAULT_ATTACH_BURST,
    };
}

impl Default for AttachRate {
    fn default() -> Self {
        AttachRate::DEFAULT
    }
}

/// The default first back-off after a lossless lease eviction
/// ([`LosslessBackoff::base`]).
pub const DEFAULT_LOSSLESS_BACKOFF: Duration = Duration::from_secs(10);
/// The default longest back-off ([`LosslessBackoff::cap`]).
pub const DEFAULT_LOSSLESS_BACKOFF_CAP: Duration = Duration::from_secs(300);
/// The default quiet spell after which a uid's strikes are forgotten
/// ([`LosslessBackoff::quiet`]).
pub const DEFAULT_LOSSLESS_BACKOFF_QUIET: Duration = Duration::from_secs(600);

/// How long a uid is refused lossless after one of its lossless readers
/// kept the producer waiting past the lease and was evicted
/// (`EVICT_LEASE`): `base` after the first such eviction (its first
/// strike), doubled for each strike after that, at most `cap`; the strikes
/// are forgotten once the uid has gone `quiet` past the end of its last
/// back-off. Readers evicted together (at one deadline) count as one
/// strike. A refused Hello gets `REJECT_LOSSLESS_BACKOFF` with the time
/// left in its reason; the uid may still connect without lossless. The
/// bound keeps a peer that reconnects after every eviction from holding the
/// producer one lease in every few (ADR 0024). The default is 10 s, doubled
/// up to 5 min, forgotten after 10 min quiet; at most 64 uids are
/// remembered at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LosslessBackoff {
    /// The back-off after the first strike (more than zero).
    pub base: Duration,
    /// The longest back-off (at least `base`).
    pub cap: Duration,
    /// How long after its back-off ended a uid's strikes are forgotten.
    pub quiet: Duration,
}

impl LosslessBackoff {
    /// The default: 10 s, doubled per strike up to 5 min, strikes forgotten
    /// after 10 min quiet.
    pub const DEFAULT: LosslessBackoff = LosslessBackoff {
        base: DEFAULT_LOSSLESS_BACKOFF,
        cap: DEFAULT_LOSSLESS_BACKOFF_CAP,
        quiet: DEFAULT_LOSSLESS_BACKOFF_QUIET,
    };
}

impl Default for LosslessBackoff {
    fn default() -> Self {
        LosslessBackoff::DEFAULT
    }
}

/// Which peers, by uid (`SO_PEERCRED`), are granted something: pull
/// delivery ([`crate::RingConfig::pull`]) or lossless delivery
/// ([`ServeConfig::lossless`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum UidAccess {
    /// Every peer.
    #[default]
    Anyone,
    /// Only peers with these uids.
    Uids(Vec<u32>),
    /// No peer.
    Nobody,
}

impl UidAccess {
    /// Whether a peer with `uid` is granted it.
    pub fn allows(&self, uid: u32) -> bool {
        match self {
            UidAccess::Anyone => true,
            UidAccess::Uids(list) => list.contains(&uid),
            UidAccess::Nobody => false,
        }
    }
}

/// How a publisher of either ring kind serves subscribers: the settings the
/// frame ring's [`crate::RingConfig`] and the packet ring's
/// [`crate::packet::PacketPublisherConfig`] share. Their builders come from
/// [`ServeOptions`].
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Subscriber table entries: the most subscribers connected at once.
    pub max_subscribers: u32,
    /// Connections that may be in their handshake at once; past that the
    /// oldest silent one is closed.
    pub max_pending: u32,
    /// Most table entries one uid may hold at once (`None`: no cap beyond
    /// the table). Containers that run as distinct uids can then not fill
    /// the table for each other.
    pub max_per_uid: Option<u32>,
    /// File mode of the socket (default `0o660`).
    pub socket_mode: u32,
    /// uid/gid allow-list checked with `SO_PEERCRED`.
    pub access: AccessPolicy,
    /// How long the producer waits for lossless subscribers on one frame
    /// or packet, measured from when it began to wait for it (across
    /// timed-out loans or writes): at the end of it, every lossless
    /// subscriber still holding that frame or packet is evicted, all at
    /// once (default 1 s).
    pub lossless_lease: Duration,
    /// Who may ask for lossless delivery (default anyone); the others are
    /// refused with `REJECT_POLICY` and may connect without it.
    pub lossless: UidAccess,
    /// How long a uid whose lossless reader was evicted for the lease is
    /// refused lossless (`None`: never refused; default
    /// [`LosslessBackoff::DEFAULT`]).
    pub lossless_backoff: Option<LosslessBackoff>,
    /// How long a connecting subscriber has to send its Hello.
    pub handshake_timeout: Duration,
    /// The bound on push attaches served (`None`: every Attach is served
    /// when it arrives).
    pub attach_rate: Option<AttachRate>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            max_subscribers: DEFAULT_MAX_SUBSCRIBERS,
            max_pending: DEFAULT_MAX_PENDING,
            max_per_uid: None,
            socket_mode: 0o660,
            access: AccessPolicy::default(),
            lossless_lease: Duration::from_secs(1),
            lossless: UidAccess::Anyone,
            lossless_backoff: Some(LosslessBackoff::DEFAULT),
            handshake_timeout: Duration::from_secs(2),
            attach_rate: Some(AttachRate::default()),
        }
    }
}

impl ServeConfig {
    /// Checks the limits.
    ///
    /// # Errors
    /// [`Error::Config`] naming the bad value.
    pub fn validate(&self) -> Result<()> {
        if self.max_subscribers == 0 || self.max_subscribers > MAX_SUBSCRIBERS_LIMIT {
            return Err(Error::Config(format!(
                "max_subscribers {} not in 1..={MAX_SUBSCRIBERS_LIMIT}",
                self.max_subscribers
            )));
        }
        if self.max_pending == 0 {
            return Err(Error::Config("max_pending must be at least 1".into()));
        }
        if let Some(r) = self.attach_rate {
            if r.per_second == 0 || r.burst == 0 {
                return Err(Error::Config(format!(
                    "attach rate {} a second with a burst of {}: both must be at least 1 (no bound at all is `unbounded_attaches`)",
                    r.per_second, r.burst
                )));
            }
        }
        if let Some(b) = self.lossless_backoff {
            if b.base.is_zero() || b.cap < b.base {
                return Err(Error::Config(format!(
                    "lossless back-off of {:?} up to {:?}: the base must be more than zero and the cap at least the base (no back-off at all is `no_lossless_backoff`)",
                    b.base, b.cap
                )));
            }
        }
        Ok(())
    }
}

/// Builder methods for the serving settings, shared by both ring kinds'
/// configs.
pub trait ServeOptions: Sized {
    /// The settings.
    fn serve_mut(&mut self) -> &mut ServeConfig;

    /// Sets the subscriber table size.
    fn max_subscribers(mut self, n: u32) -> Self {
        self.serve_mut().max_subscribers = n;
        self
    }
    /// Sets the cap on connections in their handshake.
    fn max_pending(mut self, n: u32) -> Self {
        self.serve_mut().max_pending = n;
        self
    }
    /// Caps the table entries one uid may hold at once.
    fn max_per_uid(mut self, n: u32) -> Self {
        self.serve_mut().max_per_uid = Some(n);
        self
    }
    /// Sets the socket's file mode.
    fn socket_mode(mut self, mode: u32) -> Self {
        self.serve_mut().socket_mode = mode;
        self
    }
    /// Sets the uid/gid allow-list.
    fn access(mut self, a: AccessPolicy) -> Self {
        self.serve_mut().access = a;
        self
    }
    /// Sets the lossless lease.
    fn lossless_lease(mut self, d: Duration) -> Self {
        self.serve_mut().lossless_lease = d;
        self
    }
    /// Sets who may ask for lossless delivery.
    fn lossless_access(mut self, a: UidAccess) -> Self {
        self.serve_mut().lossless = a;
        self
    }
    /// Sets how long a uid whose lossless reader was evicted for the lease
    /// is refused lossless (see [`LosslessBackoff`]).
    fn lossless_backoff(mut self, b: LosslessBackoff) -> Self {
        self.serve_mut().lossless_backoff = Some(b);
        self
    }
    /// Never refuses lossless after a lease eviction: a peer may then
    /// reconnect and stall the producer again at once. Only for trusted
    /// subscribers.
    fn no_lossless_backoff(mut self) -> Self {
        self.serve_mut().lossless_backoff = None;
        self
    }
    /// Sets how long a connecting subscriber has to send its Hello.
    fn handshake_timeout(mut self, d: Duration) -> Self {
        self.serve_mut().handshake_timeout = d;
        self
    }
    /// Bounds the push attaches served: `burst` at once, then `per_second`
    /// (see [`AttachRate`]).
    fn attach_rate(mut self, per_second: u32, burst: u32) -> Self {
        self.serve_mut().attach_rate = Some(AttachRate { per_second, burst });
        self
    }
    /// Serves every push Attach when it arrives, however often peers come
    /// and go. Only for trusted subscribers.
    fn unbounded_attaches(mut self) -> Self {
        self.serve_mut().attach_rate = None;
        self
    }
}

/// Counters of a publisher of either ring kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Frames or packets committed.
    pub published: u64,
    /// Subscribers connected now.
    pub subscribers: u32,
    /// Subscribers that connected so far.
    pub connects: u64,
    /// Subscribers whose connection closed so far.
    pub disconnects: u64,
    /// Subscribers evicted so far (lossless lease, protocol violations).
    pub evictions: u64,
    /// Lease deadlines that evicted lossless subscribers: one for each
    /// frame or packet the producer waited a whole lease for, however many
    /// subscribers it evicted then.
    pub lease_deadlines: u64,
    /// Lossless Hellos refused because the peer's uid was backing off
    /// after a lease eviction ([`ServeConfig::lossless_backoff`]).
    pub lossless_backoffs: u64,
    /// Loans or writes that had to wait for a lossless subscriber.
    pub lossless_waits: u64,
    /// Connections refused or closed before a Welcome (bad Hello, not
    /// allowed, table full, too many handshakes).
    pub refused: u64,
    /// Push attaches served (buffers handed to the ring kind to map).
    pub attaches: u64,
    /// Push attaches that had to wait for the attach rate
    /// ([`ServeConfig::attach_rate`]), each counted once, whether served in
    /// the end or dropped with their connection.
    pub attaches_deferred: u64,
}

/// A random, odd epoch for a new publisher instance.
pub(crate) fn random_epoch() -> u64 {
    let mut b = [0u8; 8];
    if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).is_err() {
        // Fall back to time and pid; the epoch only needs to differ between
        // publisher instances at one path.
        return crate::time::realtime_ns() ^ (u64::from(std::process::id()) << 32);
    }
    u64::from_le_bytes(b) | 1
}
