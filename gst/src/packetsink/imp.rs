//! `vramringpacketsink`'s implementation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_base::subclass::prelude::*;
use vramring::packet::{
    PacketMeta, PacketPublisher, PacketPublisherConfig, PacketRingConfig, PACKET_DISCONTINUITY, PACKET_KEY,
};
use vramring::Error;

use crate::codec::{self, Codec};
use crate::element::lock;
use crate::serve::{self, ServeSettings};

static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "vramringpacketsink",
        gst::DebugColorFlags::empty(),
        Some("vramring packet ring sink"),
    )
});

const DEFAULT_SOCKET: &str = "/tmp/vramring-packets.sock";
const DEFAULT_RING_BYTES: u64 = 4 << 20;
const DEFAULT_RECORDS: u32 = 512;
const DEFAULT_MAX_PACKET: u32 = 1 << 20;
const DEFAULT_WRITE_TIMEOUT_MS: u64 = 2000;
const SLICE: Duration = Duration::from_millis(5);

#[derive(Debug, Clone)]
struct Settings {
    socket_path: String,
    ring_bytes: u64,
    records: u32,
    max_packet: u32,
    allow_lossless: bool,
    write_timeout_ms: u64,
    wait_subscribers: u32,
    serve: ServeSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            socket_path: DEFAULT_SOCKET.into(),
            ring_bytes: DEFAULT_RING_BYTES,
            records: DEFAULT_RECORDS,
            max_packet: DEFAULT_MAX_PACKET,
            allow_lossless: true,
            write_timeout_ms: DEFAULT_WRITE_TIMEOUT_MS,
            wait_subscribers: 0,
            serve: ServeSettings::default(),
        }
    }
}

#[derive(Default)]
struct State {
    publisher: Option<PacketPublisher>,
    codec: Option<Codec>,
    /// The codec parameters last set on the ring.
    params: Vec<u8>,
    waited: bool,
}

#[derive(Default)]
pub struct VramringPacketSink {
    settings: Mutex<Settings>,
    state: Mutex<State>,
    flushing: AtomicBool,
}

#[glib::object_subclass]
impl ObjectSubclass for VramringPacketSink {
    const NAME: &'static str = "GstVramringPacketSink";
    type Type = super::VramringPacketSink;
    type ParentType = gst_base::BaseSink;
}

impl ObjectImpl for VramringPacketSink {
    fn properties() -> &'static [glib::ParamSpec] {
        static PROPS: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
            let mut v = vec![
                crate::element::socket_path("Unix socket the packet ring is served on", DEFAULT_SOCKET),
                glib::ParamSpecUInt64::builder("ring-bytes")
                    .nick("Ring bytes")
                    .blurb("Bytes of the ring's data area (a power of two, at least twice max-packet)")
                    .minimum(4096)
                    .default_value(DEFAULT_RING_BYTES)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("records")
                    .nick("Records")
                    .blurb("Packets the ring remembers (a power of two)")
                    .minimum(2)
                    .default_value(DEFAULT_RECORDS)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("max-packet")
                    .nick("Max packet")
                    .blurb("Largest access unit accepted, in bytes")
                    .minimum(1)
                    .default_value(DEFAULT_MAX_PACKET)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecBoolean::builder("allow-lossless")
                    .nick("Allow lossless")
                    .blurb("Let subscribers ask to be lossless (the sink then waits for them, bounded by write-timeout and their lease)")
                    .default_value(true)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt64::builder("write-timeout")
                    .nick("Write timeout")
                    .blurb("Milliseconds one write waits for a lossless subscriber before the sink tries again")
                    .minimum(1)
                    .default_value(DEFAULT_WRITE_TIMEOUT_MS)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("wait-subscribers")
                    .nick("Wait for subscribers")
                    .blurb("Before the first packet of each ring, wait until this many subscribers are connected (0: do not wait)")
                    .default_value(0)
                    .mutable_ready()
                    .build(),
            ];
            v.extend(serve::properties());
            v.push(
                glib::ParamSpecBoxed::builder::<gst::Structure>("stats")
                    .nick("Statistics")
                    .blurb("The publisher's counters: published, subscribers, connects, disconnects, evictions, refused, lossless-waits")
                    .read_only()
                    .build(),
            );
            v
        });
        PROPS.as_ref()
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
            "ring-bytes" => s.ring_bytes = value.get().unwrap_or(DEFAULT_RING_BYTES),
            "records" => s.records = value.get().unwrap_or(DEFAULT_RECORDS),
            "max-packet" => s.max_packet = value.get().unwrap_or(DEFAULT_MAX_PACKET),
            "allow-lossless" => s.allow_lossless = value.get().unwrap_or(true),
            "write-timeout" => s.write_timeout_ms = value.get().unwrap_or(DEFAULT_WRITE_TIMEOUT_MS),
            "wait-subscribers" => s.wait_subscribers = value.get().unwrap_or(0),
            other if ServeSettings::handles(other) => s.serve.set(other, value, *CAT),
            other => gst::warning!(CAT, imp = self, "no property {other}"),
        }
    }

    fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
        if pspec.name() == "stats" {
            let stats = lock(&self.state).publisher.as_ref().map(PacketPublisher::stats);
            return serve::stats_structure(stats).to_value();
        }
        let s = lock(&self.settings);
        match pspec.name() {
            "socket-path" => s.socket_path.to_value(),
            "ring-bytes" => s.ring_bytes.to_value(),
            "records" => s.records.to_value(),
            "max-packet" => s.max_packet.to_value(),
            "allow-lossless" => s.allow_lossless.to_value(),
            "write-timeout" => s.write_timeout_ms.to_value(),
            "wait-subscribers" => s.wait_subscribers.to_value(),
            other => s.serve.get(other),
        }
    }
}

impl GstObjectImpl for VramringPacketSink {}

impl ElementImpl for VramringPacketSink {
    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        static META: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            crate::element::metadata("vramring packet ring sink", "Sink/Video", "Publishes H.264 / H.265 access units (byte-stream, one access unit per buffer) on a vramring shared-memory packet ring")
        });
        Some(&*META)
    }

    fn pad_templates() -> &'static [gst::PadTemplate] {
        static TEMPLATES: LazyLock<Vec<gst::PadTemplate>> =
            LazyLock::new(|| crate::element::one_pad("sink", gst::PadDirection::Sink, &codec::template_caps()));
        TEMPLATES.as_ref()
    }
}

impl VramringPacketSink {
    fn wait_for_subscribers(&self) -> Result<(), gst::FlowError> {
        let want = lock(&self.settings).wait_subscribers;
        loop {
            {
                let mut state = lock(&self.state);
                let have = state.publisher.as_ref().map_or(0, |p| p.stats().subscribers);
                if have >= want {
                    state.waited = true;
                    return Ok(());
                }
            }
            if self.flushing.load(Ordering::Acquire) {
                return Err(gst::FlowError::Flushing);
            }
            std::thread::sleep(SLICE);
        }
    }
}

impl BaseSinkImpl for VramringPacketSink {
    fn start(&self) -> Result<(), gst::ErrorMessage> {
        self.flushing.store(false, Ordering::Release);
        Ok(())
    }

    fn stop(&self) -> Result<(), gst::ErrorMessage> {
        let mut state = lock(&self.state);
        if let Some(mut p) = state.publisher.take() {
            p.close();
        }
        *state = State::default();
        Ok(())
    }

    fn set_caps(&self, caps: &gst::Caps) -> Result<(), gst::LoggableError> {
        let s = caps
            .structure(0)
            .ok_or_else(|| gst::loggable_error!(CAT, "empty caps"))?;
        let codec = Codec::from_media_type(s.name())
            .ok_or_else(|| gst::loggable_error!(CAT, "caps {caps} are not H.264 or H.265"))?;
        let mut state = lock(&self.state);
        if state.publisher.is_some() && state.codec == Some(codec) {
            return Ok(());
        }
        if let Some(mut old) = state.publisher.take() {
            old.close();
        }
        let st = lock(&self.settings).clone();
        let ring = PacketRingConfig::new(st.ring_bytes, st.records, st.max_packet).codec(codec.fourcc());
        let mut cfg = PacketPublisherConfig::new(ring)
            .allow_lossless(st.allow_lossless)
            .write_timeout(Duration::from_millis(st.write_timeout_ms));
        cfg.serve = st.serve.config.clone();
        let publisher = PacketPublisher::create(&st.socket_path, cfg).map_err(|e| {
            gst::element_imp_error!(
                self,
                gst::ResourceError::OpenWrite,
                ["cannot serve a packet ring at {}: {}", st.socket_path, e]
            );
            gst::loggable_error!(CAT, "cannot serve a packet ring at {}: {e}", st.socket_path)
        })?;
        gst::info!(
            CAT,
            imp = self,
            "serving {} access units on {}",
            codec.media_type(),
            st.socket_path
        );
        *state = State {
            publisher: Some(publisher),
            codec: Some(codec),
            params: Vec::new(),
            waited: false,
        };
        Ok(())
    }

    fn render(&self, buffer: &gst::Buffer) -> Result<gst::FlowSuccess, gst::FlowError> {
        if !lock(&self.state).waited {
            self.wait_for_subscribers()?;
        }
        let map = buffer.map_readable().map_err(|_| gst::FlowError::Error)?;
        let data = map.as_slice();
        let key = !buffer.flags().contains(gst::BufferFlags::DELTA_UNIT);
        let mut state = lock(&self.state);
        let State {
            publisher,
            codec,
            params,
            ..
        } = &mut *state;
        let (Some(publisher), Some(codec)) = (publisher.as_mut(), *codec) else {
            return Err(gst::FlowError::NotNegotiated);
        };
        if key {
            let ps = codec.parameter_sets(data);
            if !ps.is_empty() && ps != *params {
                match publisher.set_codec_params(&ps) {
                    Ok(v) => {
                        gst::debug!(CAT, imp = self, "codec parameters version {v} ({} bytes)", ps.len());
                        *params = ps;
                    }
                    Err(e) => gst::warning!(CAT, imp = self, "codec parameters not stored: {e}"),
                }
            }
        }
        let mut flags = 0;
        if key {
            flags |= PACKET_KEY;
        }
        if buffer.flags().contains(gst::BufferFlags::DISCONT) {
            flags |= PACKET_DISCONTINUITY;
        }
        let ns = |t: Option<gst::ClockTime>| t.map_or(-1, |t| t.nseconds() as i64);
        let meta = PacketMeta {
            pts: ns(buffer.pts()),
            dts: ns(buffer.dts()),
            flags,
            codec: 0,
        };
        loop {
            match publisher.write(data, meta) {
                Ok(seq) => {
                    gst::trace!(CAT, imp = self, "packet {seq}: {} bytes, key {key}", data.len());
                    return Ok(gst::FlowSuccess::Ok);
                }
                Err(Error::LosslessBlocked { .. }) if !self.flushing.load(Ordering::Acquire) => continue,
                Err(Error::LosslessBlocked { .. }) => return Err(gst::FlowError::Flushing),
                Err(e @ Error::TooLarge { .. }) => {
                    gst::element_imp_error!(self, gst::StreamError::Failed, ["{} (raise max-packet)", e]);
                    return Err(gst::FlowError::Error);
                }
                Err(e) => {
                    gst::element_imp_error!(self, gst::ResourceError::Write, ["packet write failed: {}", e]);
                    return Err(gst::FlowError::Error);
                }
            }
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
