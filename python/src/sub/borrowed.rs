//! `vramring.BorrowedFrame`: a frame lent in place by `Subscriber.borrow`.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use vramring::{Error, Geometry};

use super::{busy, planes_of, Plane, PySubscriber};
use crate::errors::{self, IntoPy};

/// A frame lent in place by `Subscriber.borrow`. No copy: read it through
/// `data_ptr` (or `tobytes()` on a host ring) inside the `with` block; on
/// exit `intact` says whether it stayed whole.
#[pyclass(module = "vramring")]
pub struct BorrowedFrame {
    pub(super) owner: Py<PySubscriber>,
    /// Sequence number.
    #[pyo3(get)]
    pub(super) seq: u64,
    /// Presentation timestamp.
    #[pyo3(get)]
    pub(super) pts: i64,
    /// Flags.
    #[pyo3(get)]
    pub(super) flags: u32,
    /// `CLOCK_MONOTONIC` ns of the commit.
    #[pyo3(get)]
    pub(super) commit_ns: u64,
    pub(super) user: Vec<u8>,
    pub(super) geometry: Geometry,
    pub(super) addr: u64,
    pub(super) cuda: bool,
    pub(super) intact: Option<bool>,
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
