//! One camera's life: open its input, feed access units to its decoder,
//! and survive what cameras do (stall, restart, send garbage, overrun the
//! reader) without touching any other camera.
//!
//! The loop is written against two traits, [`Source`] (where access units
//! come from) and [`Decode`] (the decode-and-publish step), so that the
//! supervision is tested with fakes on a machine without NVDEC
//! (`tests/nvr.rs`); `nvdec_stage.rs` is the real [`Decode`], `sources.rs`
//! the real [`Source`]s. Each camera runs [`supervise`] on a thread of its
//! own: a camera that blocks, fails or panics holds up nobody else.
//!
//! What the loop does on trouble (each is counted in [`CameraStats`] and
//! logged as one sentence through [`Log`]):
//! * the input goes away or cannot be opened: the decoder's pending
//!   pictures are flushed, the input is opened again after a back-off
//!   (`retry`, doubling to 16×), and decoding resumes at its next keyframe
//!   (`input_restarts`, `resyncs`);
//! * the reader was overrun, or a packet says discontinuity: flush, resume
//!   at the next keyframe (`resyncs`);
//! * nothing arrives for `stall`: reported once per stall (`stalls`);
//! * the decode step fails (garbage, a stream the GPU refuses): the
//!   camera's decoder is made again ([`Decode::reset`]) and decoding
//!   resumes at the next keyframe (`decoder_resets`, `resyncs`); the ring
//!   and its subscribers stay;
//! * the camera's thread panics: it is caught, counted (`panics`), and the
//!   camera starts again with a new decoder ([`Cameras::decoder`]).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One access unit read into the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unit {
    /// Bytes in the buffer.
    pub len: usize,
    /// The input's timestamp (a packet's pts; a file unit's index).
    pub pts: i64,
    /// An IDR/IRAP access unit: decoding may start here.
    pub key: bool,
    /// The input says the stream is broken before this unit.
    pub discontinuity: bool,
}

/// What a [`Source::read`] gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// An access unit.
    Unit(Unit),
    /// Nothing within the source's poll interval.
    Idle,
    /// Nothing yet, as scheduled (a file paced at a low frame rate): not a
    /// stall.
    Paced,
    /// The end of one pass of a looped file: the decoder flushes, and the
    /// next unit starts a new stream.
    EndOfStream,
    /// The input is over for good (a file that does not loop).
    Finished,
}

/// Why an input failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputError {
    /// The input is gone (its publisher exited, the file vanished): open it
    /// again.
    Gone(String),
    /// The reader lost data (overrun) but is still connected: resume at the
    /// next keyframe.
    Resync(String),
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InputError::Gone(m) | InputError::Resync(m) => f.write_str(m),
        }
    }
}

/// Where a camera's access units come from.
pub trait Source: Send {
    /// Reads the next access unit into `buf` (resized as needed), or says
    /// why there is none. Blocks at most about a poll interval.
    ///
    /// # Errors
    /// [`InputError`].
    fn read(&mut self, buf: &mut Vec<u8>) -> Result<Read, InputError>;
}

impl<S: Source + ?Sized> Source for Box<S> {
    fn read(&mut self, buf: &mut Vec<u8>) -> Result<Read, InputError> {
        (**self).read(buf)
    }
}

/// The decode step's failure: a sentence. The supervisor recreates the
/// decoder and resumes at the next keyframe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Decodes access units and publishes the pictures on the camera's ring.
pub trait Decode: Send {
    /// Decodes one access unit; returns the pictures published.
    ///
    /// # Errors
    /// [`DecodeError`]: the decoder is in an unknown state.
    fn decode(&mut self, au: &[u8], unit: &Unit) -> Result<u64, DecodeError>;
    /// Ends the stream: publishes the pictures the decoder still holds; the
    /// next unit starts a new stream (at a keyframe).
    ///
    /// # Errors
    /// As [`Decode::decode`].
    fn end_of_stream(&mut self) -> Result<u64, DecodeError>;
    /// Throws the decoder away and makes a new one; the ring stays.
    ///
    /// # Errors
    /// [`DecodeError`] when no decoder can be made now (tried again later).
    fn reset(&mut self) -> Result<(), DecodeError>;
    /// Subscribers on the camera's ring now.
    fn subscribers(&self) -> u32 {
        0
    }
    /// Pictures decoded but not published (lossless readers held every
    /// slot past the loan timeout), so far.
    fn dropped(&self) -> u64 {
        0
    }
}

/// Makes a camera's parts; shared by every camera thread.
pub trait Cameras: Sync {
    /// The camera's description.
    type Camera: Sync;
    /// Its input.
    type Src: Source;
    /// Its decode step.
    type Dec: Decode;
    /// Opens the camera's input.
    ///
    /// # Errors
    /// [`InputError`]: tried again after the back-off.
    fn open(&self, cam: &Self::Camera) -> Result<Self::Src, InputError>;
    /// Makes the camera's decode step (after a panic: a new one).
    ///
    /// # Errors
    /// [`DecodeError`]: tried again after the back-off.
    fn decoder(&self, cam: &Self::Camera) -> Result<Self::Dec, DecodeError>;
}

/// Where a camera's sentences go (the program prints them; tests keep them).
pub trait Log: Sync {
    /// One event of camera `name`, as a sentence.
    fn line(&self, name: &str, event: &str, text: &str);
}

/// What a camera is doing, for status lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum State {
    /// Opening its input for the first time.
    Starting = 0,
    /// Decoding.
    Running = 1,
    /// Its input is gone or does not open; trying again.
    WaitingInput = 2,
    /// Connected, but nothing arrives.
    Stalled = 3,
    /// Waiting for a keyframe after a disruption.
    Resyncing = 4,
    /// Its decoder cannot be made; trying again.
    DecoderFailed = 5,
    /// The input ended (a file that does not loop).
    Ended = 6,
    /// Stopped on request.
    Stopped = 7,
}

impl State {
    const ALL: [State; 8] = [
        State::Starting,
        State::Running,
        State::WaitingInput,
        State::Stalled,
        State::Resyncing,
        State::DecoderFailed,
        State::Ended,
        State::Stopped,
    ];

    /// The name in status lines.
    pub fn name(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Running => "running",
            State::WaitingInput => "waiting-input",
            State::Stalled => "stalled",
            State::Resyncing => "resyncing",
            State::DecoderFailed => "decoder-failed",
            State::Ended => "ended",
            State::Stopped => "stopped",
        }
    }
}

/// A camera's counters. Each is written by the camera's own thread only and
/// read by the reporter for display: every access is `Relaxed` (single
/// writer, no other memory is published through them).
#[derive(Debug, Default)]
pub struct CameraStats {
    /// Access units read from the input.
    pub units: AtomicU64,
    /// Pictures published on the ring.
    pub frames: AtomicU64,
    /// Units dropped while waiting for a keyframe.
    pub skipped: AtomicU64,
    /// Times decoding resumed at a keyframe after a disruption.
    pub resyncs: AtomicU64,
    /// Times the input was opened again after it went away.
    pub input_restarts: AtomicU64,
    /// Stalls reported.
    pub stalls: AtomicU64,
    /// Decode-step failures (each followed by a new decoder).
    pub decode_errors: AtomicU64,
    /// Decoders made again.
    pub decoder_resets: AtomicU64,
    /// Ends of a looped file's pass.
    pub loops: AtomicU64,
    /// Panics caught on the camera's thread.
    pub panics: AtomicU64,
    /// Decoded pictures not published (lossless readers held every slot
    /// past the loan timeout), as last seen.
    pub dropped: AtomicU64,
    /// Subscribers on the ring, as last seen.
    pub subscribers: AtomicU32,
    state: AtomicU32,
    last_error: Mutex<String>,
}

impl CameraStats {
    /// The camera's state.
    pub fn state(&self) -> State {
        // Relaxed: see the type's comment.
        let v = self.state.load(Ordering::Relaxed);
        State::ALL
            .into_iter()
            .find(|s| *s as u32 == v)
            .unwrap_or(State::Starting)
    }

    fn set_state(&self, s: State) {
        // Relaxed: see the type's comment.
        self.state.store(s as u32, Ordering::Relaxed);
    }

    /// The last failure, as a sentence ("" if none).
    pub fn last_error(&self) -> String {
        self.last_error.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn set_error(&self, e: &str) {
        if let Ok(mut s) = self.last_error.lock() {
            e.clone_into(&mut s);
        }
    }

    /// Reads a counter.
    pub fn get(c: &AtomicU64) -> u64 {
        // Relaxed: see the type's comment.
        c.load(Ordering::Relaxed)
    }

    fn bump(c: &AtomicU64, n: u64) {
        // Relaxed: see the type's comment.
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// The supervision's timing.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Nothing for this long is a stall.
    pub stall: Duration,
    /// First back-off; doubles up to 16 times this.
    pub retry: Duration,
}

/// Sleeps `d` in short steps, returning early when `stop` is set.
fn nap(d: Duration, stop: &AtomicBool) {
    let end = Instant::now() + d;
    // Relaxed: a flag polled by loops; nothing is published with it.
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(20)));
    }
}

/// One camera's surroundings: how its parts are made, its counters, where
/// its sentences go, and the stop flag.
pub struct Env<'a, C: Cameras> {
    /// Makes the camera's input and decoder.
    pub cams: &'a C,
    /// The camera.
    pub cam: &'a C::Camera,
    /// Its name in logs.
    pub name: &'a str,
    /// Its counters.
    pub stats: &'a CameraStats,
    /// Stall and back-off times.
    pub timing: Timing,
    /// Where its sentences go.
    pub log: &'a dyn Log,
    /// Set to stop every camera.
    pub stop: &'a AtomicBool,
}

/// Runs camera `name` until its input ends or `stop` is set, catching a
/// panic of its loop and starting the camera again. `first` is its first
/// decode step, made by the caller (so that a decoder that cannot be made
/// at all is an error at start-up, not a retry loop).
pub fn supervise<C: Cameras>(env: &Env<'_, C>, first: C::Dec) {
    let (name, stats, timing, log, stop) = (env.name, env.stats, env.timing, env.log, env.stop);
    let mut dec = Some(first);
    let mut backoff = timing.retry;
    loop {
        let run = catch_unwind(AssertUnwindSafe(|| {
            let d = match dec.take() {
                Some(d) => d,
                None => make_decoder(env)?,
            };
            Some(run_camera(env, d))
        }));
        match run {
            Ok(Some(end)) => {
                stats.set_state(end);
                return;
            }
            Ok(None) => {
                stats.set_state(State::Stopped);
                return;
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                CameraStats::bump(&stats.panics, 1);
                let msg = format!("the camera's thread panicked ({what}); starting it again in {backoff:?}");
                stats.set_error(&msg);
                log.line(name, "panic", &msg);
                nap(backoff, stop);
                backoff = (backoff * 2).min(timing.retry * 16);
                // Relaxed: see `nap`.
                if stop.load(Ordering::Relaxed) {
                    stats.set_state(State::Stopped);
                    return;
                }
            }
        }
    }
}

/// Makes a decode step, retrying with back-off; `None` when stopped.
fn make_decoder<C: Cameras>(env: &Env<'_, C>) -> Option<C::Dec> {
    let (cams, cam, name, stats, timing, log, stop) =
        (env.cams, env.cam, env.name, env.stats, env.timing, env.log, env.stop);
    let mut backoff = timing.retry;
    // Relaxed: see `nap`.
    while !stop.load(Ordering::Relaxed) {
        match cams.decoder(cam) {
            Ok(d) => return Some(d),
            Err(e) => {
                stats.set_state(State::DecoderFailed);
                let msg = format!("cannot make a decoder ({e}); trying again in {backoff:?}");
                stats.set_error(&msg);
                log.line(name, "decoder-failed", &msg);
                nap(backoff, stop);
                backoff = (backoff * 2).min(timing.retry * 16);
            }
        }
    }
    None
}

/// Why the decoder must wait for a keyframe, for the resync log line.
struct Pending {
    reason: String,
    skipped: u64,
}

/// The camera's loop. Returns the state it ended in.
fn run_camera<C: Cameras>(env: &Env<'_, C>, mut dec: C::Dec) -> State {
    let (cams, cam, name, stats, timing, log, stop) =
        (env.cams, env.cam, env.name, env.stats, env.timing, env.log, env.stop);
    let mut src: Option<C::Src> = None;
    let mut opened_once = false;
    let mut open_failed_logged = false;
    let mut backoff = timing.retry;
    let mut buf = Vec::new();
    // Waiting for a keyframe: at the start (no resync counted), and after
    // every disruption (reason given).
    let mut need_key = true;
    let mut pending: Option<Pending> = None;
    let mut last_unit = Instant::now();
    let mut stalled = false;
    let mut dec_ok = true;
    let publish_subs = |dec: &C::Dec| {
        // Relaxed: see `CameraStats`.
        stats.subscribers.store(dec.subscribers(), Ordering::Relaxed);
        stats.dropped.store(dec.dropped(), Ordering::Relaxed);
    };
    // Relaxed: see `nap`.
    while !stop.load(Ordering::Relaxed) {
        if !dec_ok {
            match dec.reset() {
                Ok(()) => {
                    CameraStats::bump(&stats.decoder_resets, 1);
                    dec_ok = true;
                    backoff = timing.retry;
                }
                Err(e) => {
                    stats.set_state(State::DecoderFailed);
                    let msg = format!("cannot make a new decoder ({e}); trying again in {backoff:?}");
                    stats.set_error(&msg);
                    log.line(name, "decoder-failed", &msg);
                    nap(backoff, stop);
                    backoff = (backoff * 2).min(timing.retry * 16);
                    continue;
                }
            }
        }
        if src.is_none() {
            match cams.open(cam) {
                Ok(s) => {
                    if opened_once {
                        CameraStats::bump(&stats.input_restarts, 1);
                        log.line(
                            name,
                            "input-restarted",
                            "its input is back; decoding resumes at its next keyframe",
                        );
                    }
                    opened_once = true;
                    open_failed_logged = false;
                    backoff = timing.retry;
                    last_unit = Instant::now();
                    stalled = false;
                    stats.set_state(if pending.is_some() {
                        State::Resyncing
                    } else {
                        State::Starting
                    });
                    src = Some(s);
                }
                Err(e) => {
                    stats.set_state(State::WaitingInput);
                    let msg = format!("cannot open its input ({e}); trying again");
                    if !open_failed_logged {
                        log.line(name, "input-waiting", &msg);
                        open_failed_logged = true;
                    }
                    stats.set_error(&msg);
                    nap(backoff, stop);
                    backoff = (backoff * 2).min(timing.retry * 16);
                    continue;
                }
            }
        }
        let Some(s) = src.as_mut() else { continue };
        let read = s.read(&mut buf);
        match read {
            Ok(Read::Unit(u)) => {
                CameraStats::bump(&stats.units, 1);
                last_unit = Instant::now();
                if stalled {
                    stalled = false;
                    log.line(name, "input-resumed", "its input sends again");
                    stats.set_state(if need_key { State::Resyncing } else { State::Running });
                }
                if u.discontinuity && !need_key {
                    flush(&mut dec, name, stats, log, &mut dec_ok);
                    disrupted("the input marked a discontinuity".into(), &mut pending, &mut need_key);
                }
                if need_key {
                    if !u.key {
                        CameraStats::bump(&stats.skipped, 1);
                        if let Some(p) = pending.as_mut() {
                            p.skipped += 1;
                        }
                        continue;
                    }
                    need_key = false;
                    if let Some(p) = pending.take() {
                        CameraStats::bump(&stats.resyncs, 1);
                        log.line(
                            name,
                            "resync",
                            &format!(
                                "resynchronised at a keyframe (pts {}) after {}; {} access units skipped",
                                u.pts, p.reason, p.skipped
                            ),
                        );
                    }
                    stats.set_state(State::Running);
                }
                let au = &buf[..u.len.min(buf.len())];
                match dec.decode(au, &u) {
                    Ok(n) => {
                        CameraStats::bump(&stats.frames, n);
                        if n > 0 {
                            publish_subs(&dec);
                        }
                    }
                    Err(e) => {
                        CameraStats::bump(&stats.decode_errors, 1);
                        let msg = format!("decoding failed ({e}); making a new decoder");
                        stats.set_error(&msg);
                        log.line(name, "decode-error", &msg);
                        dec_ok = false;
                        disrupted(format!("a decoding error ({e})"), &mut pending, &mut need_key);
                        stats.set_state(State::Resyncing);
                    }
                }
            }
            Ok(Read::Idle) => {
                publish_subs(&dec);
                if !stalled && last_unit.elapsed() >= timing.stall {
                    stalled = true;
                    CameraStats::bump(&stats.stalls, 1);
                    let msg = format!("no access unit for {} ms: its input stalls", timing.stall.as_millis());
                    stats.set_error(&msg);
                    log.line(name, "stall", &msg);
                    stats.set_state(State::Stalled);
                }
            }
            Ok(Read::Paced) => last_unit = Instant::now(),
            Ok(Read::EndOfStream) => {
                flush(&mut dec, name, stats, log, &mut dec_ok);
                CameraStats::bump(&stats.loops, 1);
                // A new pass starts at the file's first unit, a keyframe.
                need_key = true;
            }
            Ok(Read::Finished) => {
                flush(&mut dec, name, stats, log, &mut dec_ok);
                log.line(name, "ended", "its input ended");
                return State::Ended;
            }
            Err(InputError::Gone(why)) => {
                src = None;
                flush(&mut dec, name, stats, log, &mut dec_ok);
                let msg = format!("its input went away ({why}); opening it again");
                stats.set_error(&msg);
                log.line(name, "input-gone", &msg);
                stats.set_state(State::WaitingInput);
                disrupted(format!("an input restart ({why})"), &mut pending, &mut need_key);
                nap(timing.retry, stop);
            }
            Err(InputError::Resync(why)) => {
                flush(&mut dec, name, stats, log, &mut dec_ok);
                stats.set_error(&why);
                log.line(name, "input-overrun", &format!("{why}; waiting for the next keyframe"));
                stats.set_state(State::Resyncing);
                disrupted(why, &mut pending, &mut need_key);
            }
        }
    }
    State::Stopped
}

/// Notes a disruption: the decoder waits for a keyframe, and the resync
/// that ends the wait is logged with the latest reason.
fn disrupted(why: String, pending: &mut Option<Pending>, need_key: &mut bool) {
    *need_key = true;
    match pending {
        Some(p) => p.reason = why,
        None => {
            *pending = Some(Pending {
                reason: why,
                skipped: 0,
            })
        }
    }
}

/// Ends the decoder's stream; a failure means a new decoder.
fn flush<D: Decode>(dec: &mut D, name: &str, stats: &CameraStats, log: &dyn Log, ok: &mut bool) {
    if !*ok {
        return;
    }
    match dec.end_of_stream() {
        Ok(n) => CameraStats::bump(&stats.frames, n),
        Err(e) => {
            CameraStats::bump(&stats.decode_errors, 1);
            let msg = format!("flushing the decoder failed ({e}); making a new decoder");
            stats.set_error(&msg);
            log.line(name, "decode-error", &msg);
            *ok = false;
        }
    }
}
