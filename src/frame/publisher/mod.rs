//! The publisher: creates the ring, serves subscribers on a socket, loans
//! slots and commits frames.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::protocol::{self, CommitMeta};
use crate::error::{Error, Result};
use crate::format::{Format, Geometry};
use crate::layout::{
    self, ProducerLine, RingHeader, RingInfo, SlotDesc, EVICT_PUSH, MAX_SLOTS, MIN_SLOTS, POLICY_LOSSLESS,
    POLICY_OVERWRITE, PRODUCER_CLOSED, PRODUCER_LIVE, SUBF_LOSSLESS, SUBF_PUSH, SUBF_SEQUENTIAL, SUBF_WRITE,
    USER_META_BYTES, USER_META_WORDS,
};
use crate::lifecycle::{ExitPhase, ExitWorker};
use crate::memory::cuda::CommitGraph;
use crate::memory::view::{DeviceViewMut, Stream};
use crate::memory::{BackendKind, ExportedPool, MappedTarget, TargetMapper, WriteCompletion};
use crate::ring::lossless::{Holder, LosslessGate};
use crate::ring::serve::{self, Served, ServiceState};
use crate::ring::table::{Assigned, Table};
use crate::ring::{PublisherStats, ServeConfig, ServeOptions};
use crate::shm::{Region, SEALS_READ_ONLY};
use crate::socket::msg::{self, Attach, Hello, Welcome};
use crate::socket::transport::Listener;
use crate::socket::PeerFd;
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::time::{monotonic_ns, realtime_ns};

mod config;
mod service;
mod slot;

pub use config::{BackendChoice, CommitMode, FrameMeta, Policy, PullAccess, RingConfig};
use service::{local_publishers, take_ready, Buffers, PushTarget};
pub(crate) use service::{published_here, Shared};
use slot::wait_landed;
pub use slot::SlotMut;

/// The producer side of a ring.
///
/// # Examples
/// ```no_run
/// use std::time::Duration;
/// use vramring::{Format, FrameMeta, Publisher, RingConfig};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut p = Publisher::create("/tmp/cam.sock", RingConfig::new(Format::Gray8, 640, 480))?;
/// let mut slot = p.loan(Duration::from_millis(50))?;
/// slot.plane_mut(0)?.fill(0x80);
/// slot.publish(FrameMeta::pts(0))?;
/// # Ok(()) }
/// ```
pub struct Publisher {
    shared: Arc<Shared>,
    pool: Box<dyn ExportedPool>,
    service: Option<ExitWorker>,
    next_seq: u64,
    /// The wait for lossless readers.
    gate: LosslessGate,
    targets: Vec<PushTarget>,
    /// Whether CUDA frames are committed in stream order.
    stream_commit: bool,
    /// The stream of the newest stream-order commit (as an integer).
    last_stream: Option<usize>,
    /// A publish failed after it may have enqueued push copies that no
    /// commit accounts for: the next unmapping synchronises the context
    /// instead of trusting `global_seq`.
    unsettled: bool,
    path: PathBuf,
    closed: bool,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("path", &self.path)
            .field("epoch", &format_args!("{:#018x}", self.shared.info.epoch))
            .field("backend", &self.pool.kind())
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

pub(crate) fn create_pool(
    choice: BackendChoice,
    bytes: u64,
    peers_may_write: bool,
    graph: CommitGraph,
) -> Result<Box<dyn ExportedPool>> {
    let host = || -> Result<Box<dyn ExportedPool>> {
        Ok(Box::new(crate::memory::host::HostPool::create_with(
            bytes,
            peers_may_write,
        )?))
    };
    match choice {
        BackendChoice::Host => host(),
        BackendChoice::Cuda(ordinal) => crate::memory::cuda::create_pool(ordinal, bytes, graph),
        BackendChoice::Auto => {
            if crate::memory::cuda::cuda_usable() {
                crate::memory::cuda::create_pool(0, bytes, graph)
            } else {
                host()
            }
        }
    }
}

impl Publisher {
    /// Creates a ring and starts serving subscribers at `path`.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad configuration, [`Error::AddressInUse`]
    /// when a live publisher owns `path`, backend errors (e.g.
    /// [`Error::OutOfDeviceMemory`]), [`Error::Io`].
    pub fn create(path: impl AsRef<Path>, cfg: RingConfig) -> Result<Publisher> {
        Self::create_ticking(path.as_ref(), cfg, crate::ring::serve::IDLE_TICK)
    }

    /// [`Publisher::create`] with the socket service's idle poll at
    /// `idle_tick` (`seam::publisher_with_idle_tick`).
    pub(crate) fn create_ticking(path: &Path, cfg: RingConfig, idle_tick: Duration) -> Result<Publisher> {
        let path = path.to_owned();
        let geometry = cfg.validate()?;
        // Bind first: a second publisher at a live path fails before it
        // allocates anything.
        let listener = Listener::bind(&path, cfg.serve.socket_mode)?;
        let slots_bytes = geometry
            .slot_stride
            .checked_mul(u64::from(cfg.slots))
            .ok_or_else(|| Error::Config("ring size overflows".into()))?;
        // A CUDA pool ends with the gate line (ADR 0011); the allocation's
        // rounding to its granularity usually absorbs it.
        let gate_bytes = if matches!(cfg.backend, BackendChoice::Host) {
            0
        } else {
            layout::GATE_BYTES
        };
        let pool_bytes = slots_bytes
            .checked_add(gate_bytes)
            .ok_or_else(|| Error::Config("ring size overflows".into()))?;
        let mut pool = create_pool(cfg.backend, pool_bytes, cfg.allow_write, cfg.commit_graph)?;
        match Self::build(listener, &mut pool, &path, cfg, geometry, idle_tick) {
            Ok((shared, service)) => {
                let mut p = Publisher {
                    shared,
                    pool,
                    service: Some(service),
                    next_seq: 1,
                    gate: LosslessGate::default(),
                    targets: Vec::new(),
                    stream_commit: false,
                    last_stream: None,
                    unsettled: false,
                    path,
                    closed: false,
                };
                p.enable_stream_commit();
                local_publishers(|epochs| epochs.push(p.shared.info.epoch));
                Ok(p)
            }
            Err(e) => {
                if let Err(close_err) = pool.close() {
                    tracing::warn!(error = %close_err, "closing the pool after a failed create");
                }
                Err(e)
            }
        }
    }

    fn build(
        listener: Listener,
        pool: &mut Box<dyn ExportedPool>,
        path: &Path,
        cfg: RingConfig,
        geometry: Geometry,
        idle_tick: Duration,
    ) -> Result<(Arc<Shared>, ExitWorker)> {
        let epoch = crate::ring::random_epoch();
        let gate_offset = layout::gate_line_offset(cfg.slots, geometry.slot_stride);
        let gate = gate_offset + layout::GATE_BYTES <= pool.pool_bytes()
            && match pool.gate_line() {
                Some(g) => g.enable_gate_line(gate_offset)?,
                None => false,
            };
        let info = RingInfo {
            epoch,
            slot_count: cfg.slots,
            backend: pool.kind().code(),
            policy: if cfg.policy == Policy::Lossless {
                POLICY_LOSSLESS
            } else {
                POLICY_OVERWRITE
            },
            geometry,
            pool_bytes: pool.pool_bytes(),
            device_uuid: pool.device_uuid(),
            max_subscribers: cfg.serve.max_subscribers,
            control_bytes: layout::control_bytes(cfg.slots),
            flags: if gate { layout::RING_GATE } else { 0 },
        };
        let (control, control_fd) = Region::create("vramring-control", info.control_bytes)?;
        info.write_to(control.at::<RingHeader>(0), realtime_ns());
        Region::seal(control_fd.as_fd(), SEALS_READ_ONLY)?;
        let control_fd = Region::reopen_read_only(control_fd.as_fd())?;
        let table = Table::create("vramring-subs", cfg.serve.max_subscribers, epoch)?;
        let pool_fd = pool.export_read_only_fd()?;
        let pool_rw_fd = if cfg.allow_write { Some(pool.export_fd()?) } else { None };
        let header = control.at::<RingHeader>(0);
        // SYNC: producer-state — Release: the ring is ready before any
        // subscriber can connect (the service starts below).
        header.producer.state.store(PRODUCER_LIVE, Ordering::Release);
        let mut state = ServiceState::new(&cfg.serve)?;
        state.idle_tick = idle_tick;
        let shared = Arc::new(Shared {
            control,
            control_fd,
            table,
            pool_fd,
            pool_rw_fd,
            info,
            cfg,
            attach_requests: Mutex::new(Vec::new()),
            mapper: pool.mapped_targets().and_then(|m| m.target_mapper()),
            unmaps: Mutex::new(Vec::new()),
            state,
        });
        let svc_shared = Arc::clone(&shared);
        // The service thread registers with the process-exit registry: a
        // `std::process::exit` with a live publisher stops and joins it (it
        // marks the ring closed and says Bye) before CUDA's exit handlers.
        let service = ExitWorker::builder(format!("vramring-service:{}", path.display()), ExitPhase::Service)
            .spawn(move |stop| serve::run(svc_shared, listener, stop))?;
        Ok((shared, service))
    }

    /// The ring's immutable description.
    pub fn info(&self) -> &RingInfo {
        &self.shared.info
    }

    /// The slot geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.shared.info.geometry
    }

    /// The backend in use.
    pub fn backend(&self) -> BackendKind {
        self.pool.kind()
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The seq the next published frame will carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Loans the next slot for writing, marking it invalid first.
    ///
    /// Under [`Policy::Lossless`] this waits, at most `timeout`, until every
    /// lossless subscriber has released the frame the slot still holds; a
    /// subscriber that holds it past the lease is evicted.
    ///
    /// # Errors
    /// [`Error::LosslessBlocked`] when the wait runs out; [`Error::Closed`].
    pub fn loan(&mut self, timeout: Duration) -> Result<SlotMut<'_>> {
        if self.closed {
            return Err(Error::Closed);
        }
        let seq = self.next_seq;
        let n = u64::from(self.shared.info.slot_count);
        let index = (seq & self.shared.info.mask()) as usize;
        if self.stream_commit && seq > n {
            // The slot's previous frame must have landed: its commit, still
            // in flight on the GPU, would otherwise store its seq over our
            // invalidation. In practice it landed long ago.
            self.wait_committed(seq - n, timeout)?;
            // SYNC: global-seq — SeqCst fence between seeing the GPU's
            // commit and reading the table (lossless holders below): the
            // Dekker pair of `Table::assign`'s fence and reload.
            crate::sync::atomic::fence(Ordering::SeqCst);
        }
        if self.shared.cfg.policy == Policy::Lossless {
            self.wait_lossless(seq, timeout)?;
        }
        protocol::invalidate(&self.shared.slots()[index], seq);
        Ok(SlotMut {
            publisher: self,
            seq,
            index,
        })
    }

    /// Stream-order commits: makes the GPU's stores possible (registers the
    /// control region and the table for them, loads the commit kernel). On
    /// failure the ring commits on the CPU after synchronising the stream.
    fn enable_stream_commit(&mut self) {
        if self.shared.cfg.commit != CommitMode::Stream || self.pool.kind() != BackendKind::Cuda {
            return;
        }
        let sh = Arc::clone(&self.shared);
        let (table, table_len) = sh.table.mapping();
        let regions = [(sh.control.as_ptr(), sh.control.len()), (table, table_len)];
        let mut ok = true;
        for (ptr, len) in regions {
            let registered = match self.pool.stream_commits() {
                // SAFETY: both are this publisher's own mappings, kept alive
                // by `self.shared` until after `self.pool.close()` (see
                // `close`).
                Some(s) => unsafe { s.register_commit_memory(ptr, len) },
                None => Ok(false),
            };
            match registered {
                Ok(true) => {}
                Ok(false) => ok = false,
                Err(e) => {
                    tracing::warn!(error = %e, "stream-order commits unavailable; committing on the CPU");
                    ok = false;
                }
            }
            if !ok {
                break;
            }
        }
        self.stream_commit = ok;
        tracing::debug!(stream_commit = ok, "commit mode");
    }

    /// Whether CUDA frames are committed in stream order
    /// ([`CommitMode::Stream`] in effect).
    pub fn stream_commit(&self) -> bool {
        self.stream_commit
    }

    /// Stream-order commits: waits until the GPU has committed `seq`.
    fn wait_committed(&self, seq: u64, timeout: Duration) -> Result<()> {
        wait_landed(&self.shared.header().seq.global_seq, seq, timeout)
    }

    /// Waits until every lossless reader has room for frame `seq`: a pull
    /// reader has released the frame its slot still holds (`seq − N`); a
    /// push reader has a buffer it is done with (it holds the frame it
    /// released last, and the frames after it fill its other buffers).
    fn wait_lossless(&mut self, seq: u64, timeout: Duration) -> Result<()> {
        let sh = &*self.shared;
        let newest = self.next_seq - 1;
        let n = u64::from(sh.info.slot_count);
        self.gate.wait(sh, timeout, newest, || {
            sh.table
                .holder_by(newest, |e, released| {
                    // Relaxed: the producer (this thread) stores it.
                    let window = match u64::from(e.push_count.load(Ordering::Relaxed)) {
                        // Buffers not mapped yet: its stream starts later.
                        0 if e.flags.load(Ordering::Relaxed) & SUBF_PUSH != 0 => return false,
                        0 => n,
                        // Its buffers, and the ring: the frame's meta is
                        // read from its slot.
                        count => (count - 1).min(n),
                    };
                    released.saturating_add(window) < seq
                })
                .map(|blocker| Holder {
                    blocker,
                    key: seq,
                    held_seq: blocker.released + 1,
                })
        })
    }

    /// Maps push buffers that subscribers sent, and unmaps those of
    /// subscribers that left. Runs on the producer thread, which owns the
    /// pool. A subscriber whose buffers cannot be mapped is evicted: it has
    /// no pool to fall back on.
    ///
    /// Nothing here waits for the GPU (ADR 0018): with stream-order commits
    /// a newcomer's buffers are taken, and a departed subscriber's let go
    /// of, only once `global_seq` shows that every commit that could touch
    /// them has landed; until then they wait for a later publish. With a
    /// mapper (CUDA) the service thread maps and unmaps them, so push
    /// subscribers that come and go in a loop cost the producer neither a
    /// driver call of the mapping nor a wait for its GPU work; without one
    /// (host) at most [`ATTACHES_PER_PUBLISH`](service::ATTACHES_PER_PUBLISH) `mmap`s per frame.
    fn sync_targets(&mut self) {
        let newest = self.next_seq - 1;
        let committed = if self.stream_commit {
            // SYNC: global-seq — Acquire pairs with the commit kernel's
            // store: every copy and push-word store of a frame at or below
            // it has landed (PROTOCOL.md §10.1).
            self.shared.header().seq.global_seq.load(Ordering::Acquire)
        } else {
            // CPU commits complete every copy before the publish returns.
            u64::MAX
        };
        let sh = &*self.shared;
        let (ready, gone) = match sh.attach_requests.lock() {
            Ok(mut q) => {
                // Requests of connections already gone are dropped before
                // anything is done for them (descriptors close, mappings go
                // to the service to be unmapped).
                let gone = sh.take_departed(&mut q);
                (take_ready(&mut q, newest, committed), gone)
            }
            Err(_) => (Vec::new(), Vec::new()),
        };
        for r in gone {
            sh.discard(r.buffers, false);
        }
        let table = &sh.table;
        for r in ready {
            let index = r.index as usize;
            let taken = match r.buffers {
                Buffers::Received(fd) => self.pool.attach_target(&fd, r.attach.bytes),
                Buffers::Mapped(t) => match self.pool.mapped_targets() {
                    Some(m) => m.adopt_target(t),
                    // No pool without a mapper makes a mapped target.
                    None => Err(Error::WrongBackend {
                        what: "adopting push buffers mapped off the producer's thread",
                        backend: "host",
                    }),
                },
            };
            match taken {
                Ok(id) => {
                    // Under the entry's lock and its generation: an entry
                    // freed and reassigned meanwhile never gets our count.
                    // A lossless reader's push stream starts here: the
                    // producer does not wait for frames published before.
                    let counted = table.start_push(index, r.generation, newest, |e| {
                        protocol::push::reset_buffers(e);
                        // SYNC: push-seq — Release; the subscriber starts
                        // taking pushed frames when it sees the count.
                        e.push_count.store(r.attach.count, Ordering::Release);
                        // Relaxed: set by the service before the Welcome.
                        service::queued(e.flags.load(Ordering::Relaxed))
                    });
                    let Some(queued) = counted else {
                        // Nothing was ever copied into these buffers.
                        if let Err(e) = Self::let_go(&mut self.pool, sh, id) {
                            tracing::warn!(error = %e, "unmapping the push buffers of a subscriber that left");
                        }
                        continue;
                    };
                    self.targets.push(PushTarget {
                        index,
                        generation: r.generation,
                        id,
                        stride: r.attach.stride,
                        count: r.attach.count as usize,
                        queued,
                        newest: None,
                        pending: None,
                        enqueued: [0; layout::PUSH_MAX_BUFFERS],
                        dead: false,
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, index, "could not map a subscriber's push buffers; evicting it");
                    sh.evict_push(index, r.generation);
                }
            }
        }
        tracing::trace!(target: "vramring::publish", "push buffers mapped");
        for t in &mut self.targets {
            if !t.dead && !table.live(t.index, t.generation) {
                t.dead = true;
            }
        }
        let (pool, unsettled) = (&mut self.pool, &mut self.unsettled);
        self.targets.retain(|t| {
            if !t.dead {
                return true;
            }
            let released = if *unsettled {
                // A failed publish may have left copies in flight that no
                // commit covers: synchronise once, then trust the seqs again.
                pool.detach_target(t.id).inspect(|()| *unsettled = false)
            } else if t.copies_landed(committed) {
                Self::let_go(pool, sh, t.id)
            } else {
                // Its last frames are still being copied: a later publish
                // unmaps it.
                return true;
            };
            match released {
                Ok(()) => false,
                Err(e) => {
                    tracing::warn!(error = %e, "unmapping a departed subscriber's push buffers failed; retrying at the next publish");
                    true
                }
            }
        });
    }

    /// Lets go of target `id`, whose copies have all landed: with a mapper
    /// the service unmaps it (it costs the producer's thread nothing),
    /// otherwise the pool unmaps it now.
    fn let_go(pool: &mut Box<dyn ExportedPool>, sh: &Shared, id: u64) -> Result<()> {
        if sh.mapper.is_some() {
            if let Some(t) = pool.mapped_targets().and_then(|m| m.disown_target(id)) {
                sh.discard(Buffers::Mapped(t), false);
                return Ok(());
            }
        }
        pool.release_target(id)
    }

    fn commit(&mut self, seq: u64, index: usize, meta: FrameMeta, completion: WriteCompletion) -> Result<()> {
        if let (true, WriteCompletion::CudaStream(stream)) = (self.stream_commit, completion) {
            return self.commit_in_stream(seq, index, meta, stream);
        }
        self.sync_targets();
        let g = self.shared.info.geometry;
        let slot_offset = index as u64 * g.slot_stride;
        let table = &self.shared.table;
        for t in self.targets.iter_mut().filter(|t| !t.dead) {
            t.pending = table
                .with_client(t.index, t.generation, |e, c| {
                    if t.queued {
                        protocol::push::claim_queued(e, c, t.count, 0, seq)
                    } else {
                        protocol::push::claim_buffer(e, c, t.newest, seq)
                    }
                })
                .flatten();
            if let Some(k) = t.pending {
                let dst = k as u64 * t.stride;
                if let Err(e) = self.pool.push_copy(t.id, dst, slot_offset, g.frame_bytes, completion) {
                    tracing::warn!(error = %e, index = t.index, "push copy failed; the subscriber sees a gap");
                    t.pending = None;
                }
            }
        }
        // One synchronisation covers the user's writes and every push copy.
        if let Err(e) = self.pool.complete_writes(completion) {
            // The copies may still be queued: unmapping a target must not
            // trust that they completed.
            self.unsettled |= self.targets.iter().any(|t| t.pending.is_some());
            return Err(e);
        }
        let sh = &self.shared;
        protocol::commit_slot(&sh.slots()[index], seq, &meta.to_commit());
        for t in &mut self.targets {
            if let Some(k) = t.pending.take() {
                // Under the entry's lock and the target's generation: a
                // newcomer at the same index never sees a seq for a buffer
                // that was never copied into.
                table.with_client(t.index, t.generation, |e, _| {
                    protocol::push::complete_buffer(e, k, seq);
                });
                t.newest = Some(k);
            }
        }
        protocol::publish_global(sh.header(), seq);
        if let Some(off) = sh.info.gate_offset() {
            // Queued copies wait on the GPU for this word (ADR 0011); the
            // frame is committed in host memory already, so a failure here
            // only delays them (their deadline), it does not fail the publish.
            if let Err(e) = write_gate(self.pool.as_mut(), off, seq, completion) {
                tracing::warn!(error = %e, seq, "storing the gate word failed; queued pull copies wait for the next frame");
            }
        }
        table.wake_parked();
        self.next_seq = seq + 1;
        Ok(())
    }

    /// Stream-order commit of frame `seq` in slot `index`, written on
    /// `stream` (ADR 0009, PROTOCOL.md §10.1): claims push buffers, stores
    /// the slot's meta (the slot is still invalid), announces the commit in
    /// `pending_seq`, enqueues one kernel that copies the frame into every
    /// push buffer and then stores the seqs, rings every parked
    /// subscriber's doorbell, and returns without waiting for the GPU
    /// (ADR 0017).
    fn commit_in_stream(
        &mut self,
        seq: u64,
        index: usize,
        meta: FrameMeta,
        stream: crate::memory::RawCuStream,
    ) -> Result<()> {
        // Commits land in seq order: one written on another stream than the
        // last waits for the previous commit first.
        if self.last_stream.is_some_and(|s| s != stream as usize) {
            self.wait_committed(seq - 1, Duration::from_secs(5))?;
        }
        // Stage marks at TRACE (target `vramring::publish`): where a
        // publish spends its time, for a subscriber that timestamps them
        // (the `wake` bench's `--probe`); a static level check otherwise.
        tracing::trace!(target: "vramring::publish", "stream checked");
        self.sync_targets();
        tracing::trace!(target: "vramring::publish", "push targets synced");
        let sh = &self.shared;
        let g = sh.info.geometry;
        let table = &sh.table;
        let header = sh.header();
        // SYNC: global-seq — Acquire: what the GPU has committed; a buffer
        // whose frame is newer is still being copied into.
        let committed = header.seq.global_seq.load(Ordering::Acquire);
        let mut writes = Vec::new();
        let mut claimed = Vec::new();
        for (n, t) in self.targets.iter().enumerate().filter(|(_, t)| !t.dead) {
            let mut skip = 0u32;
            for (k, &e) in t.enqueued.iter().enumerate() {
                if e > committed {
                    skip |= 1 << k;
                }
            }
            let k = table
                .with_client(t.index, t.generation, |e, c| {
                    if t.queued {
                        protocol::push::claim_queued(e, c, t.count, skip, seq)
                    } else {
                        let skip = skip | t.newest.map_or(0, |k| 1u32 << k);
                        protocol::push::claim_buffer_avoiding(e, c, skip, seq)
                    }
                })
                .flatten();
            let (Some(k), Some(e)) = (k, table.entry(t.index)) else {
                continue;
            };
            writes.push(crate::memory::PushWrite {
                id: t.id,
                dst_offset: k as u64 * t.stride,
                push_seq: &e.push_seq[k],
            });
            claimed.push((n, k));
        }
        tracing::trace!(target: "vramring::publish", "push buffers claimed");
        let slot = &sh.slots()[index];
        protocol::stage_meta(slot, &meta.to_commit());
        protocol::announce_pending(header, seq);
        tracing::trace!(target: "vramring::publish", "commit announced");
        let commit = crate::memory::StreamCommit {
            seq,
            src_offset: index as u64 * g.slot_stride,
            len: g.frame_bytes,
            targets: &writes,
            slot_seq: &slot.seq,
            global_seq: &header.seq.global_seq,
            gate: sh.info.gate_offset(),
        };
        let completion = WriteCompletion::CudaStream(stream);
        let enqueued = match self.pool.stream_commits() {
            // SAFETY: every word of `commit` lies in the control region or
            // the table, both registered in `enable_stream_commit` and mapped
            // by `self.shared` until after `self.pool.close()`.
            Some(s) => unsafe { s.enqueue_commit(&commit, completion) },
            None => Err(Error::WrongBackend {
                what: "a stream-order commit",
                backend: BackendKind::Host.name(),
            }),
        };
        if let Err(e) = enqueued {
            // Nothing of this frame will land: undo the announcement, so
            // no subscriber spins for it (the slot stays invalid, the seq
            // unused, as a failed publish promises). Back to the previous
            // frame's seq, not to `global_seq`: that frame's commit may
            // still be in flight, and a subscriber rung for it (ADR 0017)
            // must still see it announced when it parks again.
            protocol::withdraw_pending(header, seq);
            // Some launches (or copies) may have been enqueued before the
            // one that failed, into buffers no landed commit accounts for.
            self.unsettled |= !writes.is_empty();
            return Err(e);
        }
        tracing::trace!(target: "vramring::publish", "commit enqueued");
        // Ring every parked subscriber now, without waiting for the GPU
        // (ADR 0017): a woken subscriber that finds the commit still in
        // flight (`pending_seq` ahead of `global_seq`, PROTOCOL.md §12 step
        // 3d′) waits for it on its own CPU, so the publish never blocks on
        // a subscriber, however it waits or lies about it. After the
        // launch, so the GPU starts the commit as early as it can; the
        // `parked` loads are ordered after the `pending_seq` store by
        // `announce_pending`'s SeqCst fence (SYNC: pending).
        table.wake_parked();
        for (n, k) in claimed {
            let t = &mut self.targets[n];
            t.enqueued[k] = seq;
            t.newest = Some(k);
        }
        self.last_stream = Some(stream as usize);
        self.next_seq = seq + 1;
        tracing::trace!(target: "vramring::publish", "parked checked");
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> PublisherStats {
        serve::stats(&*self.shared, self.next_seq - 1)
    }

    /// Stops serving, tells subscribers the ring is closed, and releases
    /// the pool. Retryable after an error; idempotent after success.
    ///
    /// # Errors
    /// The backend's release error; the pool stays reachable for a retry.
    pub fn close(&mut self) -> Result<()> {
        if !self.closed {
            let gate = self.shared.info.gate_offset();
            let complete = |pool: &dyn ExportedPool| {
                if let Err(e) = pool.complete_writes(WriteCompletion::Host) {
                    tracing::warn!(error = %e, "waiting for the GPU's last commits at close");
                }
            };
            if self.stream_commit || gate.is_some() {
                // Commits still in flight land before the ring says closed
                // (a subscriber drains what is committed, then sees the
                // close), and before the gate opens below: a late commit's
                // gate store must not land over it.
                complete(&*self.pool);
            }
            if let Some(off) = gate {
                // Queued pull copies wait on the gate; one queued at a loan
                // that was never published (ADR 0014) would wait for good.
                // Opening the gate for every seq lets them run (their frames
                // fail validation, and the close follows) before the ring
                // says closed, so none has to be set aside.
                match write_gate(self.pool.as_mut(), off, u64::MAX, WriteCompletion::Host) {
                    Ok(()) => complete(&*self.pool),
                    Err(e) => {
                        tracing::warn!(error = %e, "opening the gate at close; copies queued at a loan are set aside")
                    }
                }
            }
            let header = self.shared.header();
            // SYNC: producer-state — Release; subscribers Acquire it and
            // report `ProducerGone` promptly.
            header.producer.state.store(PRODUCER_CLOSED, Ordering::Release);
            // The service rings every subscriber's doorbell as it stops.
            if let Some(worker) = self.service.take() {
                let outcome = worker.stop();
                tracing::debug!(?outcome, "socket service stopped");
            }
            // The service maps and unmaps no more: buffers it mapped that
            // no target took, and those waiting to be unmapped, are unmapped
            // here, while the pool still holds its context. No copy into
            // any of them is in flight (never adopted, or let go after
            // their copies landed).
            if let Ok(mut q) = self.shared.attach_requests.lock() {
                for r in q.drain(..) {
                    self.shared.discard(r.buffers, true);
                }
            }
            self.shared.unmap_released();
            self.closed = true;
            let epoch = self.shared.info.epoch;
            local_publishers(|epochs| epochs.retain(|&e| e != epoch));
        }
        self.pool.close()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, path = %self.path.display(), "publisher close failed in drop");
        }
    }
}

/// Stores `seq` into the pool's gate word at `offset` (see
/// [`crate::memory::GateLine::write_gate`]).
///
/// # Errors
/// [`Error::WrongBackend`] for a pool without a gate line; the driver's.
fn write_gate(pool: &mut dyn ExportedPool, offset: u64, seq: u64, completion: WriteCompletion) -> Result<()> {
    let backend = pool.kind().name();
    match pool.gate_line() {
        Some(g) => g.write_gate(offset, seq, completion),
        None => Err(Error::WrongBackend {
            what: "a gate word",
            backend,
        }),
    }
}
