//! The socket service a publisher runs on its own thread, the same for both
//! ring kinds: accepts subscribers, runs the handshake, has the
//! [`super::table::Table`] assign an entry, and frees it the moment
//! the connection closes (the connection is the subscriber's lease; no pid
//! is ever used).
//!
//! Every peer is bounded in what it can make the publisher hold:
//! * at most [`ServeConfig::max_pending`] silent connections in their
//!   handshake (past that the oldest is closed; a Hello already there is
//!   served at accept), each for at most [`ServeConfig::handshake_timeout`];
//! * one table entry and one client region per connection;
//! * after the Welcome, exactly one optional Attach (push buffers, checked
//!   by the ring kind; at most one queued per live entry), served within
//!   the publisher's attach rate ([`ServeConfig::attach_rate`], a token
//!   bucket: one that does not fit is refused before it takes a token; one
//!   that finds none waits in its connection, first come first served),
//!   which bounds how late a peer that attaches and leaves in a loop can
//!   make the others' frames on the GPU (ADR 0020); any other well-formed
//!   message but Bye, a second Attach, an Attach without a push grant or
//!   malformed buffers evict the subscriber (`EVICT_PROTOCOL`) and close
//!   its connection; a datagram that does not decode closes it without a
//!   notice; descriptors sent with any message are closed at once;
//! * when the process runs out of descriptors, accept fails: newcomers wait
//!   or are refused, the connected subscribers keep being served.
//!
//! What differs between ring kinds (acceptable Hellos, the Welcome and its
//! descriptors, push buffers) is the [`Served`] trait.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Mutex;

use super::table::{Assigned, Table};
use super::{PublisherStats, ServeConfig};
use crate::error::Error;
use crate::layout::{ProducerLine, EVICT_LEASE, EVICT_PROTOCOL, EVICT_PUSH};
use crate::socket::msg::{Attach, Hello, Welcome};
use crate::socket::PeerFd;
use crate::sync::atomic::{AtomicU64, Ordering};

/// Longest single poll of the socket service when nothing is pending
/// (`seam::publisher_with_idle_tick` sets another). Stops and evictions
/// wake the service at once through its [`Waker`]; handshake deadlines
/// shorten the poll. Only the producer's heartbeat and the counters
/// mirrored for inspection wait for this tick.
pub(crate) const IDLE_TICK: std::time::Duration = std::time::Duration::from_secs(1);

mod attach_budget;
pub(crate) mod backoff;
mod handshake;
mod service;

pub(crate) use service::run;

/// What a ring kind tells the service loop.
pub(crate) trait Served: Send + Sync + 'static {
    /// The producer line (state, heartbeat, connect counters).
    fn producer(&self) -> &ProducerLine;
    /// The subscriber table.
    fn table(&self) -> &Table;
    /// The serving settings.
    fn serve_config(&self) -> &ServeConfig;
    /// What the producer and the service exchange besides the ring.
    fn state(&self) -> &ServiceState;
    /// Settles what a Hello from `uid` asks for before it is checked: a
    /// frame ring grants push to a subscriber that accepts it
    /// (`HELLO_PUSH_OK`) where pull is refused to it. Clears flags that
    /// are only requests.
    fn settle(&self, hello: &mut Hello, uid: u32) {
        let _ = uid;
        hello.flags &= !crate::socket::msg::HELLO_PUSH_OK;
    }
    /// A refusal `(REJECT_*, reason)` for a Hello from `uid` whose peer
    /// passed the credential check, or `None` to accept it.
    fn refuse(&self, hello: &Hello, uid: u32) -> Option<(u32, String)>;
    /// `SUBF_*` entry flags for an accepted Hello.
    fn entry_flags(&self, hello: &Hello) -> u32;
    /// The seq a new lossless reader's cursor starts at (it is done with
    /// everything up to and including it).
    fn lossless_start(&self) -> u64;
    /// The kind-specific Welcome for `a` (the service fills in the client
    /// region's size), and the descriptors that go with it: first the
    /// control region, then after the table and the client region, the
    /// rest (the pool, for a pull subscriber of a frame ring).
    fn welcome(&self, a: &Assigned, hello: &Hello) -> (Welcome, BorrowedFd<'_>, Option<BorrowedFd<'_>>);
    /// Whether an Attach from the subscriber of `index` with `fds`
    /// descriptors fits (PROTOCOL.md §16.3): `Err(reason)` when this ring
    /// takes none or these do not fit, which evicts the subscriber before
    /// it spends an attach token. No side effect.
    fn check_attach(&self, index: u32, a: &Attach, fds: usize) -> std::result::Result<(), String> {
        let _ = (index, a, fds);
        Err("this ring takes no push buffers".into())
    }
    /// An Attach (push buffers) from the subscriber of `index`/`generation`,
    /// checked by [`Served::check_attach`] and within the attach rate:
    /// `Err(reason)` when this ring takes none or these do not fit, which
    /// evicts the subscriber.
    fn attach(&self, index: u32, generation: u32, a: Attach, fds: Vec<PeerFd>) -> std::result::Result<(), String> {
        let _ = (index, generation, a, fds);
        Err("this ring takes no push buffers".into())
    }
    /// Housekeeping the service does on every turn of its loop (after a
    /// wake, a connection's datagram or a tick), on its own thread.
    fn tick(&self) {}
}

/// An eviction the producer (or the service) decided: the service sends
/// the notice and closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EvictRequest {
    /// Table index.
    pub(crate) index: u32,
    /// The entry's generation when it was evicted: a request never reaches
    /// a newcomer that took the index since.
    pub(crate) generation: u32,
    /// `EVICT_*` code of the layout.
    pub(crate) code: u32,
}

/// What a publisher's producer thread and its socket service share besides
/// the ring, the same for both kinds of ring.
#[derive(Debug)]
pub(crate) struct ServiceState {
    /// Entries the producer evicted; the service sends Evicted and closes.
    /// The producer pushes one, then wakes the service.
    pub(crate) evict_requests: Mutex<Vec<EvictRequest>>,
    /// Wakes the service out of its `poll` (evictions, stop).
    pub(crate) waker: Waker,
    /// Loans or writes that had to wait for a lossless subscriber.
    pub(crate) lossless_waits: AtomicU64,
    /// Connections refused or closed before a Welcome.
    pub(crate) refused: AtomicU64,
    /// Push attaches served, and those that waited for a token (served in
    /// the end or not).
    pub(crate) attaches: AtomicU64,
    pub(crate) attaches_deferred: AtomicU64,
    /// Lease deadlines that evicted (the producer counts them).
    pub(crate) lease_deadlines: AtomicU64,
    /// Lossless Hellos refused for a uid's back-off (the service counts).
    pub(crate) lossless_backoffs: AtomicU64,
    /// Lease evictions per uid: the producer adds strikes, the service
    /// refuses lossless Hellos from a uid backing off.
    pub(crate) strikes: Mutex<backoff::Strikes>,
    /// Longest single poll with nobody connected ([`IDLE_TICK`]; a test
    /// stretches it through `seam` to prove that nothing the service must
    /// do at once waits for it).
    pub(crate) idle_tick: std::time::Duration,
}

impl ServiceState {
    /// Empty queues, a new eventfd, no strikes; lossless back-off as
    /// `cfg` says.
    pub(crate) fn new(cfg: &ServeConfig) -> crate::error::Result<ServiceState> {
        Ok(ServiceState {
            evict_requests: Mutex::new(Vec::new()),
            waker: Waker::new()?,
            lossless_waits: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            attaches: AtomicU64::new(0),
            attaches_deferred: AtomicU64::new(0),
            lease_deadlines: AtomicU64::new(0),
            lossless_backoffs: AtomicU64::new(0),
            strikes: Mutex::new(backoff::Strikes::new(cfg.lossless_backoff)),
            idle_tick: IDLE_TICK,
        })
    }

    /// Producer: entry `index` was marked evicted (`code`); has the service
    /// tell the subscriber and close its connection.
    pub(crate) fn request_eviction(&self, index: usize, generation: u32, code: u32) {
        if let Ok(mut q) = self.evict_requests.lock() {
            q.push(EvictRequest {
                index: index as u32,
                generation,
                code,
            });
        }
        self.waker.wake();
    }
}

/// The counters of a ring served by `sh`, which has committed `published`.
pub(crate) fn stats<S: Served>(sh: &S, published: u64) -> PublisherStats {
    let p = sh.producer();
    // Relaxed: counters for stats.
    let r = Ordering::Relaxed;
    PublisherStats {
        published,
        subscribers: sh.table().active(),
        connects: p.connects.load(r),
        disconnects: p.disconnects.load(r),
        evictions: p.evictions.load(r),
        lossless_waits: sh.state().lossless_waits.load(r),
        refused: sh.state().refused.load(r),
        attaches: sh.state().attaches.load(r),
        attaches_deferred: sh.state().attaches_deferred.load(r),
        lease_deadlines: sh.state().lease_deadlines.load(r),
        lossless_backoffs: sh.state().lossless_backoffs.load(r),
    }
}

/// An eventfd that wakes the service's `poll`: written by the producer
/// (evictions) and by the stop signal (close, process exit).
#[derive(Debug)]
pub(crate) struct Waker(OwnedFd);

impl Waker {
    /// A new eventfd.
    pub(crate) fn new() -> crate::error::Result<Waker> {
        rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )
        .map(Waker)
        .map_err(|e| Error::io("eventfd", e))
    }

    /// Wakes the service (best effort: a full counter already wakes it).
    pub(crate) fn wake(&self) {
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }

    /// A second handle on the same eventfd, for the stop signal's hook.
    fn try_clone(&self) -> Option<Waker> {
        self.0.try_clone().ok().map(Waker)
    }

    /// Resets the counter after a wakeup.
    fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.0, &mut b);
    }
}

/// The sentence an evicted subscriber reads for an `EVICT_*` code.
pub(crate) fn evict_reason(code: u32) -> &'static str {
    match code {
        EVICT_LEASE => "held a frame or packet past the lossless lease",
        EVICT_PUSH => "its push buffers could not be mapped by the publisher",
        EVICT_PROTOCOL => "broke the protocol",
        _ => "released by the publisher",
    }
}
