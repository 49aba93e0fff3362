//! `vramringsrc`'s implementation: properties in `Settings`, the
//! subscriber and what was last negotiated in `State`; how a frame goes out
//! (memory, buffer, timestamps) in `output`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_base::prelude::*;
use gst_base::subclass::base_src::CreateSuccess;
use gst_base::subclass::prelude::*;
use vramring::{ClientOptions, Delivery, Error, Mode, Refusal, Subscriber, SubscriberOptions, SubscriberStats};

use super::kept::{self, Facts, Lent};
use super::{DeliverySetting, ModeSetting, TimestampMode};
use crate::cuda::{self, Filler, Primary};
use crate::element::{lock, try_lock};
use crate::video;

mod output;

use output::Shape;

static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "vramringsrc",
        gst::DebugColorFlags::empty(),
        Some("vramring frame ring source"),
    )
});

const DEFAULT_SOCKET: &str = "/tmp/vramring.sock";
const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// One wait for a frame or a publisher; between two, the element looks
/// whether it is being flushed.
const SLICE: Duration = Duration::from_millis(50);
/// How long a zero-copy source goes without a frame out, while frames are
/// lost to its full queue and buffers are lent, before it takes downstream
/// for one that keeps them (`VramringSrc::starved`).
const STARVED_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
struct Settings {
    socket_path: String,
    mode: ModeSetting,
    lossless: bool,
    delivery: DeliverySetting,
    timeout_ms: u64,
    client_name: String,
    timestamp_mode: TimestampMode,
    cuda_device_id: u32,
    zero_copy: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            socket_path: DEFAULT_SOCKET.into(),
            mode: ModeSetting::default(),
            lossless: false,
            delivery: DeliverySetting::default(),
            timeout_ms: DEFAULT_TIMEOUT_MS,
            client_name: String::new(),
            timestamp_mode: TimestampMode::default(),
            cuda_device_id: 0,
            zero_copy: true,
        }
    }
}

impl Settings {
    fn timeout(&self) -> Option<Duration> {
        (self.timeout_ms > 0).then(|| Duration::from_millis(self.timeout_ms))
    }
}

#[derive(Default)]
struct State {
    sub: Option<Subscriber>,
    /// Whether a subscriber was ever connected since start.
    connected_once: bool,
    /// Since when the source has had no publisher (at start, or since
    /// ProducerGone).
    waiting_since: Option<Instant>,
    /// The next buffer follows a gap.
    discont: bool,
    /// Drops already posted as QoS.
    reported_dropped: u64,
    /// Counters of the subscribers before the current one (an eviction
    /// starts a new subscriber; a reconnect keeps the counters).
    earlier: SubscriberStats,
    /// Where a frame of a CUDA ring is copied to host memory first.
    scratch: Vec<u8>,
    /// What memory the frames of the current ring go out in, decided once
    /// per ring format and size ([`VramringSrc::decide`]).
    output: Option<OutputMemory>,
    /// The pool and stream of CUDA output, made for the caps it holds.
    filler: Option<Filler>,
    /// The subscriber was made for zero-copy output (ADR 0028): push into
    /// a queue, draining to the newest frame in `mode=latest`.
    zero_copy_sub: bool,
    /// Frames read but passed over for a newer one (a latest source
    /// draining its queue): counted as dropped, not delivered.
    superseded: u64,
    /// An error met while draining, reported at the next read (the frame
    /// in hand goes out first).
    deferred: Option<Error>,
    /// Downstream reads `GstVideoMeta` (its allocation query says so), so
    /// system memory may go out in the ring's layout.
    video_meta: bool,
    /// The caps and video info of the frames last read.
    shape: Option<Shape>,
    /// Kept frames lent downstream, not yet freed.
    lent: Arc<AtomicUsize>,
    /// Downstream kept lent buffers until the queue ran dry: copies from
    /// now on (`VramringSrc::starved`).
    copy_forced: bool,
    /// The subscriber's dropped count when the last frame went out, and
    /// when that was.
    dropped_at_frame: u64,
    last_out: Option<Instant>,
}

/// The ring a memory decision was made for: backend, format and size.
type RingKey = (vramring::BackendKind, vramring::Format, u32, u32);

/// Which memory the frames of one ring go out in.
#[derive(Clone, Copy)]
struct OutputMemory {
    key: RingKey,
    /// `Some`: GStreamer CUDA memory, in the primary context of this GPU.
    cuda: Option<&'static Primary>,
}

/// The mode and delivery a subscriber is made with; for zero-copy output,
/// push into a queue (`mode=latest`: a sequential queue, drained to the
/// newest frame at each read).
fn reading(s: &Settings, zero_copy: bool) -> (Mode, Delivery) {
    let mode = match s.mode {
        ModeSetting::Sequential => Mode::Sequential,
        ModeSetting::Latest if zero_copy && !s.lossless => Mode::Sequential,
        ModeSetting::Latest => Mode::Latest,
    };
    let delivery = match s.delivery {
        _ if zero_copy => Delivery::Push,
        DeliverySetting::Auto => Delivery::Auto,
        DeliverySetting::Pull => Delivery::Pull,
        DeliverySetting::Push => Delivery::Push,
    };
    (mode, delivery)
}

/// Whether a kept frame of a `backend` ring laid out as `geometry` can go
/// out as it is: CUDA memory wrapped around it (`cuda`: the output's GPU,
/// a libgstcuda that can wrap, and a layout GStreamer's CUDA elements read
/// right: [`kept::cuda_layout`]), or system memory that is a host ring's
/// push buffer.
fn wraps(cuda: Option<&'static Primary>, backend: vramring::BackendKind, geometry: &vramring::Geometry) -> bool {
    match backend {
        vramring::BackendKind::Host => cuda.is_none(),
        vramring::BackendKind::Cuda => cuda.is_some() && cuda::can_wrap() && kept::cuda_layout(geometry),
    }
}

fn ring_key(sub: &Subscriber) -> RingKey {
    let g = sub.geometry();
    (sub.backend(), g.format, g.width, g.height)
}

impl State {
    /// Takes the subscriber out (to subscribe again), keeping its counters
    /// in `earlier`; an error it left for the next read goes with it.
    fn retire(&mut self) -> Option<Subscriber> {
        let old = self.stats();
        self.earlier = SubscriberStats { last_seq: 0, ..old };
        self.superseded = 0;
        self.deferred = None;
        self.sub.take()
    }

    fn stats(&self) -> SubscriberStats {
        let now = self.sub.as_ref().map(Subscriber::stats).unwrap_or_default();
        let e = self.earlier;
        SubscriberStats {
            delivered: (e.delivered + now.delivered).saturating_sub(self.superseded),
            dropped: e.dropped + now.dropped + self.superseded,
            overruns: e.overruns + now.overruns,
            reconnects: e.reconnects + now.reconnects,
            pushed: e.pushed + now.pushed,
            last_seq: now.last_seq,
            ..now
        }
    }
}

/// What other threads read of the source (the `stats` property, caps and
/// context queries): a copy the streaming thread keeps current, because it
/// holds `State` through each 50 ms wait for a frame, and a reader woken by
/// its unlock can lose the lock to the thread's next step again and again.
#[derive(Default)]
struct Published {
    stats: SubscriberStats,
    /// The caps last sent downstream.
    caps: Option<gst::Caps>,
    /// The primary context of the CUDA output last decided.
    cuda: Option<&'static Primary>,
}

#[derive(Default)]
pub struct VramringSrc {
    settings: Mutex<Settings>,
    state: Mutex<State>,
    published: Mutex<Published>,
    flushing: AtomicBool,
}

#[glib::object_subclass]
impl ObjectSubclass for VramringSrc {
    const NAME: &'static str = "GstVramringSrc";
    type Type = super::VramringSrc;
    type ParentType = gst_base::PushSrc;
}

impl ObjectImpl for VramringSrc {
    fn properties() -> &'static [glib::ParamSpec] {
        static PROPS: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
            vec![
                crate::element::socket_path("Unix socket of the publisher to subscribe to", DEFAULT_SOCKET),
                glib::ParamSpecEnum::builder_with_default("mode", ModeSetting::default())
                    .nick("Mode")
                    .blurb("Which frames to read: the newest at each read, or every frame in order")
                    .mutable_ready()
                    .build(),
                glib::ParamSpecBoolean::builder("lossless")
                    .nick("Lossless")
                    .blurb("Ask the publisher (policy=lossless) to wait for this subscriber; implies mode=sequential")
                    .default_value(false)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecEnum::builder_with_default("delivery", DeliverySetting::default())
                    .nick("Delivery")
                    .blurb("How frames arrive: pull (copy out of the pool), push (the publisher copies into our buffers; any mode), or auto (pull where the publisher hands out its pool, push where it does not)")
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt64::builder("timeout")
                    .nick("Timeout")
                    .blurb("Milliseconds to wait for a publisher at the socket, at start (then an error) and after it went away (then end of stream); 0: for ever")
                    .default_value(DEFAULT_TIMEOUT_MS)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecString::builder("client-name")
                    .nick("Client name")
                    .blurb("Name this subscriber gives the publisher (shown by `vramring inspect`); empty: the element's name")
                    .mutable_ready()
                    .build(),
                glib::ParamSpecEnum::builder_with_default("timestamp-mode", TimestampMode::default())
                    .nick("Timestamp mode")
                    .blurb("clock: the publisher's presentation instant on this pipeline's running time (commit time for frames without a vramringsink trailer); pts: the frame's pts as published, in ns")
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("cuda-device-id")
                    .nick("CUDA device id")
                    .blurb("GPU whose primary context the source offers downstream CUDA elements before a CUDA ring is known (once it is, the ring's GPU)")
                    .default_value(0)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecBoxed::builder::<gst::Structure>("stats")
                    .nick("Statistics")
                    .blurb("The subscriber's counters: delivered, dropped, overruns, reconnects, pushed, last-seq")
                    .read_only()
                    .build(),
                glib::ParamSpecBoolean::builder("zero-copy")
                    .nick("Zero copy")
                    .blurb("Hand downstream the subscriber's own push buffer instead of a copy (no GPU work in this process per frame): on a CUDA ring with CUDA memory out it subscribes by push (a queue, drained to the newest frame in mode=latest) unless delivery=pull, or lossless=true without delivery=push; on a host ring with delivery=push (any mode). A downstream that keeps every buffer lent until none is left gets copies from then on, with a warning. Off: every frame is copied into a buffer of our own")
                    .default_value(true)
                    .mutable_ready()
                    .build(),
            ]
        });
        PROPS.as_ref()
    }

    fn constructed(&self) {
        self.parent_constructed();
        let obj = self.obj();
        obj.set_live(true);
        obj.set_format(gst::Format::Time);
    }

    fn set_property(&self, _id: usize, value: &glib::Value, pspec: &glib::ParamSpec) {
        let mut s = lock(&self.settings);
        match pspec.name() {
            "socket-path" => {
                s.socket_path = value
                    .get::<Option<String>>()
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| DEFAULT_SOCKET.into())
            }
            "mode" => s.mode = value.get().unwrap_or_default(),
            "lossless" => s.lossless = value.get().unwrap_or(false),
            "delivery" => s.delivery = value.get().unwrap_or_default(),
            "timeout" => s.timeout_ms = value.get().unwrap_or(DEFAULT_TIMEOUT_MS),
            "client-name" => s.client_name = value.get::<Option<String>>().ok().flatten().unwrap_or_default(),
            "timestamp-mode" => s.timestamp_mode = value.get().unwrap_or_default(),
            "cuda-device-id" => s.cuda_device_id = value.get().unwrap_or(0),
            "zero-copy" => s.zero_copy = value.get().unwrap_or(true),
            other => gst::warning!(CAT, imp = self, "no property {other}"),
        }
    }

    fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
        if pspec.name() == "stats" {
            let live = try_lock(&self.state).map(|state| state.stats());
            let st = live.unwrap_or_else(|| lock(&self.published).stats);
            return gst::Structure::builder("vramring-subscriber-stats")
                .field("delivered", st.delivered)
                .field("dropped", st.dropped)
                .field("overruns", st.overruns)
                .field("reconnects", st.reconnects)
                .field("pushed", st.pushed)
                .field("last-seq", st.last_seq)
                .build()
                .to_value();
        }
        let s = lock(&self.settings);
        match pspec.name() {
            "socket-path" => s.socket_path.to_value(),
            "mode" => s.mode.to_value(),
            "lossless" => s.lossless.to_value(),
            "delivery" => s.delivery.to_value(),
            "timeout" => s.timeout_ms.to_value(),
            "client-name" => s.client_name.to_value(),
            "timestamp-mode" => s.timestamp_mode.to_value(),
            "cuda-device-id" => s.cuda_device_id.to_value(),
            "zero-copy" => s.zero_copy.to_value(),
            _ => glib::Value::from_type(glib::Type::INVALID),
        }
    }
}

impl GstObjectImpl for VramringSrc {}

impl ElementImpl for VramringSrc {
    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        static META: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            crate::element::metadata("vramring frame ring source", "Source/Video", "Subscribes to a vramring frame ring published by another process and outputs its frames as raw video (live): in CUDA memory from a CUDA ring where downstream takes it, else in system memory")
        });
        Some(&*META)
    }

    fn pad_templates() -> &'static [gst::PadTemplate] {
        static TEMPLATES: LazyLock<Vec<gst::PadTemplate>> =
            LazyLock::new(|| crate::element::one_pad("src", gst::PadDirection::Src, &video::template_caps_with_cuda()));
        TEMPLATES.as_ref()
    }
}

/// What one read produced, ready to push once the state lock is released.
struct Output {
    buffer: gst::Buffer,
    caps: Option<gst::Caps>,
    qos: Option<(u64, u64, Option<gst::ClockTime>)>,
}

enum Step {
    /// A buffer to push.
    Frame(Output),
    /// Nothing yet: look again (after checking for a flush).
    Again,
    /// Downstream keeps the lent buffers: copies from now on. The warning
    /// (with the count lent) is posted without the state lock, so a bus
    /// sync handler may query us.
    Copying(u32),
    /// A fatal error, posted without the state lock.
    Fail(gst::ErrorMessage),
}

impl VramringSrc {
    /// Whether downstream keeps the buffers it was lent so that the queue
    /// they hold ran dry (reads came back empty for [`STARVED_AFTER`] while
    /// frames were lost to a full queue, or the publisher evicted a
    /// lossless reader while buffers were lent): an
    /// encoder with lookahead, a `queue` that fills. Then the source makes
    /// copies from now on: it subscribes again (the lent buffers stay with
    /// the old subscription until downstream lets them go) and returns the
    /// count lent, which `create` warns of without the state lock.
    /// `evicted`: the publisher just evicted us.
    fn starved(&self, state: &mut State, s: &Settings, evicted: bool) -> Option<u32> {
        if !s.zero_copy || state.copy_forced || state.lent.load(Ordering::Relaxed) == 0 {
            // Nothing lent: an empty read is the publisher's pace.
            return None;
        }
        // Frames lost to a full queue, and none out for a while: a
        // downstream that is only slow blocks our push instead, and once it
        // takes a buffer the queue's frames flow again.
        let stuck = state.last_out.is_none_or(|t| t.elapsed() >= STARVED_AFTER);
        if !evicted && (state.stats().dropped <= state.dropped_at_frame || !stuck) {
            return None;
        }
        let lent = u32::try_from(state.lent.load(Ordering::Relaxed)).unwrap_or(u32::MAX);
        state.copy_forced = true;
        state.zero_copy_sub = false;
        state.output = None;
        if !evicted {
            if let Some(mut sub) = state.retire() {
                if let Err(e) = sub.close() {
                    gst::debug!(CAT, imp = self, "closing the subscriber: {e}");
                }
            }
        }
        Some(lent)
    }

    /// The subscriber options the settings ask for; with `zero_copy`, push
    /// into a queue (a latest source reads it as sequential and drains it
    /// to the newest frame), whose frames can be kept past the read.
    fn options(&self, s: &Settings, zero_copy: bool) -> SubscriberOptions {
        let name = if s.client_name.is_empty() {
            self.obj().name().to_string()
        } else {
            s.client_name.clone()
        };
        let (mode, delivery) = reading(s, zero_copy);
        SubscriberOptions::default()
            .name(name)
            .mode(mode)
            .lossless(s.lossless)
            .delivery(delivery)
            .reconnect(true)
            .connect_timeout(Duration::from_secs(2))
    }

    /// One attempt to subscribe. `Ok(None)`: no publisher yet, try again.
    fn connect(&self, s: &Settings, zero_copy: bool) -> Result<Option<Subscriber>, gst::ErrorMessage> {
        match Subscriber::connect(&s.socket_path, self.options(s, zero_copy)) {
            Ok(sub) => {
                gst::info!(CAT, imp = self, "subscribed by {:?} delivery", sub.delivery());
                Ok(Some(sub))
            }
            Err(e @ Error::Refused { .. })
                if e.refusal() != Some(Refusal::Full) && e.refusal() != Some(Refusal::Shutdown) =>
            {
                Err(gst::error_msg!(
                    gst::ResourceError::OpenRead,
                    ["{} refused this subscriber: {}", s.socket_path, e]
                ))
            }
            Err(e) => {
                gst::debug!(CAT, imp = self, "no publisher at {} yet: {e}", s.socket_path);
                Ok(None)
            }
        }
    }

    /// Whether the wait for a publisher has run out.
    fn waited_too_long(state: &State, s: &Settings) -> bool {
        match (state.waiting_since, s.timeout()) {
            (Some(since), Some(limit)) => since.elapsed() >= limit,
            _ => false,
        }
    }

    /// One look at the ring: a frame, nothing yet, or the end.
    fn step(&self, s: &Settings) -> Result<Step, gst::FlowError> {
        let mut state = lock(&self.state);
        if state.sub.is_none() {
            state.waiting_since.get_or_insert_with(Instant::now);
            let zero_copy = state.zero_copy_sub;
            match self.connect(s, zero_copy) {
                Ok(Some(sub)) => {
                    gst::info!(
                        CAT,
                        imp = self,
                        "subscribed to {} ({} backend)",
                        s.socket_path,
                        sub.backend().name()
                    );
                    state.sub = Some(sub);
                    state.connected_once = true;
                }
                Ok(None) => {
                    if Self::waited_too_long(&state, s) {
                        if state.connected_once {
                            gst::info!(
                                CAT,
                                imp = self,
                                "no publisher came back to {}: end of stream",
                                s.socket_path
                            );
                            return Err(gst::FlowError::Eos);
                        }
                        return Ok(Step::Fail(gst::error_msg!(
                            gst::ResourceError::OpenRead,
                            ["no publisher at {} within {} ms", s.socket_path, s.timeout_ms]
                        )));
                    }
                    drop(state);
                    std::thread::sleep(SLICE / 5);
                    return Ok(Step::Again);
                }
                Err(msg) => return Ok(Step::Fail(msg)),
            }
        }
        let key = state.sub.as_ref().map(ring_key);
        if let Some(key) = key.filter(|k| state.output.map(|o| o.key) != Some(*k)) {
            let uuid = state.sub.as_ref().map(|sub| sub.info().device_uuid());
            let geometry = state.sub.as_ref().map(|sub| *sub.geometry());
            // Downstream is asked without the state lock: it may query us.
            drop(state);
            let cuda = self.decide(key, uuid, s);
            let mut state = lock(&self.state);
            state.output = Some(OutputMemory { key, cuda });
            state.filler = None;
            // A lossless source is moved to push only when asked: a push
            // reader's stream starts at its first pushed frame, a pull
            // reader's at its cursor (ADR 0026), and a recorder that
            // subscribed before the first frame expects that frame.
            let zero_copy = s.zero_copy
                && !state.copy_forced
                && geometry.is_some_and(|g| wraps(cuda, key.0, &g))
                && match s.delivery {
                    DeliverySetting::Pull => false,
                    DeliverySetting::Push => true,
                    DeliverySetting::Auto => cuda.is_some() && !s.lossless,
                };
            let before = reading(s, state.zero_copy_sub);
            state.zero_copy_sub = zero_copy;
            if reading(s, zero_copy) != before {
                // Subscribe again with the options of this output; the
                // decision stays (same ring), so it is not asked again.
                gst::info!(
                    CAT,
                    imp = self,
                    "subscribing again for {} output",
                    if zero_copy { "zero-copy" } else { "copied" }
                );
                if let Some(mut sub) = state.retire() {
                    if let Err(e) = sub.close() {
                        gst::debug!(CAT, imp = self, "closing the subscriber: {e}");
                    }
                }
            }
            return Ok(Step::Again);
        }
        let State {
            sub,
            scratch,
            output,
            filler,
            zero_copy_sub,
            superseded,
            deferred,
            video_meta,
            shape,
            lent,
            waiting_since,
            copy_forced,
            discont,
            ..
        } = &mut *state;
        let Some(sub) = sub.as_mut() else {
            return Ok(Step::Again);
        };
        // A latest source reading a queue (zero-copy) first takes what is
        // queued already, the newest of it; only with nothing queued does it
        // wait, and a frame that ends the wait goes out at once.
        // Not while the publisher is gone: a read would try to reconnect.
        let drain = *zero_copy_sub && s.mode == ModeSetting::Latest && !s.lossless;
        let queued = if drain && deferred.is_none() && waiting_since.is_none() {
            Self::newest(sub, superseded, deferred)
        } else {
            None
        };
        let read = if let Some((hold, facts)) = queued {
            let cuda = Self::output_for(output, &facts);
            if !wraps(cuda, facts.backend, &facts.geometry) {
                // The ring changed under the drain to one this output
                // cannot wrap: the frame is counted, and the next step
                // decides the output afresh.
                *superseded += 1;
                *output = None;
                *discont = true;
                return Ok(Step::Again);
            }
            self.kept_buffer(Lent::new(hold, lent), &facts, cuda, *video_meta, shape, s)
                .map(|(buffer, caps)| (buffer, caps, facts.skipped))
        } else {
            let next = match deferred.take() {
                Some(e) => Err(e),
                None => sub.next(SLICE),
            };
            match next {
                Ok(frame) => {
                    let facts = Facts::of(&frame);
                    let cuda = Self::output_for(output, &facts);
                    let hold = if s.zero_copy && !*copy_forced && wraps(cuda, facts.backend, &facts.geometry) {
                        frame.hold()
                    } else {
                        None
                    };
                    match hold {
                        Some(hold) => self.kept_buffer(Lent::new(hold, lent), &facts, cuda, *video_meta, shape, s),
                        None => self.to_buffer(&frame, &facts, scratch, cuda.map(|p| (p, filler)), shape, s),
                    }
                    .map(|(buffer, caps)| (buffer, caps, facts.skipped))
                }
                Err(e) => Err(e),
            }
        };
        match read {
            Ok((mut buffer, caps, skipped)) => {
                let was_waiting = state.waiting_since.take().is_some();
                if state.discont || skipped > 0 || was_waiting && state.connected_once {
                    buffer.make_mut().set_flags(gst::BufferFlags::DISCONT);
                }
                state.discont = false;
                let new_caps = {
                    let mut published = lock(&self.published);
                    let new = (published.caps.as_ref() != Some(&caps)).then(|| caps.clone());
                    published.caps = Some(caps);
                    new
                };
                let stats = state.stats();
                state.dropped_at_frame = stats.dropped;
                state.last_out = Some(Instant::now());
                let qos = (stats.dropped > state.reported_dropped).then(|| {
                    state.reported_dropped = stats.dropped;
                    (stats.delivered, stats.dropped, buffer.pts())
                });
                Ok(Step::Frame(Output {
                    buffer,
                    caps: new_caps,
                    qos,
                }))
            }
            Err(Error::Timeout(..)) => {
                if let Some(lent) = self.starved(&mut state, s, false) {
                    return Ok(Step::Copying(lent));
                }
                if Self::waited_too_long(&state, s) {
                    gst::info!(
                        CAT,
                        imp = self,
                        "no publisher came back to {}: end of stream",
                        s.socket_path
                    );
                    return Err(gst::FlowError::Eos);
                }
                Ok(Step::Again)
            }
            Err(Error::ProducerGone { epoch }) => {
                gst::info!(
                    CAT,
                    imp = self,
                    "publisher {epoch:#x} is gone; waiting for the next one at {}",
                    s.socket_path
                );
                state.waiting_since.get_or_insert_with(Instant::now);
                state.discont = true;
                Ok(Step::Again)
            }
            Err(Error::Evicted { reason }) => {
                gst::warning!(
                    CAT,
                    imp = self,
                    "evicted by the publisher ({reason}); subscribing again"
                );
                let copying = self.starved(&mut state, s, true);
                drop(state.retire());
                state.discont = true;
                Ok(copying.map_or(Step::Again, Step::Copying))
            }
            Err(e) => Ok(Step::Fail(gst::error_msg!(
                gst::ResourceError::Read,
                ["reading {}: {}", s.socket_path, e]
            ))),
        }
    }
}

impl BaseSrcImpl for VramringSrc {
    fn start(&self) -> Result<(), gst::ErrorMessage> {
        self.flushing.store(false, Ordering::Release);
        let s = lock(&self.settings).clone();
        *lock(&self.state) = State {
            // Asked for push: read a queue from the start (no second
            // subscription once the output is known, unless it is system
            // memory from a CUDA ring, which is copied anyway).
            zero_copy_sub: s.zero_copy && s.delivery == DeliverySetting::Push,
            ..State::default()
        };
        *lock(&self.published) = Published::default();
        Ok(())
    }

    fn stop(&self) -> Result<(), gst::ErrorMessage> {
        let mut state = lock(&self.state);
        // Its counters stay readable once it is closed.
        if let Some(mut sub) = state.retire() {
            if let Err(e) = sub.close() {
                gst::debug!(CAT, imp = self, "closing the subscriber: {e}");
            }
        }
        Ok(())
    }

    fn is_seekable(&self) -> bool {
        false
    }

    fn caps(&self, filter: Option<&gst::Caps>) -> Option<gst::Caps> {
        let caps = lock(&self.published)
            .caps
            .clone()
            .unwrap_or_else(|| self.obj().src_pad().pad_template_caps());
        Some(match filter {
            Some(f) => f.intersect_with_mode(&caps, gst::CapsIntersectMode::First),
            None => caps,
        })
    }

    /// Caps come from the ring: until a frame has been read there is
    /// nothing to negotiate (`create` sets them before the first buffer).
    fn negotiate(&self) -> Result<(), gst::LoggableError> {
        let caps = lock(&self.published).caps.clone();
        match caps {
            Some(caps) => self
                .obj()
                .set_caps(&caps)
                .map_err(|_| gst::loggable_error!(CAT, "downstream refused {caps}")),
            None => Ok(()),
        }
    }

    /// Answers downstream's `gst.cuda.context` query with the primary
    /// context the CUDA output allocates in (the `cuda-device-id` GPU's
    /// until a CUDA ring is read), so that `cudadownload`, `cudaconvert` or
    /// `nvh264enc` work in that context and read our memory without a
    /// copy between contexts.
    fn query(&self, query: &mut gst::QueryRef) -> bool {
        if let gst::QueryViewMut::Context(q) = query.view_mut() {
            if q.context_type() == cuda::CONTEXT_TYPE && cuda::available() {
                let chosen = lock(&self.published).cuda;
                let primary = match chosen {
                    Some(p) => Ok(p),
                    None => Primary::get(lock(&self.settings).cuda_device_id),
                };
                match primary {
                    Ok(p) => {
                        if p.answer_context_query(self.obj().upcast_ref(), query) {
                            gst::debug!(
                                CAT,
                                imp = self,
                                "gave downstream the primary CUDA context of device {}",
                                p.ordinal
                            );
                            return true;
                        }
                    }
                    Err(e) => gst::debug!(CAT, imp = self, "no CUDA context to share: {e}"),
                }
            }
        }
        BaseSrcImplExt::parent_query(self, query)
    }

    /// Notes whether downstream reads `GstVideoMeta`, for zero-copy system
    /// memory in the ring's layout. Every buffer is the source's own (a
    /// kept push buffer, or a copy into its CUDA pool or fresh memory), so
    /// no pool downstream offers is kept, and none is activated (a CUDA
    /// pool would allocate GPU memory for nothing).
    fn decide_allocation(&self, query: &mut gst::query::Allocation) -> Result<(), gst::LoggableError> {
        lock(&self.state).video_meta = query.find_allocation_meta::<gst_video::VideoMeta>().is_some();
        while query.allocation_pools().len() > 0 {
            query.remove_nth_allocation_pool(0);
        }
        Ok(())
    }

    fn unlock(&self) -> Result<(), gst::ErrorMessage> {
        self.flushing.store(true, Ordering::Release);
        Ok(())
    }

    fn unlock_stop(&self) -> Result<(), gst::ErrorMessage> {
        self.flushing.store(false, Ordering::Release);
        Ok(())
    }
}

impl PushSrcImpl for VramringSrc {
    fn create(&self, _buffer: Option<&mut gst::BufferRef>) -> Result<CreateSuccess, gst::FlowError> {
        let s = lock(&self.settings).clone();
        loop {
            if self.flushing.load(Ordering::Acquire) {
                return Err(gst::FlowError::Flushing);
            }
            let step = self.step(&s);
            let (stats, output) = {
                let state = lock(&self.state);
                (state.stats(), state.output)
            };
            let mut published = lock(&self.published);
            published.stats = stats;
            if let Some(o) = output {
                // Also where a reconnect within a read changed the ring's GPU.
                published.cuda = o.cuda;
            }
            drop(published);
            let out = match step? {
                Step::Again => continue,
                Step::Frame(out) => out,
                Step::Copying(lent) => {
                    gst::element_imp_warning!(
                        self,
                        gst::ResourceError::Busy,
                        (
                            "downstream keeps {} buffers lent without a copy, which leaves the subscription no room: copying frames from now on (zero-copy=false avoids this)",
                            lent
                        )
                    );
                    continue;
                }
                Step::Fail(msg) => {
                    self.post_error_message(msg);
                    return Err(gst::FlowError::Error);
                }
            };
            if let Some(caps) = out.caps {
                gst::info!(CAT, imp = self, "caps {caps}");
                // Negotiated afresh (`negotiate` sets the published caps)
                // so that an allocation query carries them: downstream's
                // answer says whether it reads a video meta, which lets a
                // host ring's later frames go out in the ring's layout
                // without a copy. The query at start had no caps.
                if !self.obj().negotiate() {
                    // Refused while the pad is being deactivated: stopping.
                    if self.flushing.load(Ordering::Acquire)
                        || self.obj().src_pad().pad_flags().contains(gst::PadFlags::FLUSHING)
                    {
                        return Err(gst::FlowError::Flushing);
                    }
                    return Err(gst::FlowError::NotNegotiated);
                }
            }
            if let Some((processed, dropped, pts)) = out.qos {
                let msg = gst::message::Qos::builder(true)
                    .running_time(pts)
                    .timestamp(pts)
                    .stats(
                        gst::GenericFormattedValue::from(gst::format::Buffers::from_u64(processed)),
                        gst::GenericFormattedValue::from(gst::format::Buffers::from_u64(dropped)),
                    )
                    .src(&*self.obj())
                    .build();
                let _ = self.obj().post_message(msg);
            }
            return Ok(CreateSuccess::NewBuffer(out.buffer));
        }
    }
}
