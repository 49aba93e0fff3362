//! [`PacketPublisher`]: a [`PacketWriter`] served over the same socket
//! handshake as the frame ring (memfd by `SCM_RIGHTS`, the connection as the
//! lease, `ProducerGone` on close or crash), with futex wakeups and lossless
//! readers.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::writer::{Placement, RingMem};
use super::{PacketMeta, PacketRingConfig, PacketRingInfo, PacketWriter};
use crate::error::{Error, Result};
use crate::layout::{
    self, DoorbellLine, ProducerLine, SubEntry, SubsHeader, BACKEND_HOST, DEFAULT_MAX_SUBSCRIBERS,
    MAX_SUBSCRIBERS_LIMIT, PRODUCER_CLOSED, SUBF_LOSSLESS, SUB_ACTIVE,
};
use crate::lifecycle::{ExitPhase, ExitWorker};
use crate::publisher::lossless::{Holder, LosslessGate};
use crate::shm::{Region, SEALS_FIXED_SIZE};
use crate::socket::msg::{self, Hello, Welcome};
use crate::socket::service::{self, Served, ServiceState};
use crate::socket::transport::{AccessPolicy, Listener};

/// How a [`PacketPublisher`] serves its ring.
#[derive(Debug, Clone)]
pub struct PacketPublisherConfig {
    /// Sizes and codec of the ring.
    pub ring: PacketRingConfig,
    /// Subscriber table entries.
    pub max_subscribers: u32,
    /// Whether subscribers may ask for lossless delivery (default yes).
    pub allow_lossless: bool,
    /// How long [`PacketPublisher::write`] waits for a lossless reader
    /// before it returns [`Error::LosslessBlocked`].
    pub write_timeout: Duration,
    /// A lossless reader that keeps the writer waiting this long is evicted.
    pub lossless_lease: Duration,
    /// File mode of the socket (default `0o660`).
    pub socket_mode: u32,
    /// uid/gid allow-list checked with `SO_PEERCRED`.
    pub access: AccessPolicy,
    /// How long a connecting subscriber has to send its Hello.
    pub handshake_timeout: Duration,
}

impl PacketPublisherConfig {
    /// Serves a ring of `ring`'s sizes; 64 subscribers, lossless allowed,
    /// 1 s write timeout, 2 s lease.
    pub fn new(ring: PacketRingConfig) -> Self {
        PacketPublisherConfig {
            ring,
            max_subscribers: DEFAULT_MAX_SUBSCRIBERS,
            allow_lossless: true,
            write_timeout: Duration::from_secs(1),
            lossless_lease: Duration::from_secs(2),
            socket_mode: 0o660,
            access: AccessPolicy::default(),
            handshake_timeout: Duration::from_secs(2),
        }
    }
    /// Sets the subscriber table size.
    pub fn max_subscribers(mut self, n: u32) -> Self {
        self.max_subscribers = n;
        self
    }
    /// Allows or refuses lossless subscribers.
    pub fn allow_lossless(mut self, yes: bool) -> Self {
        self.allow_lossless = yes;
        self
    }
    /// Sets how long a write waits for a lossless reader.
    pub fn write_timeout(mut self, d: Duration) -> Self {
        self.write_timeout = d;
        self
    }
    /// Sets the lossless lease.
    pub fn lossless_lease(mut self, d: Duration) -> Self {
        self.lossless_lease = d;
        self
    }
    /// Sets the socket's file mode.
    pub fn socket_mode(mut self, mode: u32) -> Self {
        self.socket_mode = mode;
        self
    }
    /// Sets the uid/gid allow-list.
    pub fn access(mut self, a: AccessPolicy) -> Self {
        self.access = a;
        self
    }
}

/// A packet publisher's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketPublisherStats {
    /// Packets written.
    pub published: u64,
    /// Subscribers connected now.
    pub subscribers: u32,
    /// Subscribers that connected so far.
    pub connects: u64,
    /// Subscribers whose connection closed so far.
    pub disconnects: u64,
    /// Lossless subscribers evicted so far.
    pub evictions: u64,
    /// Writes that had to wait for a lossless subscriber.
    pub lossless_waits: u64,
}

/// What the writer and the socket service share.
struct PacketShared {
    mem: Arc<RingMem>,
    info: PacketRingInfo,
    subs: Region,
    subs_fd: OwnedFd,
    cfg: PacketPublisherConfig,
    state: ServiceState,
}

impl PacketShared {
    fn entries(&self) -> &[SubEntry] {
        self.subs
            .slice::<SubEntry>(std::mem::size_of::<SubsHeader>(), self.cfg.max_subscribers as usize)
    }
}

impl Served for PacketShared {
    fn producer(&self) -> &ProducerLine {
        &self.mem.header().producer
    }
    fn doorbell(&self) -> &DoorbellLine {
        &self.mem.header().doorbell
    }
    fn entries(&self) -> &[SubEntry] {
        PacketShared::entries(self)
    }
    fn access(&self) -> &AccessPolicy {
        &self.cfg.access
    }
    fn handshake_timeout(&self) -> Duration {
        self.cfg.handshake_timeout
    }
    fn state(&self) -> &ServiceState {
        &self.state
    }

    fn refuse(&self, hello: &Hello) -> Option<(u32, String)> {
        if hello.flags & msg::HELLO_PACKETS == 0 {
            return Some((
                msg::REJECT_KIND,
                "this socket serves a packet ring; connect a PacketSubscriber".into(),
            ));
        }
        if hello.flags & (msg::HELLO_WRITE | msg::HELLO_PUSH | msg::HELLO_SEQUENTIAL) != 0 {
            return Some((
                msg::REJECT_BAD_HELLO,
                "a packet ring offers no write access, push delivery or sequential mode".into(),
            ));
        }
        if hello.flags & msg::HELLO_LOSSLESS != 0 && !self.cfg.allow_lossless {
            return Some((
                msg::REJECT_POLICY,
                "lossless asked of a packet publisher that does not allow it".into(),
            ));
        }
        None
    }

    fn entry_flags(&self, hello: &Hello) -> u32 {
        if hello.flags & msg::HELLO_LOSSLESS != 0 {
            SUBF_LOSSLESS
        } else {
            0
        }
    }

    fn lossless_start(&self) -> u64 {
        let h = self.mem.header();
        // SYNC: packet-keyframe — Acquire pairs with the writer's Release.
        let key = h.tail.keyframe_seq.load(Ordering::Acquire);
        if key > 0 {
            // Done with everything before the newest keyframe: the reader
            // starts there.
            key - 1
        } else {
            // No keyframe yet: done with everything so far; the reader
            // starts at the first keyframe to come.
            // SYNC: packet-write-seq — Acquire pairs with the writer's Release.
            h.seq.write_seq.load(Ordering::Acquire)
        }
    }

    fn welcome(&self, index: u32, generation: u32, hello: &Hello) -> (Welcome, Vec<BorrowedFd<'_>>) {
        let welcome = Welcome {
            index,
            generation,
            epoch: self.info.epoch,
            backend: BACKEND_HOST,
            granted: msg::HELLO_PACKETS | (hello.flags & msg::HELLO_LOSSLESS),
            control_bytes: self.info.region_bytes,
            subs_bytes: self.subs.len() as u64,
            pool_bytes: 0,
            device_uuid: [0; 16],
        };
        (welcome, vec![self.mem.fd.as_fd(), self.subs_fd.as_fd()])
    }
}

/// The first lossless reader that still needs something `p` overwrites.
fn lossless_holder(writer: &PacketWriter, sh: &PacketShared, p: &Placement) -> Option<Holder> {
    sh.entries().iter().enumerate().find_map(|(k, e)| {
        // SYNC: sub-state — Acquire pairs with the service's Release.
        if e.state.load(Ordering::Acquire) != SUB_ACTIVE || e.flags.load(Ordering::Relaxed) & SUBF_LOSSLESS == 0 {
            return None;
        }
        // SYNC: release-cursor — Acquire pairs with the reader's Release
        // after its copy: its reads happen-before our overwrite.
        let acked = e.released_seq.load(Ordering::Acquire);
        writer.would_overwrite(p, acked).then(|| Holder {
            index: k,
            // Relaxed: written by the service before its Release of `state`.
            generation: e.generation.load(Ordering::Relaxed),
            // The lease runs on the packet we are trying to write, not on
            // the reader's cursor, which it could move back and forth.
            key: p.seq,
            held_seq: acked.saturating_add(1),
        })
    })
}

/// The writer of a packet ring, serving subscribers on a Unix socket.
///
/// One publisher process can offer a camera's decoded frames on one socket
/// ([`crate::Publisher`]) and its encoded packets on another.
///
/// # Examples
/// ```no_run
/// use vramring::packet::{PacketMeta, PacketPublisher, PacketPublisherConfig, PacketRingConfig, PACKET_KEY};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cfg = PacketPublisherConfig::new(PacketRingConfig::new(8 << 20, 1024, 1 << 20));
/// let mut p = PacketPublisher::create("/tmp/cam1.packets.sock", cfg)?;
/// p.set_codec_params(b"\0\0\0\x01\x67...sps...\0\0\0\x01\x68...pps")?;
/// let access_unit: &[u8] = b"\0\0\0\x01\x65...";
/// p.write(access_unit, PacketMeta { pts: 0, dts: 0, flags: PACKET_KEY, codec: 0 })?;
/// # Ok(()) }
/// ```
pub struct PacketPublisher {
    writer: PacketWriter,
    shared: Arc<PacketShared>,
    service: Option<ExitWorker>,
    /// The wait for lossless readers.
    gate: LosslessGate,
    path: PathBuf,
    closed: bool,
}

impl std::fmt::Debug for PacketPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketPublisher")
            .field("path", &self.path)
            .field("epoch", &format_args!("{:#018x}", self.shared.info.epoch))
            .field("seq", &self.writer.seq())
            .finish()
    }
}

impl PacketPublisher {
    /// Creates a packet ring and starts serving subscribers at `path`.
    ///
    /// # Errors
    /// [`Error::Config`] for bad sizes, [`Error::AddressInUse`] when a live
    /// publisher owns `path`, [`Error::Io`].
    pub fn create(path: impl AsRef<Path>, cfg: PacketPublisherConfig) -> Result<PacketPublisher> {
        let path = path.as_ref().to_owned();
        if cfg.max_subscribers == 0 || cfg.max_subscribers > MAX_SUBSCRIBERS_LIMIT {
            return Err(Error::Config(format!(
                "max_subscribers {} not in 1..={MAX_SUBSCRIBERS_LIMIT}",
                cfg.max_subscribers
            )));
        }
        // Validate the sizes before binding, so a bad config leaves no socket.
        PacketRingInfo::new(
            cfg.ring.data_bytes,
            cfg.ring.records,
            cfg.ring.max_packet,
            cfg.ring.codec,
            1,
        )?;
        let listener = Listener::bind(&path, cfg.socket_mode)?;
        let writer = PacketWriter::create("vramring-packets", cfg.ring)?;
        let info = *writer.info();
        let (subs, subs_fd) = Region::create("vramring-packet-subs", layout::subs_bytes(cfg.max_subscribers))?;
        subs.at::<SubsHeader>(0).init(cfg.max_subscribers, info.epoch);
        Region::seal(subs_fd.as_fd(), SEALS_FIXED_SIZE)?;
        let shared = Arc::new(PacketShared {
            mem: Arc::clone(writer.mem()),
            info,
            subs,
            subs_fd,
            cfg,
            state: ServiceState::new()?,
        });
        let svc = Arc::clone(&shared);
        let service = ExitWorker::builder(format!("vramring-packets:{}", path.display()), ExitPhase::Service)
            .spawn(move |stop| service::run(svc, listener, stop))?;
        Ok(PacketPublisher {
            writer,
            shared,
            service: Some(service),
            gate: LosslessGate::default(),
            path,
            closed: false,
        })
    }

    /// The ring's layout.
    pub fn info(&self) -> &PacketRingInfo {
        &self.shared.info
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Seq of the newest packet (0: none).
    pub fn seq(&self) -> u64 {
        self.writer.seq()
    }

    /// Copies `data` into the ring as the next packet, commits it and wakes
    /// parked subscribers. Returns its seq (the first is 1).
    ///
    /// When a lossless subscriber still needs what this packet would
    /// overwrite, waits up to [`PacketPublisherConfig::write_timeout`]; a
    /// subscriber that keeps it waiting past the lease is evicted.
    ///
    /// # Errors
    /// [`Error::TooLarge`] for a packet over the ring's max (nothing is
    /// written); [`Error::LosslessBlocked`]; [`Error::Closed`].
    pub fn write(&mut self, data: &[u8], meta: PacketMeta) -> Result<u64> {
        self.write_with(data.len(), meta, |dst| dst.copy_from_slice(data))
    }

    /// As [`PacketPublisher::write`], but `fill` writes the packet's `len`
    /// bytes in place in the ring (zero-copy).
    ///
    /// # Errors
    /// As [`PacketPublisher::write`].
    pub fn write_with(&mut self, len: usize, meta: PacketMeta, fill: impl FnOnce(&mut [u8])) -> Result<u64> {
        // Closed by `close`, or by process exit stopping the service (which
        // marks the ring closed and frees every entry: no more lossless gate).
        // Relaxed: our own store (close) or the service's, seen soon enough.
        if self.closed || self.shared.producer().state.load(Ordering::Relaxed) == PRODUCER_CLOSED {
            return Err(Error::Closed);
        }
        let max = self.shared.info.max_packet as usize;
        if len > max {
            return Err(Error::TooLarge { len, max });
        }
        let placement = self.writer.placement(len);
        self.wait_lossless(&placement)?;
        self.writer.write_inner(len, meta, fill, self.shared.entries())
    }

    fn wait_lossless(&mut self, p: &Placement) -> Result<()> {
        let (sh, writer) = (&*self.shared, &self.writer);
        self.gate.wait(sh, sh.cfg.lossless_lease, sh.cfg.write_timeout, || {
            lossless_holder(writer, sh, p)
        })
    }

    /// Replaces the codec parameters (SPS/PPS/VPS or extradata) atomically.
    /// Returns their new version.
    ///
    /// # Errors
    /// [`Error::TooLarge`] over [`super::PARAMS_BYTES`].
    pub fn set_codec_params(&mut self, params: &[u8]) -> Result<u64> {
        self.writer.set_codec_params(params)
    }

    /// Counters.
    pub fn stats(&self) -> PacketPublisherStats {
        let p = self.shared.producer();
        let r = Ordering::Relaxed;
        PacketPublisherStats {
            published: self.writer.seq(),
            subscribers: self
                .shared
                .entries()
                .iter()
                .filter(|e| e.state.load(r) == SUB_ACTIVE)
                .count() as u32,
            connects: p.connects.load(r),
            disconnects: p.disconnects.load(r),
            evictions: p.evictions.load(r),
            lossless_waits: self.shared.state.lossless_waits.load(r),
        }
    }

    /// Stops serving and tells subscribers the ring is closed (they get
    /// [`Error::ProducerGone`] once they have read what is left). Idempotent;
    /// also done on drop.
    pub fn close(&mut self) {
        if self.closed {
            return;
        }
        self.writer.close();
        if let Some(worker) = self.service.take() {
            let outcome = worker.stop();
            tracing::debug!(?outcome, "packet socket service stopped");
        }
        self.closed = true;
    }
}

impl Drop for PacketPublisher {
    fn drop(&mut self) {
        self.close();
    }
}
