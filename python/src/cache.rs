//! Tensors made once per frame buffer and handed out again:
//! `Subscriber(tensors="torch" | "numpy")` and `Frame.tensors`.
//!
//! `torch.from_dlpack` of a plane costs 13–100 µs right after a wait
//! (torch's stream lookup and import, `docs/PERF.md`), more than the rest
//! of `next()`. A subscriber's frames come from a few buffers that are
//! reused: its pool's (pull, and push copies) and the publisher-filled push
//! buffers. So each buffer's plane tensors, its *bases*, are imported once
//! (DLPack, in the buffer's first frame) and kept here; every frame in that
//! buffer hands out fresh *aliases* of them (`Tensor.detach()`,
//! `ndarray.view()`: new objects over the same memory), made before the
//! wait that delivers the frame. No DLPack and no torch call is left on the
//! frame's path.
//!
//! # The rule: a buffer is rewritten only when nothing of it is reachable
//! A buffer is written again (pull: our copy into it; push: the hold moves
//! off it and the publisher writes it) only after a check, made just before
//! (in `next()`, before its wait), finds both:
//!
//! 1. the last `Frame` handed out in the buffer gone, with every DLPack
//!    export made from it (`frame.plane(k)`, `np.from_dlpack(frame)`, ...):
//!    they all hold the frame's [`Keep::Cached`] token, of which the entry
//!    keeps only a `Weak`;
//! 2. each base's use count back at the value it had alone, when it was
//!    made:
//!    - torch: its storage's use count (`torch._C._storage_Use_Count`)
//!      plus the base's Python reference count. Every tensor that can read
//!      the memory through torch is a `TensorImpl` holding a reference to
//!      that storage: an alias, any view or slice of it (`t[:, :100]`
//!      shares the storage, not the Python object), one that C++ holds with
//!      no Python reference left (autograd's saved tensors). torch keeps
//!      one Python object per storage, holding one use of it however many
//!      references it has, so those references are added (an
//!      `untyped_storage()` or `storage()` kept alone). The base's own
//!      reference count sees a way back to the base object itself. torch's CUDA graph trees use
//!      the same storage count to decide that a graph output's memory may
//!      be overwritten.
//!    - numpy: the base array's reference count plus that of its `base`
//!      (the DLPack capsule). numpy collapses a chain of views onto the
//!      first array that owns its memory or whose `base` is not an array:
//!      for every view of an alias that is the cached base, so each view
//!      holds a reference to it; the buffer protocol (memoryview, Cython,
//!      numba) holds the exporting array, an alias or a view.
//!
//! Aliases are handed out, never the bases, because a reference C++ keeps
//! to the very object handed out (autograd saves a leaf tensor itself, not
//! a copy of its `TensorImpl`) shows in neither count. An alias is made
//! only when the check has found its buffer free; until it is handed out
//! nobody but the cache can reach it, so a buffer whose aliases are ready
//! is known free without a new check.
//!
//! Both counts are proven before they are trusted, on every base when it
//! is made: the count must rise when an alias is made (torch: and when its
//! storage object is kept) and fall back when it goes. A base that fails (a torch without
//! `_storage_Use_Count`, a library that tracks views another way) turns
//! the cache off for the subscriber (`stats()["tensors_cache"]` says why)
//! and frames get their tensors imported per frame, each holding its
//! buffer through its DLPack context: the rule of `mem`, which needs no
//! count.
//!
//! No count sees a raw address (`data_ptr()`, `__array_interface__`) used
//! after the tensors are gone, as for any tensor. Objects that only an
//! uncollected reference cycle keeps alive still count: they delay reuse,
//! never allow it early.
//!
//! # GPU work still queued
//! When a check finds a CUDA buffer free, each stream that may still have
//! work queued on its tensors gets an event, unless the stream is idle:
//! the stream its tensors were promised to (`Subscriber(stream=)`; by
//! default torch's current stream when the first tensors were made) and
//! every stream a frame's own exports named. Our copy stream waits for those events (on
//! the GPU) before a pull copy into the buffer; the host waits for them
//! before the hold moves off a push buffer. Work on another stream is the
//! user's to order, as for any DLPack export.
//!
//! # Memory
//! Each base holds its buffer through its DLPack context (`Keep::Buf` of a
//! pool buffer, or the subscriber's push mapping `Keep::Lent`), so a buffer
//! is freed, and push buffers unmapped, only once the last tensor of it is
//! gone, whatever the user keeps past `close()`.

use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Weak};

use dlpark::ffi::{DLDevice, DLDeviceType};
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyTuple};
use vramring::Geometry;

use crate::mem::{Buf, BufPool, Consumers, Cuda, Event};
use crate::view::{self, Keep, View};

/// The library `Frame.tensors` are made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consumer {
    /// `torch.Tensor`s (CUDA or CPU).
    Torch,
    /// `numpy.ndarray`s (host rings).
    Numpy,
}

impl Consumer {
    /// `"torch"` or `"numpy"`.
    ///
    /// # Errors
    /// `ValueError` for another name.
    pub fn parse(name: &str) -> PyResult<Consumer> {
        match name {
            "torch" => Ok(Consumer::Torch),
            "numpy" => Ok(Consumer::Numpy),
            other => Err(PyValueError::new_err(format!(
                "tensors must be \"torch\" or \"numpy\", got {other:?}"
            ))),
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            Consumer::Torch => "torch",
            Consumer::Numpy => "numpy",
        }
    }
}

/// The consumer library's functions, looked up once.
struct Api {
    consumer: Consumer,
    from_dlpack: Py<PyAny>,
    /// torch: `torch._C._storage_Use_Count`, `None` where this torch lacks it.
    use_count: Option<Py<PyAny>>,
    /// torch: `torch.cuda.current_stream`.
    current_stream: Option<Py<PyAny>>,
}

impl Api {
    fn load(py: Python<'_>, consumer: Consumer) -> PyResult<Api> {
        match consumer {
            Consumer::Torch => {
                let torch = py.import("torch")?;
                let c = torch.getattr("_C")?;
                Ok(Api {
                    consumer,
                    from_dlpack: torch.getattr("from_dlpack")?.unbind(),
                    use_count: c.getattr("_storage_Use_Count").ok().map(Bound::unbind),
                    current_stream: Some(torch.getattr("cuda")?.getattr("current_stream")?.unbind()),
                })
            }
            Consumer::Numpy => Ok(Api {
                consumer,
                from_dlpack: py.import("numpy")?.getattr("from_dlpack")?.unbind(),
                use_count: None,
                current_stream: None,
            }),
        }
    }

    /// The consumer's array of `v`. torch gets a capsule made for `stream`
    /// (it skips torch's per-call stream lookup); numpy the view itself.
    fn import<'py>(&self, py: Python<'py>, v: View, stream: Option<isize>) -> PyResult<Bound<'py, PyAny>> {
        match self.consumer {
            Consumer::Torch => {
                let s = stream.map(|s| PyInt::new(py, s).into_any());
                let capsule = view::dlpack(&v, py, s, None, None, None)?;
                self.from_dlpack.bind(py).call1((capsule,))
            }
            Consumer::Numpy => self.from_dlpack.bind(py).call1((Py::new(py, v)?,)),
        }
    }

    /// A new object over the memory of `base`, sharing everything else.
    fn alias<'py>(&self, base: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = base.py();
        match self.consumer {
            Consumer::Torch => base.call_method0(intern!(py, "detach")),
            Consumer::Numpy => base.call_method0(intern!(py, "view")),
        }
    }

    /// The use count of `base` (see the module docs); the same calls every
    /// time, so that what they hold themselves is in every figure alike.
    fn uses(&self, base: &Bound<'_, PyAny>) -> PyResult<Result<isize, &'static str>> {
        let py = base.py();
        match self.consumer {
            Consumer::Torch => {
                let Some(count) = &self.use_count else {
                    return Ok(Err("this torch has no torch._C._storage_Use_Count"));
                };
                // torch keeps one Python object per storage, which holds a
                // single use of it however many references it has: those
                // references count too (a storage kept alone).
                let storage = base.call_method0(intern!(py, "untyped_storage"))?;
                let cdata = storage.getattr(intern!(py, "_cdata"))?;
                let n: isize = count.bind(py).call1((cdata,))?.extract()?;
                Ok(Ok(n + refcnt(base) + refcnt(&storage)))
            }
            Consumer::Numpy => {
                let owner = base.getattr(intern!(py, "base"))?;
                let n = if owner.is_none() { 0 } else { refcnt(&owner) };
                Ok(Ok(refcnt(base) + n))
            }
        }
    }

    /// The use count of `base` alone, once proven to see an alias: it must
    /// rise while one lives and fall back when it goes. `Err` says why the
    /// count cannot be trusted.
    fn prove(&self, base: &Bound<'_, PyAny>) -> PyResult<Result<isize, String>> {
        let alone = match self.uses(base)? {
            Ok(n) => n,
            Err(why) => return Ok(Err(why.to_string())),
        };
        let alias = self.alias(base)?;
        if alias.is(base) {
            return Ok(Err(format!(
                "{} returned the base itself, not an alias",
                self.consumer.name()
            )));
        }
        if let Some(why) = self.unseen(base, alone, alias, "an alias")? {
            return Ok(Err(why));
        }
        if let Consumer::Torch = self.consumer {
            let storage = base.call_method0(intern!(base.py(), "untyped_storage"))?;
            if let Some(why) = self.unseen(base, alone, storage, "a storage kept alone")? {
                return Ok(Err(why));
            }
        }
        Ok(Ok(alone))
    }

    /// Why the use count of `base` (`alone` without it) does not see
    /// `held`, a reference to its memory: the count must rise while it
    /// lives and fall back when it goes. `None` when it does.
    fn unseen(
        &self,
        base: &Bound<'_, PyAny>,
        alone: isize,
        held: Bound<'_, PyAny>,
        what: &str,
    ) -> PyResult<Option<String>> {
        let with = self.uses(base)?.unwrap_or(alone);
        drop(held);
        let after = self.uses(base)?.unwrap_or(alone);
        Ok((with <= alone || after != alone).then(|| {
            format!(
                "the {} use count does not see {what} (alone {alone}, with one {with}, after it {after})",
                self.consumer.name()
            )
        }))
    }
}

/// The Python reference count of `obj`.
fn refcnt(obj: &Bound<'_, PyAny>) -> isize {
    // SAFETY: `obj` is a live object (the `Bound` holds or borrows a
    // reference) and we hold the GIL (`Bound` proves it).
    unsafe { pyo3::ffi::Py_REFCNT(obj.as_ptr()) }
}

/// One buffer's cached tensors.
struct Entry {
    /// The buffer's first byte (host pointer or `CUdeviceptr`).
    addr: u64,
    /// The buffer's owner, shared with the bases' DLPack contexts:
    /// `Keep::Buf` (a pool buffer) or `Keep::Lent` (a push buffer).
    mem: Arc<Keep>,
    /// The buffer's GPU (`None` on the host).
    cuda: Option<Arc<Cuda>>,
    /// One array per plane, imported once; never handed out.
    bases: Vec<Py<PyAny>>,
    /// Each base's use count alone.
    alone: Vec<isize>,
    /// Aliases of the bases that nobody but the cache has seen: `Some`
    /// means the buffer is free (proven, and nothing handed out since).
    spare: Option<Py<PyTuple>>,
    /// The token of the last frame handed out in the buffer.
    handout: Weak<Keep>,
    /// Streams that frame's own exports named.
    consumers: Arc<Consumers>,
    /// Frames handed out in the buffer.
    uses: u64,
}

impl Entry {
    fn pushed(&self) -> bool {
        matches!(*self.mem, Keep::Lent(_))
    }

    fn pool_buf(&self) -> Option<&Arc<Buf>> {
        match &*self.mem {
            Keep::Buf(b) => Some(b),
            _ => None,
        }
    }
}

/// What a check found.
pub enum Check {
    /// Nothing to check (no such buffer).
    None,
    /// The user still references the buffer: it must not be written.
    Busy,
    /// Free; when the host must wait before the buffer is written (a push
    /// buffer), these events first.
    Free(Option<(Arc<Cuda>, Vec<Event>)>),
}

/// A frame's share of a cached buffer ([`TensorCache::hand_out`]).
pub struct Handout {
    /// The frame's token (`Keep::Cached`).
    pub keep: Arc<Keep>,
    /// One alias per plane.
    pub tensors: Py<PyTuple>,
    /// The buffer's first byte.
    pub addr: u64,
    /// Its device.
    pub dev: DLDevice,
}

/// A subscriber's cached tensors (see the module docs).
pub struct TensorCache {
    api: Api,
    /// The CUDA stream the tensors are promised to: `None` until the first
    /// CUDA tensors are made (then torch's current stream), `-1` for none
    /// (the user orders its own work).
    stream: Option<isize>,
    entries: Vec<Entry>,
    /// The push buffers' owner (`Keep::Lent`), shared by their bases.
    push_keep: Option<Arc<Keep>>,
    /// The address of the push buffer handed out last.
    lent: Option<u64>,
    /// Why the cache is off (frames get tensors imported per frame).
    off: Option<String>,
    /// Plane tensors imported.
    pub made: u64,
    /// Frames handed tensors made for an earlier frame in the same buffer.
    pub reused: u64,
    /// Checks that found a buffer still referenced (it was skipped).
    pub busy: u64,
}

impl TensorCache {
    /// A cache of `consumer` arrays promised to `stream` (see
    /// `Subscriber(stream=)`); imports the library now.
    ///
    /// # Errors
    /// The import's (`ModuleNotFoundError` when the library is missing).
    pub fn new(py: Python<'_>, consumer: Consumer, stream: Option<isize>) -> PyResult<TensorCache> {
        Ok(TensorCache {
            api: Api::load(py, consumer)?,
            stream,
            entries: Vec::new(),
            push_keep: None,
            lent: None,
            off: None,
            made: 0,
            reused: 0,
            busy: 0,
        })
    }

    /// Whether tensors are cached (not imported per frame).
    pub fn on(&self) -> bool {
        self.off.is_none()
    }

    /// `"on"`, or `"off: "` and why.
    pub fn state(&self) -> String {
        match &self.off {
            None => "on".to_string(),
            Some(why) => format!("off: {why}"),
        }
    }

    /// The library's name.
    pub fn consumer(&self) -> Consumer {
        self.api.consumer
    }

    /// Forgets every entry: the cache's bases and aliases go. A buffer the
    /// user still holds tensors of stays with them (its DLPack contexts
    /// hold it): a pool buffer goes back to its pool, and a push buffer's
    /// hold is let go, only when they are gone (the rule of `mem`).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.push_keep = None;
        self.lent = None;
    }

    /// Whether entry `i` is free, without acting on it.
    fn probe(&self, py: Python<'_>, i: usize) -> PyResult<bool> {
        let e = &self.entries[i];
        if e.spare.is_some() {
            return Ok(true);
        }
        let mut free = e.handout.strong_count() == 0;
        for (b, &alone) in e.bases.iter().zip(&e.alone) {
            if !free {
                break;
            }
            // A count that cannot be read any more counts as busy.
            free = self.api.uses(b.bind(py))? == Ok(alone);
        }
        if free {
            // SYNC: buffer-released. The counts above were read after the
            // last holder let go: the frame token's strong count is
            // decremented with Release in `Arc`'s drop, torch's storage
            // count with acq_rel in `intrusive_ptr`'s; Python references
            // change under the GIL, which we hold. This fence orders every
            // read those holders made of the buffer (on any thread) before
            // the writes that follow the check.
            fence(Ordering::Acquire);
        }
        Ok(free)
    }

    /// Checks entry `i` and, when it is free and was handed out, fences its
    /// consumers' streams and makes its next aliases. Pool buffers: our
    /// copy stream waits for the events (GPU side); push buffers: they are
    /// returned for the host to wait on.
    fn claim(&mut self, py: Python<'_>, i: usize) -> PyResult<Check> {
        if self.entries[i].spare.is_some() {
            return Ok(Check::Free(None));
        }
        if !self.probe(py, i)? {
            self.busy += 1;
            return Ok(Check::Busy);
        }
        let declared = self.stream.filter(|&s| s > 0).map(|s| s as usize);
        let e = &mut self.entries[i];
        // The aliases before the fence: an error making them leaves the
        // consumers' streams for the next check to fence.
        let aliases = e
            .bases
            .iter()
            .map(|b| self.api.alias(b.bind(py)))
            .collect::<PyResult<Vec<_>>>()?;
        let spare = PyTuple::new(py, aliases)?.unbind();
        let mut wait = None;
        if let Some(c) = e
            .cuda
            .as_ref()
            .filter(|_| declared.is_some() || !e.consumers.is_empty())
        {
            let mut streams = e.consumers.take();
            if let Some(s) = declared {
                if !streams.contains(&s) {
                    streams.push(s);
                }
            }
            let events = c.fence(&streams);
            if e.pushed() {
                wait = Some((Arc::clone(c), events));
            } else {
                c.wait_on_stream(events);
            }
        }
        e.spare = Some(spare);
        Ok(Check::Free(wait))
    }

    /// Checks the pool buffers of `pool` (entries of another pool, from
    /// before a reconnect to another ring, are forgotten). Returns a free
    /// one, if any, and how many are free.
    pub fn scan_pool(&mut self, py: Python<'_>, pool: &Arc<BufPool>) -> PyResult<(Option<usize>, usize)> {
        self.retire_other_pools(pool);
        let (mut first, mut free) = (None, 0);
        for i in 0..self.entries.len() {
            if self.entries[i].pushed() {
                continue;
            }
            if let Check::Free(_) = self.claim(py, i)? {
                free += 1;
                first.get_or_insert(i);
            }
        }
        Ok((first, free))
    }

    /// How many pool buffers of `pool` are free, and whether the push
    /// buffer handed out last is busy; nothing is fenced or made.
    pub fn count_free(&self, py: Python<'_>, pool: Option<&Arc<BufPool>>) -> PyResult<(usize, bool)> {
        let mut free = 0;
        for i in 0..self.entries.len() {
            let e = &self.entries[i];
            let ours = e
                .pool_buf()
                .is_some_and(|b| pool.is_some_and(|p| Arc::ptr_eq(b.pool(), p)));
            if ours && self.probe(py, i)? {
                free += 1;
            }
        }
        let lent_busy = match self.lent.and_then(|a| self.find_push(a)) {
            Some(i) => !self.probe(py, i)?,
            None => false,
        };
        Ok((free, lent_busy))
    }

    fn retire_other_pools(&mut self, pool: &Arc<BufPool>) {
        self.entries
            .retain(|e| e.pool_buf().is_none_or(|b| Arc::ptr_eq(b.pool(), pool)));
    }

    /// Checks the push buffer handed out last (see [`Check`]).
    pub fn check_lent(&mut self, py: Python<'_>) -> PyResult<Check> {
        match self.lent.and_then(|a| self.find_push(a)) {
            Some(i) => self.claim(py, i),
            None => Ok(Check::None),
        }
    }

    /// The pool buffer of entry `i`.
    pub fn buf(&self, i: usize) -> Option<Arc<Buf>> {
        self.entries.get(i).and_then(Entry::pool_buf).cloned()
    }

    /// The entry of the push buffer at `addr`.
    pub fn find_push(&self, addr: u64) -> Option<usize> {
        self.entries.iter().position(|e| e.pushed() && e.addr == addr)
    }

    /// The push buffers' owner, made from `lent` on first use.
    pub fn push_keep(&mut self, lent: impl FnOnce() -> Arc<crate::sub::Lent>) -> Arc<Keep> {
        Arc::clone(self.push_keep.get_or_insert_with(|| Arc::new(Keep::Lent(lent()))))
    }

    /// The stream for CUDA tensors: the declared one, or torch's current
    /// stream on `dev` (looked up once, here).
    fn stream_for(&mut self, py: Python<'_>, dev: DLDevice) -> PyResult<Option<isize>> {
        if dev.device_type != DLDeviceType::CUDA {
            return Ok(None);
        }
        if self.stream.is_none() {
            if let Some(cs) = &self.api.current_stream {
                let s: isize = cs.bind(py).call1((dev.device_id,))?.getattr("cuda_stream")?.extract()?;
                // torch names the legacy default stream 0; DLPack calls it 1.
                self.stream = Some(if s == 0 { 1 } else { s });
            }
        }
        Ok(self.stream)
    }

    /// Makes the entry of a buffer seen for the first time: its bases (one
    /// DLPack import per plane), proven (module docs), and its first
    /// aliases. `None` when a count could not be proven: the cache is off
    /// from now on, and the caller imports per frame.
    ///
    /// # Errors
    /// The consumer's, from an import.
    pub fn add(
        &mut self,
        py: Python<'_>,
        mem: Arc<Keep>,
        addr: u64,
        g: &Geometry,
        dev: DLDevice,
        cuda: Option<Arc<Cuda>>,
    ) -> PyResult<Option<usize>> {
        let stream = self.stream_for(py, dev)?;
        let mut bases = Vec::new();
        let mut alone = Vec::new();
        for k in 0..g.planes().len() {
            let v = View::plane(Arc::clone(&mem), addr, g, dev, k)?;
            let base = self.api.import(py, v, stream)?.unbind();
            self.made += 1;
            match self.api.prove(base.bind(py))? {
                Ok(n) => alone.push(n),
                Err(why) => {
                    self.off = Some(why);
                    self.clear();
                    return Ok(None);
                }
            }
            bases.push(base);
        }
        let aliases = bases
            .iter()
            .map(|b| self.api.alias(b.bind(py)))
            .collect::<PyResult<Vec<_>>>()?;
        self.entries.push(Entry {
            addr,
            mem,
            cuda,
            bases,
            alone,
            spare: Some(PyTuple::new(py, aliases)?.unbind()),
            handout: Weak::new(),
            consumers: Arc::default(),
            uses: 0,
        });
        Ok(Some(self.entries.len() - 1))
    }

    /// Hands out entry `i` (free, aliases ready): the frame's token,
    /// tensors, address and device. The entry is busy until a check finds
    /// them gone.
    pub fn hand_out(&mut self, i: usize) -> PyResult<Handout> {
        let e = self
            .entries
            .get_mut(i)
            .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("vramring: no such cached buffer"))?;
        let tensors = e.spare.take().ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err("vramring: a cached buffer was handed out twice")
        })?;
        let token = Arc::new(Keep::Cached {
            mem: Arc::clone(&e.mem),
            consumers: Arc::clone(&e.consumers),
        });
        e.handout = Arc::downgrade(&token);
        if e.uses > 0 {
            self.reused += 1;
        }
        e.uses += 1;
        if e.pushed() {
            self.lent = Some(e.addr);
        }
        Ok(Handout {
            keep: token,
            tensors,
            addr: e.addr,
            dev: view::device(e.cuda.as_ref().map(|c| c.ordinal)),
        })
    }

    /// The per-frame path (the cache is off): one import per plane of the
    /// frame at `base`, each holding `keep` (the frame's memory).
    pub fn per_frame(
        &mut self,
        py: Python<'_>,
        keep: &Arc<Keep>,
        base: u64,
        g: &Geometry,
        dev: DLDevice,
    ) -> PyResult<Py<PyTuple>> {
        let stream = self.stream_for(py, dev)?;
        let mut out = Vec::new();
        for k in 0..g.planes().len() {
            let v = View::plane(Arc::clone(keep), base, g, dev, k)?;
            out.push(self.api.import(py, v, stream)?);
            self.made += 1;
        }
        Ok(PyTuple::new(py, out)?.unbind())
    }
}
