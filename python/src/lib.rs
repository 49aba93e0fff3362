//! `vramring` for Python: subscribe to and publish vramring frame rings
//! and packet rings; frames are DLPack tensors (`torch.from_dlpack`,
//! `numpy.from_dlpack`).
//!
//! DLPack is implemented with `dlpark` 0.10 (which targets pyo3 0.30, the
//! version used here). Built as one abi3 wheel (CPython >= 3.11); the CUDA
//! driver is loaded at run time (cudarc's dynamic loading), so the same
//! wheel works on machines with and without a GPU.

mod errors;
mod mem;
mod packet;
mod publisher;
mod sub;
mod view;

use pyo3::prelude::*;

/// The pattern word `i` of frame `seq` (`vramring::testpattern::word`), for
/// tests and examples that check frames.
#[pyfunction]
fn pattern_word(seq: u64, i: u32) -> u32 {
    ::vramring::testpattern::word(seq, i)
}

/// Fills `buf` (a writable bytes-like object, e.g. a numpy uint8 array)
/// with the self-checking test pattern of `seq`.
#[pyfunction]
fn pattern_fill(py: Python<'_>, buf: &Bound<'_, PyAny>, seq: u64) -> PyResult<()> {
    let b: pyo3::buffer::PyBuffer<u8> = pyo3::buffer::PyBuffer::get(buf)?;
    if b.readonly() || !b.is_c_contiguous() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "pattern_fill needs a writable C-contiguous buffer",
        ));
    }
    let mut v = vec![0u8; b.len_bytes()];
    ::vramring::testpattern::fill(&mut v, seq);
    b.copy_from_slice(py, &v)?;
    Ok(())
}

/// Checks `buf` against the test pattern of `seq`; returns `None` when it
/// matches, else a sentence saying what differs.
#[pyfunction]
fn pattern_check(py: Python<'_>, buf: &Bound<'_, PyAny>, seq: u64) -> PyResult<Option<String>> {
    let b: pyo3::buffer::PyBuffer<u8> = pyo3::buffer::PyBuffer::get(buf)?;
    let v = b.to_vec(py)?;
    Ok(::vramring::testpattern::verify(&v, seq).err().map(|e| e.to_string()))
}

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
    m.add_function(wrap_pyfunction!(pattern_word, m)?)?;
    m.add_function(wrap_pyfunction!(pattern_fill, m)?)?;
    m.add_function(wrap_pyfunction!(pattern_check, m)?)?;
    errors::register(m)?;
    Ok(())
}
