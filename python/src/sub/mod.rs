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

use pyo3::exceptions::{PyStopIteration, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use vramring::ClientOptions;
use vramring::{BackendKind, Borrow, Delivery, Error, Mode, Subscriber, SubscriberOptions};

use crate::cache::{Check, Consumer, TensorCache};
use crate::errors::{self, FramesHeld, IntoPy};
use crate::mem::{Buf, Excl};
use crate::view::{self, Keep};

mod borrowed;
mod frame;
mod read;

pub use borrowed::BorrowedFrame;
pub use frame::{planes_of, Frame, Plane};
pub use read::Lent;
use read::{borrow_addr, read, Got, Held, Sink};

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
        let first = || {
            if let Some(l) = &settle {
                l.settle();
            }
        };
        let got = self.read_detached(py, first, lend, None, wait)?;
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
        let first = || {
            if let Some((c, evs)) = wait {
                c.sync_events(evs);
            }
        };
        let mut got = self.read_detached(py, first, lend, dest_buf.as_deref(), within)?;
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

    /// One read (`read`) without the GIL: `first` (the host's wait for the
    /// consumers' work on a buffer about to be written again), the pool's
    /// settling, then the read into `dest` or a buffer of the pool.
    fn read_detached(
        &mut self,
        py: Python<'_>,
        first: impl FnOnce() + Send,
        lend: bool,
        dest: Option<&Buf>,
        wait: Wait,
    ) -> PyResult<Got> {
        let mut sink = std::mem::take(&mut self.sink);
        let sub = match self.sub() {
            Ok(s) => s,
            Err(e) => {
                self.sink = sink;
                return Err(e);
            }
        };
        let got = py.detach(|| {
            first();
            if let Some(p) = &sink.pool {
                p.settle();
            }
            read(sub, &mut sink, lend, dest, wait)
        });
        self.sink = sink;
        got.py_err()
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
            sink: Sink::new(max_held),
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

/// A clear error instead of PyO3's when another thread is inside a call on
/// the same object (it holds it while the GIL is released).
pub fn busy<T>(r: Result<T, pyo3::pycell::PyBorrowMutError>) -> PyResult<T> {
    r.map_err(|_| {
        pyo3::exceptions::PyRuntimeError::new_err(
            "the object is in use by another thread (a call on it is waiting); use one object per thread",
        )
    })
}
