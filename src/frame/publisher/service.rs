//! What the producer and its socket service share (`Shared`), and the
//! service's side of the frame ring: handshakes, push attaches and their
//! mapping, departures.

use super::*;

/// What the producer and the socket service share.
pub(crate) struct Shared {
    pub(crate) control: Region,
    /// Read-only reopen of the sealed control memfd, sent in every Welcome.
    pub(crate) control_fd: OwnedFd,
    pub(crate) table: Table,
    /// The pool for pull subscribers without write access (read-only for
    /// host memory).
    pub(crate) pool_fd: OwnedFd,
    /// The pool for subscribers granted write access.
    pub(crate) pool_rw_fd: Option<OwnedFd>,
    pub(crate) info: RingInfo,
    pub(crate) cfg: RingConfig,
    /// Push buffers sent by subscribers (mapped already where the pool has
    /// a mapper), for the producer to take as targets.
    pub(crate) attach_requests: Mutex<Vec<AttachRequest>>,
    /// Maps and unmaps push buffers on the service thread instead of the
    /// producer's (CUDA, ADR 0018); `None`: the producer maps them (host).
    pub(crate) mapper: Option<Arc<dyn TargetMapper>>,
    /// Push buffers the producer let go of, for the service to unmap.
    pub(crate) unmaps: Mutex<Vec<MappedTarget>>,
    /// Evictions, the service's waker, counters.
    pub(crate) state: ServiceState,
}

/// A push subscriber's buffers as they reach the producer.
pub(crate) enum Buffers {
    /// The descriptor, for the producer to map (a pool without a mapper);
    /// dropped where its close cannot block ([`PeerFd`]).
    Received(PeerFd),
    /// Mapped by the service thread already.
    Mapped(MappedTarget),
}

/// A subscriber's push buffers, received (and, with a mapper, mapped) by
/// the service, taken as a target by the producer thread (which owns the
/// pool).
pub(crate) struct AttachRequest {
    pub(crate) index: u32,
    pub(crate) generation: u32,
    pub(crate) buffers: Buffers,
    pub(crate) attach: crate::socket::Attach,
    /// Stream-order commits: the newest seq enqueued when the producer
    /// first saw the request; the producer takes it once the GPU has
    /// committed that seq (`None` until seen).
    pub(crate) after: Option<u64>,
}

/// Push targets the producer takes per publish, at most, first come first
/// served: a peer that attaches and leaves in a loop adds a bounded amount
/// of work to a frame (with a mapper, taking a mapped target costs about a
/// microsecond; without one, the host `mmap` costs a few).
pub(super) const ATTACHES_PER_PUBLISH: usize = 4;

/// How many push buffers a subscriber with entry `flags` may attach: a
/// latest reader [`PUSH_BUFFERS`](layout::PUSH_BUFFERS), a queued one
/// (sequential or lossless) [`PUSH_QUEUE_MIN`](layout::PUSH_QUEUE_MIN) to
/// [`PUSH_MAX_BUFFERS`](layout::PUSH_MAX_BUFFERS).
pub(super) fn push_buffers(flags: u32) -> (usize, usize) {
    if queued(flags) {
        (layout::PUSH_QUEUE_MIN, layout::PUSH_MAX_BUFFERS)
    } else {
        (layout::PUSH_BUFFERS, layout::PUSH_BUFFERS)
    }
}

/// Whether a push subscriber with entry `flags` reads a queue (sequential
/// or lossless) rather than the newest frame.
pub(super) fn queued(flags: u32) -> bool {
    flags & (layout::SUBF_SEQUENTIAL | layout::SUBF_LOSSLESS) != 0
}

/// A push subscriber's buffers as mapped by the producer.
#[derive(Debug)]
pub(super) struct PushTarget {
    pub(super) index: usize,
    pub(super) generation: u32,
    pub(super) id: u64,
    pub(super) stride: u64,
    /// Buffers attached.
    pub(super) count: usize,
    /// A queued reader (sequential or lossless): its buffers are claimed
    /// by [`protocol::push::claim_queued`],
    /// a latest reader's by the newest rule.
    pub(super) queued: bool,
    pub(super) newest: Option<usize>,
    pub(super) pending: Option<usize>,
    /// Stream-order commits: the seq last enqueued into each buffer (a
    /// buffer whose seq the GPU has not committed yet is not claimed).
    pub(super) enqueued: [u64; layout::PUSH_MAX_BUFFERS],
    pub(super) dead: bool,
}

/// Takes from `queue`, first come first served, at most
/// [`ATTACHES_PER_PUBLISH`] requests whose buffers may be mapped now:
/// every commit enqueued when the request was first seen (`newest` then)
/// has landed (`committed`). A newcomer may sit at the index of a
/// subscriber whose frames are still being committed on the GPU, which
/// stores into the entry's `push_seq` words; mapping clears them, so it
/// waits for those stores. The rest stay queued for a later publish.
pub(super) fn take_ready(queue: &mut Vec<AttachRequest>, newest: u64, committed: u64) -> Vec<AttachRequest> {
    let mut ready = Vec::new();
    let mut i = 0;
    while i < queue.len() && ready.len() < ATTACHES_PER_PUBLISH {
        if *queue[i].after.get_or_insert(newest) <= committed {
            ready.push(queue.remove(i));
        } else {
            i += 1;
        }
    }
    ready
}

impl PushTarget {
    /// Whether every frame enqueued into the buffers has been committed
    /// (`committed`: `global_seq`): no copy into them is in flight, and
    /// they may be unmapped without waiting for the GPU.
    pub(super) fn copies_landed(&self, committed: u64) -> bool {
        self.enqueued.iter().all(|&s| s <= committed)
    }
}

impl Shared {
    /// The ring's backend.
    pub(super) fn backend(&self) -> BackendKind {
        // Unknown (never: the publisher wrote it) counts as CUDA, whose
        // pool is handed out more sparingly.
        BackendKind::from_code(self.info.backend).unwrap_or(BackendKind::Cuda)
    }

    /// Evicts the push subscriber at `index`/`generation` whose buffers
    /// cannot be mapped (it has no pool to fall back on): marks the entry,
    /// counts it, and has the service tell it.
    pub(super) fn evict_push(&self, index: usize, generation: u32) {
        if self.table.evict(index, generation, EVICT_PUSH) {
            // Relaxed: a counter for stats.
            self.header().producer.evictions.fetch_add(1, Ordering::Relaxed);
            self.state.request_eviction(index, generation, EVICT_PUSH);
        }
    }

    /// Removes from the attach queue `q` the requests of subscribers that
    /// left (their entry is no longer live with the same generation), and
    /// returns them for [`Shared::discard`]: the queue holds at most one
    /// request per live entry.
    pub(super) fn take_departed(&self, q: &mut Vec<AttachRequest>) -> Vec<AttachRequest> {
        let (live, gone) = std::mem::take(q)
            .into_iter()
            .partition(|r| self.table.live(r.index as usize, r.generation));
        *q = live;
        gone
    }

    /// Lets go of push buffers no target will use: a received descriptor
    /// closes; mapped buffers go to the service to be unmapped (`now`: on
    /// the service thread, which unmaps them at once).
    pub(super) fn discard(&self, b: Buffers, now: bool) {
        let Buffers::Mapped(mut t) = b else {
            return;
        };
        if now {
            if let Some(m) = &self.mapper {
                match m.unmap(&mut t) {
                    Ok(()) => return,
                    Err(e) => tracing::warn!(error = %e, "unmapping push buffers nobody uses; retrying"),
                }
            }
        }
        if let Ok(mut q) = self.unmaps.lock() {
            q.push(t);
        }
        if !now {
            self.state.waker.wake();
        }
    }

    /// Service thread: unmaps the push buffers the producer let go of;
    /// those that fail stay for the next round.
    pub(super) fn unmap_released(&self) {
        let Some(m) = &self.mapper else {
            return;
        };
        let mut todo = match self.unmaps.lock() {
            Ok(mut q) if !q.is_empty() => std::mem::take(&mut *q),
            _ => return,
        };
        todo.retain_mut(|t| match m.unmap(t) {
            Ok(()) => false,
            Err(e) => {
                tracing::warn!(error = %e, "unmapping a departed subscriber's push buffers; retrying");
                true
            }
        });
        if let Ok(mut q) = self.unmaps.lock() {
            q.append(&mut todo);
        }
    }

    pub(crate) fn header(&self) -> &RingHeader {
        self.control.at::<RingHeader>(0)
    }
    pub(crate) fn slots(&self) -> &[SlotDesc] {
        self.control
            .slice::<SlotDesc>(std::mem::size_of::<RingHeader>(), self.info.slot_count as usize)
    }
    /// Bytes a push subscriber's buffer stride must be.
    fn push_stride(&self) -> u64 {
        self.info
            .geometry
            .frame_bytes
            .next_multiple_of(crate::format::SLOT_ALIGN)
    }
}

impl Served for Shared {
    fn producer(&self) -> &ProducerLine {
        &self.header().producer
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

    fn refuse(&self, hello: &Hello, uid: u32) -> Option<(u32, String)> {
        let info = &self.info;
        if hello.flags & msg::HELLO_PACKETS != 0 {
            return Some((
                msg::REJECT_KIND,
                "this socket serves a frame ring; connect a PacketSubscriber to a packet ring's socket".into(),
            ));
        }
        if hello.backends & (1 << info.backend) == 0 {
            let name = BackendKind::from_code(info.backend).map_or("?", |b| b.name());
            return Some((
                msg::REJECT_BACKEND,
                format!("the ring is on the {name} backend, which this subscriber cannot import"),
            ));
        }
        if hello.flags & msg::HELLO_LOSSLESS != 0 && info.policy == POLICY_OVERWRITE {
            return Some((
                msg::REJECT_POLICY,
                "lossless asked of a publisher with the overwrite policy".into(),
            ));
        }
        let push = hello.flags & msg::HELLO_PUSH != 0;
        if push && hello.flags & msg::HELLO_WRITE != 0 {
            return Some((
                msg::REJECT_BAD_HELLO,
                "push delivery hands out no pool, so it cannot be written: ask for write access with pull delivery"
                    .into(),
            ));
        }
        if hello.flags & msg::HELLO_WRITE != 0 && !self.cfg.allow_write {
            return Some((
                msg::REJECT_WRITE_DENIED,
                "write access to the pool is not granted by this publisher".into(),
            ));
        }
        if !push && !self.cfg.pull.allows(uid, self.backend()) {
            return Some((
                msg::REJECT_PULL_DENIED,
                format!("this publisher does not hand its pool to uid {uid}; ask for push delivery"),
            ));
        }
        None
    }

    fn settle(&self, hello: &mut Hello, uid: u32) {
        // A subscriber that accepts push gets it where pull is refused
        // (and never the pool of a ring that does not trust it with it).
        let ok = hello.flags & msg::HELLO_PUSH_OK != 0;
        hello.flags &= !msg::HELLO_PUSH_OK;
        if ok && hello.flags & (msg::HELLO_PUSH | msg::HELLO_WRITE) == 0 && !self.cfg.pull.allows(uid, self.backend()) {
            hello.flags |= msg::HELLO_PUSH;
        }
    }

    fn entry_flags(&self, hello: &Hello) -> u32 {
        let mut flags = 0;
        for (h, f) in [
            (msg::HELLO_LOSSLESS, SUBF_LOSSLESS),
            (msg::HELLO_SEQUENTIAL, SUBF_SEQUENTIAL),
            (msg::HELLO_WRITE, SUBF_WRITE),
            (msg::HELLO_PUSH, SUBF_PUSH),
        ] {
            if hello.flags & h != 0 {
                flags |= f;
            }
        }
        flags
    }

    fn lossless_start(&self) -> u64 {
        // SYNC: global-seq — Acquire: the lossless cursor starts at the
        // newest committed frame, so the producer never waits for frames
        // published before this subscriber joined.
        self.header().seq.global_seq.load(Ordering::Acquire)
    }

    fn welcome(&self, a: &Assigned, hello: &Hello) -> (Welcome, BorrowedFd<'_>, Option<BorrowedFd<'_>>) {
        let info = &self.info;
        let welcome = Welcome {
            index: a.index,
            generation: a.generation,
            epoch: info.epoch,
            backend: info.backend,
            granted: hello.flags & (msg::HELLO_LOSSLESS | msg::HELLO_SEQUENTIAL | msg::HELLO_WRITE | msg::HELLO_PUSH),
            control_bytes: self.control.len() as u64,
            subs_bytes: 0,
            pool_bytes: info.pool_bytes,
            device_uuid: info.device_uuid,
            client_bytes: 0,
        };
        // A push subscriber never receives the pool.
        let pool = if hello.flags & msg::HELLO_PUSH != 0 {
            None
        } else if hello.flags & msg::HELLO_WRITE != 0 {
            self.pool_rw_fd.as_ref().map(|fd| fd.as_fd())
        } else {
            Some(self.pool_fd.as_fd())
        };
        (welcome, self.control_fd.as_fd(), pool)
    }

    /// Checks a subscriber's push buffers against the ring and hands them
    /// to the producer thread, which maps them.
    fn check_attach(&self, index: u32, a: &Attach, fds: usize) -> std::result::Result<(), String> {
        // Relaxed: written by the service thread, which calls us.
        let flags = self
            .table
            .entry(index as usize)
            .map_or(0, |e| e.flags.load(Ordering::Relaxed));
        if flags & SUBF_PUSH == 0 {
            return Err("push delivery was not granted".into());
        }
        let (fewest, most_buffers) = push_buffers(flags);
        let count = a.count as usize;
        let stride = self.push_stride();
        let need = stride * u64::from(a.count);
        // A CUDA allocation is rounded up to its granularity (2 MiB on
        // current GPUs); nothing else may exceed what the buffers need.
        let most = need + crate::memory::cuda::MAX_GRANULARITY;
        if fds != 1
            || !(fewest..=most_buffers).contains(&count)
            || a.stride != stride
            || a.bytes < need
            || a.bytes > most
        {
            return Err(format!(
                "{fds} descriptors, {} buffers of {} bytes in {} bytes; want 1 descriptor, {fewest}..={most_buffers} buffers of {stride} bytes in {need}..={most}",
                a.count, a.stride, a.bytes,
            ));
        }
        Ok(())
    }

    fn attach(&self, index: u32, generation: u32, a: Attach, fds: Vec<PeerFd>) -> std::result::Result<(), String> {
        // The service checked already (before it spent a token); a check
        // here too keeps this call safe on its own.
        self.check_attach(index, &a, fds.len())?;
        let Some(fd) = fds.into_iter().next() else {
            return Err("no descriptor".into());
        };
        // With a mapper the buffers are mapped here, on the service thread:
        // the import costs a few hundred microseconds that a publish must
        // not pay (ADR 0018). The descriptor closes after it.
        let buffers = match &self.mapper {
            Some(m) => match m.map(&fd, a.bytes) {
                Ok(t) => Buffers::Mapped(t),
                Err(e) => {
                    tracing::warn!(error = %e, index, "could not map a subscriber's push buffers; evicting it");
                    self.evict_push(index as usize, generation);
                    return Ok(());
                }
            },
            None => Buffers::Received(fd),
        };
        let Ok(mut q) = self.attach_requests.lock() else {
            self.discard(buffers, true);
            return Err("attach queue poisoned".into());
        };
        // Requests of subscribers that left before the producer got to them
        // go now (descriptors close, mappings are unmapped below): the queue
        // holds at most one request per live entry, however often a peer
        // reconnects while the producer is idle. Only this thread frees
        // entries, so a live check here stays true until the next service
        // step.
        let gone = self.take_departed(&mut q);
        q.push(AttachRequest {
            index,
            generation,
            buffers,
            attach: a,
            after: None,
        });
        drop(q);
        for r in gone {
            self.discard(r.buffers, true);
        }
        Ok(())
    }

    fn tick(&self) {
        self.unmap_released();
    }
}

/// Runs `f` on the epochs of the frame publishers open in this process.
///
/// A queued-pull subscriber of one of them does not queue its copy at the
/// loan (ADR 0014): it shares the publisher's CUDA context (the device's
/// primary one), so a `cuCtxSynchronize` of the publisher (a CPU commit,
/// a departing push target, the close) would wait for that copy, and the
/// copy waits for this publisher's next gate store.
pub(super) fn local_publishers<T>(f: impl FnOnce(&mut Vec<u64>) -> T) -> T {
    static EPOCHS: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());
    // A panic while the lock was held leaves a list that is still whole.
    let mut epochs = EPOCHS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    f(&mut epochs)
}

/// Whether the frame publisher of `epoch` is open in this process.
pub(crate) fn published_here(epoch: u64) -> bool {
    local_publishers(|epochs| epochs.contains(&epoch))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(index: u32) -> AttachRequest {
        AttachRequest {
            index,
            generation: 1,
            buffers: Buffers::Received(PeerFd::new(std::fs::File::open("/dev/null").expect("/dev/null").into())),
            attach: crate::socket::Attach {
                count: layout::PUSH_BUFFERS as u32,
                stride: 4096,
                bytes: 4096 * layout::PUSH_BUFFERS as u64,
            },
            after: None,
        }
    }

    fn indices(q: &[AttachRequest]) -> Vec<u32> {
        q.iter().map(|r| r.index).collect()
    }

    #[test]
    fn an_attach_waits_for_the_commits_enqueued_when_it_came_without_blocking_and_a_few_go_per_publish() {
        let mut q = vec![request(3), request(1)];
        // Frame 9 enqueued, frame 8 landed: nothing may be mapped yet, and
        // each request remembers the commit it waits for.
        assert!(take_ready(&mut q, 9, 8).is_empty());
        assert_eq!(q.iter().map(|r| r.after).collect::<Vec<_>>(), [Some(9), Some(9)]);
        // A later request waits for the newer frame it saw.
        q.push(request(0));
        assert!(take_ready(&mut q, 10, 8).is_empty());
        assert_eq!(q[2].after, Some(10));
        // Frame 9 landed: the first two go, in order; the third waits for
        // frame 10.
        assert_eq!(indices(&take_ready(&mut q, 10, 9)), [3, 1]);
        assert!(take_ready(&mut q, 11, 9).is_empty());
        assert_eq!(indices(&take_ready(&mut q, 11, 10)), [0]);
        assert!(q.is_empty());
        // CPU commits: everything has landed; at most
        // ATTACHES_PER_PUBLISH per publish, first come first served.
        let mut q: Vec<_> = (0..ATTACHES_PER_PUBLISH as u32 + 1).map(request).collect();
        let first: Vec<u32> = (0..ATTACHES_PER_PUBLISH as u32).collect();
        assert_eq!(indices(&take_ready(&mut q, 4, u64::MAX)), first);
        assert_eq!(indices(&take_ready(&mut q, 5, u64::MAX)), [ATTACHES_PER_PUBLISH as u32]);
    }

    #[test]
    fn a_departed_target_is_unmapped_only_after_its_last_frame_landed() {
        let mut t = PushTarget {
            index: 0,
            generation: 1,
            id: 1,
            stride: 4096,
            count: 3,
            queued: false,
            newest: Some(1),
            pending: None,
            enqueued: [0; layout::PUSH_MAX_BUFFERS],
            dead: true,
        };
        t.enqueued[..3].copy_from_slice(&[7, 9, 8]);
        assert!(!t.copies_landed(8), "frame 9 is still being copied into buffer 1");
        assert!(t.copies_landed(9));
        t.enqueued = [0; layout::PUSH_MAX_BUFFERS];
        assert!(t.copies_landed(0), "a target never copied into is due at once");
    }
}
