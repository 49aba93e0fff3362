//! `vramring.PacketPublisher`, `vramring.PacketSubscriber`, `vramring.Packet`:
//! the encoded side of a camera (H.264/H.265 access units) in a CPU
//! shared-memory packet ring. Packets arrive as `bytes` (one copy out of
//! the ring, made with the GIL released); `write` takes any bytes-like
//! object (`bytes`, `bytearray`, `memoryview`, a contiguous numpy array).

use std::time::Duration;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use vramring::packet::{
    PacketMeta, PacketPublisher, PacketPublisherConfig, PacketRingConfig, PacketSubscriber, PacketSubscriberOptions,
    PACKET_KEY,
};
use vramring::ClientOptions;
use vramring::Error;

use crate::errors::{self, IntoPy};

fn secs(s: f64) -> PyResult<Duration> {
    if !s.is_finite() || s < 0.0 {
        return Err(PyValueError::new_err(format!(
            "timeout must be a finite number of seconds >= 0, got {s}"
        )));
    }
    Ok(Duration::from_secs_f64(s))
}

/// One encoded packet (an access unit) and its metadata.
#[pyclass(module = "vramring", frozen, get_all)]
pub struct Packet {
    /// Sequence number.
    pub seq: u64,
    /// Presentation timestamp.
    pub pts: i64,
    /// Decode timestamp.
    pub dts: i64,
    /// `PACKET_*` flags.
    pub flags: u32,
    /// Codec code.
    pub codec: u32,
    /// `CLOCK_MONOTONIC` ns of the commit.
    pub commit_ns: u64,
    /// Packets never delivered between the previous one and this one.
    pub skipped: u64,
    /// The packet's bytes.
    pub data: Py<PyBytes>,
}

#[pymethods]
impl Packet {
    /// Whether the packet is a keyframe (an IDR access unit).
    #[getter]
    fn is_key(&self) -> bool {
        self.flags & PACKET_KEY != 0
    }
    fn __len__(&self, py: Python<'_>) -> usize {
        self.data.bind(py).as_bytes().len()
    }
    fn __bytes__(&self, py: Python<'_>) -> Py<PyBytes> {
        self.data.clone_ref(py)
    }
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Packet(seq={}, pts={}, key={}, {} bytes)",
            self.seq,
            self.pts,
            self.is_key(),
            self.__len__(py)
        )
    }
}

/// Reads the packets of a `PacketPublisher`, starting at its newest
/// keyframe. `lossless=True` asks the publisher to wait for this reader
/// (a recorder); it must allow lossless readers.
#[pyclass(module = "vramring", name = "PacketSubscriber")]
pub struct PyPacketSubscriber {
    inner: Option<PacketSubscriber>,
    buf: Vec<u8>,
    iter_timeout: Duration,
}

impl PyPacketSubscriber {
    fn next_packet(&mut self, py: Python<'_>, t: Duration) -> PyResult<Packet> {
        let s = self.inner.as_mut().ok_or_else(|| errors::to_py(Error::Closed))?;
        let buf = &mut self.buf;
        let p = py.detach(|| s.next_copy(buf, t)).py_err()?;
        Ok(Packet {
            seq: p.seq,
            pts: p.pts,
            dts: p.dts,
            flags: p.flags,
            codec: p.codec,
            commit_ns: p.commit_ns,
            skipped: p.skipped,
            data: PyBytes::new(py, &self.buf[..p.len]).unbind(),
        })
    }
}

#[pymethods]
impl PyPacketSubscriber {
    #[new]
    #[pyo3(signature = (path, *, name=None, lossless=false, timeout=5.0, connect_timeout=5.0))]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        name: Option<String>,
        lossless: bool,
        timeout: f64,
        connect_timeout: f64,
    ) -> PyResult<Self> {
        let mut o = PacketSubscriberOptions::new()
            .lossless(lossless)
            .connect_timeout(secs(connect_timeout)?);
        if let Some(n) = name {
            o = o.name(n);
        }
        let iter_timeout = secs(timeout)?;
        let s = py.detach(|| PacketSubscriber::connect(&path, o)).py_err()?;
        Ok(PyPacketSubscriber {
            inner: Some(s),
            buf: Vec::new(),
            iter_timeout,
        })
    }

    /// Waits at most `timeout` seconds for the next packet. Raises
    /// `Timeout`, `ProducerGone`, `PacketOverrun` (the next read resumes at
    /// a keyframe), `Evicted`.
    #[pyo3(signature = (timeout=5.0))]
    fn next(&mut self, py: Python<'_>, timeout: f64) -> PyResult<Packet> {
        let t = secs(timeout)?;
        self.next_packet(py, t)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Ends when the publisher is gone.
    fn __next__(&mut self, py: Python<'_>) -> PyResult<Packet> {
        let t = self.iter_timeout;
        match self.next_packet(py, t) {
            Err(e) if e.is_instance_of::<errors::ProducerGone>(py) => Err(PyStopIteration::new_err(())),
            r => r,
        }
    }

    /// The codec parameters (SPS/PPS for H.264) the publisher set; empty
    /// when none.
    fn codec_params<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let s = self.inner.as_mut().ok_or_else(|| errors::to_py(Error::Closed))?;
        let mut out = Vec::new();
        s.codec_params(&mut out).py_err()?;
        Ok(PyBytes::new(py, &out))
    }

    /// Counters: delivered, skipped, overruns.
    fn stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.as_ref().ok_or_else(|| errors::to_py(Error::Closed))?.stats();
        let d = PyDict::new(py);
        d.set_item("delivered", s.delivered)?;
        d.set_item("skipped", s.skipped)?;
        d.set_item("overruns", s.overruns)?;
        Ok(d)
    }

    /// Disconnects. Idempotent.
    fn close(&mut self) {
        if let Some(mut s) = self.inner.take() {
            s.close();
        }
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close();
        false
    }
}

/// Serves a packet ring on the Unix socket `path`.
#[pyclass(module = "vramring", name = "PacketPublisher")]
pub struct PyPacketPublisher {
    inner: Option<PacketPublisher>,
}

#[pymethods]
impl PyPacketPublisher {
    /// A ring of `data_bytes` bytes (a power of two, at least twice
    /// `max_packet`) and `records` records (a power of two).
    #[new]
    #[pyo3(signature = (path, *, data_bytes=8 << 20, records=1024, max_packet=2 << 20, codec=0,
                        allow_lossless=false, write_timeout=1.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        data_bytes: u64,
        records: u32,
        max_packet: u32,
        codec: u32,
        allow_lossless: bool,
        write_timeout: f64,
    ) -> PyResult<Self> {
        let cfg = PacketPublisherConfig::new(PacketRingConfig::new(data_bytes, records, max_packet).codec(codec))
            .allow_lossless(allow_lossless)
            .write_timeout(secs(write_timeout)?);
        let p = py.detach(|| PacketPublisher::create(&path, cfg)).py_err()?;
        Ok(PyPacketPublisher { inner: Some(p) })
    }

    /// Writes one packet (any bytes-like object); returns its seq.
    #[pyo3(signature = (data, *, pts=0, dts=None, key=false, flags=0, codec=0))]
    #[allow(clippy::too_many_arguments)]
    fn write(
        &mut self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        pts: i64,
        dts: Option<i64>,
        key: bool,
        flags: u32,
        codec: u32,
    ) -> PyResult<u64> {
        let p = self.inner.as_mut().ok_or_else(|| errors::to_py(Error::Closed))?;
        let meta = PacketMeta {
            pts,
            dts: dts.unwrap_or(pts),
            flags: flags | if key { PACKET_KEY } else { 0 },
            codec,
        };
        if let Ok(b) = data.cast::<PyBytes>() {
            let bytes = b.as_bytes();
            return py.detach(|| p.write(bytes, meta)).py_err();
        }
        let buf: PyBuffer<u8> = PyBuffer::get(data)?;
        let v = buf.to_vec(py)?;
        py.detach(|| p.write(&v, meta)).py_err()
    }

    /// Sets the codec parameters (SPS/PPS) readers get with their first
    /// keyframe; returns the parameters' version.
    fn set_codec_params(&mut self, params: &[u8]) -> PyResult<u64> {
        let p = self.inner.as_mut().ok_or_else(|| errors::to_py(Error::Closed))?;
        p.set_codec_params(params).py_err()
    }

    /// Counters: published, subscribers, connects, disconnects, evictions,
    /// lossless_waits.
    fn stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.as_ref().ok_or_else(|| errors::to_py(Error::Closed))?.stats();
        let d = PyDict::new(py);
        d.set_item("published", s.published)?;
        d.set_item("subscribers", s.subscribers)?;
        d.set_item("connects", s.connects)?;
        d.set_item("disconnects", s.disconnects)?;
        d.set_item("evictions", s.evictions)?;
        d.set_item("lossless_waits", s.lossless_waits)?;
        Ok(d)
    }

    /// Stops serving; subscribers drain and then see `ProducerGone`.
    fn close(&mut self) {
        if let Some(mut p) = self.inner.take() {
            p.close();
        }
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&mut self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close();
        false
    }
}
