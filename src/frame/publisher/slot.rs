//! A loaned slot (`SlotMut`): written on the host or the GPU, then
//! committed; and the wait for an earlier stream-order commit to land.

use super::*;

/// A loaned slot: write the frame, then [`SlotMut::publish`].
///
/// Dropping it without publishing leaves the slot invalid and the seq
/// unused; the next loan reuses both.
pub struct SlotMut<'p> {
    pub(super) publisher: &'p mut Publisher,
    pub(super) seq: u64,
    pub(super) index: usize,
}

impl std::fmt::Debug for SlotMut<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotMut")
            .field("seq", &self.seq)
            .field("index", &self.index)
            .finish()
    }
}

impl SlotMut<'_> {
    /// The seq this frame will carry.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The slot index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The slot geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.publisher.shared.info.geometry
    }

    /// The ring's backend: whether the slot is written through
    /// [`SlotMut::bytes_mut`] (host) or [`SlotMut::device_mut`] (CUDA).
    pub fn backend(&self) -> BackendKind {
        self.publisher.pool.kind()
    }

    /// Address of the slot's first byte in this process.
    pub(crate) fn addr(&self) -> u64 {
        self.publisher.pool.base_addr() + self.index as u64 * self.geometry().slot_stride
    }

    /// The whole slot (`frame_bytes`) as device memory, CUDA backend only:
    /// write it on your own stream and pass that stream to
    /// [`SlotMut::publish_cuda`].
    ///
    /// # Errors
    /// [`Error::WrongBackend`] on a host ring.
    pub fn device_mut(&mut self) -> Result<DeviceViewMut<'_>> {
        self.require_cuda()?;
        Ok(DeviceViewMut::new(self.addr(), self.geometry().frame_bytes))
    }

    /// Plane `k` (`pitch * rows` bytes) as device memory, CUDA backend only.
    ///
    /// # Errors
    /// [`Error::WrongBackend`] on a host ring, [`Error::Config`] for a plane
    /// the format does not have.
    pub fn plane_device_mut(&mut self, k: usize) -> Result<DeviceViewMut<'_>> {
        self.require_cuda()?;
        let g = self.geometry();
        let p = g
            .planes()
            .get(k)
            .ok_or_else(|| Error::Config(format!("{} has no plane {k}", g.format.name())))?;
        Ok(DeviceViewMut::new(self.addr() + p.offset, p.pitch * p.rows))
    }

    /// Address of plane `k` in this process, whatever the backend.
    #[cfg(feature = "nvdec")]
    pub(crate) fn plane_addr(&self, k: usize) -> Result<u64> {
        let g = self.geometry();
        let p = g
            .planes()
            .get(k)
            .ok_or_else(|| Error::Config(format!("{} has no plane {k}", g.format.name())))?;
        Ok(self.addr() + p.offset)
    }

    fn require_cuda(&self) -> Result<()> {
        match self.backend() {
            BackendKind::Cuda => Ok(()),
            BackendKind::Host => Err(Error::WrongBackend {
                what: "device memory of a slot",
                backend: BackendKind::Host.name(),
            }),
        }
    }

    /// The whole slot (`frame_bytes`) as bytes, host backend only.
    ///
    /// # Errors
    /// [`Error::WrongBackend`] on a GPU ring.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        let len = self.geometry().frame_bytes as usize;
        self.host_range(0, len)
    }

    /// Plane `k` (`pitch * rows` bytes), host backend only.
    ///
    /// # Errors
    /// [`Error::WrongBackend`] on a GPU ring, [`Error::Config`] for a
    /// plane the format does not have.
    pub fn plane_mut(&mut self, k: usize) -> Result<&mut [u8]> {
        let g = *self.geometry();
        let p = *g
            .planes()
            .get(k)
            .ok_or_else(|| Error::Config(format!("{} has no plane {k}", g.format.name())))?;
        self.host_range(p.offset as usize, p.span() as usize)
    }

    fn host_range(&mut self, offset: usize, len: usize) -> Result<&mut [u8]> {
        if self.publisher.pool.kind() != BackendKind::Host {
            return Err(Error::WrongBackend {
                what: "CPU access to a slot",
                backend: self.publisher.pool.kind().name(),
            });
        }
        let ptr = (self.addr() as usize + offset) as *mut u8;
        // SAFETY: the range lies inside this slot of the publisher's own
        // read-write mapping (offset + len <= frame_bytes <= slot_stride, and
        // the pool holds slot_count strides); the slot was invalidated, so
        // this `&mut self` loan is its only writer in this process. Peers
        // only read it, unless granted write access, in which case they are
        // trusted not to write a slot they do not own.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    /// Commits a frame written by the CPU (host backend).
    ///
    /// # Errors
    /// [`Error::WrongBackend`] on a GPU ring (use [`SlotMut::publish_cuda`]).
    pub fn publish(self, meta: FrameMeta) -> Result<u64> {
        let seq = self.seq;
        let kind = self.publisher.pool.kind();
        if kind != BackendKind::Host {
            return Err(Error::WrongBackend {
                what: "publishing without a CUDA stream",
                backend: kind.name(),
            });
        }
        self.publisher.commit(seq, self.index, meta, WriteCompletion::Host)?;
        Ok(seq)
    }

    /// Commits a frame written on CUDA stream `stream`.
    ///
    /// With [`CommitMode::Stream`] (the default, see
    /// [`Publisher::stream_commit`]) this enqueues, behind the frame's
    /// writes on `stream`, one kernel that copies the frame into every push
    /// subscriber's buffer and then stores the frame's seqs into the ring,
    /// and returns without waiting: subscribers see the frame when the GPU
    /// has finished it. Keep the slot's bytes untouched after this call, as
    /// always; to reuse `stream`'s other work, order it after the commit as
    /// usual (stream order). With [`CommitMode::Synchronous`] it
    /// synchronises `stream`, then commits on the CPU.
    ///
    /// A stream-order publish emits a TRACE event of target
    /// `vramring::publish` at each of its stages: stream checked, push
    /// targets synced, push buffers claimed, commit announced, context
    /// current, kernel launched (or graph replayed, ADR 0021; with no push
    /// subscriber: stores enqueued),
    /// commit enqueued, parked checked. A `tracing` subscriber that
    /// timestamps them shows where a publish spends its time
    /// (`benches/wake.rs --probe` does).
    ///
    /// # Safety
    /// `stream` must be a valid `CUstream` of the ring's CUDA context (or
    /// null for the legacy default stream) that stays valid for this call
    /// (destroying it afterwards is fine: the driver finishes its work).
    ///
    /// # Errors
    /// The driver's error from enqueueing the commit (or from
    /// `cuStreamSynchronize`); the slot stays invalid and the seq unused.
    /// [`Error::Timeout`] when `stream` differs from the previous frame's
    /// and the GPU has not committed that frame within 5 s.
    pub unsafe fn publish_cuda(self, meta: FrameMeta, stream: Stream<'_>) -> Result<u64> {
        let stream = stream.as_raw();
        let seq = self.seq;
        self.publisher
            .commit(seq, self.index, meta, WriteCompletion::CudaStream(stream))?;
        Ok(seq)
    }
}

/// Stream-order commits: spins (then yields) until the GPU's `global_seq`
/// reaches `seq`.
///
/// # Errors
/// [`Error::Timeout`] after `timeout`.
pub(super) fn wait_landed(global: &AtomicU64, seq: u64, timeout: Duration) -> Result<()> {
    let start = std::time::Instant::now();
    let mut spins = 0u32;
    // SYNC: global-seq — Acquire pairs with the GPU's commit store (after
    // its system-scope fence).
    while global.load(Ordering::Acquire) < seq {
        if start.elapsed() >= timeout {
            return Err(Error::Timeout(timeout, "the GPU to commit an earlier frame"));
        }
        spins = spins.saturating_add(1);
        if spins < 1000 {
            crate::sync::spin_hint();
        } else {
            std::thread::yield_now();
        }
    }
    Ok(())
}

#[cfg(all(test, not(loom)))]
mod landing_tests {
    use super::*;

    #[test]
    fn the_wait_ends_when_the_commit_lands() {
        let g = AtomicU64::new(0);
        let got = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(20));
                g.store(3, Ordering::Release);
            });
            wait_landed(&g, 3, Duration::from_secs(5))
        });
        got.unwrap();
        assert!(g.load(Ordering::Relaxed) >= 3);
    }

    #[test]
    fn a_commit_that_never_lands_times_out_with_a_sentence() {
        let g = AtomicU64::new(0);
        let e = wait_landed(&g, 1, Duration::from_millis(30)).unwrap_err();
        assert!(matches!(e, Error::Timeout(..)), "{e:?}");
        assert!(e.to_string().contains("the GPU to commit"), "{e}");
    }
}
