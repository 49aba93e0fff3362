//! One read of a frame for Python (see the module docs of `crate::sub`):
//! where it is copied to, the push buffer lent as it is, and what the read
//! produced before it becomes a `Frame`.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use dlpark::ffi::DLDevice;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use vramring::{monotonic_ns, BackendKind, Borrow, Error, Geometry, RingInfo, Subscriber};

use super::{Frame, Wait};
use crate::mem::{Buf, BufPool, Consumers, Cuda, Event};
use crate::view::{self, Keep};

/// The pool and CUDA context frames of the current publisher instance use.
#[derive(Default)]
pub(super) struct Sink {
    pub(super) pool: Option<Arc<BufPool>>,
    /// The geometry of the frames `pool` was made for: the tensor cache's
    /// entries are keyed by pool, and their tensors have its shapes.
    geometry: Option<Geometry>,
    cuda: Option<(Arc<Cuda>, [u8; 16])>,
    pub(super) keep: usize,
}

impl Sink {
    /// No pool yet; at most `keep` frame buffers alive at once.
    pub(super) fn new(keep: usize) -> Sink {
        Sink {
            keep,
            ..Sink::default()
        }
    }

    /// The CUDA context of ring `info` (`None` for a host ring).
    fn cuda_for(&mut self, info: &RingInfo) -> vramring::Result<Option<Arc<Cuda>>> {
        if info.backend() != BackendKind::Cuda {
            return Ok(None);
        }
        match &self.cuda {
            Some((c, uuid)) if *uuid == info.device_uuid() => Ok(Some(Arc::clone(c))),
            _ => {
                let c = Cuda::for_uuid(&info.device_uuid())?;
                self.cuda = Some((Arc::clone(&c), info.device_uuid()));
                Ok(Some(c))
            }
        }
    }

    /// The pool for frames of ring `info`; a new one when the ring changed
    /// (a reconnect to a publisher with another geometry or device), even
    /// one of the same size (cached tensors have the old shapes).
    pub(super) fn pool_for(&mut self, info: &RingInfo) -> vramring::Result<Arc<BufPool>> {
        let cuda = self.cuda_for(info)?;
        let bytes = info.geometry().frame_bytes;
        let same_geometry = self.geometry.as_ref() == Some(info.geometry());
        let fits = same_geometry
            && self.pool.as_ref().is_some_and(|p| {
                p.bytes == bytes
                    && match (&p.cuda, &cuda) {
                        (None, None) => true,
                        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                        _ => false,
                    }
            });
        if !fits {
            self.pool = Some(BufPool::new(cuda, bytes, self.keep));
            self.geometry = Some(*info.geometry());
        }
        self.pool.clone().ok_or(Error::Closed)
    }

    /// Where a frame of ring `info` is copied to: `dest` (a cached buffer)
    /// when it belongs to the ring's pool, else a buffer from the pool.
    fn dst_for<'a>(&mut self, info: &RingInfo, dest: Option<&'a Buf>) -> vramring::Result<Dst<'a>> {
        let pool = self.pool_for(info)?;
        match dest {
            Some(d) if Arc::ptr_eq(d.pool(), &pool) => Ok(Dst::Cached(d)),
            _ => Ok(Dst::Own(pool.take()?)),
        }
    }
}

/// Where a read copies a frame to.
enum Dst<'a> {
    /// A buffer just taken from the pool: nobody else references it.
    Own(Buf),
    /// A buffer of the tensor cache, proven unreferenced (`crate::cache`).
    Cached(&'a Buf),
}

impl Dst<'_> {
    fn buf(&self) -> &Buf {
        match self {
            Dst::Own(b) => b,
            Dst::Cached(b) => b,
        }
    }

    /// The bytes to write, when the buffer is host memory.
    fn host(&mut self) -> Option<&mut [u8]> {
        match self {
            Dst::Own(b) => b.host_mut(),
            Dst::Cached(b) => {
                let p = b.host_ptr()?;
                // SAFETY: `host_ptr`'s bytes (the pool's `bytes` of them);
                // the cache's check found no frame, export, tensor or view
                // of this buffer alive, and the cache hands out nothing of
                // it until this read has returned; the slice is the only
                // one (`&mut self`).
                Some(unsafe { std::slice::from_raw_parts_mut(p, b.pool().bytes as usize) })
            }
        }
    }

    fn held(self) -> Held {
        match self {
            Dst::Own(b) => Held::Buf(b),
            Dst::Cached(_) => Held::Cached,
        }
    }
}

/// A push buffer lent to Python as a frame. The subscriber keeps one `Arc`
/// of the newest one it lent; the frame's [`Keep`] holds another, which
/// every tensor made from the frame keeps alive. While the subscriber's is
/// not the only one, the subscriber never calls `Subscriber::next` (which
/// would move its hold off the buffer), and closing or dropping it parks
/// the Rust subscriber here instead: it (its hold, its mapping of the
/// buffer) goes when the last tensor does.
pub struct Lent {
    pub(super) parked: Mutex<Option<Box<Subscriber>>>,
    /// The buffer's GPU (`None` on the host).
    cuda: Option<Arc<Cuda>>,
    /// Streams of the tensors exported from the frame.
    pub consumers: Consumers,
    /// Recorded on those streams when the frame's last reference went; the
    /// hold moves off the buffer only after they completed.
    events: Mutex<Vec<Event>>,
}

impl Lent {
    pub(super) fn new(cuda: Option<Arc<Cuda>>) -> Arc<Lent> {
        Arc::new(Lent {
            parked: Mutex::new(None),
            cuda,
            consumers: Consumers::default(),
            events: Mutex::new(Vec::new()),
        })
    }

    /// The frame and its tensors are gone: fences their consumers' streams.
    pub fn frame_gone(&self) {
        let streams = self.consumers.take();
        if let (Some(c), false) = (&self.cuda, streams.is_empty()) {
            let evs = c.fence(&streams);
            self.events.lock().unwrap_or_else(|p| p.into_inner()).extend(evs);
        }
    }

    /// Waits until the consumers' work on the buffer is done (before the
    /// hold moves off it, or the buffer is unmapped).
    pub(super) fn settle(&self) {
        let evs = std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()));
        if let Some(c) = &self.cuda {
            c.sync_events(evs);
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        // Before a parked subscriber (dropped after this) unmaps the buffer.
        self.settle();
    }
}

/// The memory a read produced.
pub(super) enum Held {
    /// A buffer of the subscriber's pool, holding a copy.
    Buf(Buf),
    /// The cached buffer the read was given, holding a copy.
    Cached,
    /// The push buffer at `addr` (host pointer or device address), held by
    /// the subscriber; `cuda` is its GPU's context, `None` on the host.
    Lent { addr: u64, cuda: Option<Arc<Cuda>> },
}

/// What a read produced, before it becomes a Python `Frame`.
pub(super) struct Got {
    seq: u64,
    pts: i64,
    flags: u32,
    commit_ns: u64,
    skipped: u64,
    pushed: bool,
    user: Vec<u8>,
    pub(super) geometry: Geometry,
    mem: Held,
    /// woke, copied, checked (`CLOCK_MONOTONIC` ns).
    timing: [u64; 3],
}

impl Got {
    /// The Python frame in memory `keep` (at `base`, on `dev`).
    pub(super) fn frame(
        self,
        keep: Arc<Keep>,
        base: u64,
        dev: DLDevice,
        zero_copy: bool,
        tensors: Option<Py<PyTuple>>,
    ) -> Frame {
        let [woke, copied, checked] = self.timing;
        Frame {
            seq: self.seq,
            pts: self.pts,
            flags: self.flags,
            commit_ns: self.commit_ns,
            skipped: self.skipped,
            pushed: self.pushed,
            user: self.user,
            geometry: self.geometry,
            keep,
            base,
            dev,
            zero_copy,
            timing: [woke, copied, checked, monotonic_ns()],
            tensors: Mutex::new(tensors),
        }
    }

    /// Takes the memory out (`Held::Cached` is left behind).
    pub(super) fn take_mem(&mut self) -> Held {
        std::mem::replace(&mut self.mem, Held::Cached)
    }

    /// The Python frame of a read into a buffer of its own or a lent push
    /// buffer (`None` for a read into a cached buffer); `lent` makes the
    /// token a lent push buffer gets.
    pub(super) fn into_frame(mut self, lent: impl FnOnce(Option<Arc<Cuda>>) -> Arc<Lent>) -> Option<Frame> {
        let (keep, base, dev, zero_copy) = match self.take_mem() {
            Held::Buf(buf) => {
                let dev = view::device(buf.pool().cuda.as_ref().map(|c| c.ordinal));
                let base = buf.addr();
                (Keep::Buf(Arc::new(buf)), base, dev, false)
            }
            Held::Lent { addr, cuda } => {
                let dev = view::device(cuda.as_ref().map(|c| c.ordinal));
                (Keep::Lent(lent(cuda)), addr, dev, true)
            }
            Held::Cached => return None,
        };
        Some(self.frame(Arc::new(keep), base, dev, zero_copy, None))
    }
}

/// Copies what `src` (host pointer or device address of the ring) holds
/// into `dst`.
///
/// # Safety
/// `src` is valid for `len` bytes (host memory, or device memory of the
/// primary context) for the call.
unsafe fn copy_into(dst: &mut Dst<'_>, src: u64, len: u64) -> vramring::Result<()> {
    if let Some(d) = dst.host() {
        // SAFETY: the caller's contract on `src`; `d` is our own buffer of
        // at least `len` bytes (pool buffers hold frame_bytes); they do not
        // overlap.
        unsafe { std::ptr::copy_nonoverlapping(src as usize as *const u8, d.as_mut_ptr(), len as usize) };
        return Ok(());
    }
    let buf = dst.buf();
    let cuda = buf.pool().cuda.clone().ok_or(Error::Closed)?;
    // SAFETY: the caller's contract on `src`; the destination is a pool
    // buffer of `len` bytes that nobody else references (not yet in an
    // Arc), or a cached one the cache proved unreferenced, whose last
    // consumers' work our stream already waits for (`TensorCache::claim`).
    unsafe { cuda.copy_dtod(buf.addr(), src, len) }
}

/// Reads one frame (see the module docs): with `lend` (a push subscriber
/// with no lent frame alive), the pushed buffer itself; otherwise borrow in
/// place + copy into a pool buffer + release, which proves the copy whole.
/// A copy goes into `dest` (a cached buffer proven free) when it is given
/// and belongs to the ring's pool (`Held::Cached`). It waits until
/// `wait`'s deadline.
pub(super) fn read(
    sub: &mut Subscriber,
    sink: &mut Sink,
    lend: bool,
    dest: Option<&Buf>,
    wait: Wait,
) -> vramring::Result<Got> {
    let Wait { timeout, deadline } = wait;
    let timed_out = |e: Error| match e {
        Error::Timeout(_, what) => Error::Timeout(timeout, what),
        e => e,
    };
    loop {
        let left = wait.left();
        if lend {
            let f = sub.next(left).map_err(timed_out)?;
            let woke = monotonic_ns();
            let info = *f.info();
            let len = info.geometry().frame_bytes;
            let (mem, done) = if f.pushed() {
                // The subscriber holds this buffer until its next `next()`,
                // which the caller makes only once the frame is gone.
                let cuda = sink.cuda_for(&info)?;
                let addr = frame_addr(&f);
                (Held::Lent { addr, cuda }, woke)
            } else {
                // A frame in the subscriber's own buffer, which its next
                // read overwrites: copy it.
                let mut dst = sink.dst_for(&info, dest)?;
                match f.host_bytes() {
                    Some(h) if h.len() as u64 >= len => {
                        let d = dst.host().ok_or(Error::Closed)?;
                        d[..len as usize].copy_from_slice(&h[..len as usize]);
                    }
                    // SAFETY: the subscriber's buffer holds `len` bytes in
                    // the primary context and stays untouched while `f` lives.
                    _ => unsafe { copy_into(&mut dst, frame_addr(&f), len) }?,
                }
                (dst.held(), monotonic_ns())
            };
            return Ok(Got {
                seq: f.seq(),
                pts: f.pts(),
                flags: f.flags(),
                commit_ns: f.commit_ns(),
                skipped: f.skipped(),
                pushed: f.pushed(),
                user: f.user(),
                geometry: *info.geometry(),
                mem,
                timing: [woke, done, done],
            });
        }
        let b: Borrow<'_> = sub.borrow(left).map_err(timed_out)?;
        let woke = monotonic_ns();
        let info = *b.info();
        let mut dst = sink.dst_for(&info, dest)?;
        let len = info.geometry().frame_bytes;
        if let Some(d) = dst.host() {
            b.copy_to(d)?;
        } else {
            // SAFETY: the borrowed slot (or push buffer) is `len` bytes of
            // memory mapped in the primary context until the subscriber
            // closes; bytes may change under the copy, which `release`
            // detects.
            unsafe { copy_into(&mut dst, borrow_addr(&b), len) }?;
        }
        let copied = monotonic_ns();
        let mut got = Got {
            seq: b.seq(),
            pts: b.pts(),
            flags: b.flags(),
            commit_ns: b.commit_ns(),
            skipped: b.skipped(),
            pushed: b.pushed(),
            user: b.user(),
            geometry: *info.geometry(),
            mem: dst.held(),
            timing: [woke, copied, 0],
        };
        match b.release() {
            Ok(()) => {
                got.timing[2] = monotonic_ns();
                return Ok(got);
            }
            // Torn: the frame is lost (counted as an overrun); read the next.
            Err(Error::Overrun { .. }) if deadline.is_none_or(|d| Instant::now() < d) => continue,
            Err(Error::Overrun { .. }) => return Err(Error::Timeout(timeout, "the next frame")),
            Err(e) => return Err(e),
        }
    }
}

/// A frame's copy in this process: its device address on a CUDA ring, its
/// host address otherwise.
fn frame_addr(f: &vramring::Frame<'_>) -> u64 {
    match (f.device(), f.host_bytes()) {
        (Some(d), _) => d.as_raw(),
        (None, Some(h)) => h.as_ptr() as u64,
        (None, None) => 0,
    }
}

/// A borrowed slot (or push buffer) in this process: its device address on
/// a CUDA ring, its host mapping otherwise.
pub(super) fn borrow_addr(b: &Borrow<'_>) -> u64 {
    match (b.device(), b.host_ptr()) {
        (Some(d), _) => d.as_raw(),
        (None, Some(h)) => h as u64,
        (None, None) => 0,
    }
}
