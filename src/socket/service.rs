//! The socket service a publisher runs on its own thread: accepts
//! subscribers, runs the handshake, assigns subscriber-table entries, and
//! frees an entry the moment its connection closes (the connection is the
//! subscriber's lease; no pid is ever used).
//!
//! One loop serves both kinds of ring: the frame ring
//! ([`crate::Publisher`]) and the packet ring
//! ([`crate::packet::PacketPublisher`]). What differs between them (which
//! Hellos are acceptable, the Welcome and its descriptors, push buffers) is
//! the [`Served`] trait.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use crate::error::Error;
use crate::layout::{DoorbellLine, ProducerLine, SubEntry, PRODUCER_CLOSED, SUB_ACTIVE, SUB_EVICTED, SUB_FREE};
use crate::lifecycle::StopSignal;
use crate::socket::msg::{self, Attach, Hello, Msg, Notice, Welcome, PROTOCOL_VERSION};
use crate::socket::transport::{self, AccessPolicy, Listener};
use crate::time::monotonic_ns;

/// What a ring tells the service loop.
pub(crate) trait Served: Send + Sync + 'static {
    /// The producer line (state, heartbeat, connect counters).
    fn producer(&self) -> &ProducerLine;
    /// The futex word subscribers park on.
    fn doorbell(&self) -> &DoorbellLine;
    /// The subscriber table.
    fn entries(&self) -> &[SubEntry];
    /// Who may connect.
    fn access(&self) -> &AccessPolicy;
    /// How long a new connection has to send its Hello.
    fn handshake_timeout(&self) -> Duration;
    /// What the producer and the service exchange besides the ring.
    fn state(&self) -> &ServiceState;
    /// A refusal `(REJECT_*, reason)` for a Hello whose peer passed the
    /// credential check, or `None` to accept it.
    fn refuse(&self, hello: &Hello) -> Option<(u32, String)>;
    /// `SUBF_*` entry flags for an accepted Hello.
    fn entry_flags(&self, hello: &Hello) -> u32;
    /// The seq a new lossless reader's cursor starts at (it is done with
    /// everything up to and including it).
    fn lossless_start(&self) -> u64;
    /// The Welcome for entry `index`, and the descriptors that go with it.
    fn welcome(&self, index: u32, generation: u32, hello: &Hello) -> (Welcome, Vec<BorrowedFd<'_>>);
    /// An Attach from an active subscriber (push buffers); ignored by
    /// default.
    fn attach(&self, index: u32, a: Attach, fds: Vec<OwnedFd>) {
        let _ = (a, fds);
        tracing::debug!(index, "ignoring an Attach this ring does not use");
    }
}

/// Rings the doorbell: wakes every subscriber parked on it.
pub(crate) fn ring(doorbell: &DoorbellLine) {
    crate::protocol::ring_doorbell_word(doorbell);
}

/// Longest single poll when nothing is pending. Stops and evictions wake
/// the service at once through its [`Waker`]; handshake deadlines shorten
/// the poll. Only the producer's heartbeat word waits for this tick, so an
/// idle service costs one wakeup a second instead of fifty.
const IDLE_TICK: Duration = Duration::from_secs(1);
/// Pause after a failed poll.
const RETRY: Duration = Duration::from_millis(20);

/// What a publisher's producer thread and its socket service share besides
/// the ring, the same for both kinds of ring.
#[derive(Debug)]
pub(crate) struct ServiceState {
    /// Entries the producer evicted; the service sends Evicted and closes.
    /// The producer pushes one, then wakes the service.
    pub(crate) evict_requests: Mutex<Vec<u32>>,
    /// Wakes the service out of its `poll` (evictions, stop).
    pub(crate) waker: Waker,
    /// Loans or writes that had to wait for a lossless subscriber.
    pub(crate) lossless_waits: std::sync::atomic::AtomicU64,
}

impl ServiceState {
    /// Empty queues, a new eventfd.
    pub(crate) fn new() -> crate::error::Result<ServiceState> {
        Ok(ServiceState {
            evict_requests: Mutex::new(Vec::new()),
            waker: Waker::new()?,
            lossless_waits: std::sync::atomic::AtomicU64::new(0),
        })
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
    Pending { deadline: Instant },
    Active { index: u32 },
}

struct Conn {
    fd: OwnedFd,
    state: State,
}

/// Serves `listener` until `stop` is raised, then marks the ring closed,
/// rings the doorbell, says Bye on every connection and frees its entry.
pub(crate) fn run<S: Served>(sh: Arc<S>, listener: Listener, stop: StopSignal) {
    match sh.state().waker.try_clone() {
        Some(w) => stop.on_raise(move || w.wake()),
        None => tracing::warn!("no second handle on the service's eventfd; a stop is seen within a second"),
    }
    let mut conns: Vec<Conn> = Vec::new();
    while !stop.is_raised() {
        handle_evictions(&*sh, &mut conns);
        let timeout = conns
            .iter()
            .filter_map(|c| match c.state {
                State::Pending { deadline } => Some(deadline.saturating_duration_since(Instant::now())),
                State::Active { .. } => None,
            })
            .fold(IDLE_TICK, Duration::min);
        let (listener_ready, ready) = match poll(&listener, &sh.state().waker, &conns, timeout) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "poll in the socket service");
                std::thread::sleep(RETRY);
                continue;
            }
        };
        if listener_ready {
            loop {
                match listener.accept(Duration::ZERO) {
                    Ok(Some(fd)) => conns.push(Conn {
                        fd,
                        state: State::Pending {
                            deadline: Instant::now() + sh.handshake_timeout(),
                        },
                    }),
                    Ok(None) => break,
                    Err(e) => {
                        // E.g. EMFILE: the listener stays readable, so
                        // without a pause the loop would spin.
                        tracing::warn!(error = %e, "accept in the socket service");
                        std::thread::sleep(RETRY);
                        break;
                    }
                }
            }
        }
        let now = Instant::now();
        let mut k = 0;
        let mut ready = ready.into_iter().peekable();
        conns.retain_mut(|c| {
            let is_ready = ready.next_if_eq(&k).is_some();
            k += 1;
            service_conn(&*sh, c, is_ready, now)
        });
        // Relaxed: informational heartbeat, single writer.
        sh.producer().heartbeat_ns.store(monotonic_ns(), Ordering::Relaxed);
    }
    // Stopped by `Publisher::close` or at process exit: either way no more
    // frames come. Say so in the header (subscribers notice at once) and on
    // every connection.
    // SYNC: producer-state — Release; subscribers Acquire it.
    sh.producer().state.store(PRODUCER_CLOSED, Ordering::Release);
    ring(sh.doorbell());
    for c in conns {
        if let State::Active { index } = c.state {
            let _ = transport::send(c.fd.as_fd(), &Msg::Bye.encode(), &[]);
            free_entry(&*sh, index);
        }
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
    let ts = rustix::time::Timespec {
        tv_sec: timeout.as_secs() as _,
        tv_nsec: timeout.subsec_nanos() as _,
    };
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

/// Returns whether to keep the connection.
fn service_conn<S: Served>(sh: &S, c: &mut Conn, ready: bool, now: Instant) -> bool {
    match c.state {
        State::Pending { deadline } => {
            if !ready {
                if now >= deadline {
                    tracing::debug!("closing a connection that sent no Hello in time");
                    return false;
                }
                return true;
            }
            match transport::recv(c.fd.as_fd(), Duration::ZERO) {
                Ok(Some(m)) => match handshake(sh, &c.fd, &m.bytes) {
                    Ok(index) => {
                        c.state = State::Active { index };
                        true
                    }
                    Err(e) => {
                        tracing::info!(error = %e, "subscriber refused");
                        false
                    }
                },
                Ok(None) => true,
                Err(_) => false,
            }
        }
        State::Active { index } => {
            if !ready {
                return true;
            }
            // Anything but a well-formed message keeps nothing alive: EOF,
            // Bye or garbage all end the lease.
            match transport::recv(c.fd.as_fd(), Duration::ZERO) {
                Ok(None) => true,
                Ok(Some(m)) => match Msg::decode(&m.bytes) {
                    Ok(Msg::Bye) | Err(_) => {
                        free_entry(sh, index);
                        false
                    }
                    Ok(Msg::Attach(a)) => {
                        sh.attach(index, a, m.fds);
                        true
                    }
                    Ok(other) => {
                        tracing::debug!(kind = other.kind(), index, "ignoring an unexpected message");
                        true
                    }
                },
                Err(_) => {
                    free_entry(sh, index);
                    false
                }
            }
        }
    }
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

fn handshake<S: Served>(sh: &S, fd: &OwnedFd, bytes: &[u8]) -> Result<u32, Error> {
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
    if !sh.access().allows(uid, gid) {
        return Err(reject(
            fd,
            msg::REJECT_PERMISSION,
            format!("uid {uid} gid {gid} is not on the allow-list"),
        ));
    }
    if let Some((code, reason)) = sh.refuse(&hello) {
        return Err(reject(fd, code, reason));
    }
    let entries = sh.entries();
    // Relaxed: the service thread is the only writer of `state` besides the
    // producer's eviction (FREE entries are never touched by the producer).
    let Some(index) = entries.iter().position(|e| e.state.load(Ordering::Relaxed) == SUB_FREE) else {
        return Err(reject(
            fd,
            msg::REJECT_FULL,
            format!("subscriber table full ({} entries)", entries.len()),
        ));
    };
    let e = &entries[index];
    // Relaxed: all published by the Release store of `state` below.
    let generation = e.generation.load(Ordering::Relaxed).wrapping_add(1);
    e.generation.store(generation, Ordering::Relaxed);
    e.flags.store(sh.entry_flags(&hello), Ordering::Relaxed);
    e.set_name(&hello.name);
    e.released_seq.store(sh.lossless_start(), Ordering::Relaxed);
    e.reading_seq.store(0, Ordering::Relaxed);
    e.delivered.store(0, Ordering::Relaxed);
    e.dropped.store(0, Ordering::Relaxed);
    e.overruns.store(0, Ordering::Relaxed);
    e.parked.store(0, Ordering::Relaxed);
    e.push_count.store(0, Ordering::Relaxed);
    e.push_held.store(0, Ordering::Relaxed);
    for w in &e.push_seq {
        w.store(0, Ordering::Relaxed);
    }
    e.heartbeat_ns.store(monotonic_ns(), Ordering::Relaxed);
    // SYNC: sub-state — Release, paired with the producer's Acquire when it
    // scans the table and the subscriber's Acquire at connect.
    e.state.store(SUB_ACTIVE, Ordering::Release);
    let (welcome, fds) = sh.welcome(index as u32, generation, &hello);
    // The descriptors stay ours: SCM_RIGHTS installs new ones in the peer.
    let sent = transport::send(fd.as_fd(), &Msg::Welcome(welcome).encode(), &fds);
    if let Err(e) = sent {
        free_entry(sh, index as u32);
        return Err(e);
    }
    // Relaxed: own counter, single writer (this thread).
    sh.producer().connects.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(index, name = %hello.name, uid, "subscriber connected");
    Ok(index as u32)
}

fn free_entry<S: Served>(sh: &S, index: u32) {
    let Some(e) = sh.entries().get(index as usize) else {
        return;
    };
    // Relaxed: published by the Release store of `state`.
    e.flags.store(0, Ordering::Relaxed);
    e.parked.store(0, Ordering::Relaxed);
    e.push_count.store(0, Ordering::Relaxed);
    // SYNC: sub-state — Release; the producer stops waiting for this entry
    // and unmaps its push buffers at its next publish.
    e.state.store(SUB_FREE, Ordering::Release);
    // Relaxed: own counter, single writer (this thread).
    sh.producer().disconnects.fetch_add(1, Ordering::Relaxed);
}

fn handle_evictions<S: Served>(sh: &S, conns: &mut Vec<Conn>) {
    let requests = match sh.state().evict_requests.lock() {
        Ok(mut q) if !q.is_empty() => std::mem::take(&mut *q),
        _ => return,
    };
    conns.retain(|c| {
        let State::Active { index } = c.state else { return true };
        if !requests.contains(&index) {
            return true;
        }
        let notice = Notice {
            code: msg::EVICT_LEASE,
            reason: "held a frame or packet past the lossless lease".into(),
        };
        let _ = transport::send(c.fd.as_fd(), &Msg::Evicted(notice).encode(), &[]);
        free_entry(sh, index);
        false
    });
    // An entry evicted after its connection had already closed (the service
    // freed it, then the producer's eviction landed): nobody is left to
    // tell; give the entry back.
    for index in requests {
        if let Some(e) = sh.entries().get(index as usize) {
            // SYNC: sub-state — Release, as in `free_entry`.
            let _ = e
                .state
                .compare_exchange(SUB_EVICTED, SUB_FREE, Ordering::Release, Ordering::Relaxed);
        }
    }
}
