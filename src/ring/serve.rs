//! The socket service a publisher runs on its own thread, the same for both
//! ring kinds: accepts subscribers, runs the handshake, has the
//! [`Table`](super::table::Table) assign an entry, and frees it the moment
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
//!   that finds none waits in its connection, first come first served,
//!   ADR 0020); any other
//!   well-formed message but Bye, a second Attach or malformed buffers evict
//!   the subscriber (`EVICT_PROTOCOL`) and close its connection; a datagram
//!   that does not decode closes it without a notice; descriptors sent with
//!   any message are closed at once;
//! * when the process runs out of descriptors, accept fails: newcomers wait
//!   or are refused, the connected subscribers keep being served.
//!
//! What differs between ring kinds (acceptable Hellos, the Welcome and its
//! descriptors, push buffers) is the [`Served`] trait.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use super::table::{Assigned, Table};
use super::{AttachRate, PublisherStats, ServeConfig};
use crate::error::Error;
use crate::layout::{ProducerLine, CLIENT_BYTES, EVICT_LEASE, EVICT_PROTOCOL, EVICT_PUSH, PRODUCER_CLOSED};
use crate::lifecycle::StopSignal;
use crate::socket::msg::{self, Attach, Hello, Msg, Notice, Welcome, PROTOCOL_VERSION};
use crate::socket::transport::{self, Listener};
use crate::socket::PeerFd;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::time::monotonic_ns;

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

/// Longest single poll when nothing is pending. Stops and evictions wake
/// the service at once through its [`Waker`]; handshake deadlines shorten
/// the poll. Only the producer's heartbeat and the counters mirrored for
/// inspection wait for this tick.
const IDLE_TICK: Duration = Duration::from_secs(1);
/// Longest poll while subscribers are connected: their counters are
/// copied into the table this often, for inspection tools (`vramring top`).
const MIRROR_TICK: Duration = Duration::from_millis(250);
/// Pause after a failed poll or accept.
const RETRY: Duration = Duration::from_millis(20);

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
}

impl ServiceState {
    /// Empty queues, a new eventfd.
    pub(crate) fn new() -> crate::error::Result<ServiceState> {
        Ok(ServiceState {
            evict_requests: Mutex::new(Vec::new()),
            waker: Waker::new()?,
            lossless_waits: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            attaches: AtomicU64::new(0),
            attaches_deferred: AtomicU64::new(0),
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

enum State {
    Pending {
        deadline: Instant,
    },
    Active {
        index: u32,
        generation: u32,
        attached: bool,
        /// An Attach that found no token (or others waiting before it).
        waiting: Option<Waiting>,
    },
}

/// A checked Attach waiting for the attach rate, with its descriptors.
struct Waiting {
    /// Its place in the order of arrival.
    arrival: u64,
    attach: Attach,
    fds: Vec<PeerFd>,
}

/// The attach rate's state in the service loop: the bucket, and which
/// waiting Attach goes next (first come, first served).
struct Attaches {
    budget: AttachBudget,
    /// Arrivals so far (the next waiting Attach's `arrival`).
    arrivals: u64,
    /// The oldest waiting Attach's `arrival` at the start of this turn:
    /// only it may take a token this turn, and a new Attach queues behind
    /// it.
    first: Option<u64>,
}

/// The attach rate's token bucket ([`AttachRate`]); `None` inside: no bound.
struct AttachBudget {
    rate: Option<AttachRate>,
    tokens: u32,
    /// When the last token was added (or the bucket was last full).
    refilled: Instant,
}

impl AttachBudget {
    fn new(rate: Option<AttachRate>, now: Instant) -> AttachBudget {
        AttachBudget {
            rate,
            tokens: rate.map_or(0, |r| r.burst),
            refilled: now,
        }
    }

    fn interval(r: AttachRate) -> Duration {
        // Rounded up, so that no rate makes it zero.
        Duration::from_nanos(1_000_000_000u64.div_ceil(u64::from(r.per_second.max(1))))
    }

    fn refill(&mut self, now: Instant) {
        let Some(r) = self.rate else { return };
        if self.tokens >= r.burst {
            self.refilled = now;
            return;
        }
        let every = Self::interval(r);
        let due = now.saturating_duration_since(self.refilled).as_nanos() / every.as_nanos().max(1);
        let add = u32::try_from(due).unwrap_or(u32::MAX);
        if add > 0 {
            self.tokens = self.tokens.saturating_add(add).min(r.burst);
            self.refilled = if self.tokens >= r.burst {
                now
            } else {
                self.refilled + every * add
            };
        }
    }

    /// Takes a token if there is one at `now`.
    fn take(&mut self, now: Instant) -> bool {
        if self.rate.is_none() {
            return true;
        }
        self.refill(now);
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }

    /// How long from `now` until the next token (zero when one is there).
    fn next_in(&self, now: Instant) -> Duration {
        match self.rate {
            Some(r) if self.tokens == 0 => (self.refilled + Self::interval(r)).saturating_duration_since(now),
            _ => Duration::ZERO,
        }
    }
}

struct Conn {
    fd: OwnedFd,
    state: State,
}

/// What to do with a connection after serving it.
enum Verdict {
    Keep,
    /// Close it (its entry, if any, is freed).
    Close,
    /// Evict it with this `EVICT_*` code and reason, then close.
    Evict(u32, &'static str),
}

/// Serves `listener` until `stop` is raised, then marks the ring closed,
/// rings every doorbell, says Bye on every connection and frees its entry.
pub(crate) fn run<S: Served>(sh: Arc<S>, listener: Listener, stop: StopSignal) {
    match sh.state().waker.try_clone() {
        Some(w) => stop.on_raise(move || w.wake()),
        None => tracing::warn!("no second handle on the service's eventfd; a stop is seen within a second"),
    }
    let mut conns: Vec<Conn> = Vec::new();
    let mut attaches = Attaches {
        budget: AttachBudget::new(sh.serve_config().attach_rate, Instant::now()),
        arrivals: 0,
        first: None,
    };
    while !stop.is_raised() {
        sh.tick();
        handle_evictions(&*sh, &mut conns);
        let now = Instant::now();
        let timeout = conns
            .iter()
            .filter_map(|c| match c.state {
                State::Pending { deadline } => Some(deadline.saturating_duration_since(now)),
                State::Active { waiting: Some(_), .. } => Some(attaches.budget.next_in(now)),
                State::Active { .. } => None,
            })
            .fold(if conns.is_empty() { IDLE_TICK } else { MIRROR_TICK }, Duration::min);
        let (listener_ready, ready) = match poll(&listener, &sh.state().waker, &conns, timeout) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "poll in the socket service");
                std::thread::sleep(RETRY);
                continue;
            }
        };
        if listener_ready {
            accept_all(&*sh, &listener, &mut conns);
        }
        attaches.first = conns
            .iter()
            .filter_map(|c| match &c.state {
                State::Active { waiting: Some(w), .. } => Some(w.arrival),
                _ => None,
            })
            .min();
        let now = Instant::now();
        let mut k = 0;
        let mut ready = ready.into_iter().peekable();
        conns.retain_mut(|c| {
            let is_ready = ready.next_if_eq(&k).is_some();
            k += 1;
            match service_conn(&*sh, c, is_ready, now, &mut attaches) {
                Verdict::Keep => true,
                Verdict::Close => {
                    close_conn(&*sh, c);
                    false
                }
                Verdict::Evict(code, reason) => {
                    if let State::Active { index, generation, .. } = c.state {
                        let mut code = code;
                        let mut reason = reason;
                        if sh.table().evict(index as usize, generation, code) {
                            // Relaxed: own counter, single writer per thread
                            // (fetch_add: the producer counts too).
                            sh.producer().evictions.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(index, reason, "evicting a subscriber that broke the protocol");
                        } else if let Some(e) = sh.table().entry(index as usize) {
                            // Already evicted by the producer: say its reason.
                            // Relaxed: written before the entry's state moved.
                            code = e.evict_code.load(Ordering::Relaxed);
                            reason = evict_reason(code);
                        }
                        send_evicted(c, code, reason);
                    }
                    close_conn(&*sh, c);
                    false
                }
            }
        });
        // Relaxed: a bound for the mirrored cursors (informational).
        sh.table()
            .mirror_counters(sh.producer().published.load(Ordering::Relaxed));
        // Relaxed: informational heartbeat, single writer.
        sh.producer().heartbeat_ns.store(monotonic_ns(), Ordering::Relaxed);
    }
    // Stopped by `close` or at process exit: either way no more frames
    // come. Say so in the header first (a woken reader that checks it sees
    // ProducerGone, not an eviction), then on every connection.
    // SYNC: producer-state — Release; subscribers Acquire it.
    sh.producer().state.store(PRODUCER_CLOSED, Ordering::Release);
    let table = sh.table();
    for c in &conns {
        if let State::Active { index, generation, .. } = c.state {
            table.with_client(index as usize, generation, |_, line| super::ring_doorbell(line));
        }
    }
    for c in conns {
        if let State::Active { index, .. } = c.state {
            let _ = transport::send(c.fd.as_fd(), &Msg::Bye.encode(), &[]);
            table.free(index);
            // Relaxed: own counter, single writer (this thread).
            sh.producer().disconnects.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Most connections accepted per service iteration, so a connect flood
/// cannot keep the service from the connections it already has.
const ACCEPT_BATCH: usize = 64;

/// Accepts what is waiting (at most [`ACCEPT_BATCH`]). A subscriber sends
/// its Hello right after connecting, so a new connection whose Hello is
/// already there is served at once; one that has said nothing waits in the
/// pending set, and when that set is full its oldest member (which had its
/// chance) is closed to make room. A flood of silent connections therefore
/// costs the flooder its own connections, not a newcomer's handshake.
fn accept_all<S: Served>(sh: &S, listener: &Listener, conns: &mut Vec<Conn>) {
    for _ in 0..ACCEPT_BATCH {
        match listener.accept(Duration::ZERO) {
            Ok(Some(fd)) => {
                let mut c = Conn {
                    fd,
                    state: State::Pending {
                        deadline: crate::time::deadline_after(Instant::now(), sh.serve_config().handshake_timeout),
                    },
                };
                if transport::readable(c.fd.as_fd(), Duration::ZERO).unwrap_or(false) {
                    // A refused or broken handshake closes the connection.
                    if !matches!(serve_pending(sh, &mut c, true, Instant::now()), Verdict::Keep) {
                        continue;
                    }
                }
                if matches!(c.state, State::Pending { .. }) {
                    expire_oldest_if_full(sh, conns);
                }
                conns.push(c);
            }
            Ok(None) => break,
            Err(e) => {
                // E.g. EMFILE: the listener stays readable, so without a
                // pause the loop would spin. Connected subscribers are
                // served by the next iteration as usual.
                tracing::warn!(error = %e, "accept in the socket service");
                std::thread::sleep(RETRY);
                break;
            }
        }
    }
}

/// When the pending set is full, expires its oldest member: the loop that
/// follows closes it (connections are not removed here, so the indices
/// `poll` reported stay valid). The refusal is counted there.
fn expire_oldest_if_full<S: Served>(sh: &S, conns: &mut [Conn]) {
    let now = Instant::now();
    let mut live = conns.iter_mut().filter_map(|c| match &mut c.state {
        State::Pending { deadline } if *deadline > now => Some(deadline),
        _ => None,
    });
    let Some(oldest) = live.next() else { return };
    if 1 + live.count() >= sh.serve_config().max_pending as usize {
        tracing::debug!("too many silent connections; closing the oldest");
        *oldest = now;
    }
}

/// Waits up to `timeout` for the listener, the waker or a connection;
/// returns whether the listener is ready and which connections are.
fn poll(
    listener: &Listener,
    waker: &Waker,
    conns: &[Conn],
    timeout: Duration,
) -> rustix::io::Result<(bool, Vec<usize>)> {
    let mut fds = Vec::with_capacity(conns.len() + 2);
    fds.push(PollFd::from_borrowed_fd(listener.as_fd(), PollFlags::IN));
    fds.push(PollFd::from_borrowed_fd(waker.0.as_fd(), PollFlags::IN));
    for c in conns {
        fds.push(PollFd::from_borrowed_fd(c.fd.as_fd(), PollFlags::IN | PollFlags::RDHUP));
    }
    let ts = crate::time::timespec(timeout);
    match rustix::event::poll(&mut fds, Some(&ts)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => {}
        Err(e) => return Err(e),
    }
    let listener_ready = !fds[0].revents().is_empty();
    if !fds[1].revents().is_empty() {
        waker.drain();
    }
    let ready = fds[2..]
        .iter()
        .enumerate()
        .filter(|(_, p)| !p.revents().is_empty())
        .map(|(i, _)| i)
        .collect();
    Ok((listener_ready, ready))
}

/// A connection in its handshake: its Hello, or its deadline.
fn serve_pending<S: Served>(sh: &S, c: &mut Conn, ready: bool, now: Instant) -> Verdict {
    let State::Pending { deadline } = c.state else {
        return Verdict::Keep;
    };
    // A connection accepted in this iteration was not in its poll:
    // look once more before giving up on it, so a newcomer whose
    // Hello just arrived is served even while its slot was expired
    // to make room.
    let ready = ready || (now >= deadline && transport::readable(c.fd.as_fd(), Duration::ZERO).unwrap_or(false));
    if !ready {
        if now >= deadline {
            tracing::debug!("closing a connection that sent no Hello in time");
            // Relaxed: own counter.
            sh.state().refused.fetch_add(1, Ordering::Relaxed);
            return Verdict::Close;
        }
        return Verdict::Keep;
    }
    match transport::recv(c.fd.as_fd(), Duration::ZERO) {
        Ok(Some(m)) => match handshake(sh, &c.fd, &m.bytes) {
            // Descriptors sent with a Hello (`m.fds`) are dropped
            // (closed) here: a Hello carries none.
            Ok((index, generation)) => {
                c.state = State::Active {
                    index,
                    generation,
                    attached: false,
                    waiting: None,
                };
                Verdict::Keep
            }
            Err(e) => {
                tracing::info!(error = %e, "subscriber refused");
                // Relaxed: own counter.
                sh.state().refused.fetch_add(1, Ordering::Relaxed);
                Verdict::Close
            }
        },
        Ok(None) => Verdict::Keep,
        Err(_) => Verdict::Close,
    }
}

fn service_conn<S: Served>(sh: &S, c: &mut Conn, ready: bool, now: Instant, attaches: &mut Attaches) -> Verdict {
    match c.state {
        State::Pending { .. } => serve_pending(sh, c, ready, now),
        State::Active {
            index,
            generation,
            ref mut attached,
            ref mut waiting,
        } => {
            // Anything but a well-formed message keeps nothing alive: EOF,
            // Bye or garbage all end the lease.
            let heard = if !ready {
                Verdict::Keep
            } else {
                match transport::recv(c.fd.as_fd(), Duration::ZERO) {
                    Ok(None) => Verdict::Keep,
                    Ok(Some(m)) => match Msg::decode(&m.bytes) {
                        Ok(Msg::Bye) | Err(_) => Verdict::Close,
                        Ok(Msg::Attach(_)) if *attached => Verdict::Evict(EVICT_PROTOCOL, "sent a second Attach"),
                        Ok(Msg::Attach(a)) => {
                            *attached = true;
                            if let Err(reason) = sh.check_attach(index, &a, m.fds.len()) {
                                // Refused before it spends a token.
                                tracing::warn!(index, %reason, "refusing a subscriber's push buffers");
                                Verdict::Evict(EVICT_PROTOCOL, "sent push buffers that do not fit the ring")
                            } else if attaches.first.is_none() && attaches.budget.take(now) {
                                serve_attach(sh, index, generation, a, m.fds)
                            } else {
                                // Relaxed: own counter.
                                sh.state().attaches_deferred.fetch_add(1, Ordering::Relaxed);
                                tracing::debug!(index, "a push Attach waits for the attach rate");
                                *waiting = Some(Waiting {
                                    arrival: attaches.arrivals,
                                    attach: a,
                                    fds: m.fds,
                                });
                                attaches.arrivals += 1;
                                Verdict::Keep
                            }
                        }
                        Ok(_) => Verdict::Evict(EVICT_PROTOCOL, "sent a message that is not allowed after the Welcome"),
                    },
                    Err(_) => Verdict::Close,
                }
            };
            // A connection that just ended spends no token. Otherwise the
            // oldest waiting Attach is served once a token has come (one a
            // turn; a turn with tokens left and Attaches waiting follows at
            // once).
            if !matches!(heard, Verdict::Keep) {
                return heard;
            }
            let first = waiting.as_ref().is_some_and(|w| Some(w.arrival) == attaches.first);
            if first && attaches.budget.take(now) {
                if let Some(w) = waiting.take() {
                    return serve_attach(sh, index, generation, w.attach, w.fds);
                }
            }
            Verdict::Keep
        }
    }
}

/// Hands an Attach to the ring kind; buffers that do not fit evict.
fn serve_attach<S: Served>(sh: &S, index: u32, generation: u32, a: Attach, fds: Vec<PeerFd>) -> Verdict {
    // Relaxed: own counter.
    sh.state().attaches.fetch_add(1, Ordering::Relaxed);
    match sh.attach(index, generation, a, fds) {
        Ok(()) => Verdict::Keep,
        Err(reason) => {
            tracing::warn!(index, %reason, "refusing a subscriber's push buffers");
            Verdict::Evict(EVICT_PROTOCOL, "sent push buffers that do not fit the ring")
        }
    }
}

/// Frees the entry of a connection that ends (if it had one).
fn close_conn<S: Served>(sh: &S, c: &Conn) {
    if let State::Active { index, .. } = c.state {
        sh.table().free(index);
        // Relaxed: own counter, single writer (this thread).
        sh.producer().disconnects.fetch_add(1, Ordering::Relaxed);
    }
}

fn send_evicted(c: &Conn, code: u32, reason: &str) {
    let notice = Notice {
        code,
        reason: reason.into(),
    };
    let _ = transport::send(c.fd.as_fd(), &Msg::Evicted(notice).encode(), &[]);
}

fn reject(fd: &OwnedFd, code: u32, reason: String) -> Error {
    let _ = transport::send(
        fd.as_fd(),
        &Msg::Reject(Notice {
            code,
            reason: reason.clone(),
        })
        .encode(),
        &[],
    );
    Error::Refused { code, reason }
}

fn handshake<S: Served>(sh: &S, fd: &OwnedFd, bytes: &[u8]) -> Result<(u32, u32), Error> {
    let hello = match Msg::decode(bytes) {
        Ok(Msg::Hello(h)) => h,
        Ok(other) => {
            return Err(reject(
                fd,
                msg::REJECT_BAD_HELLO,
                format!("expected Hello, got kind {}", other.kind()),
            ))
        }
        Err(Error::VersionMismatch { peer, .. }) => {
            tracing::warn!(
                peer,
                ours = PROTOCOL_VERSION,
                "subscriber speaks another protocol version"
            );
            return Err(reject(
                fd,
                msg::REJECT_VERSION,
                format!("publisher speaks protocol {PROTOCOL_VERSION}, subscriber speaks {peer}"),
            ));
        }
        Err(e) => return Err(reject(fd, msg::REJECT_BAD_HELLO, e.to_string())),
    };
    let (uid, gid) = transport::peer_ids(fd.as_fd())?;
    if !sh.serve_config().access.allows(uid, gid) {
        return Err(reject(
            fd,
            msg::REJECT_PERMISSION,
            format!("uid {uid} gid {gid} is not on the allow-list"),
        ));
    }
    if let Some((code, reason)) = sh.refuse(&hello, uid) {
        return Err(reject(fd, code, reason));
    }
    let table = sh.table();
    if let Some(most) = sh.serve_config().max_per_uid {
        if table.held_by(uid) >= most {
            return Err(reject(
                fd,
                msg::REJECT_FULL,
                format!("uid {uid} already holds {most} subscriber entries, the most this publisher allows one uid"),
            ));
        }
    }
    let Some(a) = table.assign(sh.entry_flags(&hello), &hello.name, &|| sh.lossless_start(), uid)? else {
        return Err(reject(
            fd,
            msg::REJECT_FULL,
            format!("subscriber table full ({} entries)", table.entries().len()),
        ));
    };
    let (mut welcome, control, pool) = sh.welcome(&a, &hello);
    welcome.index = a.index;
    welcome.generation = a.generation;
    welcome.subs_bytes = table.bytes();
    welcome.client_bytes = CLIENT_BYTES;
    let mut fds = vec![control, table.fd(), a.client_fd.as_fd()];
    fds.extend(pool);
    // The descriptors stay ours (the client region's is closed when `a`
    // drops: the subscriber and our mapping keep the memory alive).
    let sent = transport::send(fd.as_fd(), &Msg::Welcome(welcome).encode(), &fds);
    if let Err(e) = sent {
        table.free(a.index);
        return Err(e);
    }
    // Relaxed: own counter, single writer (this thread).
    sh.producer().connects.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(index = a.index, name = %hello.name, uid, "subscriber connected");
    Ok((a.index, a.generation))
}

fn handle_evictions<S: Served>(sh: &S, conns: &mut Vec<Conn>) {
    let requests = match sh.state().evict_requests.lock() {
        Ok(mut q) if !q.is_empty() => std::mem::take(&mut *q),
        _ => return,
    };
    conns.retain(|c| {
        let State::Active { index, generation, .. } = c.state else {
            return true;
        };
        let Some(r) = requests.iter().find(|r| r.index == index && r.generation == generation) else {
            return true;
        };
        send_evicted(c, r.code, evict_reason(r.code));
        close_conn(sh, c);
        false
    });
    // An entry evicted after its connection had already closed (the service
    // freed it, then the producer's eviction landed): nobody is left to
    // tell; give the entry back.
    for r in requests {
        sh.table().reap(r.index, r.generation);
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_attach_budget_serves_a_burst_then_one_per_interval_and_never_stores_more_than_the_burst() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut b = AttachBudget::new(
            Some(AttachRate {
                per_second: 10,
                burst: 3,
            }),
            t0,
        );
        // The burst, at once; then nothing until a token has come.
        assert!((0..3).all(|_| b.take(t0)));
        assert!(!b.take(t0));
        assert_eq!(b.next_in(t0), ms(100));
        assert_eq!(b.next_in(t0 + ms(40)), ms(60));
        assert!(!b.take(t0 + ms(99)));
        assert!(b.take(t0 + ms(100)));
        assert!(!b.take(t0 + ms(150)));
        // Two intervals later, two tokens; the third waits for its own.
        assert!(b.take(t0 + ms(300)));
        assert!(b.take(t0 + ms(300)));
        assert!(!b.take(t0 + ms(300)));
        assert_eq!(b.next_in(t0 + ms(300)), ms(100));
        // A long quiet spell fills the bucket to the burst, no further.
        let later = t0 + Duration::from_secs(60);
        assert!((0..3).all(|_| b.take(later)));
        assert!(!b.take(later));
    }

    #[test]
    fn a_zero_attach_rate_or_burst_is_refused_with_a_sentence() {
        for (per_second, burst) in [(0, 4), (4, 0)] {
            let c = ServeConfig {
                attach_rate: Some(AttachRate { per_second, burst }),
                ..ServeConfig::default()
            };
            let e = c.validate().unwrap_err();
            assert!(matches!(e, Error::Config(_)), "{e:?}");
            assert!(e.to_string().contains("attach rate"), "{e}");
        }
        let unbounded = ServeConfig {
            attach_rate: None,
            ..ServeConfig::default()
        };
        unbounded.validate().unwrap();
        ServeConfig::default().validate().unwrap();
    }

    #[test]
    fn a_rate_above_a_billion_a_second_still_has_a_nonzero_interval() {
        let r = AttachRate {
            per_second: u32::MAX,
            burst: 1,
        };
        assert_eq!(AttachBudget::interval(r), Duration::from_nanos(1));
        let t0 = Instant::now();
        let mut b = AttachBudget::new(Some(r), t0);
        assert!(b.take(t0));
        assert!(!b.take(t0));
        assert_eq!(b.next_in(t0), Duration::from_nanos(1));
        assert!(b.take(t0 + Duration::from_nanos(1)));
    }

    #[test]
    fn no_rate_means_every_attach_is_served_at_once() {
        let t0 = Instant::now();
        let mut b = AttachBudget::new(None, t0);
        assert!((0..10_000).all(|_| b.take(t0)));
        assert_eq!(b.next_in(t0), Duration::ZERO);
    }
}
