//! `vramring.Frame` and `vramring.Plane`: a frame in memory of its own,
//! its metadata and its DLPack exports.

use std::sync::{Arc, Mutex};

use dlpark::ffi::DLDevice;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use vramring::Geometry;

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
    pub(super) seq: u64,
    /// Presentation timestamp (the publisher's units).
    #[pyo3(get)]
    pub(super) pts: i64,
    /// `FRAME_*` flags.
    #[pyo3(get)]
    pub(super) flags: u32,
    /// `CLOCK_MONOTONIC` ns when the publisher committed the frame
    /// (`time.clock_gettime_ns(time.CLOCK_MONOTONIC)` on the same host).
    #[pyo3(get)]
    pub(super) commit_ns: u64,
    /// Frames skipped between the previous frame delivered and this one.
    #[pyo3(get)]
    pub(super) skipped: u64,
    /// Whether the frame came by push delivery.
    #[pyo3(get)]
    pub(super) pushed: bool,
    pub(super) user: Vec<u8>,
    pub(super) geometry: Geometry,
    pub(super) keep: Arc<Keep>,
    pub(super) base: u64,
    pub(super) dev: DLDevice,
    /// Whether the frame is the push buffer the publisher filled, lent
    /// as it is (no copy in this process); `False` for a frame in a buffer
    /// of the subscriber's pool.
    #[pyo3(get)]
    pub(super) zero_copy: bool,
    /// `CLOCK_MONOTONIC` ns: woke, copied, checked, returned (see `timing`).
    pub(super) timing: [u64; 4],
    /// One array per plane (`Subscriber(tensors=)`), `None` without. In a
    /// mutex so that the garbage collector can clear it (`__clear__`): a
    /// reference cycle through the frame (`y.frame = frame`) is then
    /// collected and its buffer reused.
    pub(super) tensors: Mutex<Option<Py<PyTuple>>>,
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
