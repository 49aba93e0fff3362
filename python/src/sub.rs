//! `vramring.Subscriber`, `vramring.Frame` and `vramring.BorrowedFrame`.
//!
//! # Where a frame's bytes go
//! A pull subscriber borrows the slot in place (`Subscriber::borrow`),
//! copies it straight into a buffer of its own frame-buffer pool (`memcpy`,
//! or `cuMemcpyDtoDAsync` + stream sync on the GPU: device to device, never
//! through the host), and releases the borrow, which proves the copy was not
//! torn; a torn copy is dropped and the next frame read. That is the one
//! copy the Rust subscriber makes too, only into a buffer the `Frame` owns.
//!
//! A push subscriber lets the publisher copy into its push buffers and, when
//! no frame it lent before is still alive, hands the buffer the publisher
//! filled to Python as it is: no copy and no GPU work in this process, as
//! in the Rust push subscriber. The subscriber holds that buffer (push-hold
//! protocol), so the publisher does not write it, until the next `next()`
//! finds the frame and all its tensors gone ([`Lent`]). While a lent frame
//! is still alive, `next()` keeps its hold where it is and reads the newest
//! pushed buffer in place instead (`Subscriber::borrow`), copies it into a
//! pool buffer and proves the copy whole, as a pull subscriber does.
//! With `reconnect`, every push frame takes that second way (a reconnect
//! replaces the push buffers, which a lent frame could not survive), and
//! so does every frame of a sequential or lossless push subscriber: its
//! every read moves its hold on to the next frame of its queue, which
//! frees the buffers before it.
//!
//! A pool buffer is reused only after the `Frame` and every tensor made from
//! it are gone, so no later `next()` writes memory a live tensor views. At
//! most `max_held` buffers (lent ones included) are out at once; past that
//! `next()` raises `FramesHeld` instead of allocating without bound.
//!
//! With `tensors=` ([`crate::cache`]) each buffer's plane tensors are made
//! once and handed out again; buffers then stay shared with those tensors,
//! and a check in `next()`, before its wait, proves a buffer unreferenced
//! before it is copied into or its push hold moves on (`next_cached`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlpark::ffi::DLDevice;
use pyo3::exceptions::{PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use vramring::ClientOptions;
use vramring::{
    monotonic_ns, BackendKind, Borrow, Delivery, Error, Geometry, Mode, RingInfo, Subscriber, SubscriberOptions,
};

use crate::cache::{Check, Consumer, TensorCache};
use crate::errors::{self, FramesHeld, IntoPy};
use crate::mem::{Buf, BufPool, Consumers, Cuda, Event, Excl};
use crate::view::{self, Keep, View};

/// One plane of a frame: where it starts, its pitch, bytes per row, rows.
#[pyclass(module = "vramring", frozen, get_all)]
#[derive(Clone, Copy)]
pub struct Plane {
    /// Byte offset of the plane inside the frame.
    pub offset: u64,
    /// Bytes from one row to the next.
    pub pitch: u64,
    /// Bytes of pixels in a row (`<= pitch`).
    pub row_bytes: u64,
    /// Rows.
    pub rows: u64,
}

#[pymethods]
impl Plane {
    fn __repr__(&self) -> String {
        format!(
            "Plane(offset={}, pitch={}, row_bytes={}, rows={})",
            self.offset, self.pitch, self.row_bytes, self.rows
        )
    }
}

pub fn planes_of(g: &Geometry) -> Vec<Plane> {
    g.planes()
        .iter()
        .map(|p| Plane {
            offset: p.offset,
            pitch: p.pitch,
            row_bytes: p.row_bytes,
            rows: p.rows,
        })
        .collect()
}

/// A frame in memory of its own (host or the ring's GPU), with its metadata.
/// Export it with DLPack: `torch.from_dlpack(frame.plane(0))`,
/// `numpy.from_dlpack(frame)`. The memory lives as long as the frame or any
/// tensor made from it.
#[pyclass(module = "vramring", frozen)]
pub struct Frame {
    /// Sequence number (1 for the publisher's first frame).
    #[pyo3(get)]
    seq: u64,
    /// Presentation timestamp (the publisher's units).
    #[pyo3(get)]
    pts: i64,
    /// `FRAME_*` flags.
    #[pyo3(get)]
    flags: u32,
    /// `CLOCK_MONOTONIC` ns when the publisher committed the frame
    /// (`time.clock_gettime_ns(time.CLOCK_MONOTONIC)` on the same host).
    #[pyo3(get)]
    commit_ns: u64,
    /// Frames skipped between the previous frame delivered and this one.
    #[pyo3(get)]
    skipped: u64,
    /// Whether the frame came by push delivery.
    #[pyo3(get)]
    pushed: bool,
    user: Vec<u8>,
    geometry: Geometry,
    keep: Arc<Keep>,
    base: u64,
    dev: DLDevice,
    /// Whether the frame is the push buffer the publisher filled, lent
    /// as it is (no copy in this process); `False` for a frame in a buffer
    /// of the subscriber's pool.
    #[pyo3(get)]
    zero_copy: bool,
    /// `CLOCK_MONOTONIC` ns: woke, copied, checked, returned (see `timing`).
    timing: [u64; 4],
    /// One array per plane (`Subscriber(tensors=)`), `None` without. In a
    /// mutex so that the garbage collector can clear it (`__clear__`): a
    /// reference cycle through the frame (`y.frame = frame`) is then
    /// collected and its buffer reused.
    tensors: Mutex<Option<Py<PyTuple>>>,
}

#[pymethods]
impl Frame {
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        // Never blocks: a frame whose tensors are being read is not in a
        // collection's way.
        if let Ok(t) = self.tensors.try_lock() {
            if let Some(t) = &*t {
                visit.call(t)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let t = self.tensors.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(t);
    }

    /// Where `next()` spent its time, as `CLOCK_MONOTONIC` ns (compare with
    /// `commit_ns`): `(woke, copied, checked, returned)`: the wait ended
    /// and the frame was found; its copy into the frame's buffer was
    /// complete (`woke` for a zero-copy frame); the copy was proven whole;
    /// the GIL was held again and the frame about to be returned.
    #[getter]
    fn timing(&self) -> (u64, u64, u64, u64) {
        let [a, b, c, d] = self.timing;
        (a, b, c, d)
    }
    /// One tensor per plane, of the library `Subscriber(tensors=)` named
    /// (NV12: `(y, uv)`, shaped as `plane(k)`). Made once per buffer and
    /// handed out again for later frames in the same buffer: no DLPack
    /// import per frame. The buffer is not written again while this frame,
    /// any of these tensors, or any view of them is alive.
    #[getter]
    fn tensors(&self, py: Python<'_>) -> PyResult<Py<PyTuple>> {
        let tensors = self.tensors.lock().unwrap_or_else(|p| p.into_inner());
        tensors.as_ref().map(|t| t.clone_ref(py)).ok_or_else(|| {
            PyValueError::new_err(
                "this frame has no tensors: make the Subscriber with tensors=\"torch\" or tensors=\"numpy\"",
            )
        })
    }
    /// The user metadata (up to 64 bytes) the publisher attached.
    #[getter]
    fn meta<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.user)
    }
    /// Pixel format name: "nv12", "p010", "gray8", "rgb8", "rgba8", "raw".
    #[getter]
    fn format(&self) -> &'static str {
        self.geometry.format.name()
    }
    /// Width in pixels.
    #[getter]
    fn width(&self) -> u32 {
        self.geometry.width
    }
    /// Height in rows.
    #[getter]
    fn height(&self) -> u32 {
        self.geometry.height
    }
    /// The planes' layout.
    #[getter]
    fn planes(&self) -> Vec<Plane> {
        planes_of(&self.geometry)
    }
    /// Bytes of the frame (every plane, pitch padding included).
    #[getter]
    fn nbytes(&self) -> u64 {
        self.geometry.frame_bytes
    }
    /// Address of the frame's first byte (host pointer or `CUdeviceptr`).
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.base
    }
    /// Plane `k` as a DLPack view: NV12's Y is `rows x width` uint8 with
    /// the pitch as row stride; its UV is `rows x width/2 x 2`. P010 is
    /// uint16; RGB/RGBA are `rows x width x 3|4`.
    fn plane(&self, k: usize) -> PyResult<View> {
        View::plane(Arc::clone(&self.keep), self.base, &self.geometry, self.dev, k)
    }
    /// The whole frame as a 1-D uint8 DLPack tensor of `nbytes` bytes.
    #[pyo3(signature = (stream=None, *, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let v = View::whole(Arc::clone(&self.keep), self.base, &self.geometry, self.dev);
        view::dlpack(&v, py, stream, max_version, dl_device, copy)
    }
    /// `(1, 0)` on a host ring, `(2, ordinal)` on a CUDA ring.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.dev.device_type.0 as i32, self.dev.device_id)
    }
    fn __repr__(&self) -> String {
        format!(
            "Frame(seq={}, pts={}, format={}, {}x{}, device={})",
            self.seq,
            self.pts,
            self.geometry.format.name(),
            self.geometry.width,
            self.geometry.height,
            if self.dev.device_type.0 == 2 { "cuda" } else { "cpu" }
        )
    }
}

/// The pool and CUDA context frames of the current publisher instance use.
#[derive(Default)]
struct Sink {
    pool: Option<Arc<BufPool>>,
    /// The geometry of the frames `pool` was made for: the tensor cache's
    /// entries are keyed by pool, and their tensors have its shapes.
    geometry: Option<Geometry>,
    cuda: Option<(Arc<Cuda>, [u8; 16])>,
    keep: usize,
}

impl Sink {
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
    fn pool_for(&mut self, info: &RingInfo) -> vramring::Result<Arc<BufPool>> {
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
    parked: Mutex<Option<Box<Subscriber>>>,
    /// The buffer's GPU (`None` on the host).
    cuda: Option<Arc<Cuda>>,
    /// Streams of the tensors exported from the frame.
    pub consumers: Consumers,
    /// Recorded on those streams when the frame's last reference went; the
    /// hold moves off the buffer only after they completed.
    events: Mutex<Vec<Event>>,
}

impl Lent {
    fn new(cuda: Option<Arc<Cuda>>) -> Arc<Lent> {
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
    fn settle(&self) {
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
enum Held {
    /// A buffer of the subscriber's pool, holding a copy.
    Buf(Buf),
    /// The cached buffer the read was given, holding a copy.
    Cached,
    /// The push buffer at `addr` (host pointer or device address), held by
    /// the subscriber; `cuda` is its GPU's context, `None` on the host.
    Lent { addr: u64, cuda: Option<Arc<Cuda>> },
}

/// What a read produced, before it becomes a Python `Frame`.
struct Got {
    seq: u64,
    pts: i64,
    flags: u32,
    commit_ns: u64,
    skipped: u64,
    pushed: bool,
    user: Vec<u8>,
    geometry: Geometry,
    mem: Held,
    /// woke, copied, checked (`CLOCK_MONOTONIC` ns).
    timing: [u64; 3],
}

impl Got {
    /// The Python frame in memory `keep` (at `base`, on `dev`).
    fn frame(self, keep: Arc<Keep>, base: u64, dev: DLDevice, zero_copy: bool, tensors: Option<Py<PyTuple>>) -> Frame {
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
    fn take_mem(&mut self) -> Held {
        std::mem::replace(&mut self.mem, Held::Cached)
    }

    /// The Python frame of a read into a buffer of its own or a lent push
    /// buffer (`None` for a read into a cached buffer); `lent` makes the
    /// token a lent push buffer gets.
    fn into_frame(mut self, lent: impl FnOnce(Option<Arc<Cuda>>) -> Arc<Lent>) -> Option<Frame> {
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

/// How long a `next()` may wait: the caller's timeout (what a `Timeout`
/// says) and the deadline it sets (`None`: past what `Instant` can hold,
/// which never ends).
#[derive(Debug, Clone, Copy)]
struct Wait {
    timeout: Duration,
    deadline: Option<Instant>,
}

impl Wait {
    fn from_now(timeout: Duration) -> Wait {
        Wait {
            timeout,
            deadline: Instant::now().checked_add(timeout),
        }
    }

    /// What is left of it now.
    fn left(self) -> Duration {
        self.deadline
            .map_or(Duration::MAX, |d| d.saturating_duration_since(Instant::now()))
    }
}

fn timeout_of(secs: f64) -> PyResult<Duration> {
    seconds("timeout", secs)
}

/// `secs` as a duration; a `ValueError` naming `what` when it is not one.
fn seconds(what: &str, secs: f64) -> PyResult<Duration> {
    if !secs.is_finite() || secs < 0.0 {
        return Err(PyValueError::new_err(format!(
            "{what} must be a finite number of seconds >= 0, got {secs}"
        )));
    }
    Duration::try_from_secs_f64(secs)
        .map_err(|_| PyValueError::new_err(format!("{what} of {secs} seconds is too long")))
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
fn read(sub: &mut Subscriber, sink: &mut Sink, lend: bool, dest: Option<&Buf>, wait: Wait) -> vramring::Result<Got> {
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

/// A delivery's name in Python.
fn delivery_name(d: Delivery) -> &'static str {
    match d {
        Delivery::Push => "push",
        _ => "pull",
    }
}

/// A subscriber to a vramring publisher. See the module docs for the
/// copy each frame costs.
#[pyclass(module = "vramring", name = "Subscriber")]
pub struct PySubscriber {
    // Field order matters: `borrow` points into `*sub` and must drop first.
    borrow: Excl<Option<Borrow<'static>>>,
    sub: Excl<Option<Box<Subscriber>>>,
    sink: Sink,
    /// The newest push buffer lent to Python (see [`Lent`]).
    lent: Option<Arc<Lent>>,
    /// Frames handed out zero-copy.
    lent_count: u64,
    /// A latest push subscriber: its pushed buffer may be lent.
    push: bool,
    reconnect: bool,
    iter_timeout: Duration,
    /// `Subscriber(prepare_ahead=)`: how long before it would start
    /// spinning for the next frame `next()` prepares for it
    /// (`Subscriber::park_until_due`).
    ahead: Duration,
    path: String,
    /// `Subscriber(tensors=)`: tensors made once per buffer (`crate::cache`).
    cache: Option<TensorCache>,
}

impl Drop for PySubscriber {
    fn drop(&mut self) {
        self.end_borrow();
        // The cache's tensors first: what of them the user still holds is
        // all that may keep a push buffer (and so the subscriber) now.
        if let Some(c) = &mut self.cache {
            c.clear();
        }
        // A lent frame outlives us: it keeps the Rust subscriber (its hold
        // and its mapping of the buffer); otherwise it closes here, once
        // the last lent frame's GPU work is done (waited for without the
        // GIL, which that work may need: a host callback).
        if let Some(s) = self.sub.get_mut().take() {
            if let Some((s, lent)) = self.park(s) {
                // SAFETY: a pyclass is dropped by its deallocator, with the
                // GIL held by this thread.
                let py = unsafe { Python::assume_attached() };
                py.detach(move || {
                    drop(lent);
                    drop(s);
                });
            }
        }
    }
}

impl PySubscriber {
    fn sub(&mut self) -> PyResult<&mut Subscriber> {
        if self.borrow.get_mut().is_some() {
            return Err(PyValueError::new_err(
                "a borrow of this subscriber is still open: release it (leave its `with` block) first",
            ));
        }
        self.sub
            .get_mut()
            .as_deref_mut()
            .ok_or_else(|| errors::to_py(Error::Closed))
    }

    fn end_borrow(&mut self) -> Option<bool> {
        self.borrow.get_mut().take().map(|b| b.release().is_ok())
    }

    /// Whether a frame lent by push (or a tensor made from it) is alive.
    fn lent_alive(&mut self) -> bool {
        // `get_mut` is `Some` only when ours is the last `Arc`; its check
        // is an Acquire, after every other owner's Release drop, so their
        // reads of the buffer happen before we let the hold go.
        self.lent.as_mut().is_some_and(|l| Arc::get_mut(l).is_none())
    }

    /// Hands the Rust subscriber `s` to the lent frame still alive, if any
    /// (it closes when that frame and its tensors are gone); gives it back
    /// when there is none, with the token of the frame lent last: the work
    /// its consumers queued on the buffer completes before `s` (and its
    /// mapping) can go, and dropping that last `Arc` waits for it (do that
    /// without the GIL, before `s` goes).
    fn park(&mut self, s: Box<Subscriber>) -> Option<(Box<Subscriber>, Option<Arc<Lent>>)> {
        if !self.lent_alive() {
            return Some((s, self.lent.take()));
        }
        let l = self.lent.take()?;
        *l.parked.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
        None
    }

    /// Frame buffers alive now: the pool's and a lent push buffer.
    fn held(&mut self) -> usize {
        self.sink.pool.as_ref().map_or(0, |p| p.live()) + usize::from(self.lent_alive())
    }

    /// `next()`: parked (without the GIL) until shortly before the next
    /// frame is due, so that the checks made before the wait, the wait's
    /// end and the frame's way back to Python all run warm, just ahead of
    /// the frame, instead of an interval earlier (ADR 0030).
    fn next_frame(&mut self, py: Python<'_>, timeout: Duration) -> PyResult<Frame> {
        let wait = Wait::from_now(timeout);
        let cached = self.cache.as_ref().is_some_and(TensorCache::on);
        // Not when the read is bound to fail on `max_held` (checked again
        // there): that error comes at once. The cache's count needs its
        // scan, which is part of the work prepared after the park.
        let full = !cached && self.held() >= self.sink.keep;
        if !self.ahead.is_zero() && !full {
            let ahead = self.ahead;
            let sub = self.sub()?;
            py.detach(|| sub.park_until_due(ahead, wait.left()));
        }
        if cached {
            return self.next_cached(py, wait);
        }
        self.next_uncached(py, wait)
    }

    fn next_uncached(&mut self, py: Python<'_>, wait: Wait) -> PyResult<Frame> {
        let held = self.held();
        if held >= self.sink.keep {
            return Err(FramesHeld::new_err(format!(
                "{held} frames (or tensors made from them) are still alive, the subscriber's max_held; \
                 drop some (del frame, tensor) or raise max_held"
            )));
        }
        // Lend the pushed buffer only when no frame lent before is alive:
        // `Subscriber::next` moves the hold off that buffer.
        let lend = self.push && !self.reconnect && !self.lent_alive();
        // `Subscriber::next` is about to move the hold off the buffer lent
        // last (its frame is gone): the consumers' work on it must be done.
        let settle = if lend { self.lent.take() } else { None };
        let mut sink = std::mem::take(&mut self.sink);
        let sub = match self.sub() {
            Ok(s) => s,
            Err(e) => {
                self.sink = sink;
                return Err(e);
            }
        };
        let got = py.detach(|| {
            if let Some(l) = &settle {
                l.settle();
            }
            if let Some(p) = &sink.pool {
                p.settle();
            }
            read(sub, &mut sink, lend, None, wait)
        });
        self.sink = sink;
        let got = got.py_err()?;
        let lent = &mut self.lent;
        let count = &mut self.lent_count;
        let mut frame = got
            .into_frame(|cuda| {
                let l = Lent::new(cuda);
                *lent = Some(Arc::clone(&l));
                *count += 1;
                l
            })
            .ok_or_else(|| internal("an uncached read returned a cached buffer"))?;
        // `tensors=` with the cache off: imported per frame, each holding
        // the frame's memory through its DLPack context.
        if let Some(c) = &mut self.cache {
            let t = c.per_frame(py, &frame.keep, frame.base, &frame.geometry, frame.dev)?;
            frame.tensors = Mutex::new(Some(t));
        }
        Ok(frame)
    }

    /// `next()` with tensors cached (`crate::cache`). The checks that let
    /// a buffer be written again, and the aliases handed out next, are made
    /// here, before the wait and with the GIL; after the wait the frame's
    /// path calls nothing in Python but the `Frame`'s allocation.
    fn next_cached(&mut self, py: Python<'_>, within: Wait) -> PyResult<Frame> {
        let info = *self.sub()?.info();
        let pool = self.sink.pool_for(&info).py_err()?;
        let cache = self.cache.as_mut().ok_or_else(|| internal("no tensor cache"))?;
        let (mut dest, free) = cache.scan_pool(py, &pool)?;
        let lent = cache.check_lent(py)?;
        let lent_busy = matches!(lent, Check::Busy);
        // The host waits for the consumers' work on the push buffer lent
        // last before `Subscriber::next` moves the hold off it.
        let wait = match lent {
            Check::Free(w) => w,
            _ => None,
        };
        let held = pool.live().saturating_sub(free) + usize::from(lent_busy);
        if held >= self.sink.keep {
            if let Some((c, evs)) = wait {
                py.detach(|| c.sync_events(evs));
            }
            return Err(FramesHeld::new_err(format!(
                "{held} frames (or tensors made from them, or views of those) are still alive, the \
                 subscriber's max_held; drop some (del frame, tensor) or raise max_held"
            )));
        }
        // A push buffer is lent only when nothing of the one lent before is
        // alive: `Subscriber::next` moves the hold off it.
        let lend = self.push && !self.reconnect && !lent_busy;
        if dest.is_none() && !lend {
            // A new pool buffer for the copy, its tensors made now.
            let buf = pool.take().py_err()?;
            let addr = buf.addr();
            let dev = view::device(pool.cuda.as_ref().map(|c| c.ordinal));
            let mem = Arc::new(Keep::Buf(Arc::new(buf)));
            dest = cache.add(py, mem, addr, info.geometry(), dev, pool.cuda.clone())?;
            if !cache.on() {
                // Its count could not be proven: per frame from now on.
                if let Some((c, evs)) = wait {
                    py.detach(|| c.sync_events(evs));
                }
                return self.next_uncached(py, within);
            }
        }
        let dest_buf = dest.and_then(|i| cache.buf(i));
        let mut sink = std::mem::take(&mut self.sink);
        let sub = match self.sub() {
            Ok(s) => s,
            Err(e) => {
                self.sink = sink;
                return Err(e);
            }
        };
        let got = py.detach(|| {
            if let Some((c, evs)) = wait {
                c.sync_events(evs);
            }
            if let Some(p) = &sink.pool {
                p.settle();
            }
            read(sub, &mut sink, lend, dest_buf.as_deref(), within)
        });
        self.sink = sink;
        let mut got = got.py_err()?;
        let cache = self.cache.as_mut().ok_or_else(|| internal("no tensor cache"))?;
        // The entry of the buffer the frame is in; a buffer seen first (a
        // push buffer, or a copy the cache had not prepared for: the ring
        // changed during the wait) gets its tensors made now.
        let (i, zero_copy) = match got.take_mem() {
            Held::Cached => (dest.ok_or_else(|| internal("a copy into no cached buffer"))?, false),
            Held::Buf(buf) => {
                let addr = buf.addr();
                let cuda = buf.pool().cuda.clone();
                let dev = view::device(cuda.as_ref().map(|c| c.ordinal));
                let mem = Arc::new(Keep::Buf(Arc::new(buf)));
                match cache.add(py, Arc::clone(&mem), addr, &got.geometry, dev, cuda)? {
                    Some(i) => (i, false),
                    None => {
                        let t = cache.per_frame(py, &mem, addr, &got.geometry, dev)?;
                        return Ok(got.frame(mem, addr, dev, false, Some(t)));
                    }
                }
            }
            Held::Lent { addr, cuda } => {
                self.lent_count += 1;
                match cache.find_push(addr) {
                    Some(i) => (i, true),
                    None => {
                        let dev = view::device(cuda.as_ref().map(|c| c.ordinal));
                        let lent = &mut self.lent;
                        let keep = cache.push_keep(|| {
                            // The push buffers' owner: where the Rust
                            // subscriber is parked when it closes with
                            // tensors of them alive (`park`).
                            let l = Lent::new(cuda.clone());
                            *lent = Some(Arc::clone(&l));
                            l
                        });
                        match cache.add(py, Arc::clone(&keep), addr, &got.geometry, dev, cuda)? {
                            Some(i) => (i, true),
                            None => {
                                let t = cache.per_frame(py, &keep, addr, &got.geometry, dev)?;
                                return Ok(got.frame(keep, addr, dev, true, Some(t)));
                            }
                        }
                    }
                }
            }
        };
        let h = cache.hand_out(i)?;
        Ok(got.frame(h.keep, h.addr, h.dev, zero_copy, Some(h.tensors)))
    }

    /// Frame buffers alive now, for `stats()`.
    fn held_now(&mut self, py: Python<'_>) -> PyResult<usize> {
        match self.cache.as_mut().filter(|c| c.on()) {
            Some(c) => {
                let pool = self.sink.pool.clone();
                let (free, lent_busy) = c.count_free(py, pool.as_ref())?;
                let live = pool.as_ref().map_or(0, |p| p.live());
                Ok(live.saturating_sub(free) + usize::from(lent_busy))
            }
            None => Ok(self.held()),
        }
    }
}

/// An error for a broken invariant of this module.
fn internal(what: &str) -> PyErr {
    pyo3::exceptions::PyRuntimeError::new_err(format!("vramring internal error: {what}"))
}

/// `Subscriber(stream=)`: an int (`CUstream`; 0, torch's name for the
/// legacy default stream, is 1 as DLPack names it; -1: none) or an object
/// with `cuda_stream` (a `torch.cuda.Stream`).
fn stream_arg(s: Option<&Bound<'_, PyAny>>) -> PyResult<Option<isize>> {
    let Some(s) = s.filter(|s| !s.is_none()) else {
        return Ok(None);
    };
    let v: isize = match s.extract() {
        Ok(v) => v,
        Err(_) => s.getattr("cuda_stream").and_then(|a| a.extract()).map_err(|_| {
            PyValueError::new_err("stream must be an int (a CUstream) or have cuda_stream (a torch.cuda.Stream)")
        })?,
    };
    match v {
        0 => Ok(Some(1)),
        v if v >= -1 => Ok(Some(v)),
        v => Err(PyValueError::new_err(format!(
            "stream must be -1 or a CUstream (>= 0), got {v}"
        ))),
    }
}

#[pymethods]
impl PySubscriber {
    /// Connects to the publisher whose socket is `path`.
    ///
    /// `mode`: "latest" (default; jump to the newest frame) or "sequential"
    /// (every frame in order, gaps counted). `lossless`: the publisher waits
    /// for this reader (its policy must be "lossless"; implies sequential).
    /// `push`: the publisher copies frames into this subscriber's buffers
    /// (any mode); without it the subscriber pulls where the publisher
    /// hands out its pool and is pushed to where it does not (a CUDA ring
    /// hands its pool only to its own uid by default); `delivery` says
    /// which. `reconnect`: follow the publisher across restarts.
    /// `timeout`: seconds `for frame in sub` waits for each frame.
    /// `max_held`: frames (and tensors made from them) alive at once.
    /// `spin`: seconds `next()` spins before it parks the thread (default
    /// 50 µs, as in Rust); longer costs CPU and saves the wake-up.
    /// `prepare_ahead`: once the publisher's cadence is known, `next()`
    /// first parks until this many seconds before it would start spinning
    /// for the next frame, then prepares for it (default 500 µs; 0:
    /// prepare at once): a frame reaches Python sooner when that work and
    /// its way back run warm.
    /// `tensors`: "torch" or "numpy": `frame.tensors` holds one array per
    /// plane, made once per buffer and handed out again (no DLPack import
    /// per frame); a buffer is written again only when nothing of its last
    /// frame (tensors, views of them, exports) is alive. `stream`: the CUDA
    /// stream those tensors are used on (an int, or a `torch.cuda.Stream`;
    /// default: torch's current stream when the first tensors are made).
    #[new]
    #[pyo3(signature = (path, *, name=None, mode=None, lossless=false, push=false, reconnect=false,
                        timeout=5.0, connect_timeout=5.0, max_held=16, spin=None, prepare_ahead=0.0005, tensors=None,
                        stream=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        name: Option<String>,
        mode: Option<String>,
        lossless: bool,
        push: bool,
        reconnect: bool,
        timeout: f64,
        connect_timeout: f64,
        max_held: usize,
        spin: Option<f64>,
        prepare_ahead: f64,
        tensors: Option<String>,
        stream: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mode = match mode.as_deref() {
            None => {
                if lossless {
                    Mode::Sequential
                } else {
                    Mode::Latest
                }
            }
            Some("latest") => Mode::Latest,
            Some("sequential") => Mode::Sequential,
            Some(other) => {
                return Err(PyValueError::new_err(format!(
                    "mode must be \"latest\" or \"sequential\", got {other:?}"
                )))
            }
        };
        if lossless && mode == Mode::Latest {
            return Err(PyValueError::new_err(
                "a lossless subscriber reads every frame: use mode=\"sequential\" or leave mode out",
            ));
        }
        if max_held == 0 {
            return Err(PyValueError::new_err("max_held must be at least 1"));
        }
        let iter_timeout = timeout_of(timeout)?;
        let ahead = seconds("prepare_ahead", prepare_ahead)?;
        let mut opts = SubscriberOptions::default()
            .mode(mode)
            .lossless(lossless)
            .push(push)
            .reconnect(reconnect);
        if let Some(n) = name {
            opts = opts.name(n);
        }
        opts.client.connect_timeout = timeout_of(connect_timeout)?;
        if let Some(s) = spin {
            opts.client.spin = seconds("spin", s)?;
        }
        let stream = stream_arg(stream.as_ref())?;
        let consumer = tensors.as_deref().map(Consumer::parse).transpose()?;
        if stream.is_some() && consumer.is_none() {
            return Err(PyValueError::new_err(
                "stream names the stream of Frame.tensors: give tensors=\"torch\" too",
            ));
        }
        // The library is imported before connecting: importing torch takes
        // seconds, which a lossless publisher would wait for.
        let cache = consumer.map(|c| TensorCache::new(py, c, stream)).transpose()?;
        let shown = path.display().to_string();
        let sub = py.detach(|| Subscriber::connect(&path, opts)).py_err()?;
        if consumer == Some(Consumer::Numpy) && sub.backend() == BackendKind::Cuda {
            return Err(errors::to_py(Error::WrongBackend {
                what: "tensors=\"numpy\" (numpy arrays are host memory; use tensors=\"torch\")",
                backend: "cuda",
            }));
        }
        // A latest push reader's buffer can be lent to Python (see the
        // module docs); a queued one's cannot.
        let lendable = sub.delivery() == Delivery::Push && mode == Mode::Latest && !lossless;
        Ok(PySubscriber {
            borrow: Excl::new(None),
            sub: Excl::new(Some(Box::new(sub))),
            sink: Sink {
                keep: max_held,
                ..Sink::default()
            },
            lent: None,
            lent_count: 0,
            push: lendable,
            reconnect,
            iter_timeout,
            ahead,
            path: shown,
            cache,
        })
    }

    /// Waits at most `timeout` seconds for the next frame and returns it in
    /// memory of its own. Raises `Timeout`, `ProducerGone` (after the frames
    /// committed before the publisher went away were read), `Evicted`,
    /// `FramesHeld`.
    #[pyo3(signature = (timeout=5.0))]
    fn next(&mut self, py: Python<'_>, timeout: f64) -> PyResult<Frame> {
        let t = timeout_of(timeout)?;
        self.next_frame(py, t)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// `for frame in sub:` ends when the publisher is gone (unless
    /// `reconnect`); raises `Timeout` when no frame came within `timeout`.
    fn __next__(&mut self, py: Python<'_>) -> PyResult<Frame> {
        let t = self.iter_timeout;
        match self.next_frame(py, t) {
            Err(e) if e.is_instance_of::<errors::ProducerGone>(py) => {
                if self.reconnect {
                    self.next_frame(py, t)
                } else {
                    Err(PyStopIteration::new_err(()))
                }
            }
            r => r,
        }
    }

    /// Lends the next frame in place, without a copy. Use as a context
    /// manager: `with sub.borrow(1.0) as b: ...`; after the block
    /// `b.intact` says whether the publisher left the slot alone meanwhile.
    /// The subscriber cannot be used until the borrow is released. A push
    /// subscriber lends its newest pushed buffer without holding it.
    #[pyo3(signature = (timeout=5.0))]
    fn borrow(slf: Bound<'_, Self>, timeout: f64) -> PyResult<BorrowedFrame> {
        let py = slf.py();
        let t = timeout_of(timeout)?;
        let mut me = slf.borrow_mut();
        let sub = me.sub()?;
        let b: Borrow<'_> = py.detach(|| sub.borrow(t)).py_err()?;
        let info = *b.info();
        let (seq, pts, flags, commit_ns, user, addr) =
            (b.seq(), b.pts(), b.flags(), b.commit_ns(), b.user(), borrow_addr(&b));
        // SAFETY: `b` borrows the Subscriber in `me.sub`, a Box whose heap
        // address does not change and which is not dropped or touched while
        // `me.borrow` is Some: every other use goes through `sub()`, which
        // refuses while a borrow is open; `close` and `end_borrow` take the
        // borrow out first; and the field order drops `borrow` before `sub`.
        let b: Borrow<'static> = unsafe { std::mem::transmute::<Borrow<'_>, Borrow<'static>>(b) };
        *me.borrow.get_mut() = Some(b);
        drop(me);
        Ok(BorrowedFrame {
            owner: slf.unbind(),
            seq,
            pts,
            flags,
            commit_ns,
            user,
            geometry: *info.geometry(),
            addr,
            cuda: info.backend() == BackendKind::Cuda,
            intact: None,
        })
    }

    /// Counters: delivered, dropped, overruns, last_seq, reconnects, pushed,
    /// delivery ("pull" or "push", as the publisher granted);
    /// held (frame buffers alive now), zero_copy (push frames handed out
    /// without a copy) and allocated (frame buffers the pool ever
    /// allocated: they are reused, not made per frame); with `tensors=`:
    /// tensors ("torch" or "numpy", else None), tensors_cache ("on", or
    /// "off: " and why, when tensors are imported per frame instead),
    /// tensors_made (plane tensors imported: once per buffer while the
    /// cache is on), tensors_reused (frames handed tensors made for an
    /// earlier frame in the same buffer), tensors_busy (checks that found a
    /// buffer still referenced, so that it was skipped: the frame went to
    /// another buffer, or was a copy instead of a zero-copy push buffer);
    /// the cadence wait's cadence_windows (frames it planned a spin window
    /// for), cadence_hits (frames caught spinning in it), cadence_misses
    /// (windows that ended without their frame), cadence_early (frames that
    /// came before their window's spin began: woken from a park, or already
    /// there when the wait began).
    fn stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let held = self.held_now(py)?;
        let allocated = self.sink.pool.as_ref().map_or(0, |p| p.allocated());
        let s = self.sub()?.stats();
        let d = PyDict::new(py);
        d.set_item("delivered", s.delivered)?;
        d.set_item("dropped", s.dropped)?;
        d.set_item("overruns", s.overruns)?;
        d.set_item("last_seq", s.last_seq)?;
        d.set_item("reconnects", s.reconnects)?;
        d.set_item("pushed", s.pushed)?;
        d.set_item("delivery", delivery_name(s.delivery))?;
        d.set_item("held", held)?;
        d.set_item("zero_copy", self.lent_count)?;
        d.set_item("allocated", allocated)?;
        let c = self.cache.as_ref();
        d.set_item("tensors", c.map(|c| c.consumer().name()))?;
        d.set_item("tensors_cache", c.map(TensorCache::state))?;
        d.set_item("tensors_made", c.map_or(0, |c| c.made))?;
        d.set_item("tensors_reused", c.map_or(0, |c| c.reused))?;
        d.set_item("tensors_busy", c.map_or(0, |c| c.busy))?;
        let w = self.sub()?.cadence();
        d.set_item("cadence_windows", w.windows)?;
        d.set_item("cadence_hits", w.hits)?;
        d.set_item("cadence_misses", w.misses)?;
        d.set_item("cadence_early", w.early)?;
        Ok(d)
    }

    /// How frames arrive: "pull" or "push", as the publisher granted.
    #[getter]
    fn delivery(&mut self) -> PyResult<&'static str> {
        Ok(delivery_name(self.sub()?.delivery()))
    }
    /// "host" or "cuda".
    #[getter]
    fn backend(&mut self) -> PyResult<&'static str> {
        Ok(self.sub()?.backend().name())
    }
    /// Pixel format name.
    #[getter]
    fn format(&mut self) -> PyResult<&'static str> {
        Ok(self.sub()?.geometry().format.name())
    }
    /// Width in pixels.
    #[getter]
    fn width(&mut self) -> PyResult<u32> {
        Ok(self.sub()?.geometry().width)
    }
    /// Height in rows.
    #[getter]
    fn height(&mut self) -> PyResult<u32> {
        Ok(self.sub()?.geometry().height)
    }
    /// The planes' layout.
    #[getter]
    fn planes(&mut self) -> PyResult<Vec<Plane>> {
        Ok(planes_of(self.sub()?.geometry()))
    }
    /// The publisher instance (changes on reconnect).
    #[getter]
    fn epoch(&mut self) -> PyResult<u64> {
        Ok(self.sub()?.epoch())
    }
    /// Whether push delivery is active (the publisher mapped our buffers).
    #[getter]
    fn push_active(&mut self) -> PyResult<bool> {
        Ok(self.sub()?.push_active())
    }
    /// The socket path.
    #[getter]
    fn path(&self) -> String {
        self.path.clone()
    }

    /// Says goodbye to the publisher and releases the ring's memory. Frames
    /// already returned stay valid: a zero-copy push frame still alive
    /// keeps the connection and its buffer until it and its tensors are
    /// gone. Idempotent.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        self.end_borrow();
        // The cache's own tensors go; those the user holds keep their
        // buffers (and a push buffer's hold, through `park`).
        if let Some(c) = &mut self.cache {
            c.clear();
        }
        let parked = self.sub.get_mut().take().map(|s| self.park(s));
        if let Some(Some((mut s, lent))) = parked {
            let r = py.detach(|| {
                drop(lent);
                s.close()
            });
            drop(s);
            r.py_err()?;
        }
        Ok(())
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&mut self) -> String {
        format!("Subscriber({:?}, open={})", self.path, self.sub.get_mut().is_some())
    }
}

/// A frame lent in place by `Subscriber.borrow`. No copy: read it through
/// `data_ptr` (or `tobytes()` on a host ring) inside the `with` block; on
/// exit `intact` says whether it stayed whole.
#[pyclass(module = "vramring")]
pub struct BorrowedFrame {
    owner: Py<PySubscriber>,
    /// Sequence number.
    #[pyo3(get)]
    seq: u64,
    /// Presentation timestamp.
    #[pyo3(get)]
    pts: i64,
    /// Flags.
    #[pyo3(get)]
    flags: u32,
    /// `CLOCK_MONOTONIC` ns of the commit.
    #[pyo3(get)]
    commit_ns: u64,
    user: Vec<u8>,
    geometry: Geometry,
    addr: u64,
    cuda: bool,
    intact: Option<bool>,
}

#[pymethods]
impl BorrowedFrame {
    /// User metadata.
    #[getter]
    fn meta<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.user)
    }
    /// Bytes of the frame.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.geometry.frame_bytes
    }
    /// The planes' layout.
    #[getter]
    fn planes(&self) -> Vec<Plane> {
        planes_of(&self.geometry)
    }
    /// Address of the slot in this process (host pointer, or `CUdeviceptr`
    /// in the device's primary context), read-only; valid until release.
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.addr
    }
    /// `None` while lent; after release, whether the frame stayed intact.
    #[getter]
    fn intact(&self) -> Option<bool> {
        self.intact
    }
    /// A copy of the slot's bytes (host ring only); may be torn, which
    /// `release()` / `intact` then says.
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        if self.intact.is_some() {
            return Err(errors::to_py(Error::Closed));
        }
        if self.cuda {
            return Err(errors::to_py(Error::WrongBackend {
                what: "CPU reads of a borrowed slot",
                backend: "cuda",
            }));
        }
        let mut me = self.owner.borrow_mut(py);
        let b = me
            .borrow
            .get_mut()
            .as_ref()
            .ok_or_else(|| errors::to_py(Error::Closed))?;
        let mut v = vec![0u8; self.geometry.frame_bytes as usize];
        b.copy_to(&mut v).py_err()?;
        Ok(PyBytes::new(py, &v))
    }
    /// Ends the borrow; returns whether the frame stayed intact. Idempotent.
    fn release(&mut self, py: Python<'_>) -> PyResult<bool> {
        if let Some(i) = self.intact {
            return Ok(i);
        }
        let i = busy(self.owner.try_borrow_mut(py))?.end_borrow().unwrap_or(false);
        self.intact = Some(i);
        Ok(i)
    }
    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }
    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.release(py)?;
        Ok(false)
    }
}

/// A clear error instead of PyO3's when another thread is inside a call on
/// the same object (it holds it while the GIL is released).
pub fn busy<T>(r: Result<T, pyo3::pycell::PyBorrowMutError>) -> PyResult<T> {
    r.map_err(|_| {
        pyo3::exceptions::PyRuntimeError::new_err(
            "the object is in use by another thread (a call on it is waiting); use one object per thread",
        )
    })
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
fn borrow_addr(b: &Borrow<'_>) -> u64 {
    match (b.device(), b.host_ptr()) {
        (Some(d), _) => d.as_raw(),
        (None, Some(h)) => h as u64,
        (None, None) => 0,
    }
}
