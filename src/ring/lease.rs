//! The subscriber's half of the handshake and of the lease, shared by the
//! frame-ring [`crate::Subscriber`] and the packet-ring
//! [`crate::packet::PacketSubscriber`].
//!
//! The lease holds while our entry in the publisher's (read-only) table is
//! `ACTIVE` with our Welcome's generation; it is checked on every read,
//! before anything is delivered. What we write goes to our own client
//! region, which no other subscriber holds.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::layout::{ClientLine, SubEntry, SubsHeader, SUB_ACTIVE};
use crate::shm::Region;
use crate::socket::msg::{self, Hello, Msg, Welcome};
use crate::socket::transport;
use crate::socket::PeerFd;
use crate::sync::atomic::Ordering;

/// Connects to `path`, sends `hello`, and waits up to `timeout` for the
/// Welcome. Returns the connection, the Welcome and its descriptors.
///
/// # Errors
/// [`Error::Io`] when nothing listens; [`Error::Refused`] or
/// [`Error::VersionMismatch`] when the publisher says no; [`Error::Timeout`];
/// [`Error::BadMessage`] for anything but a Welcome or a Reject.
pub(crate) fn request(path: &Path, hello: Hello, timeout: Duration) -> Result<(OwnedFd, Welcome, Vec<OwnedFd>)> {
    let sock = transport::connect_within(path, timeout)?;
    transport::send(sock.as_fd(), &Msg::Hello(hello).encode(), &[])?;
    let got = transport::recv(sock.as_fd(), timeout)?.ok_or(Error::Timeout(timeout, "the publisher's Welcome"))?;
    let welcome = match Msg::decode(&got.bytes) {
        Ok(Msg::Welcome(w)) => w,
        Ok(Msg::Reject(n)) => {
            let h = Msg::header(&got.bytes)?;
            if n.code == msg::REJECT_VERSION || h.version != msg::PROTOCOL_VERSION {
                return Err(Error::VersionMismatch {
                    peer_role: "publisher",
                    peer: h.version,
                    ours: msg::PROTOCOL_VERSION,
                });
            }
            return Err(Error::Refused {
                code: n.code,
                reason: n.reason,
            });
        }
        Ok(other) => {
            return Err(Error::BadMessage(format!(
                "expected Welcome, got kind {}",
                other.kind()
            )))
        }
        Err(Error::VersionMismatch { peer, ours, .. }) => {
            return Err(Error::VersionMismatch {
                peer_role: "publisher",
                peer,
                ours,
            })
        }
        Err(e) => return Err(e),
    };
    // The publisher's regions: the subscriber trusts its publisher with
    // them (docs/SECURITY.md) and keeps them.
    Ok((sock, welcome, got.fds.into_iter().map(PeerFd::into_owned).collect()))
}

/// A subscriber's lease: its connection and its entry in the publisher's
/// subscriber table. The lease ends when the publisher closes or dies
/// ([`Error::ProducerGone`]) or evicts us ([`Error::Evicted`]); from then on
/// every call returns that error again.
pub(crate) struct Lease {
    sock: OwnedFd,
    subs: Arc<Region>,
    client: Arc<Region>,
    index: usize,
    generation: u32,
    max_subscribers: u32,
    epoch: u64,
    gone: Option<Error>,
    /// The publisher is gone: what is still committed in the ring is read
    /// before `ProducerGone` is reported.
    draining: bool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("index", &self.index)
            .field("generation", &self.generation)
            .field("gone", &self.gone)
            .finish()
    }
}

impl Lease {
    /// Takes up the entry a Welcome assigned, in a subscriber table mapped
    /// read-only (already validated against the ring: `max_subscribers`
    /// entries, `epoch`), with our client region.
    ///
    /// # Errors
    /// [`Error::ProducerGone`] when the publisher closed since its Welcome
    /// (the entry is free again and the socket says Bye or EOF);
    /// [`Error::LayoutMismatch`] when the index is out of range or the entry
    /// is not active with the Welcome's generation.
    pub(crate) fn new(
        sock: OwnedFd,
        subs: Region,
        client: Region,
        welcome: &Welcome,
        max_subscribers: u32,
        epoch: u64,
    ) -> Result<Lease> {
        let index = super::table::check_index(welcome.index, max_subscribers)?;
        let lease = Lease {
            sock,
            subs: Arc::new(subs),
            client: Arc::new(client),
            index,
            generation: welcome.generation,
            max_subscribers,
            epoch,
            gone: None,
            draining: false,
        };
        if !lease.still_ours() {
            // A publisher that closed between its Welcome and now freed the
            // entry and said Bye (or hung up): that is a publisher gone, not
            // a bad layout.
            if transport::readable(lease.sock.as_fd(), Duration::ZERO).unwrap_or(true) {
                return Err(Error::ProducerGone { epoch });
            }
            return Err(Error::LayoutMismatch("our subscriber entry is not active".into()));
        }
        Ok(lease)
    }

    /// The connection.
    pub(crate) fn sock(&self) -> &OwnedFd {
        &self.sock
    }

    /// Our table index.
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// Our entry in the subscriber table (read-only).
    pub(crate) fn entry(&self) -> &SubEntry {
        &self
            .subs
            .slice::<SubEntry>(std::mem::size_of::<SubsHeader>(), self.max_subscribers as usize)[self.index]
    }

    /// Our client region.
    pub(crate) fn client(&self) -> &ClientLine {
        self.client.at::<ClientLine>(0)
    }

    /// A handle on our client region that keeps it mapped.
    pub(crate) fn client_ref(&self) -> ClientRef {
        ClientRef(Arc::clone(&self.client))
    }

    /// The whole subscriber table (for inspection; read only).
    pub(crate) fn table(&self) -> &[SubEntry] {
        self.subs
            .slice::<SubEntry>(std::mem::size_of::<SubsHeader>(), self.max_subscribers as usize)
    }

    /// Whether the entry is still active and ours (two loads).
    pub(crate) fn still_ours(&self) -> bool {
        let e = self.entry();
        // SYNC: sub-state — Acquire pairs with the publisher's Release (the
        // service's at connect, the producer's at eviction); the cursor the
        // service set is then visible.
        e.state.load(Ordering::Acquire) == SUB_ACTIVE && e.generation.load(Ordering::Relaxed) == self.generation
    }

    /// Records the end of the lease and returns the error.
    pub(crate) fn end(&mut self, e: Error) -> Error {
        self.gone = Some(clone_gone(&e));
        e
    }

    /// The cheap per-call check: two loads while all is well; otherwise
    /// [`Lease::check`].
    ///
    /// # Errors
    /// The lease's terminal error.
    pub(crate) fn ensure(&mut self) -> Result<()> {
        if let Some(e) = &self.gone {
            return Err(clone_gone(e));
        }
        if !self.still_ours() {
            return self.check();
        }
        Ok(())
    }

    /// For a waiter between park slices: `false` when it should stop
    /// waiting and call [`Lease::check`] (entry lost, or the socket has
    /// something to say: a Bye, an Evicted notice, EOF).
    pub(crate) fn quiet(&self) -> bool {
        self.still_ours() && !transport::readable(self.sock.as_fd(), Duration::ZERO).unwrap_or(true)
    }

    /// Checks the lease: the publisher's socket, an Evicted notice, our
    /// entry.
    ///
    /// # Errors
    /// [`Error::ProducerGone`] on Bye or EOF, [`Error::Evicted`] when our
    /// entry was taken back; the same error on every later call.
    pub(crate) fn check(&mut self) -> Result<()> {
        if let Some(e) = &self.gone {
            return Err(clone_gone(e));
        }
        let evicted = !self.still_ours();
        let mut err = None;
        if transport::readable(self.sock.as_fd(), Duration::ZERO)? {
            match transport::recv(self.sock.as_fd(), Duration::ZERO) {
                Ok(Some(m)) => match Msg::decode(&m.bytes) {
                    Ok(Msg::Evicted(n)) => err = Some(Error::Evicted { reason: n.reason }),
                    Ok(Msg::Bye) => err = Some(Error::ProducerGone { epoch: self.epoch }),
                    _ => {}
                },
                Ok(None) => {}
                Err(_) => err = Some(Error::ProducerGone { epoch: self.epoch }),
            }
        }
        if err.is_none() && evicted {
            // The publisher's notice (with its reason) follows the entry's
            // release at once (the producer wakes the service); wait a little for it.
            let notice = match transport::recv(self.sock.as_fd(), Duration::from_millis(100)) {
                Ok(Some(m)) => match Msg::decode(&m.bytes) {
                    Ok(Msg::Evicted(n)) => Some(n.reason),
                    _ => None,
                },
                _ => None,
            };
            err = Some(Error::Evicted {
                reason: notice.unwrap_or_else(|| {
                    // Relaxed: the Acquire load of `state` in `still_ours`
                    // ordered the code written before it.
                    let code = self.entry().evict_code.load(Ordering::Relaxed);
                    crate::ring::serve::evict_reason(code).into()
                }),
            });
        }
        match err {
            Some(e) => Err(self.end(e)),
            None => Ok(()),
        }
    }

    /// The wait saw `PRODUCER_CLOSED`: start the drain, unless the lease
    /// had already ended by an eviction (PROTOCOL.md §15.1: the producer
    /// state counts only while our entry is ours; the socket says which).
    ///
    /// # Errors
    /// [`Error::Evicted`], [`Error::Io`].
    pub(crate) fn on_producer_closed(&mut self) -> Result<()> {
        let checked = if self.quiet() { Ok(()) } else { self.check() };
        match checked {
            Ok(()) | Err(Error::ProducerGone { .. }) => {
                self.draining = true;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Whether the publisher is gone and the reader is draining the ring.
    pub(crate) fn draining(&self) -> bool {
        self.draining
    }

    /// [`Lease::ensure`] for a reader that drains: a publisher that is gone
    /// starts the drain instead of failing; an eviction fails at once.
    ///
    /// # Errors
    /// [`Error::Evicted`], [`Error::Io`].
    pub(crate) fn ensure_or_drain(&mut self) -> Result<()> {
        if self.draining {
            return Ok(());
        }
        let checked = self.ensure();
        self.drain_if_gone(checked)
    }

    /// [`Lease::check`] (the socket too) for a reader that drains.
    ///
    /// # Errors
    /// As [`Lease::ensure_or_drain`].
    pub(crate) fn check_or_drain(&mut self) -> Result<()> {
        if self.draining {
            return Ok(());
        }
        let checked = self.check();
        self.drain_if_gone(checked)
    }

    fn drain_if_gone(&mut self, checked: Result<()>) -> Result<()> {
        match checked {
            Err(Error::ProducerGone { .. }) => {
                self.draining = true;
                Ok(())
            }
            other => other,
        }
    }

    /// Says goodbye (best effort).
    pub(crate) fn bye(&self) {
        let _ = transport::send(self.sock.as_fd(), &Msg::Bye.encode(), &[]);
    }
}

/// An owned handle on a subscriber's own client region.
#[derive(Debug, Clone)]
pub(crate) struct ClientRef(Arc<Region>);

impl ClientRef {
    /// A handle on a region of the caller's, for tests of a reader alone.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn for_tests(region: Region) -> ClientRef {
        ClientRef(Arc::new(region))
    }

    /// The client line.
    pub(crate) fn get(&self) -> &ClientLine {
        self.0.at(0)
    }
}

/// A copy of a terminal error (the lease ended), to return it again on
/// every later call.
pub(crate) fn clone_gone(e: &Error) -> Error {
    match e {
        Error::Evicted { reason } => Error::Evicted { reason: reason.clone() },
        Error::ProducerGone { epoch } => Error::ProducerGone { epoch: *epoch },
        _ => Error::ProducerGone { epoch: 0 },
    }
}
