//! [`PacketPublisher`]: a [`PacketWriter`] served over the same socket
//! handshake as the frame ring (memfd by `SCM_RIGHTS`, the connection as the
//! lease, `ProducerGone` on close or crash), with futex wakeups and lossless
//! readers.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::writer::{Placement, RingMem};
use super::{PacketMeta, PacketRingConfig, PacketRingInfo, PacketWriter};
use crate::error::{Error, Result};
use crate::layout::{ProducerLine, BACKEND_HOST, PRODUCER_CLOSED, SUBF_LOSSLESS};
use crate::lifecycle::{ExitPhase, ExitWorker};
use crate::ring::lossless::{Holder, LosslessGate};
use crate::ring::serve::{self, Served, ServiceState};
use crate::ring::table::{Assigned, Table};
use crate::ring::{PublisherStats, ServeConfig, ServeOptions};
use crate::socket::msg::{self, Hello, Welcome};
use crate::socket::transport::Listener;
use crate::sync::atomic::Ordering;

/// How a [`PacketPublisher`] serves its ring.
#[derive(Debug, Clone)]
pub struct PacketPublisherConfig {
    /// Sizes and codec of the ring.
    pub ring: PacketRingConfig,
    /// Whether subscribers may ask for lossless delivery (default yes).
    pub allow_lossless: bool,
    /// How long [`PacketPublisher::write`] waits for a lossless reader
    /// before it returns [`Error::LosslessBlocked`]. Longer than the lease
    /// by default, so a stalled reader is evicted and the write goes on.
    pub write_timeout: Duration,
    /// The serving settings shared with the frame ring.
    pub serve: ServeConfig,
}

impl ServeOptions for PacketPublisherConfig {
    fn serve_mut(&mut self) -> &mut ServeConfig {
        &mut self.serve
    }
}

impl PacketPublisherConfig {
    /// Serves a ring of `ring`'s sizes; 64 subscribers, lossless allowed,
    /// 2 s write timeout, 1 s lease.
    pub fn new(ring: PacketRingConfig) -> Self {
        PacketPublisherConfig {
            ring,
            allow_lossless: true,
            write_timeout: Duration::from_secs(2),
            serve: ServeConfig::default(),
        }
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
}

/// Whether keyframe `key`'s record and bytes are still in the ring (the
/// publisher's own memory: the writer's record and tail). A write racing
/// with this look is covered by the table's re-check at assignment.
fn keyframe_intact(mem: &RingMem, info: &PacketRingInfo, key: u64) -> bool {
    let h = mem.header();
    let rec: &super::layout::PacketRecord = mem.region.at(info.record_at(key));
    // SYNC: packet-record — Acquire pairs with the writer's Release commit.
    let seq = rec.seq.load(Ordering::Acquire);
    // Relaxed: the writer's own words, read after the Acquire above; a
    // value moved since only makes the reader start later (at write_seq).
    seq == key && rec.offset.load(Ordering::Relaxed) >= h.tail.tail.load(Ordering::Relaxed)
}

/// What the writer and the socket service share.
struct PacketShared {
    mem: Arc<RingMem>,
    /// Read-only reopen of the sealed ring memfd, sent in every Welcome.
    ring_fd: std::os::fd::OwnedFd,
    info: PacketRingInfo,
    table: Table,
    cfg: PacketPublisherConfig,
    state: ServiceState,
}

impl Served for PacketShared {
    fn producer(&self) -> &ProducerLine {
        &self.mem.header().producer
    }
    fn table(&self) -> &Table {
        &self.table
    }
    fn serve_config(&self) -> &ServeConfig {
        &self.cfg.serve
    }
    fn state(&self) -> &ServiceState {
        &self.state
    }

    fn refuse(&self, hello: &Hello, _uid: u32) -> Option<(u32, String)> {
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
        if key > 0 && keyframe_intact(&self.mem, &self.info, key) {
            // Done with everything before the newest keyframe: the reader
            // starts there.
            key - 1
        } else {
            // No keyframe yet, or the newest one is already overwritten (a
            // GOP longer than the ring, which nobody can read, so holding the
            // writer for it would only stall the stream until the reader gave
            // up on it): done with everything so far; the reader starts at
            // the next keyframe to come.
            // SYNC: packet-write-seq — Acquire pairs with the writer's Release.
            h.seq.write_seq.load(Ordering::Acquire)
        }
    }

    fn welcome(&self, a: &Assigned, hello: &Hello) -> (Welcome, BorrowedFd<'_>, Option<BorrowedFd<'_>>) {
        let welcome = Welcome {
            index: a.index,
            generation: a.generation,
            epoch: self.info.epoch,
            backend: BACKEND_HOST,
            granted: msg::HELLO_PACKETS | (hello.flags & msg::HELLO_LOSSLESS),
            control_bytes: self.info.region_bytes,
            subs_bytes: 0,
            pool_bytes: 0,
            device_uuid: [0; 16],
            client_bytes: 0,
        };
        (welcome, self.ring_fd.as_fd(), None)
    }
}

/// The first lossless reader that still needs something `p` overwrites.
fn lossless_holder(writer: &PacketWriter, sh: &PacketShared, p: &Placement) -> Option<Holder> {
    sh.table
        .holder(writer.seq(), |acked| writer.would_overwrite(p, acked))
        .map(|blocker| Holder {
            blocker,
            // The lease runs on the packet we are trying to write, not on
            // the reader's cursor, which it could move back and forth.
            key: p.seq,
            held_seq: blocker.released.saturating_add(1),
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
        cfg.serve.validate()?;
        // Validate the sizes before binding, so a bad config leaves no socket.
        PacketRingInfo::new(
            cfg.ring.data_bytes,
            cfg.ring.records,
            cfg.ring.max_packet,
            cfg.ring.codec,
            1,
        )?;
        let listener = Listener::bind(&path, cfg.serve.socket_mode)?;
        let writer = PacketWriter::create("vramring-packets", cfg.ring)?;
        let info = *writer.info();
        let table = Table::create("vramring-packet-subs", cfg.serve.max_subscribers, info.epoch)?;
        let ring_fd = crate::shm::Region::reopen_read_only(writer.mem().fd.as_fd())?;
        let state = ServiceState::new(&cfg.serve)?;
        let shared = Arc::new(PacketShared {
            mem: Arc::clone(writer.mem()),
            ring_fd,
            info,
            table,
            cfg,
            state,
        });
        let svc = Arc::clone(&shared);
        let service = ExitWorker::builder(format!("vramring-packets:{}", path.display()), ExitPhase::Service)
            .spawn(move |stop| serve::run(svc, listener, stop))?;
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
        let table = &self.shared.table;
        self.writer.write_inner(len, meta, fill, || table.wake_parked())
    }

    fn wait_lossless(&mut self, p: &Placement) -> Result<()> {
        let (sh, writer) = (&*self.shared, &self.writer);
        self.gate.wait(sh, sh.cfg.write_timeout, writer.seq(), || {
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
    pub fn stats(&self) -> PublisherStats {
        serve::stats(&*self.shared, self.writer.seq())
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
