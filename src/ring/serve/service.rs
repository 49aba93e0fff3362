//! The service loop a publisher runs on its own thread: accept, poll, serve
//! each connection within its limits, evict, and close the ring on stop.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use super::attach_budget::{AttachBudget, Attaches, Waiting};
use super::handshake::{handshake, refuse_unreadable};
use super::{evict_reason, Served, Waker};
use crate::error::Error;
use crate::layout::{EVICT_PROTOCOL, PRODUCER_CLOSED, SUBF_PUSH};
use crate::lifecycle::StopSignal;
use crate::socket::msg::{Attach, Msg, Notice};
use crate::socket::transport::{self, Listener};
use crate::socket::PeerFd;
use crate::sync::atomic::Ordering;
use crate::time::monotonic_ns;

/// Longest poll while subscribers are connected: their counters are
/// copied into the table this often, for inspection tools (`vramring top`).
const MIRROR_TICK: Duration = Duration::from_millis(250);
/// Pause after a failed poll or accept.
const RETRY: Duration = Duration::from_millis(20);

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
            .fold(
                if conns.is_empty() {
                    sh.state().idle_tick
                } else {
                    MIRROR_TICK
                },
                Duration::min,
            );
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
            table.with_client(index as usize, generation, |_, line| crate::ring::ring_doorbell(line));
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
    let outcome = match transport::recv(c.fd.as_fd(), Duration::ZERO) {
        // Descriptors sent with a Hello (`m.fds`) are dropped (closed)
        // here: a Hello carries none.
        Ok(Some(m)) => handshake(sh, &c.fd, &m.bytes),
        Ok(None) => return Verdict::Keep,
        // Longer than any message, or its descriptors cut: malformed.
        Err(Error::BadMessage(reason)) => Err(refuse_unreadable(&c.fd, reason)),
        Err(_) => return Verdict::Close,
    };
    match outcome {
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
                        Ok(Msg::Attach(_)) if !push_granted(sh, index) => Verdict::Evict(
                            EVICT_PROTOCOL,
                            "sent an Attach, but push delivery was not granted to this connection",
                        ),
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
                                tracing::debug!(index, generation, "a push Attach waits for the attach rate");
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

/// Whether the entry of `index` was granted push delivery (`SUBF_PUSH`):
/// only then may its connection send an Attach (PROTOCOL.md §16.3).
fn push_granted<S: Served>(sh: &S, index: u32) -> bool {
    sh.table()
        .entry(index as usize)
        // Relaxed: the flags are written by this thread at assignment.
        .is_some_and(|e| e.flags.load(Ordering::Relaxed) & SUBF_PUSH != 0)
}

/// Hands an Attach to the ring kind; buffers that do not fit evict.
fn serve_attach<S: Served>(sh: &S, index: u32, generation: u32, a: Attach, fds: Vec<PeerFd>) -> Verdict {
    // Relaxed: own counter.
    sh.state().attaches.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(index, generation, "serving a push Attach");
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
