//! The handshake on a new connection: its Hello checked against the protocol
//! version, the allow-list, the ring kind, who may read lossless (by uid,
//! and the uid's back-off after a lease eviction) and the per-uid and table
//! limits, answered with a Welcome and its descriptors or a Reject.

use std::os::fd::{AsFd, OwnedFd};

use std::time::Instant;

use super::{backoff, Served};
use crate::error::Error;
use crate::layout::CLIENT_BYTES;
use crate::socket::msg::{self, Msg, Notice, PROTOCOL_VERSION};
use crate::socket::transport;
use crate::sync::atomic::Ordering;

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

/// Refuses a first datagram that could not be received whole (longer than
/// any message, or its descriptors cut): it is malformed, so it gets
/// `REJECT_BAD_HELLO` like any other malformed first message.
pub(super) fn refuse_unreadable(fd: &OwnedFd, reason: String) -> Error {
    reject(
        fd,
        msg::REJECT_BAD_HELLO,
        format!("the first message could not be read: {reason}"),
    )
}

pub(super) fn handshake<S: Served>(sh: &S, fd: &OwnedFd, bytes: &[u8]) -> Result<(u32, u32), Error> {
    let mut hello = match Msg::decode(bytes) {
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
    sh.settle(&mut hello, uid);
    if let Some((code, reason)) = sh.refuse(&hello, uid) {
        return Err(reject(fd, code, reason));
    }
    if hello.flags & msg::HELLO_LOSSLESS != 0 {
        if !sh.serve_config().lossless.allows(uid) {
            return Err(reject(
                fd,
                msg::REJECT_POLICY,
                format!(
                    "this publisher grants lossless to named uids only, not to uid {uid}; connect without lossless"
                ),
            ));
        }
        let refused = match sh.state().strikes.lock() {
            Ok(s) => s.refused(uid, Instant::now()),
            Err(p) => p.into_inner().refused(uid, Instant::now()),
        };
        if let Some(r) = refused {
            // Relaxed: own counter (this thread).
            sh.state().lossless_backoffs.fetch_add(1, Ordering::Relaxed);
            return Err(reject(fd, msg::REJECT_LOSSLESS_BACKOFF, backoff::reason(uid, r)));
        }
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
