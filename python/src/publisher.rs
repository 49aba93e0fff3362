//! `vramring.Publisher` and `vramring.Loan`.
//!
//! `publish(tensor)` takes any DLPack producer. A CUDA tensor is handed our
//! stream (`__dlpack__(stream=ours)`, so the producer orders its pending
//! work before it) and copied into the slot on that stream with
//! `cuMemcpy2DAsync` (device to device, or host to device for a host array
//! on a CUDA ring); the commit is enqueued behind the copy on that stream
//! (stream-order commit), and the stream is synchronised before `publish`
//! returns, so the tensor may be reused at once. A host array on a host ring is a `memcpy`. Accepted layouts: a
//! C-contiguous tensor of exactly `nbytes` (the slot image, pitch padding
//! included) or of the packed size (planes back to back, rows without
//! padding), whatever its dtype and shape.
//!
//! `loan()` lends the next slot for zero-copy writers: write its planes
//! (DLPack views), then `loan.publish()`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dlpark::ffi::{DLDevice, DLDeviceType};
use dlpark::python::{DlpackStream, ImportRequest, StreamArg};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use vramring::cuda::Stream;
use vramring::ServeOptions;
use vramring::{
    BackendChoice, BackendKind, Error, Format, FrameMeta, Geometry, Policy, Publisher, RingConfig, SlotMut,
};

use crate::errors::{self, IntoPy};
use crate::mem::{Cuda, Excl, Side};
use crate::sub::{planes_of, Plane};
use crate::view::{self, Keep, LoanKeep, View};

/// Our CUDA stream, offered to a DLPack producer.
struct OurStream(usize);

// SAFETY: the stream is a live `CUstream` of the tensor's device's primary
// context (a `Cuda` the caller holds for the whole import).
unsafe impl DlpackStream for OurStream {
    fn as_python_arg(&self, _py: Python<'_>, device: DLDevice) -> PyResult<StreamArg> {
        if device.device_type == DLDeviceType::CUDA {
            Ok(dlpark::python::consumer::stream::cuda(self.0 as *mut std::ffi::c_void))
        } else {
            Ok(dlpark::python::consumer::stream::none())
        }
    }
}

fn secs(s: f64) -> PyResult<Duration> {
    if !s.is_finite() || s < 0.0 {
        return Err(PyValueError::new_err(format!(
            "timeout must be a finite number of seconds >= 0, got {s}"
        )));
    }
    Ok(Duration::from_secs_f64(s))
}

/// Bytes of the planes back to back without pitch padding.
fn packed_bytes(g: &Geometry) -> u64 {
    g.planes().iter().map(|p| p.row_bytes * p.rows).sum()
}

/// A raw CUDA stream from `None` (the legacy default stream), an int, or
/// an object with `cuda_stream` (`torch.cuda.Stream`).
fn stream_arg(s: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
    let Some(s) = s.filter(|s| !s.is_none()) else {
        return Ok(0);
    };
    if let Ok(v) = s.extract::<usize>() {
        return Ok(v);
    }
    s.getattr("cuda_stream")?.extract::<usize>()
}

/// A ring publisher: frames go from `publish()` (or `loan()`) to every
/// subscriber of the socket at `path`.
#[pyclass(module = "vramring", name = "Publisher")]
pub struct PyPublisher {
    inner: Excl<Option<Publisher>>,
    /// The ring's GPU (CUDA ring).
    ring_cuda: Option<Arc<Cuda>>,
    /// Other GPUs tensors came from (host ring fed from a GPU).
    src_cuda: Vec<Arc<Cuda>>,
    views: Arc<AtomicUsize>,
    loan_open: Option<u64>,
    path: String,
}

impl PyPublisher {
    fn open(&mut self) -> PyResult<&mut Publisher> {
        self.inner
            .get_mut()
            .as_mut()
            .ok_or_else(|| errors::to_py(Error::Closed))
    }

    fn no_loan(&self) -> PyResult<()> {
        match self.loan_open {
            Some(seq) => Err(PyValueError::new_err(format!(
                "slot of frame {seq} is still on loan: publish or cancel it first"
            ))),
            None => Ok(()),
        }
    }

    fn cuda_for(&mut self, ordinal: i32) -> PyResult<Arc<Cuda>> {
        if let Some(c) = self.ring_cuda.as_ref().filter(|c| c.ordinal == ordinal) {
            return Ok(Arc::clone(c));
        }
        if let Some(c) = self.src_cuda.iter().find(|c| c.ordinal == ordinal) {
            return Ok(Arc::clone(c));
        }
        let c = Cuda::for_ordinal(ordinal).py_err()?;
        self.src_cuda.push(Arc::clone(&c));
        Ok(c)
    }

    fn meta(pts: Option<i64>, seq: u64, meta: &[u8], flags: u32) -> PyResult<FrameMeta> {
        FrameMeta::pts(pts.unwrap_or(seq as i64))
            .with_flags(flags)
            .with_user(meta)
            .py_err()
    }

    fn publish_loan(&mut self, seq: u64, meta: FrameMeta, stream: usize, py: Python<'_>) -> PyResult<u64> {
        if self.loan_open != Some(seq) {
            return Err(PyValueError::new_err(format!("the loan of frame {seq} is over")));
        }
        let p = self.open()?;
        let r = py.detach(|| -> vramring::Result<u64> {
            // The loan was dropped at `loan()` with the slot invalid and the
            // seq unused, so this loan returns the same slot and seq.
            let kind = p.backend();
            let slot = p.loan(Duration::from_secs(5))?;
            if slot.seq() != seq {
                return Err(Error::Config(format!(
                    "the publisher moved on to frame {} while frame {seq} was on loan",
                    slot.seq()
                )));
            }
            match kind {
                BackendKind::Host => slot.publish(meta),
                // SAFETY: `stream` is the caller's stream of the ring's
                // device (or 0, the legacy default stream), live for the call.
                BackendKind::Cuda => unsafe {
                    slot.publish_cuda(meta, Stream::from_raw(stream as cudarc::driver::sys::CUstream))
                },
            }
        });
        self.loan_open = None;
        r.py_err()
    }
}

#[pymethods]
impl PyPublisher {
    /// Creates a ring of `slots` frames of `format` (`"nv12"`, `"p010"`,
    /// `"gray8"`, `"rgb8"`, `"rgba8"`, `"raw"`) at `width` x `height` and
    /// serves it on the Unix socket `path`. `backend`: "auto" (CUDA device 0
    /// when usable, else host), "host", "cuda" or "cuda:N". `policy`:
    /// "overwrite" (live video) or "lossless" (wait for lossless readers).
    /// `attach_rate`: `(per_second, burst)`, how many push subscribers'
    /// buffers the publisher takes (ADR 0020; one past the rate waits for
    /// its first frame), or `None` to take every one at once (trusted
    /// subscribers only). `commit_graph` (CUDA rings): "auto" (replay the
    /// commit graph while the ring publishes fast), "always" or "never".
    #[new]
    #[pyo3(signature = (path, format, width, height, *, slots=8, backend="auto", policy="overwrite",
                        max_subscribers=None, lossless_lease=1.0,
                        attach_rate=Some((vramring::AttachRate::DEFAULT.per_second, vramring::AttachRate::DEFAULT.burst)),
                        commit_graph="auto"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        format: &str,
        width: u32,
        height: u32,
        slots: u32,
        backend: &str,
        policy: &str,
        max_subscribers: Option<u32>,
        lossless_lease: f64,
        attach_rate: Option<(u32, u32)>,
        commit_graph: &str,
    ) -> PyResult<Self> {
        let format: Format = format
            .parse()
            .map_err(|e: Error| PyValueError::new_err(e.to_string()))?;
        let backend: BackendChoice = backend
            .parse()
            .map_err(|e: Error| PyValueError::new_err(e.to_string()))?;
        let policy = match policy {
            "overwrite" => Policy::Overwrite,
            "lossless" => Policy::Lossless,
            other => {
                return Err(PyValueError::new_err(format!(
                    "policy must be \"overwrite\" or \"lossless\", got {other:?}"
                )))
            }
        };
        let mut cfg = RingConfig::new(format, width, height)
            .slots(slots)
            .backend(backend)
            .policy(policy)
            .commit_graph(commit_graph.parse().map_err(PyValueError::new_err)?)
            .lossless_lease(secs(lossless_lease)?);
        if let Some(n) = max_subscribers {
            cfg = cfg.max_subscribers(n);
        }
        cfg = match attach_rate {
            Some((per_second, burst)) => cfg.attach_rate(per_second, burst),
            None => cfg.unbounded_attaches(),
        };
        let shown = path.display().to_string();
        let p = py.detach(|| Publisher::create(&path, cfg)).py_err()?;
        let ring_cuda = if p.info().backend() == BackendKind::Cuda {
            Some(Cuda::for_uuid(&p.info().device_uuid()).py_err()?)
        } else {
            None
        };
        Ok(PyPublisher {
            inner: Excl::new(Some(p)),
            ring_cuda,
            src_cuda: Vec::new(),
            views: Arc::new(AtomicUsize::new(0)),
            loan_open: None,
            path: shown,
        })
    }

    /// Copies `frame` (any DLPack producer: a torch tensor, CUDA or CPU; a
    /// numpy array) into the next slot and commits it; returns its seq.
    /// `pts` defaults to the seq; `meta`: up to 64 bytes for subscribers.
    /// `timeout`: how long a lossless publisher waits for slow readers.
    #[pyo3(signature = (frame, *, pts=None, meta=b"".as_slice(), flags=0, timeout=1.0))]
    fn publish(
        &mut self,
        py: Python<'_>,
        frame: &Bound<'_, PyAny>,
        pts: Option<i64>,
        meta: &[u8],
        flags: u32,
        timeout: f64,
    ) -> PyResult<u64> {
        self.no_loan()?;
        let t = secs(timeout)?;
        let (g, seq, ring_cuda) = {
            let p = self.open()?;
            (*p.geometry(), p.next_seq(), p.backend() == BackendKind::Cuda)
        };
        let meta = Self::meta(pts, seq, meta, flags)?;
        if !frame.hasattr("__dlpack__")? {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "publish takes a DLPack producer (a torch tensor, a numpy array, ...), got {}",
                frame.get_type().name()?
            )));
        }
        let req = ImportRequest::new(frame.as_borrowed())?;
        let dev = req.device()?;
        let src_cuda = match dev.device_type {
            DLDeviceType::CUDA => Some(self.cuda_for(dev.device_id)?),
            DLDeviceType::CPU | DLDeviceType::CUDAHOST => None,
            other => {
                return Err(PyValueError::new_err(format!(
                    "tensors on DLPack device type {} cannot be published; use a CPU or CUDA tensor",
                    other.0
                )))
            }
        };
        if let (Some(s), Some(r)) = (&src_cuda, &self.ring_cuda) {
            if s.ordinal != r.ordinal {
                return Err(PyValueError::new_err(format!(
                    "the tensor is on cuda:{} but the ring is on cuda:{}; move it first",
                    s.ordinal, r.ordinal
                )));
            }
        }
        // The copy runs on the ring's stream for a CUDA ring, else on the
        // source GPU's; the producer orders its work before that stream.
        let copier = self.ring_cuda.clone().or_else(|| src_cuda.clone());
        let stream = copier.as_ref().map(|c| OurStream(c.raw_stream() as usize));
        let imported = req.import(stream.as_ref().map(|s| s as &dyn DlpackStream), None)?;
        let t_ref = imported
            .validate()
            .map_err(|e| PyValueError::new_err(format!("not a usable DLPack tensor: {e}")))?;
        if !t_ref.is_compact().map_err(|e| PyValueError::new_err(e.to_string()))? {
            return Err(PyValueError::new_err(
                "the tensor is not C-contiguous; call .contiguous() (torch) or numpy.ascontiguousarray first",
            ));
        }
        let nbytes = t_ref.num_bytes() as u64;
        let src = t_ref.data_ptr() as u64 + t_ref.byte_offset();
        let packed = packed_bytes(&g);
        let linear = if nbytes == g.frame_bytes {
            true
        } else if nbytes == packed {
            false
        } else {
            return Err(PyValueError::new_err(format!(
                "a {} {}x{} frame is {} bytes as the slot image (pitch padding included) or {} bytes packed; \
                 this tensor has {} bytes (shape {:?})",
                g.format.name(),
                g.width,
                g.height,
                g.frame_bytes,
                packed,
                nbytes,
                t_ref.shape()
            )));
        };
        let src_side = if src_cuda.is_some() {
            Side::Device(src)
        } else {
            Side::Host(src)
        };
        let p = self
            .inner
            .get_mut()
            .as_mut()
            .ok_or_else(|| errors::to_py(Error::Closed))?;
        let r = py.detach(|| -> vramring::Result<u64> {
            let mut slot = p.loan(t)?;
            let dst = slot_addr(&mut slot)?;
            let dst_side = if ring_cuda { Side::Device(dst) } else { Side::Host(dst) };
            match (copier, dst_side, src_side) {
                (None, Side::Host(_), Side::Host(s)) => {
                    let bytes = slot.bytes_mut()?;
                    // SAFETY: the tensor holds `nbytes` bytes at `s`, kept
                    // alive by `imported` (held by the caller until this
                    // returns); `bytes` is the slot, private to this loan.
                    let src = unsafe { std::slice::from_raw_parts(s as usize as *const u8, nbytes as usize) };
                    if linear {
                        bytes.copy_from_slice(src);
                    } else {
                        let mut at = 0usize;
                        for pl in g.planes() {
                            let rb = pl.row_bytes as usize;
                            for r in 0..pl.rows as usize {
                                let o = pl.offset as usize + r * pl.pitch as usize;
                                bytes[o..o + rb].copy_from_slice(&src[at..at + rb]);
                                at += rb;
                            }
                        }
                    }
                    slot.publish(meta)
                }
                (Some(c), dst_side, src_side) => {
                    let (d0, s0) = (addr_of(dst_side), addr_of(src_side));
                    let side = |s: Side, a: u64| match s {
                        Side::Host(_) => Side::Host(a),
                        Side::Device(_) => Side::Device(a),
                    };
                    if linear {
                        // SAFETY: slot and tensor each hold `frame_bytes`
                        // bytes; the tensor stays alive (`imported`) and the
                        // slot is ours until the commit below, after which
                        // the stream is synchronised before we let go.
                        unsafe { c.copy_2d(dst_side, g.frame_bytes, src_side, g.frame_bytes, g.frame_bytes, 1) }?;
                    } else {
                        let mut at = 0u64;
                        for pl in g.planes() {
                            // SAFETY: as above, plane by plane: `rows` rows
                            // of `row_bytes` at the slot pitch / packed.
                            unsafe {
                                c.copy_2d(
                                    side(dst_side, d0 + pl.offset),
                                    pl.pitch,
                                    side(src_side, s0 + at),
                                    pl.row_bytes,
                                    pl.row_bytes,
                                    pl.rows,
                                )
                            }?;
                            at += pl.row_bytes * pl.rows;
                        }
                    }
                    if ring_cuda {
                        // SAFETY: our stream, in the ring's (primary) context.
                        let seq = unsafe { slot.publish_cuda(meta, Stream::from_raw(c.raw_stream())) }?;
                        // The commit is only enqueued (stream-order commit):
                        // the copy still reads the caller's tensor, which
                        // may be freed or reused once this returns.
                        c.sync()?;
                        Ok(seq)
                    } else {
                        c.sync()?;
                        slot.publish(meta)
                    }
                }
                (None, _, _) => Err(Error::WrongBackend {
                    what: "publishing a host array without a CUDA context",
                    backend: "cuda",
                }),
            }
        });
        drop(imported);
        r.py_err()
    }

    /// Lends the next slot for zero-copy writing: fill `loan.plane(k)`
    /// (DLPack views), then `loan.publish()`. One loan at a time.
    #[pyo3(signature = (timeout=1.0))]
    fn loan(slf: Bound<'_, Self>, timeout: f64) -> PyResult<Loan> {
        let py = slf.py();
        let t = secs(timeout)?;
        let mut me = slf.borrow_mut();
        me.no_loan()?;
        let dev = view::device(me.ring_cuda.as_ref().map(|c| c.ordinal));
        let p = me.open()?;
        let (seq, addr, g) = py
            .detach(|| {
                p.loan(t)
                    .and_then(|mut s| Ok((s.seq(), slot_addr(&mut s)?, *s.geometry())))
            })
            .py_err()?;
        // The SlotMut is gone: the slot stays invalid and its seq unused
        // until `Loan.publish` loans it again and commits.
        me.loan_open = Some(seq);
        let views = Arc::clone(&me.views);
        drop(me);
        Ok(Loan {
            owner: slf.unbind(),
            views,
            seq,
            addr,
            geometry: g,
            dev,
            done: false,
        })
    }

    /// Counters: published, subscribers, connects, disconnects, evictions,
    /// lossless_waits, refused, attaches (push subscribers' buffers taken),
    /// attaches_deferred (Attaches that waited for the attach rate, taken in
    /// the end or not).
    fn stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.open()?.stats();
        let d = PyDict::new(py);
        d.set_item("published", s.published)?;
        d.set_item("subscribers", s.subscribers)?;
        d.set_item("connects", s.connects)?;
        d.set_item("disconnects", s.disconnects)?;
        d.set_item("evictions", s.evictions)?;
        d.set_item("lossless_waits", s.lossless_waits)?;
        d.set_item("refused", s.refused)?;
        d.set_item("attaches", s.attaches)?;
        d.set_item("attaches_deferred", s.attaches_deferred)?;
        Ok(d)
    }

    /// "host" or "cuda".
    #[getter]
    fn backend(&mut self) -> PyResult<&'static str> {
        Ok(self.open()?.backend().name())
    }
    /// Bytes of a frame (the slot image, pitch padding included).
    #[getter]
    fn nbytes(&mut self) -> PyResult<u64> {
        Ok(self.open()?.geometry().frame_bytes)
    }
    /// Bytes of a frame with its planes packed (no pitch padding).
    #[getter]
    fn packed_nbytes(&mut self) -> PyResult<u64> {
        Ok(packed_bytes(self.open()?.geometry()))
    }
    /// The planes' layout in a slot.
    #[getter]
    fn planes(&mut self) -> PyResult<Vec<Plane>> {
        Ok(planes_of(self.open()?.geometry()))
    }
    /// The seq the next frame will carry.
    #[getter]
    fn next_seq(&mut self) -> PyResult<u64> {
        Ok(self.open()?.next_seq())
    }
    /// The socket path.
    #[getter]
    fn path(&self) -> String {
        self.path.clone()
    }

    /// Stops serving, tells subscribers, removes the socket. Refused while
    /// tensors made from a loan are alive (they view the ring). Idempotent.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        // Acquire: pairs with the views' Release decrement.
        let live = self.views.load(Ordering::Acquire);
        if live > 0 {
            return Err(PyValueError::new_err(format!(
                "{live} tensor view(s) of loaned slots are still alive; delete them before close()"
            )));
        }
        if let Some(mut p) = self.inner.get_mut().take() {
            let r = py.detach(|| p.close());
            drop(p);
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
}

fn addr_of(s: Side) -> u64 {
    match s {
        Side::Host(a) | Side::Device(a) => a,
    }
}

/// A slot lent by `Publisher.loan()`.
#[pyclass(module = "vramring")]
pub struct Loan {
    owner: Py<PyPublisher>,
    views: Arc<AtomicUsize>,
    seq: u64,
    addr: u64,
    geometry: Geometry,
    dev: DLDevice,
    done: bool,
}

impl Loan {
    fn keep(&self, py: Python<'_>) -> Arc<Keep> {
        // Relaxed: the increment only has to happen before the view exists;
        // `close` runs on the thread holding the GIL, as this does.
        self.views.fetch_add(1, Ordering::Relaxed);
        Arc::new(Keep::Slot(LoanKeep {
            owner: self.owner.clone_ref(py).into_any(),
            views: Arc::clone(&self.views),
        }))
    }
}

#[pymethods]
impl Loan {
    /// The seq the frame will carry.
    #[getter]
    fn seq(&self) -> u64 {
        self.seq
    }
    /// Address of the slot (host pointer or `CUdeviceptr`).
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.addr
    }
    /// The planes' layout.
    #[getter]
    fn planes(&self) -> Vec<Plane> {
        planes_of(&self.geometry)
    }
    /// Plane `k` of the slot as a writable DLPack view (shapes as
    /// `Frame.plane`).
    fn plane(&self, py: Python<'_>, k: usize) -> PyResult<View> {
        View::plane(self.keep(py), self.addr, &self.geometry, self.dev, k)
    }
    /// The whole slot as a 1-D uint8 DLPack tensor.
    #[pyo3(signature = (stream=None, *, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let v = View::whole(self.keep(py), self.addr, &self.geometry, self.dev);
        view::dlpack(&v, py, stream, max_version, dl_device, copy)
    }
    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.dev.device_type.0 as i32, self.dev.device_id)
    }
    /// Commits the frame; returns its seq. `stream`: the CUDA stream you
    /// wrote on (int, or `torch.cuda.Stream`); `None` is the legacy default
    /// stream (torch's default). The commit is enqueued behind your work on
    /// that stream; this returns without waiting for it.
    #[pyo3(signature = (*, pts=None, meta=b"".as_slice(), flags=0, stream=None))]
    fn publish(
        &mut self,
        py: Python<'_>,
        pts: Option<i64>,
        meta: &[u8],
        flags: u32,
        stream: Option<Bound<'_, PyAny>>,
    ) -> PyResult<u64> {
        if self.done {
            return Err(PyValueError::new_err(format!("the loan of frame {} is over", self.seq)));
        }
        let m = PyPublisher::meta(pts, self.seq, meta, flags)?;
        let s = stream_arg(stream.as_ref())?;
        self.done = true;
        crate::sub::busy(self.owner.try_borrow_mut(py))?.publish_loan(self.seq, m, s, py)
    }
    /// Gives the slot back unpublished (the seq is reused).
    fn cancel(&mut self, py: Python<'_>) -> PyResult<()> {
        if !self.done {
            let mut o = crate::sub::busy(self.owner.try_borrow_mut(py))?;
            self.done = true;
            if o.loan_open == Some(self.seq) {
                o.loan_open = None;
            }
        }
        Ok(())
    }
    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }
    /// Leaving the block without `publish()` cancels the loan.
    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.cancel(py)?;
        Ok(false)
    }
}

/// A loaned slot's address in this process: its device address on a CUDA
/// ring, its host mapping on a host ring (what a loan tensor points at).
fn slot_addr(slot: &mut SlotMut<'_>) -> vramring::Result<u64> {
    match slot.backend() {
        BackendKind::Cuda => Ok(slot.device_mut()?.as_raw()),
        BackendKind::Host => Ok(slot.bytes_mut()?.as_mut_ptr() as u64),
    }
}
