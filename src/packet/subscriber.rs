//! [`PacketSubscriber`]: connects to a [`super::PacketPublisher`], maps its
//! ring read-only, and reads packets with futex wakeups; optionally
//! lossless.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::layout::PacketHeader;
use super::{Packet, PacketBorrow, PacketReader, PacketReaderStats, PacketRingInfo};
use crate::error::{Error, Result};
use crate::ring::attach::map_packet_table;
use crate::ring::cadence::{wait_by, Cadence};
use crate::ring::lease::{self, Lease};
use crate::ring::{Bell, WaitOutcome};
use crate::ring::{ClientConfig, ClientOptions};

use crate::socket::msg::{self, Hello};

/// How often the non-blocking reads look at the publisher's socket when
/// there is nothing to read (blocking reads check it between park slices).
const LIVENESS_CHECK: Duration = Duration::from_millis(20);

/// How to subscribe to a packet ring.
#[derive(Debug, Clone)]
pub struct PacketSubscriberOptions {
    /// The settings both ring kinds share (builders: [`ClientOptions`]).
    /// Lossless here means the writer never overwrites a packet this
    /// subscriber has not read yet (it waits, then evicts a reader that
    /// stalls past the lease): for recorders.
    pub client: ClientConfig,
}

impl Default for PacketSubscriberOptions {
    fn default() -> Self {
        PacketSubscriberOptions {
            client: ClientConfig::named("packets"),
        }
    }
}

impl PacketSubscriberOptions {
    /// The defaults: not lossless, cadence-aware wait (50 µs spin before
    /// parking when there is no steady cadence), 20 ms park slices.
    pub fn new() -> Self {
        Self::default()
    }
}

impl ClientOptions for PacketSubscriberOptions {
    fn client_mut(&mut self) -> &mut ClientConfig {
        &mut self.client
    }
}

/// A subscriber of a packet ring.
///
/// It joins at the most recent keyframe (or waits for the first one); a
/// reader that falls a whole ring behind gets [`Error::PacketOverrun`] and
/// resumes at the next keyframe. Packets already committed when the
/// publisher closes or dies are still delivered; [`Error::ProducerGone`]
/// comes once none are left.
///
/// # Examples
/// ```no_run
/// use std::time::Duration;
/// use vramring::packet::{PacketSubscriber, PacketSubscriberOptions};
/// use vramring::ClientOptions;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut sub = PacketSubscriber::connect("/tmp/cam1.packets.sock", PacketSubscriberOptions::new().lossless(true))?;
/// let mut params = Vec::new();
/// sub.codec_params(&mut params)?;
/// let mut buf = Vec::new();
/// let p = sub.next_copy(&mut buf, Duration::from_secs(1))?;
/// println!("packet {} of {} bytes, key {}", p.seq, p.len, p.is_key());
/// # Ok(()) }
/// ```
pub struct PacketSubscriber {
    reader: PacketReader,
    lease: Lease,
    opts: PacketSubscriberOptions,
    path: PathBuf,
    /// When the non-blocking calls last looked at the socket
    /// (`CLOCK_MONOTONIC_COARSE` ns: cheap enough for a busy-poll loop).
    last_check_ns: u64,
    /// The writer's cadence, for [`WaitStrategy::Cadence`](crate::WaitStrategy::Cadence).
    cadence: Cadence,
}

impl std::fmt::Debug for PacketSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketSubscriber")
            .field("path", &self.path)
            .field("index", &self.lease.index())
            .field("epoch", &format_args!("{:#018x}", self.reader.info().epoch))
            .finish()
    }
}

impl PacketSubscriber {
    /// Connects to the packet publisher at `path` and maps its ring.
    ///
    /// # Errors
    /// [`Error::Io`] when nothing listens; [`Error::Refused`] (e.g. a frame
    /// ring's socket: code [`msg::REJECT_KIND`]) or [`Error::VersionMismatch`];
    /// [`Error::Timeout`]; [`Error::LayoutMismatch`] / [`Error::BadMessage`]
    /// for a malformed answer.
    pub fn connect(path: impl AsRef<Path>, opts: PacketSubscriberOptions) -> Result<PacketSubscriber> {
        let path = path.as_ref().to_owned();
        let mut flags = msg::HELLO_PACKETS;
        if opts.client.lossless {
            flags |= msg::HELLO_LOSSLESS;
        }
        let hello = Hello {
            flags,
            backends: 1 << crate::layout::BACKEND_HOST,
            name: opts.client.name.clone(),
            device_uuid: [0; 16],
        };
        let (sock, welcome, fds) = lease::request(&path, hello, opts.client.connect_timeout)?;
        let mut fds = fds.into_iter();
        let (Some(ring_fd), Some(subs_fd), Some(client_fd), None) = (fds.next(), fds.next(), fds.next(), fds.next())
        else {
            return Err(Error::BadMessage(
                "a packet Welcome must carry exactly 3 descriptors".into(),
            ));
        };
        if welcome.granted & msg::HELLO_PACKETS == 0 {
            return Err(Error::BadMessage("the Welcome does not grant a packet ring".into()));
        }
        if opts.client.lossless && welcome.granted & msg::HELLO_LOSSLESS == 0 {
            return Err(Error::Refused {
                code: msg::REJECT_POLICY,
                reason: "lossless not granted".into(),
            });
        }
        let (subs, client, max) = map_packet_table(&welcome, &subs_fd, &client_fd)?;
        // `PacketReader::open_for` re-validates the ring's own header; the
        // entry must be ours before it reads the cursor the service set.
        let lease = Lease::new(sock, subs, client, &welcome, max, welcome.epoch)?;
        let reader = PacketReader::open_for(ring_fd.as_fd(), lease.client_ref(), opts.client.lossless)?;
        let info = *reader.info();
        if info.epoch != welcome.epoch || info.region_bytes != welcome.control_bytes {
            return Err(Error::LayoutMismatch(
                "Welcome disagrees with the packet ring's header".into(),
            ));
        }
        Ok(PacketSubscriber {
            reader,
            lease,
            opts,
            path,
            last_check_ns: crate::time::coarse_monotonic_ns(),
            cadence: Cadence::new(),
        })
    }

    /// The ring's validated layout.
    pub fn info(&self) -> &PacketRingInfo {
        self.reader.info()
    }

    /// Counters.
    pub fn stats(&self) -> PacketReaderStats {
        self.reader.stats()
    }

    /// What the cadence wait ([`WaitStrategy::Cadence`](crate::WaitStrategy::Cadence)) knows of the
    /// writer's cadence (as [`crate::Subscriber::cadence`]).
    pub fn cadence(&self) -> crate::ring::cadence::CadenceState {
        self.cadence.state()
    }

    /// A read-only snapshot of the packet ring this subscriber is attached
    /// to: producer state, positions, codec parameters, the newest records
    /// and the subscriber table (this subscriber's own entry marked
    /// `is_self`). See [`crate::inspect`].
    pub fn ring_status(&self) -> crate::inspect::RingStatus {
        crate::inspect::packet_status(&self.path, &self.reader, self.lease.table(), Some(self.lease.index()))
    }

    /// The publisher instance.
    pub fn epoch(&self) -> u64 {
        self.reader.info().epoch
    }

    fn gone(&self) -> Error {
        Error::ProducerGone { epoch: self.epoch() }
    }

    /// Copies the next packet into `buf` if one is committed; `Ok(None)` when
    /// there is nothing new. Never blocks.
    ///
    /// # Errors
    /// [`Error::PacketOverrun`] (the next call resumes at a keyframe);
    /// [`Error::ProducerGone`] once the publisher is gone and nothing is
    /// left; [`Error::Evicted`]; [`Error::LayoutMismatch`] for a record out
    /// of bounds.
    pub fn try_next_copy(&mut self, buf: &mut Vec<u8>) -> Result<Option<Packet>> {
        self.lease.ensure_or_drain()?;
        if let Some(p) = self.reader.try_next_copy(buf)? {
            self.cadence
                .observe_deferred(p.seq, p.commit_ns, crate::time::monotonic_ns());
            return Ok(Some(p));
        }
        if !self.idle_check()? {
            return Ok(None);
        }
        // The publisher went away after our read: one more look, then the end.
        match self.reader.try_next_copy(buf)? {
            Some(p) => Ok(Some(p)),
            None => Err(self.gone()),
        }
    }

    /// Nothing to read now. While draining that is the end; otherwise, at
    /// most every [`LIVENESS_CHECK`], looks at the socket too (a crashed
    /// publisher leaves our entry active: only its socket's EOF tells).
    /// Returns whether the drain starts (or has started) now.
    ///
    /// # Errors
    /// [`Error::ProducerGone`] when draining is over; the lease's errors.
    fn idle_check(&mut self) -> Result<bool> {
        if self.lease.draining() {
            return Err(self.gone());
        }
        let now = crate::time::coarse_monotonic_ns();
        if now.saturating_sub(self.last_check_ns) < LIVENESS_CHECK.as_nanos() as u64 {
            return Ok(false);
        }
        self.last_check_ns = now;
        if !self.lease.quiet() {
            self.lease.check_or_drain()?;
        }
        Ok(self.lease.draining())
    }

    /// Copies the next packet into `buf`, waiting up to `timeout` (spin,
    /// then park on the futex doorbell; `Duration::MAX` waits for ever).
    ///
    /// # Errors
    /// As [`PacketSubscriber::try_next_copy`], and [`Error::Timeout`].
    pub fn next_copy(&mut self, buf: &mut Vec<u8>, timeout: Duration) -> Result<Packet> {
        let deadline = crate::time::deadline_after(Instant::now(), timeout);
        loop {
            if let Some(p) = self.try_next_copy(buf)? {
                return Ok(p);
            }
            // `wait` returns at once while `write_seq` is past a record that
            // is not committed (only a misbehaving writer does that): the
            // deadline is checked here too.
            if Instant::now() >= deadline {
                return Err(Error::Timeout(timeout, "the next packet"));
            }
            self.wait(deadline, timeout)?;
        }
    }

    /// Borrows the next packet in place if one is committed. Its bytes are
    /// trustworthy only if [`PacketBorrow::release`] says so; a lossless
    /// subscriber's cursor moves at release.
    ///
    /// # Errors
    /// As [`PacketSubscriber::try_next_copy`].
    pub fn try_borrow(&mut self) -> Result<Option<PacketBorrow<'_>>> {
        self.lease.ensure_or_drain()?;
        if !self.reader.has_next()? {
            if !self.idle_check()? {
                return Ok(None);
            }
            if !self.reader.has_next()? {
                return Err(self.gone());
            }
        }
        let b = self.reader.try_borrow()?;
        if let Some(b) = &b {
            self.cadence
                .observe_deferred(b.seq(), b.commit_ns(), crate::time::monotonic_ns());
        }
        Ok(b)
    }

    /// Borrows the next packet in place, waiting up to `timeout`.
    ///
    /// # Errors
    /// As [`PacketSubscriber::next_copy`].
    pub fn borrow(&mut self, timeout: Duration) -> Result<PacketBorrow<'_>> {
        let deadline = crate::time::deadline_after(Instant::now(), timeout);
        loop {
            self.lease.ensure_or_drain()?;
            if self.reader.has_next()? {
                break;
            }
            if self.lease.draining() {
                return Err(self.gone());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout(timeout, "the next packet"));
            }
            self.wait(deadline, timeout)?;
        }
        // `has_next` found the packet committed; only a writer that moved a
        // record's seq backwards makes it vanish now.
        let b = self
            .reader
            .try_borrow()?
            .ok_or_else(|| Error::LayoutMismatch("packet ring: a committed record went back to an older seq".into()))?;
        self.cadence
            .observe_deferred(b.seq(), b.commit_ns(), crate::time::monotonic_ns());
        Ok(b)
    }

    /// Version of the current codec parameters (0: never set).
    pub fn codec_params_version(&self) -> u64 {
        self.reader.codec_params_version()
    }

    /// Copies the codec parameters into `out`; returns their version.
    ///
    /// # Errors
    /// As [`PacketReader::codec_params`].
    pub fn codec_params(&self, out: &mut Vec<u8>) -> Result<u64> {
        self.reader.codec_params(out)
    }

    fn wait(&mut self, deadline: Instant, timeout: Duration) -> Result<()> {
        if self.lease.draining() {
            return Err(self.gone());
        }
        let outcome = {
            let h: &PacketHeader = self.reader.header_for_wait();
            let bell = Bell {
                seq: &h.seq.write_seq,
                producer: &h.producer,
                pending: None,
                push: None,
                loaned: None,
            };
            let lease = &self.lease;
            let after = self.reader.done_through();
            let alive = || lease.quiet();
            wait_by(
                &self.opts.client,
                &mut self.cadence,
                bell,
                lease.client(),
                after,
                deadline,
                alive,
            )
        };
        match outcome {
            WaitOutcome::Advanced(_) => Ok(()),
            // Closed in order: drain what is left, then report it.
            WaitOutcome::ProducerClosed => {
                self.lease.on_producer_closed()?;
                Ok(())
            }
            WaitOutcome::TimedOut => {
                self.lease.check_or_drain()?;
                if self.lease.draining() {
                    return Ok(());
                }
                Err(Error::Timeout(timeout, "the next packet"))
            }
            WaitOutcome::Stopped => self.lease.check_or_drain(),
        }
    }

    /// Says goodbye to the publisher. Also done on drop.
    pub fn close(&mut self) {
        self.lease.bye();
    }
}

impl Drop for PacketSubscriber {
    fn drop(&mut self) {
        self.close();
    }
}
