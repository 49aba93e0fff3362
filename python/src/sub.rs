//! `vramring.Subscriber`, `vramring.Frame` and `vramring.BorrowedFrame`.
//!
//! # Where a frame's bytes go
//! A pull subscriber borrows the slot in place (`Subscriber::borrow`),
//! copies it straight into a buffer of its own frame-buffer pool (`memcpy`,
//! or `cuMemcpyDtoDAsync` + stream sync on the GPU: device to device, never
//! through the host), and releases the borrow, which proves the copy was not
//! torn; a torn copy is dropped and the next frame read. That is the one
//! copy the Rust subscriber makes too, only into a buffer the `Frame` owns.
//! A push subscriber lets the publisher copy into its push buffers and then
//! copies that buffer into a pool buffer (one device-to-device copy in this
//! process; the Rust push subscriber makes none).
//!
//! A pool buffer is reused only after the `Frame` and every tensor made from
//! it are gone, so no later `next()` writes memory a live tensor views. At
//! most `max_held` buffers are out at once; past that `next()` raises
//! `FramesHeld` instead of allocating without bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlpark::ffi::DLDevice;
use pyo3::exceptions::{PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use vramring::layout::{RingInfo, BACKEND_CUDA};
use vramring::{Borrow, Error, Geometry, Mode, Subscriber, SubscriberOptions};

use crate::errors::{self, FramesHeld, IntoPy};
use crate::mem::{Buf, BufPool, Cuda, Excl};
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
    seq: u64,
    pts: i64,
    flags: u32,
    commit_ns: u64,
    skipped: u64,
    pushed: bool,
    user: Vec<u8>,
    geometry: Geometry,
    keep: Arc<Keep>,
    base: u64,
    dev: DLDevice,
}

#[pymethods]
impl Frame {
    /// Sequence number (1 for the publisher's first frame).
    #[getter]
    fn seq(&self) -> u64 {
        self.seq
    }
    /// Presentation timestamp (the publisher's units).
    #[getter]
    fn pts(&self) -> i64 {
        self.pts
    }
    /// `FRAME_*` flags.
    #[getter]
    fn flags(&self) -> u32 {
        self.flags
    }
    /// `CLOCK_MONOTONIC` ns when the publisher committed the frame
    /// (`time.clock_gettime_ns(time.CLOCK_MONOTONIC)` on the same host).
    #[getter]
    fn commit_ns(&self) -> u64 {
        self.commit_ns
    }
    /// Frames skipped between the previous frame delivered and this one.
    #[getter]
    fn skipped(&self) -> u64 {
        self.skipped
    }
    /// Whether the frame came by push delivery.
    #[getter]
    fn pushed(&self) -> bool {
        self.pushed
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
    cuda: Option<(Arc<Cuda>, [u8; 16])>,
    keep: usize,
}

impl Sink {
    /// A buffer for a frame of ring `info`; a new pool when the ring changed
    /// (a reconnect to a publisher with another geometry or device).
    fn buf_for(&mut self, info: &RingInfo) -> vramring::Result<Buf> {
        let cuda = if info.backend == BACKEND_CUDA {
            match &self.cuda {
                Some((c, uuid)) if *uuid == info.device_uuid => Some(Arc::clone(c)),
                _ => {
                    let c = Cuda::for_uuid(&info.device_uuid)?;
                    self.cuda = Some((Arc::clone(&c), info.device_uuid));
                    Some(c)
                }
            }
        } else {
            None
        };
        let bytes = info.geometry.frame_bytes;
        let fits = self.pool.as_ref().is_some_and(|p| {
            p.bytes == bytes
                && match (&p.cuda, &cuda) {
                    (None, None) => true,
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    _ => false,
                }
        });
        if !fits {
            self.pool = Some(BufPool::new(cuda, bytes, self.keep));
        }
        self.pool.as_ref().ok_or(Error::Closed)?.take()
    }
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
    buf: Buf,
}

impl Got {
    fn into_frame(self) -> Frame {
        let dev = view::device(self.buf.pool().cuda.as_ref().map(|c| c.ordinal));
        let base = self.buf.addr();
        Frame {
            seq: self.seq,
            pts: self.pts,
            flags: self.flags,
            commit_ns: self.commit_ns,
            skipped: self.skipped,
            pushed: self.pushed,
            user: self.user,
            geometry: self.geometry,
            keep: Arc::new(Keep::Buf(Arc::new(self.buf))),
            base,
            dev,
        }
    }
}

fn timeout_of(secs: f64) -> PyResult<Duration> {
    if !secs.is_finite() || secs < 0.0 {
        return Err(PyValueError::new_err(format!(
            "timeout must be a finite number of seconds >= 0, got {secs}"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Copies what `src` (host pointer or device address of ring `info`) holds
/// into `buf`.
///
/// # Safety
/// `src` is valid for `frame_bytes` bytes (host memory, or device memory
/// of the primary context) for the call.
unsafe fn copy_into(buf: &mut Buf, src: u64, len: u64) -> vramring::Result<()> {
    if let Some(dst) = buf.host_mut() {
        // SAFETY: the caller's contract on `src`; `dst` is our own buffer
        // of at least `len` bytes (pool buffers hold frame_bytes); they do
        // not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src as usize as *const u8, dst.as_mut_ptr(), len as usize) };
        return Ok(());
    }
    let cuda = buf.pool().cuda.clone().ok_or(Error::Closed)?;
    // SAFETY: the caller's contract on `src`; the destination is a pool
    // buffer of `len` bytes nobody else references (not yet in an Arc).
    unsafe { cuda.copy_dtod(buf.addr(), src, len) }
}

/// Reads one frame (see the module docs): pull by borrow + copy + release,
/// push by next + copy.
fn read(sub: &mut Subscriber, sink: &mut Sink, push: bool, timeout: Duration) -> vramring::Result<Got> {
    let deadline = Instant::now() + timeout;
    let timed_out = |e: Error| match e {
        Error::Timeout(_, what) => Error::Timeout(timeout, what),
        e => e,
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if push {
            let f = sub.next(left).map_err(timed_out)?;
            let info = *f.info();
            let mut buf = sink.buf_for(&info)?;
            let len = info.geometry.frame_bytes;
            match f.host_bytes() {
                Some(h) if h.len() as u64 >= len => {
                    let dst = buf.host_mut().ok_or(Error::Closed)?;
                    dst[..len as usize].copy_from_slice(&h[..len as usize]);
                }
                // SAFETY: the frame's buffer (push buffer or the
                // subscriber's copy) holds `len` bytes in the primary
                // context and stays untouched while `f` lives.
                _ => unsafe { copy_into(&mut buf, f.addr(), len) }?,
            }
            return Ok(Got {
                seq: f.seq(),
                pts: f.pts(),
                flags: f.flags(),
                commit_ns: f.commit_ns(),
                skipped: f.skipped(),
                pushed: f.pushed(),
                user: f.user(),
                geometry: info.geometry,
                buf,
            });
        }
        let b: Borrow<'_> = sub.borrow(left).map_err(timed_out)?;
        let info = *b.info();
        let mut buf = sink.buf_for(&info)?;
        let len = info.geometry.frame_bytes;
        if let Some(dst) = buf.host_mut() {
            b.copy_to(dst)?;
        } else {
            // SAFETY: the borrowed slot is `len` bytes of the imported pool,
            // mapped in the primary context until the subscriber closes;
            // bytes may change under the copy, which `release` detects.
            unsafe { copy_into(&mut buf, b.addr(), len) }?;
        }
        let got = Got {
            seq: b.seq(),
            pts: b.pts(),
            flags: b.flags(),
            commit_ns: b.commit_ns(),
            skipped: b.skipped(),
            pushed: false,
            user: b.user(),
            geometry: info.geometry,
            buf,
        };
        match b.release() {
            Ok(()) => return Ok(got),
            // Torn: the frame is lost (counted as an overrun); read the next.
            Err(Error::Overrun { .. }) if Instant::now() < deadline => continue,
            Err(Error::Overrun { .. }) => return Err(Error::Timeout(timeout, "the next frame")),
            Err(e) => return Err(e),
        }
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
    push: bool,
    reconnect: bool,
    iter_timeout: Duration,
    path: String,
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

    fn next_frame(&mut self, py: Python<'_>, timeout: Duration) -> PyResult<Frame> {
        let held = self.sink.pool.as_ref().map_or(0, |p| p.live());
        if held >= self.sink.keep {
            return Err(FramesHeld::new_err(format!(
                "{held} frames (or tensors made from them) are still alive, the subscriber's max_held; \
                 drop some (del frame, tensor) or raise max_held"
            )));
        }
        let push = self.push;
        let mut sink = std::mem::take(&mut self.sink);
        let sub = match self.sub() {
            Ok(s) => s,
            Err(e) => {
                self.sink = sink;
                return Err(e);
            }
        };
        let got = py.detach(|| read(sub, &mut sink, push, timeout));
        self.sink = sink;
        Ok(got.py_err()?.into_frame())
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
    /// (latest only). `reconnect`: follow the publisher across restarts.
    /// `timeout`: seconds `for frame in sub` waits for each frame.
    /// `max_held`: frames (and tensors made from them) alive at once.
    #[new]
    #[pyo3(signature = (path, *, name=None, mode=None, lossless=false, push=false, reconnect=false,
                        timeout=5.0, connect_timeout=5.0, max_held=16))]
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
        if push && (mode != Mode::Latest || lossless) {
            return Err(PyValueError::new_err(
                "push delivery supports mode=\"latest\" without lossless only",
            ));
        }
        if max_held == 0 {
            return Err(PyValueError::new_err("max_held must be at least 1"));
        }
        let iter_timeout = timeout_of(timeout)?;
        let mut opts = SubscriberOptions::default()
            .mode(mode)
            .lossless(lossless)
            .push(push)
            .reconnect(reconnect);
        if let Some(n) = name {
            opts = opts.name(n);
        }
        opts.connect_timeout = timeout_of(connect_timeout)?;
        let shown = path.display().to_string();
        let sub = py.detach(|| Subscriber::connect(&path, opts)).py_err()?;
        Ok(PySubscriber {
            borrow: Excl::new(None),
            sub: Excl::new(Some(Box::new(sub))),
            sink: Sink {
                keep: max_held,
                ..Sink::default()
            },
            push,
            reconnect,
            iter_timeout,
            path: shown,
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
    /// The subscriber cannot be used until the borrow is released.
    #[pyo3(signature = (timeout=5.0))]
    fn borrow(slf: Bound<'_, Self>, timeout: f64) -> PyResult<BorrowedFrame> {
        let py = slf.py();
        let t = timeout_of(timeout)?;
        let mut me = slf.borrow_mut();
        let sub = me.sub()?;
        let b: Borrow<'_> = py.detach(|| sub.borrow(t)).py_err()?;
        let info = *b.info();
        let (seq, pts, flags, commit_ns, user, addr) = (b.seq(), b.pts(), b.flags(), b.commit_ns(), b.user(), b.addr());
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
            geometry: info.geometry,
            addr,
            cuda: info.backend == BACKEND_CUDA,
            intact: None,
        })
    }

    /// Counters: delivered, dropped, overruns, last_seq, reconnects, pushed,
    /// and held (frame buffers alive now).
    fn stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let held = self.sink.pool.as_ref().map_or(0, |p| p.live());
        let s = self.sub()?.stats();
        let d = PyDict::new(py);
        d.set_item("delivered", s.delivered)?;
        d.set_item("dropped", s.dropped)?;
        d.set_item("overruns", s.overruns)?;
        d.set_item("last_seq", s.last_seq)?;
        d.set_item("reconnects", s.reconnects)?;
        d.set_item("pushed", s.pushed)?;
        d.set_item("held", held)?;
        Ok(d)
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
    /// already returned stay valid. Idempotent.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        self.end_borrow();
        if let Some(mut s) = self.sub.get_mut().take() {
            let r = py.detach(|| s.close());
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
    seq: u64,
    pts: i64,
    flags: u32,
    commit_ns: u64,
    user: Vec<u8>,
    geometry: Geometry,
    addr: u64,
    cuda: bool,
    intact: Option<bool>,
}

#[pymethods]
impl BorrowedFrame {
    /// Sequence number.
    #[getter]
    fn seq(&self) -> u64 {
        self.seq
    }
    /// Presentation timestamp.
    #[getter]
    fn pts(&self) -> i64 {
        self.pts
    }
    /// Flags.
    #[getter]
    fn flags(&self) -> u32 {
        self.flags
    }
    /// `CLOCK_MONOTONIC` ns of the commit.
    #[getter]
    fn commit_ns(&self) -> u64 {
        self.commit_ns
    }
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
