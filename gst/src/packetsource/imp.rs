//! `vramringpacketsrc`'s implementation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_base::prelude::*;
use gst_base::subclass::base_src::CreateSuccess;
use gst_base::subclass::prelude::*;
use vramring::packet::{PacketReaderStats, PacketSubscriber, PacketSubscriberOptions};
use vramring::{ClientOptions, Error};

use crate::codec::{self, Codec};
use crate::element::{lock, try_lock};
use crate::source::TimestampMode;

static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "vramringpacketsrc",
        gst::DebugColorFlags::empty(),
        Some("vramring packet ring source"),
    )
});

const DEFAULT_SOCKET: &str = "/tmp/vramring-packets.sock";
const DEFAULT_TIMEOUT_MS: u64 = 10_000;
const SLICE: Duration = Duration::from_millis(50);

#[derive(Debug, Clone)]
struct Settings {
    socket_path: String,
    lossless: bool,
    timeout_ms: u64,
    client_name: String,
    timestamp_mode: TimestampMode,
    insert_params: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            socket_path: DEFAULT_SOCKET.into(),
            lossless: false,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            client_name: String::new(),
            timestamp_mode: TimestampMode::default(),
            insert_params: true,
        }
    }
}

#[derive(Default)]
struct State {
    sub: Option<PacketSubscriber>,
    codec: Option<Codec>,
    connected_once: bool,
    waiting_since: Option<Instant>,
    discont: bool,
    /// The next keyframe is the first after a join: it gets the codec
    /// parameters if it carries none.
    joining: bool,
    /// Counters of earlier subscribers (a reconnect starts a new one).
    earlier: PacketReaderStats,
    reported_skipped: u64,
    buf: Vec<u8>,
}

impl State {
    fn stats(&self) -> PacketReaderStats {
        let now = self.sub.as_ref().map(PacketSubscriber::stats).unwrap_or_default();
        PacketReaderStats {
            delivered: self.earlier.delivered + now.delivered,
            overruns: self.earlier.overruns + now.overruns,
            skipped: self.earlier.skipped + now.skipped,
        }
    }

    /// Drops the subscriber, keeping its counters.
    fn drop_subscriber(&mut self) {
        self.earlier = self.stats();
        self.sub = None;
        self.discont = true;
    }
}

#[derive(Default)]
pub struct VramringPacketSrc {
    settings: Mutex<Settings>,
    state: Mutex<State>,
    /// What other threads read (`stats`, caps queries) as of the streaming
    /// thread's last step: it holds `State` through each 50 ms wait.
    published: Mutex<(PacketReaderStats, Option<Codec>)>,
    flushing: AtomicBool,
}

#[glib::object_subclass]
impl ObjectSubclass for VramringPacketSrc {
    const NAME: &'static str = "GstVramringPacketSrc";
    type Type = super::VramringPacketSrc;
    type ParentType = gst_base::PushSrc;
}

impl ObjectImpl for VramringPacketSrc {
    fn properties() -> &'static [glib::ParamSpec] {
        static PROPS: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
            vec![
                crate::element::socket_path("Unix socket of the packet publisher to subscribe to", DEFAULT_SOCKET),
                glib::ParamSpecBoolean::builder("lossless")
                    .nick("Lossless")
                    .blurb("Ask the publisher to never overwrite a packet this subscriber has not read (it waits, and evicts a reader that stalls past its lease): for recorders")
                    .default_value(false)
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
                    .blurb("Name this subscriber gives the publisher; empty: the element's name")
                    .mutable_ready()
                    .build(),
                glib::ParamSpecEnum::builder_with_default("timestamp-mode", TimestampMode::default())
                    .nick("Timestamp mode")
                    .blurb("clock: DTS is the packet's commit instant on this pipeline's running time, PTS keeps its distance to DTS; pts: the packet's pts and dts as published, in ns")
                    .mutable_ready()
                    .build(),
                glib::ParamSpecBoolean::builder("insert-params")
                    .nick("Insert parameters")
                    .blurb("Prepend the ring's codec parameters to the first keyframe after a join when it carries none")
                    .default_value(true)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecBoxed::builder::<gst::Structure>("stats")
                    .nick("Statistics")
                    .blurb("The subscriber's counters: delivered, overruns, skipped (packets never delivered)")
                    .read_only()
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
            "lossless" => s.lossless = value.get().unwrap_or(false),
            "timeout" => s.timeout_ms = value.get().unwrap_or(DEFAULT_TIMEOUT_MS),
            "client-name" => s.client_name = value.get::<Option<String>>().ok().flatten().unwrap_or_default(),
            "timestamp-mode" => s.timestamp_mode = value.get().unwrap_or_default(),
            "insert-params" => s.insert_params = value.get().unwrap_or(true),
            other => gst::warning!(CAT, imp = self, "no property {other}"),
        }
    }

    fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
        if pspec.name() == "stats" {
            let live = try_lock(&self.state).map(|state| state.stats());
            let st = live.unwrap_or_else(|| lock(&self.published).0);
            return gst::Structure::builder("vramring-packet-subscriber-stats")
                .field("delivered", st.delivered)
                .field("overruns", st.overruns)
                .field("skipped", st.skipped)
                .build()
                .to_value();
        }
        let s = lock(&self.settings);
        match pspec.name() {
            "socket-path" => s.socket_path.to_value(),
            "lossless" => s.lossless.to_value(),
            "timeout" => s.timeout_ms.to_value(),
            "client-name" => s.client_name.to_value(),
            "timestamp-mode" => s.timestamp_mode.to_value(),
            "insert-params" => s.insert_params.to_value(),
            _ => glib::Value::from_type(glib::Type::INVALID),
        }
    }
}

impl GstObjectImpl for VramringPacketSrc {}

impl ElementImpl for VramringPacketSrc {
    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        static META: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            crate::element::metadata("vramring packet ring source", "Source/Video", "Subscribes to a vramring packet ring and outputs its H.264 / H.265 access units (byte-stream, one per buffer), joining at a keyframe (live)")
        });
        Some(&*META)
    }

    fn pad_templates() -> &'static [gst::PadTemplate] {
        static TEMPLATES: LazyLock<Vec<gst::PadTemplate>> =
            LazyLock::new(|| crate::element::one_pad("src", gst::PadDirection::Src, &codec::template_caps()));
        TEMPLATES.as_ref()
    }
}

struct Output {
    buffer: gst::Buffer,
    caps: Option<gst::Caps>,
    qos: Option<(u64, u64, Option<gst::ClockTime>)>,
}

enum Step {
    Packet(Output),
    Again,
}

impl VramringPacketSrc {
    fn waited_too_long(state: &State, s: &Settings) -> bool {
        match state.waiting_since {
            Some(since) if s.timeout_ms > 0 => since.elapsed() >= Duration::from_millis(s.timeout_ms),
            _ => false,
        }
    }

    /// Ends the wait for a publisher: EOS after one was there, an error
    /// before.
    fn give_up(&self, state: &State, s: &Settings) -> gst::FlowError {
        if state.connected_once {
            gst::info!(
                CAT,
                imp = self,
                "no publisher came back to {}: end of stream",
                s.socket_path
            );
            return gst::FlowError::Eos;
        }
        gst::element_imp_error!(
            self,
            gst::ResourceError::OpenRead,
            ["no packet publisher at {} within {} ms", s.socket_path, s.timeout_ms]
        );
        gst::FlowError::Error
    }

    fn connect(&self, state: &mut State, s: &Settings) -> Result<bool, gst::FlowError> {
        state.waiting_since.get_or_insert_with(Instant::now);
        let name = if s.client_name.is_empty() {
            self.obj().name().to_string()
        } else {
            s.client_name.clone()
        };
        let opts = PacketSubscriberOptions::new()
            .name(name)
            .lossless(s.lossless)
            .connect_timeout(Duration::from_secs(2));
        match PacketSubscriber::connect(&s.socket_path, opts) {
            Ok(sub) => {
                let code = sub.info().codec;
                let Some(codec) = Codec::from_fourcc(code) else {
                    gst::element_imp_error!(
                        self,
                        gst::StreamError::CodecNotFound,
                        [
                            "the packet ring at {} carries codec {:#010x}, neither H.264 nor H.265",
                            s.socket_path,
                            code
                        ]
                    );
                    return Err(gst::FlowError::NotNegotiated);
                };
                gst::info!(
                    CAT,
                    imp = self,
                    "subscribed to {} ({})",
                    s.socket_path,
                    codec.media_type()
                );
                state.sub = Some(sub);
                state.codec = Some(codec);
                lock(&self.published).1 = Some(codec);
                state.connected_once = true;
                state.joining = true;
                Ok(true)
            }
            Err(e @ Error::Refused { .. }) => {
                gst::element_imp_error!(
                    self,
                    gst::ResourceError::OpenRead,
                    ["{} refused this subscriber: {}", s.socket_path, e]
                );
                Err(gst::FlowError::Error)
            }
            Err(e) => {
                gst::debug!(CAT, imp = self, "no packet publisher at {} yet: {e}", s.socket_path);
                if Self::waited_too_long(state, s) {
                    return Err(self.give_up(state, s));
                }
                Ok(false)
            }
        }
    }

    fn step(&self, s: &Settings, last_caps: &mut Option<gst::Caps>) -> Result<Step, gst::FlowError> {
        let mut state = lock(&self.state);
        if state.sub.is_none() && !self.connect(&mut state, s)? {
            drop(state);
            std::thread::sleep(SLICE / 5);
            return Ok(Step::Again);
        }
        let State { sub, buf, .. } = &mut *state;
        let Some(sub) = sub.as_mut() else {
            return Ok(Step::Again);
        };
        match sub.next_copy(buf, SLICE) {
            Ok(packet) => {
                let codec = state.codec.unwrap_or(Codec::H264);
                let bytes = state.buf.get(..packet.len).ok_or(gst::FlowError::Error)?;
                let prepend =
                    packet.is_key() && state.joining && s.insert_params && codec.parameter_sets(bytes).is_empty();
                let mut data = Vec::with_capacity(bytes.len());
                if packet.is_key() {
                    state.joining = false;
                }
                if prepend {
                    let mut params = Vec::new();
                    if let Some(sub) = state.sub.as_ref() {
                        if sub.codec_params(&mut params).is_ok() && !params.is_empty() {
                            gst::debug!(CAT, imp = self, "prepending {} bytes of codec parameters", params.len());
                            data.extend_from_slice(&params);
                        }
                    }
                }
                let bytes = state.buf.get(..packet.len).ok_or(gst::FlowError::Error)?;
                data.extend_from_slice(bytes);
                let mut buffer = gst::Buffer::from_mut_slice(data);
                {
                    let b = buffer.get_mut().ok_or(gst::FlowError::Error)?;
                    let ns = |v: i64| u64::try_from(v).ok().map(gst::ClockTime::from_nseconds);
                    let (pts, dts) = match s.timestamp_mode {
                        TimestampMode::Pts => (ns(packet.pts), ns(packet.dts)),
                        TimestampMode::Clock => {
                            let dts =
                                crate::clock::monotonic_to_running_time(self.obj().upcast_ref(), packet.commit_ns);
                            let pts = match (dts, packet.pts >= 0 && packet.dts >= 0) {
                                (Some(d), true) => u64::try_from(packet.pts - packet.dts)
                                    .ok()
                                    .map(|ahead| d + gst::ClockTime::from_nseconds(ahead)),
                                _ => dts,
                            };
                            (pts, dts)
                        }
                    };
                    b.set_pts(pts);
                    b.set_dts(dts);
                    b.set_offset(packet.seq);
                    let mut flags = gst::BufferFlags::empty();
                    if !packet.is_key() {
                        flags |= gst::BufferFlags::DELTA_UNIT;
                    }
                    state.waiting_since = None;
                    if state.discont || packet.skipped > 0 {
                        flags |= gst::BufferFlags::DISCONT;
                    }
                    state.discont = false;
                    b.set_flags(flags);
                }
                let caps = codec.caps();
                let new_caps = (last_caps.as_ref() != Some(&caps)).then(|| caps.clone());
                *last_caps = Some(caps);
                let stats = state.stats();
                let qos = (stats.skipped > state.reported_skipped).then(|| {
                    state.reported_skipped = stats.skipped;
                    (stats.delivered, stats.skipped, buffer.dts())
                });
                Ok(Step::Packet(Output {
                    buffer,
                    caps: new_caps,
                    qos,
                }))
            }
            Err(Error::Timeout(..)) => Ok(Step::Again),
            Err(Error::PacketOverrun { .. }) => {
                gst::warning!(CAT, imp = self, "fell a ring behind; resuming at the next keyframe");
                state.discont = true;
                state.joining = true;
                Ok(Step::Again)
            }
            Err(Error::ProducerGone { epoch }) => {
                gst::info!(
                    CAT,
                    imp = self,
                    "packet publisher {epoch:#x} is gone; waiting for the next one"
                );
                state.drop_subscriber();
                state.waiting_since = Some(Instant::now());
                Ok(Step::Again)
            }
            Err(Error::Evicted { reason }) => {
                gst::warning!(
                    CAT,
                    imp = self,
                    "evicted by the publisher ({reason}); subscribing again"
                );
                state.drop_subscriber();
                Ok(Step::Again)
            }
            Err(e) => {
                gst::element_imp_error!(self, gst::ResourceError::Read, ["reading {}: {}", s.socket_path, e]);
                Err(gst::FlowError::Error)
            }
        }
    }
}

impl BaseSrcImpl for VramringPacketSrc {
    fn start(&self) -> Result<(), gst::ErrorMessage> {
        self.flushing.store(false, Ordering::Release);
        *lock(&self.state) = State::default();
        *lock(&self.published) = Default::default();
        Ok(())
    }

    fn stop(&self) -> Result<(), gst::ErrorMessage> {
        let mut state = lock(&self.state);
        // Its counters stay readable once it is closed.
        state.earlier = state.stats();
        if let Some(mut sub) = state.sub.take() {
            sub.close();
        }
        Ok(())
    }

    fn is_seekable(&self) -> bool {
        false
    }

    fn caps(&self, filter: Option<&gst::Caps>) -> Option<gst::Caps> {
        let caps = lock(&self.published)
            .1
            .map(Codec::caps)
            .unwrap_or_else(|| self.obj().src_pad().pad_template_caps());
        Some(match filter {
            Some(f) => f.intersect_with_mode(&caps, gst::CapsIntersectMode::First),
            None => caps,
        })
    }

    fn negotiate(&self) -> Result<(), gst::LoggableError> {
        let caps = lock(&self.published).1.map(Codec::caps);
        match caps {
            Some(caps) => self
                .obj()
                .set_caps(&caps)
                .map_err(|_| gst::loggable_error!(CAT, "downstream refused {caps}")),
            None => Ok(()),
        }
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

impl PushSrcImpl for VramringPacketSrc {
    fn create(&self, _buffer: Option<&mut gst::BufferRef>) -> Result<CreateSuccess, gst::FlowError> {
        let s = lock(&self.settings).clone();
        let mut last_caps = self.obj().src_pad().current_caps();
        loop {
            if self.flushing.load(Ordering::Acquire) {
                return Err(gst::FlowError::Flushing);
            }
            let step = self.step(&s, &mut last_caps);
            let stats = lock(&self.state).stats();
            lock(&self.published).0 = stats;
            let out = match step? {
                Step::Again => continue,
                Step::Packet(out) => out,
            };
            if let Some(caps) = out.caps {
                self.obj().set_caps(&caps).map_err(|_| gst::FlowError::NotNegotiated)?;
            }
            if let Some((processed, skipped, t)) = out.qos {
                let msg = gst::message::Qos::builder(true)
                    .running_time(t)
                    .timestamp(t)
                    .stats(
                        gst::GenericFormattedValue::from(gst::format::Buffers::from_u64(processed)),
                        gst::GenericFormattedValue::from(gst::format::Buffers::from_u64(skipped)),
                    )
                    .src(&*self.obj())
                    .build();
                let _ = self.obj().post_message(msg);
            }
            return Ok(CreateSuccess::NewBuffer(out.buffer));
        }
    }
}
