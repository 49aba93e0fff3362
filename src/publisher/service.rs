//! The publisher's socket service: accepts subscribers, runs the handshake,
//! assigns table entries, and frees an entry the moment its connection
//! closes (the connection is the subscriber's lease; no pid is ever used).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use super::Shared;
use crate::error::Error;
use crate::layout::{
    POLICY_OVERWRITE, PRODUCER_CLOSED, PUSH_BUFFERS, SUBF_LOSSLESS, SUBF_PUSH, SUBF_SEQUENTIAL, SUBF_WRITE, SUB_ACTIVE,
    SUB_FREE,
};
use crate::lifecycle::StopSignal;
use crate::socket::msg::{self, Msg, Notice, Welcome, PROTOCOL_VERSION};
use crate::socket::transport::{self, Listener};
use crate::time::monotonic_ns;

/// How long one poll waits; bounds how late a stop request is seen.
const TICK: Duration = Duration::from_millis(20);

enum State {
    Pending { deadline: Instant },
    Active { index: u32 },
}

struct Conn {
    fd: OwnedFd,
    state: State,
}

pub(super) fn run(sh: Arc<Shared>, listener: Listener, stop: StopSignal) {
    let mut conns: Vec<Conn> = Vec::new();
    while !stop.is_raised() {
        handle_evictions(&sh, &mut conns);
        let (listener_ready, ready) = match poll(&listener, &conns) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "poll in the socket service");
                std::thread::sleep(TICK);
                continue;
            }
        };
        if listener_ready {
            while let Ok(Some(fd)) = listener.accept(Duration::ZERO) {
                conns.push(Conn {
                    fd,
                    state: State::Pending {
                        deadline: Instant::now() + sh.cfg.handshake_timeout,
                    },
                });
            }
        }
        let now = Instant::now();
        let mut k = 0;
        let mut ready = ready.into_iter().peekable();
        conns.retain_mut(|c| {
            let is_ready = ready.next_if_eq(&k).is_some();
            k += 1;
            service_conn(&sh, c, is_ready, now)
        });
        // Relaxed: informational heartbeat, single writer.
        sh.header()
            .producer
            .heartbeat_ns
            .store(monotonic_ns(), Ordering::Relaxed);
    }
    // Stopped by `Publisher::close` or at process exit: either way no more
    // frames come. Say so in the header (subscribers notice at once) and on
    // every connection.
    let header = sh.header();
    // SYNC: producer-state — Release; subscribers Acquire it.
    header.producer.state.store(PRODUCER_CLOSED, Ordering::Release);
    crate::protocol::ring_doorbell(header);
    for c in conns {
        if let State::Active { index } = c.state {
            let _ = transport::send(c.fd.as_fd(), &Msg::Bye.encode(), &[]);
            free_entry(&sh, index);
        }
    }
}

fn poll(listener: &Listener, conns: &[Conn]) -> rustix::io::Result<(bool, Vec<usize>)> {
    let lfd = listener.as_fd();
    let mut fds = Vec::with_capacity(conns.len() + 1);
    fds.push(PollFd::from_borrowed_fd(lfd, PollFlags::IN));
    for c in conns {
        fds.push(PollFd::from_borrowed_fd(c.fd.as_fd(), PollFlags::IN | PollFlags::RDHUP));
    }
    let ts = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: TICK.as_nanos() as _,
    };
    match rustix::event::poll(&mut fds, Some(&ts)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => {}
        Err(e) => return Err(e),
    }
    let listener_ready = !fds[0].revents().is_empty();
    let ready = fds[1..]
        .iter()
        .enumerate()
        .filter(|(_, p)| !p.revents().is_empty())
        .map(|(i, _)| i)
        .collect();
    Ok((listener_ready, ready))
}

/// Returns whether to keep the connection.
fn service_conn(sh: &Shared, c: &mut Conn, ready: bool, now: Instant) -> bool {
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
                        queue_attach(sh, index, a, m.fds);
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

fn handshake(sh: &Shared, fd: &OwnedFd, bytes: &[u8]) -> Result<u32, Error> {
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
    if !sh.cfg.access.allows(uid, gid) {
        return Err(reject(
            fd,
            msg::REJECT_PERMISSION,
            format!("uid {uid} gid {gid} is not on the allow-list"),
        ));
    }
    let info = &sh.info;
    if hello.backends & (1 << info.backend) == 0 {
        let name = crate::memory::BackendKind::from_code(info.backend).map_or("?", |b| b.name());
        return Err(reject(
            fd,
            msg::REJECT_BACKEND,
            format!("the ring is on the {name} backend, which this subscriber cannot import"),
        ));
    }
    if hello.flags & msg::HELLO_LOSSLESS != 0 && info.policy == POLICY_OVERWRITE {
        return Err(reject(
            fd,
            msg::REJECT_POLICY,
            "lossless asked of a publisher with the overwrite policy".into(),
        ));
    }
    if hello.flags & msg::HELLO_WRITE != 0 && !sh.cfg.allow_write {
        return Err(reject(
            fd,
            msg::REJECT_WRITE_DENIED,
            "write access to the pool is not granted by this publisher".into(),
        ));
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
    let mut flags = 0;
    if hello.flags & msg::HELLO_LOSSLESS != 0 {
        flags |= SUBF_LOSSLESS;
    }
    if hello.flags & msg::HELLO_SEQUENTIAL != 0 {
        flags |= SUBF_SEQUENTIAL;
    }
    if hello.flags & msg::HELLO_WRITE != 0 {
        flags |= SUBF_WRITE;
    }
    if hello.flags & msg::HELLO_PUSH != 0 {
        flags |= SUBF_PUSH;
    }
    // Relaxed: all published by the Release store of `state` below.
    let generation = e.generation.load(Ordering::Relaxed).wrapping_add(1);
    e.generation.store(generation, Ordering::Relaxed);
    e.flags.store(flags, Ordering::Relaxed);
    e.set_name(&hello.name);
    // SYNC: global-seq — Acquire: the lossless cursor starts at the newest
    // committed frame, so the producer never waits for frames published
    // before this subscriber joined.
    let start = sh.header().seq.global_seq.load(Ordering::Acquire);
    e.released_seq.store(start, Ordering::Relaxed);
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
    // SYNC: sub-state — Release, paired with the producer's Acquire in
    // `lossless_holder` and the subscriber's Acquire at connect.
    e.state.store(SUB_ACTIVE, Ordering::Release);
    let welcome = Welcome {
        index: index as u32,
        generation,
        epoch: info.epoch,
        backend: info.backend,
        granted: hello.flags & (msg::HELLO_LOSSLESS | msg::HELLO_SEQUENTIAL | msg::HELLO_WRITE | msg::HELLO_PUSH),
        control_bytes: sh.control.len() as u64,
        subs_bytes: sh.subs.len() as u64,
        pool_bytes: info.pool_bytes,
        device_uuid: info.device_uuid,
    };
    // The descriptors stay ours: SCM_RIGHTS installs new ones in the peer.
    let sent = transport::send(
        fd.as_fd(),
        &Msg::Welcome(welcome).encode(),
        &[sh.control_fd.as_fd(), sh.subs_fd.as_fd(), sh.pool_fd.as_fd()],
    );
    if let Err(e) = sent {
        free_entry(sh, index as u32);
        return Err(e);
    }
    // Relaxed: own counter, single writer (this thread).
    sh.header().producer.connects.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(index, name = %hello.name, uid, "subscriber connected");
    Ok(index as u32)
}

/// Checks a subscriber's push buffers against the ring and hands them to
/// the producer thread, which maps them. Bad ones are dropped (the
/// subscriber stays on pull delivery).
fn queue_attach(sh: &Shared, index: u32, a: crate::socket::Attach, fds: Vec<OwnedFd>) {
    let Some(e) = sh.entries().get(index as usize) else {
        return;
    };
    // Relaxed: written by this thread.
    let push = e.flags.load(Ordering::Relaxed) & SUBF_PUSH != 0;
    let frame = sh.info.geometry.frame_bytes;
    let ok = push
        && fds.len() == 1
        && a.count as usize == PUSH_BUFFERS
        && a.stride >= frame
        && a.stride
            .checked_mul(u64::from(a.count))
            .is_some_and(|need| need <= a.bytes);
    let Some(fd) = fds.into_iter().next().filter(|_| ok) else {
        tracing::warn!(index, ?a, "ignoring a malformed Attach");
        return;
    };
    let generation = e.generation.load(Ordering::Relaxed);
    if let Ok(mut q) = sh.attach_requests.lock() {
        q.push(super::AttachRequest {
            index,
            generation,
            fd,
            attach: a,
        });
    }
}

fn free_entry(sh: &Shared, index: u32) {
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
    sh.header().producer.disconnects.fetch_add(1, Ordering::Relaxed);
}

fn handle_evictions(sh: &Shared, conns: &mut Vec<Conn>) {
    let requests = match sh.evict_requests.lock() {
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
            reason: "held a frame past the lossless lease".into(),
        };
        let _ = transport::send(c.fd.as_fd(), &Msg::Evicted(notice).encode(), &[]);
        free_entry(sh, index);
        false
    });
}
