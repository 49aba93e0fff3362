//! `vramring` for Python: subscribe to and publish vramring frame rings
//! and packet rings; frames are DLPack tensors (`torch.from_dlpack`,
//! `numpy.from_dlpack`).
//!
//! DLPack is implemented with `dlpark` 0.10 (which targets pyo3 0.30, the
//! version used here). Built as one abi3 wheel (CPython >= 3.11); the CUDA
//! driver is loaded at run time (cudarc's dynamic loading), so the same
//! wheel works on machines with and without a GPU.

mod cache;
mod errors;
mod mem;
mod packet;
mod publisher;
mod sub;
mod view;

use pyo3::prelude::*;

#[pymodule]
fn vramring(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<sub::PySubscriber>()?;
    m.add_class::<sub::Frame>()?;
    m.add_class::<sub::BorrowedFrame>()?;
    m.add_class::<sub::Plane>()?;
    m.add_class::<view::View>()?;
    m.add_class::<publisher::PyPublisher>()?;
    m.add_class::<publisher::Loan>()?;
    m.add_class::<packet::PyPacketPublisher>()?;
    m.add_class::<packet::PyPacketSubscriber>()?;
    m.add_class::<packet::Packet>()?;
    errors::register(m)?;
    Ok(())
}
