//! DLPack export of frames and planes through `dlpark`.
//!
//! A [`View`] names memory (a frame's own buffer, or a loaned slot of a
//! publisher), a dtype, a shape and strides. Each `__dlpack__` call makes a
//! fresh managed tensor whose context is an `Arc<Keep>`: the memory cannot
//! go away while any consumer (torch, numpy, ...) still holds the tensor.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dlpark::ffi::{DLDataType, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned};
use dlpark::metadata::Dynamic;
use dlpark::python::{export_dlpack, CudaStreamRequest, DlpackExporter, ExportRequest};
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use vramring::{Format, Geometry};

use crate::mem::{Buf, Consumers};

/// What keeps a view's memory alive.
pub enum Keep {
    /// A frame's own buffer.
    Buf(Arc<Buf>),
    /// A push buffer lent as it is (the subscriber keeps holding it while
    /// this lives).
    Lent(Arc<crate::sub::Lent>),
    /// A frame in a buffer whose tensors are cached (`crate::cache`): the
    /// buffer's owner (a `Buf` or `Lent` keep, shared with the cached
    /// tensors), and the streams this frame's own exports were promised
    /// to, which the cache fences before the buffer is written again. The
    /// cache watches this token: while it lives, the buffer is not reused.
    Cached {
        /// The buffer's owner.
        mem: Arc<Keep>,
        /// Streams of this frame's exports, for the cache's next check.
        consumers: Arc<Consumers>,
    },
    /// A loaned publisher slot: the publisher object (kept alive, so its
    /// mapping is) and its count of live slot views (`close()` refuses while
    /// it is not zero).
    Slot(LoanKeep),
}

impl Keep {
    /// Notes the stream a consumer of a CUDA export will use (the DLPack
    /// `stream` argument): when the memory's last reference goes, its next
    /// writer waits for the work queued there (see `mem`). `-1` (the
    /// consumer orders its own work) notes nothing; an omitted stream is
    /// the legacy default stream, as DLPack says.
    fn note_consumer(&self, req: CudaStreamRequest) {
        let stream = match req {
            CudaStreamRequest::NoSync => return,
            CudaStreamRequest::Omitted | CudaStreamRequest::LegacyDefault => 1,
            CudaStreamRequest::PerThreadDefault => 2,
            CudaStreamRequest::Pointer(p) => p,
        };
        self.note(stream);
    }

    fn note(&self, stream: usize) {
        match self {
            Keep::Buf(b) => b.consumers.note(stream),
            Keep::Lent(l) => l.consumers.note(stream),
            Keep::Cached { mem, consumers } => {
                // For the cache's check before reuse, and for the buffer's
                // own fence when its last reference goes.
                consumers.note(stream);
                mem.note(stream);
            }
            // The publisher's own slot: its publish orders the writer.
            Keep::Slot(_) => {}
        }
    }
}

impl Drop for Keep {
    fn drop(&mut self) {
        // The frame's last reference is gone; a lent push buffer's token
        // lives on in the subscriber, which must learn when the consumers'
        // work on it is done. (A pool buffer does this in its own drop.)
        if let Keep::Lent(l) = self {
            l.frame_gone();
        }
    }
}

/// See [`Keep::Slot`].
pub struct LoanKeep {
    /// The `Publisher` Python object.
    pub owner: Py<PyAny>,
    /// Its live-view count, incremented when this was made.
    pub views: Arc<AtomicUsize>,
}

impl Drop for LoanKeep {
    fn drop(&mut self) {
        // Release: pairs with the Acquire load in `Publisher.close`, so a
        // close that sees zero happens after every view is gone.
        self.views.fetch_sub(1, Ordering::Release);
    }
}

/// DLPack device of a backend: CUDA `ordinal`, or the CPU.
pub fn device(cuda_ordinal: Option<i32>) -> DLDevice {
    match cuda_ordinal {
        Some(id) => DLDevice {
            device_type: DLDeviceType::CUDA,
            device_id: id,
        },
        None => DLDevice {
            device_type: DLDeviceType::CPU,
            device_id: 0,
        },
    }
}

/// A DLPack-exportable view of frame memory.
#[pyclass(module = "vramring", frozen)]
pub struct View {
    keep: Arc<Keep>,
    base: u64,
    byte_offset: u64,
    shape: Vec<i64>,
    strides: Vec<i64>,
    dtype: DLDataType,
    device: DLDevice,
}

/// Element size and channels of plane `k` of `format`.
fn plane_elems(format: Format, k: usize) -> (u64, u64) {
    match (format, k) {
        (Format::Nv12, 1) => (1, 2),
        (Format::P010, 0) => (2, 1),
        (Format::P010, 1) => (2, 2),
        (Format::Rgb8, _) => (1, 3),
        (Format::Rgba8, _) => (1, 4),
        _ => (1, 1),
    }
}

impl View {
    /// The whole frame (`frame_bytes` bytes, pitch padding included) as a
    /// 1-D uint8 tensor.
    pub fn whole(keep: Arc<Keep>, base: u64, g: &Geometry, dev: DLDevice) -> View {
        View {
            keep,
            base,
            byte_offset: 0,
            shape: vec![g.frame_bytes as i64],
            strides: vec![1],
            dtype: DLDataType::new(dlpark::ffi::DLDataTypeCode::UINT, 8, 1),
            device: dev,
        }
    }

    /// Plane `k`: `rows x cols` (`x channels` for interleaved planes), the
    /// pitch as the row stride. uint16 for P010, uint8 otherwise.
    pub fn plane(keep: Arc<Keep>, base: u64, g: &Geometry, dev: DLDevice, k: usize) -> PyResult<View> {
        let p = g.planes().get(k).ok_or_else(|| {
            PyIndexError::new_err(format!(
                "{} has {} plane(s); there is no plane {k}",
                g.format.name(),
                g.planes().len()
            ))
        })?;
        let (esize, ch) = plane_elems(g.format, k);
        if p.pitch % esize != 0 {
            return Err(PyValueError::new_err("plane pitch is not a whole number of elements"));
        }
        let cols = p.row_bytes / (esize * ch);
        let mut shape = vec![p.rows as i64, cols as i64];
        let mut strides = vec![(p.pitch / esize) as i64, ch as i64];
        if ch > 1 {
            shape.push(ch as i64);
            strides.push(1);
        }
        Ok(View {
            keep,
            base,
            byte_offset: p.offset,
            shape,
            strides,
            dtype: DLDataType::new(dlpark::ffi::DLDataTypeCode::UINT, (esize * 8) as u8, 1),
            device: dev,
        })
    }

    fn managed<M: ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        let mut init = Dynamic::new(self.shape.clone(), self.strides.clone())
            .initialize_as::<M>(Arc::clone(&self.keep))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        init.set_data(self.base as usize as *mut std::ffi::c_void)
            .set_device(self.device)
            .set_dtype(self.dtype)
            .set_byte_offset(self.byte_offset);
        // SAFETY: data, shape and strides describe memory inside the
        // buffer (or slot) `keep` owns, which the tensor's context (a clone
        // of `keep`) keeps alive until the consumer drops it; no flags.
        Ok(unsafe { init.finish() })
    }
}

impl DlpackExporter for View {
    fn device(&self) -> DLDevice {
        self.device
    }
    fn flags(&self) -> DlpackFlags {
        DlpackFlags::empty()
    }
    fn prepare_export(&self, _py: Python<'_>, request: &ExportRequest<'_>) -> PyResult<()> {
        if self.device.device_type == DLDeviceType::CUDA {
            // The bytes were complete (stream synchronised, or pushed and
            // held) before the frame was handed out, so any consumer stream
            // may read them at once: no wait. The stream is noted so that
            // the memory is not written again before the work the consumer
            // queues on it is done.
            self.keep.note_consumer(request.cuda_stream()?);
        }
        Ok(())
    }
    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        self.managed()
    }
    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        self.managed()
    }
}

/// The standard `__dlpack__` of `v`.
pub fn dlpack(
    v: &View,
    py: Python<'_>,
    stream: Option<Bound<'_, PyAny>>,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(u32, i32)>,
    copy: Option<bool>,
) -> PyResult<Py<PyAny>> {
    let stream = stream.filter(|s| !s.is_none());
    let req = ExportRequest::parse(stream.as_ref(), max_version, dl_device, copy)?;
    export_dlpack(v, py, req)
}

#[pymethods]
impl View {
    /// DLPack export (Python array API standard). `stream` is the consumer's
    /// CUDA stream; the data is already complete, so no wait is enqueued.
    #[pyo3(signature = (stream=None, *, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        dlpack(self, py, stream, max_version, dl_device, copy)
    }

    /// `(device_type, device_id)`: `(1, 0)` for host memory, `(2, ordinal)`
    /// for CUDA.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.device.device_type.0 as i32, self.device.device_id)
    }

    /// Shape of the tensor this view exports.
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.shape.clone()
    }

    /// Strides, in elements.
    #[getter]
    fn strides(&self) -> Vec<i64> {
        self.strides.clone()
    }

    /// Address of the first element (host pointer or `CUdeviceptr`).
    #[getter]
    fn data_ptr(&self) -> u64 {
        self.base + self.byte_offset
    }

    fn __repr__(&self) -> String {
        format!(
            "View(shape={:?}, strides={:?}, bits={}, device={:?}:{})",
            self.shape, self.strides, self.dtype.bits, self.device.device_type, self.device.device_id
        )
    }
}
