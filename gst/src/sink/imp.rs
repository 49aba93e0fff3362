//! `vramringsink`'s implementation: properties in `Settings`, the ring and
//! the negotiated video in `State`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_base::prelude::*;
use gst_base::subclass::prelude::*;
use gst_video::prelude::*;
use vramring::frame::{FRAME_DISCONTINUITY, FRAME_KEY};
use vramring::{
    BackendChoice, BackendKind, Error, FrameMeta, Policy, Publisher, PublisherStats, PullAccess, RingConfig, SlotMut,
};

use super::{BackendSetting, PolicySetting, PullAccessSetting};
use crate::cuda::{self, Copier, MappedCuda, Primary};
use crate::element::{lock, try_lock};
use crate::serve::{self, ServeSettings};
use crate::trailer::FrameTrailer;
use crate::video;

static CAT: LazyLock<gst::DebugCategory> = LazyLock::new(|| {
    gst::DebugCategory::new(
        "vramringsink",
        gst::DebugColorFlags::empty(),
        Some("vramring frame ring sink"),
    )
});

const DEFAULT_SOCKET: &str = "/tmp/vramring.sock";
const DEFAULT_SLOTS: u32 = 8;
/// How long one wait (for a slot, for subscribers) lasts before the element
/// looks whether it is being flushed.
const SLICE: Duration = Duration::from_millis(50);

#[derive(Debug, Clone)]
struct Settings {
    socket_path: String,
    slots: u32,
    policy: PolicySetting,
    backend: BackendSetting,
    cuda_device_id: u32,
    pull_access: PullAccessSetting,
    pull_uids: Vec<u32>,
    allow_write: bool,
    wait_subscribers: u32,
    serve: ServeSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            socket_path: DEFAULT_SOCKET.into(),
            slots: DEFAULT_SLOTS,
            policy: PolicySetting::default(),
            backend: BackendSetting::default(),
            cuda_device_id: 0,
            pull_access: PullAccessSetting::default(),
            pull_uids: Vec::new(),
            allow_write: false,
            wait_subscribers: 0,
            serve: ServeSettings::default(),
        }
    }
}

#[derive(Default)]
struct State {
    publisher: Option<Publisher>,
    info: Option<gst_video::VideoInfo>,
    /// The device-side copier while the input is CUDA memory.
    cuda: Option<Copier>,
    /// Whether `wait-subscribers` has been met for this ring.
    waited: bool,
}

#[derive(Default)]
pub struct VramringSink {
    settings: Mutex<Settings>,
    state: Mutex<State>,
    /// The publisher's counters as of the streaming thread's last look,
    /// for `stats` reads while it holds `State` (waiting for a slot that a
    /// lossless subscriber holds).
    stats: Mutex<Option<PublisherStats>>,
    flushing: AtomicBool,
}

#[glib::object_subclass]
impl ObjectSubclass for VramringSink {
    const NAME: &'static str = "GstVramringSink";
    type Type = super::VramringSink;
    type ParentType = gst_base::BaseSink;
}

impl ObjectImpl for VramringSink {
    fn properties() -> &'static [glib::ParamSpec] {
        static PROPS: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
            let mut v = vec![
                crate::element::socket_path("Unix socket the ring is served on (a <path>.lock file is made beside it)", DEFAULT_SOCKET),
                glib::ParamSpecUInt::builder("slots")
                    .nick("Slots")
                    .blurb("Frames in the ring, a power of two in 2..=1024")
                    .minimum(2)
                    .maximum(1024)
                    .default_value(DEFAULT_SLOTS)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecEnum::builder_with_default("policy", PolicySetting::default())
                    .nick("Policy")
                    .blurb("What the sink does when a slot it reuses is still held by a lossless subscriber")
                    .mutable_ready()
                    .build(),
                glib::ParamSpecEnum::builder_with_default("backend", BackendSetting::default())
                    .nick("Backend")
                    .blurb("Memory the ring lives in: host for system-memory input, cuda (on cuda-device-id) for memory:CUDAMemory input; auto follows the input")
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("cuda-device-id")
                    .nick("CUDA device")
                    .blurb("Ordinal of the GPU a CUDA ring lives on; the sink offers upstream CUDA elements this device's primary context")
                    .default_value(0)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecEnum::builder_with_default("pull-access", PullAccessSetting::default())
                    .nick("Pull access")
                    .blurb("Who may receive the slot pool (pull delivery); the others must ask for push delivery")
                    .mutable_ready()
                    .build(),
                glib::ParamSpecString::builder("pull-uids")
                    .nick("Pull uids")
                    .blurb("Comma-separated uids that may pull when pull-access=uids")
                    .mutable_ready()
                    .build(),
                glib::ParamSpecBoolean::builder("allow-write")
                    .nick("Allow write")
                    .blurb("Grant write access to the pool to subscribers that ask (the host pool is then not sealed against writes)")
                    .default_value(false)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("wait-subscribers")
                    .nick("Wait for subscribers")
                    .blurb("Before the first frame of each ring, wait until this many subscribers are connected (0: do not wait)")
                    .default_value(0)
                    .mutable_ready()
                    .build(),
            ];
            v.extend(serve::properties());
            v.push(
                glib::ParamSpecBoxed::builder::<gst::Structure>("stats")
                    .nick("Statistics")
                    .blurb("The publisher's counters: published, subscribers, connects, disconnects, evictions, refused, lossless-waits, attaches, attaches-deferred")
                    .read_only()
                    .build(),
            );
            v
        });
        PROPS.as_ref()
    }

    fn set_property(&self, _id: usize, value: &glib::Value, pspec: &glib::ParamSpec) {
        let mut s = lock(&self.settings);
        let name = pspec.name();
        match name {
            "socket-path" => {
                s.socket_path = value
                    .get::<Option<String>>()
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| DEFAULT_SOCKET.into())
            }
            "slots" => s.slots = value.get().unwrap_or(DEFAULT_SLOTS),
            "policy" => s.policy = value.get().unwrap_or_default(),
            "backend" => s.backend = value.get().unwrap_or_default(),
            "cuda-device-id" => s.cuda_device_id = value.get().unwrap_or(0),
            "pull-access" => s.pull_access = value.get().unwrap_or_default(),
            "pull-uids" => {
                let text = value.get::<Option<String>>().ok().flatten().unwrap_or_default();
                match serve::parse_ids(&text) {
                    Ok(ids) => s.pull_uids = ids,
                    Err(e) => gst::warning!(CAT, imp = self, "pull-uids: {e}; the setting is unchanged"),
                }
            }
            "allow-write" => s.allow_write = value.get().unwrap_or(false),
            "wait-subscribers" => s.wait_subscribers = value.get().unwrap_or(0),
            other if ServeSettings::handles(other) => s.serve.set(other, value, *CAT),
            other => gst::warning!(CAT, imp = self, "no property {other}"),
        }
    }

    fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
        if pspec.name() == "stats" {
            let live = try_lock(&self.state).map(|state| state.publisher.as_ref().map(Publisher::stats));
            let stats = live.unwrap_or_else(|| *lock(&self.stats));
            return serve::stats_structure(stats).to_value();
        }
        let s = lock(&self.settings);
        match pspec.name() {
            "socket-path" => s.socket_path.to_value(),
            "slots" => s.slots.to_value(),
            "policy" => s.policy.to_value(),
            "backend" => s.backend.to_value(),
            "cuda-device-id" => s.cuda_device_id.to_value(),
            "pull-access" => s.pull_access.to_value(),
            "pull-uids" => s
                .pull_uids
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
                .to_value(),
            "allow-write" => s.allow_write.to_value(),
            "wait-subscribers" => s.wait_subscribers.to_value(),
            other => s.serve.get(other),
        }
    }
}

impl GstObjectImpl for VramringSink {}

impl ElementImpl for VramringSink {
    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        static META: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            crate::element::metadata("vramring frame ring sink", "Sink/Video", "Publishes raw video frames (system or CUDA memory) on a vramring shared-memory frame ring that subscribers in other processes read")
        });
        Some(&*META)
    }

    fn pad_templates() -> &'static [gst::PadTemplate] {
        static TEMPLATES: LazyLock<Vec<gst::PadTemplate>> = LazyLock::new(|| {
            crate::element::one_pad("sink", gst::PadDirection::Sink, &video::template_caps_with_cuda())
        });
        TEMPLATES.as_ref()
    }
}

impl VramringSink {
    /// The ring configuration for `info` in system memory or (`cuda_input`)
    /// in CUDA memory, from the settings.
    fn ring_config(&self, info: &gst_video::VideoInfo, cuda_input: bool) -> Result<(String, RingConfig), String> {
        let s = lock(&self.settings).clone();
        let format = video::ring_format(info.format())
            .ok_or_else(|| format!("{} has no vramring format", info.format().to_str()))?;
        let backend = match (s.backend, cuda_input) {
            (BackendSetting::Host | BackendSetting::Auto, false) => BackendChoice::Host,
            (BackendSetting::Cuda | BackendSetting::Auto, true) => BackendChoice::Cuda(s.cuda_device_id),
            (BackendSetting::Cuda, false) => {
                return Err(
                    "backend=cuda needs memory:CUDAMemory input (the ring's slots are device memory and \
                            the sink copies on the GPU); put cudaupload before the sink, or use backend=host or \
                            auto for system memory"
                        .into(),
                )
            }
            (BackendSetting::Host, true) => {
                return Err(
                    "backend=host with memory:CUDAMemory input: put cudadownload before the sink, or use \
                            backend=cuda or auto"
                        .into(),
                )
            }
        };
        let pull = match s.pull_access {
            PullAccessSetting::Anyone => PullAccess::Anyone,
            PullAccessSetting::Uids => PullAccess::Uids(s.pull_uids.clone()),
            PullAccessSetting::Nobody => PullAccess::Nobody,
        };
        let policy = match s.policy {
            PolicySetting::Overwrite => Policy::Overwrite,
            PolicySetting::Lossless => Policy::Lossless,
        };
        let mut cfg = RingConfig::new(format, info.width(), info.height())
            .slots(s.slots)
            .policy(policy)
            .backend(backend)
            .pull(pull)
            .allow_write(s.allow_write);
        cfg.serve = s.serve.config.clone();
        Ok((s.socket_path, cfg))
    }

    /// Waits (in slices, while not flushing) until `wait-subscribers`
    /// subscribers are connected to the current ring.
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
            std::thread::sleep(SLICE / 10);
        }
    }

    /// The frame's metadata: the buffer's PTS as pts (ns, -1 for none), its
    /// DISCONT and DELTA_UNIT flags, and the trailer.
    fn frame_meta(&self, buffer: &gst::BufferRef, info: &gst_video::VideoInfo) -> FrameMeta {
        let obj = self.obj();
        let pts = buffer.pts();
        let presentation = pts.and_then(|pts| {
            let running = obj.segment().downcast::<gst::ClockTime>().ok()?.to_running_time(pts)?;
            let clock = obj.clock()?;
            let t = running + obj.base_time()? + obj.latency();
            crate::clock::clock_to_monotonic(&clock, t)
        });
        let fps = info.fps();
        let par = info.par();
        let trailer = FrameTrailer {
            duration: buffer.duration().map(gst::ClockTime::nseconds),
            presentation,
            dts: buffer.dts().map(gst::ClockTime::nseconds),
            fps: (fps.numer().max(0) as u32, fps.denom().max(1) as u32),
            par: (par.numer().max(1) as u32, par.denom().max(1) as u32),
        };
        let mut flags = 0;
        if buffer.flags().contains(gst::BufferFlags::DISCONT) {
            flags |= FRAME_DISCONTINUITY;
        }
        if !buffer.flags().contains(gst::BufferFlags::DELTA_UNIT) {
            flags |= FRAME_KEY;
        }
        let meta = FrameMeta::pts(pts.map_or(-1, |t| t.nseconds() as i64)).with_flags(flags);
        // 48 bytes always fit the 64 a frame carries.
        meta.with_user(&trailer.encode()).unwrap_or(meta)
    }

    /// Copies `frame` into `slot` plane by plane and publishes it.
    fn fill_and_publish(
        &self,
        mut slot: SlotMut<'_>,
        frame: &gst_video::VideoFrameRef<&gst::BufferRef>,
        meta: FrameMeta,
    ) -> Result<gst::FlowSuccess, gst::FlowError> {
        let planes: Vec<(usize, usize)> = (0..frame.n_planes())
            .map(|k| {
                let stride = frame.plane_stride()[k as usize].max(0) as usize;
                (stride, frame.plane_data(k).map_or(0, <[u8]>::len))
            })
            .collect();
        let plan = video::plan(&planes, slot.geometry(), true).map_err(|e| {
            gst::element_imp_error!(self, gst::StreamError::Format, ["{}", e]);
            gst::FlowError::Error
        })?;
        let bytes = slot.bytes_mut().map_err(|e| {
            gst::element_imp_error!(
                self,
                gst::ResourceError::Write,
                ["the slot is not in host memory: {}", e]
            );
            gst::FlowError::Error
        })?;
        for (k, p) in plan.iter().enumerate() {
            let src = frame.plane_data(k as u32).map_err(|_| gst::FlowError::Error)?;
            video::copy_plane(src, bytes, p).map_err(|e| {
                gst::element_imp_error!(self, gst::StreamError::Format, ["plane {}: {}", k, e]);
                gst::FlowError::Error
            })?;
        }
        let seq = slot.publish(meta).map_err(|e| {
            gst::element_imp_error!(self, gst::ResourceError::Write, ["publish failed: {}", e]);
            gst::FlowError::Error
        })?;
        gst::trace!(CAT, imp = self, "published frame {seq}");
        Ok(gst::FlowSuccess::Ok)
    }

    /// Copies CUDA memory `src` into `slot` on the GPU and commits it in
    /// stream order ([`Copier::copy`], then `SlotMut::publish_cuda`): the
    /// element does not wait for the GPU.
    fn copy_and_publish_cuda(
        &self,
        mut slot: SlotMut<'_>,
        copier: &mut Copier,
        src: &MappedCuda,
        meta: FrameMeta,
    ) -> Result<gst::FlowSuccess, gst::FlowError> {
        let planes: Vec<(usize, usize)> = src.planes.iter().map(|&(_, stride, bytes)| (stride, bytes)).collect();
        let plan = video::plan(&planes, slot.geometry(), true).map_err(|e| {
            gst::element_imp_error!(self, gst::StreamError::Format, ["{}", e]);
            gst::FlowError::Error
        })?;
        let (dst, dst_len) = match slot.device_mut() {
            Ok(view) => (view.as_raw(), view.len()),
            Err(e) => {
                gst::element_imp_error!(
                    self,
                    gst::ResourceError::Write,
                    ["the slot is not device memory: {}", e]
                );
                return Err(gst::FlowError::Error);
            }
        };
        tracing::trace!(target: "vramring::publish", "sink: copy planned");
        // SAFETY: `dst..dst + dst_len` is the loaned slot, device memory of
        // the ring's (primary) context, which stays allocated: the slot is
        // committed on the returned stream below, or dropped unpublished
        // (the ring reuses it only behind later stream-ordered work).
        let stream = unsafe { copier.copy(src, &plan, dst, dst_len) }.map_err(|e| {
            gst::element_imp_error!(self, gst::ResourceError::Write, ["CUDA copy into the slot: {}", e]);
            gst::FlowError::Error
        })?;
        tracing::trace!(target: "vramring::publish", "sink: copy enqueued");
        // SAFETY: `stream` is a stream of the primary context, the ring's
        // context (`Copier::copy` returns its own stream or the memory's
        // when the memory is of that context), alive for the call: the
        // copier's lives in `State`, the memory's as long as `src` is
        // mapped.
        let seq = unsafe { slot.publish_cuda(meta, vramring::cuda::Stream::from_raw(stream)) }.map_err(|e| {
            gst::element_imp_error!(self, gst::ResourceError::Write, ["publish failed: {}", e]);
            gst::FlowError::Error
        })?;
        gst::trace!(CAT, imp = self, "published frame {seq} (CUDA)");
        Ok(gst::FlowSuccess::Ok)
    }

    /// Whether the sink may take CUDA memory: its backend allows it and
    /// CUDA memory is usable in this process.
    fn cuda_possible(&self) -> bool {
        lock(&self.settings).backend != BackendSetting::Host && cuda::available()
    }
}

/// A buffer mapped for the copy: in system memory, or CUDA memory for the
/// device.
enum Input<'a> {
    System(gst_video::VideoFrameRef<&'a gst::BufferRef>),
    Cuda(MappedCuda),
}

impl BaseSinkImpl for VramringSink {
    fn start(&self) -> Result<(), gst::ErrorMessage> {
        self.flushing.store(false, Ordering::Release);
        Ok(())
    }

    fn stop(&self) -> Result<(), gst::ErrorMessage> {
        let mut state = lock(&self.state);
        if let Some(mut p) = state.publisher.take() {
            if let Err(e) = p.close() {
                gst::warning!(CAT, imp = self, "closing the ring: {e}");
            }
        }
        *state = State::default();
        *lock(&self.stats) = None;
        Ok(())
    }

    fn set_caps(&self, caps: &gst::Caps) -> Result<(), gst::LoggableError> {
        let info = gst_video::VideoInfo::from_caps(caps)
            .map_err(|_| gst::loggable_error!(CAT, "caps {caps} are not raw video"))?;
        let cuda_input = video::is_cuda_memory(caps);
        let (path, cfg) = self.ring_config(&info, cuda_input).map_err(|e| {
            gst::element_imp_error!(self, gst::ResourceError::Settings, ["{}", e]);
            gst::loggable_error!(CAT, "{e}")
        })?;
        let copier = if cuda_input {
            let ordinal = lock(&self.settings).cuda_device_id;
            let copier = Primary::get(ordinal).and_then(Copier::new).map_err(|e| {
                gst::element_imp_error!(self, gst::ResourceError::Settings, ["CUDA memory input: {}", e]);
                gst::loggable_error!(CAT, "CUDA memory input: {e}")
            })?;
            Some(copier)
        } else {
            None
        };
        let kind = if cuda_input {
            BackendKind::Cuda
        } else {
            BackendKind::Host
        };
        let mut state = lock(&self.state);
        // The copier goes before any ring it wrote into.
        state.cuda = copier;
        let same = state.publisher.as_ref().is_some_and(|p| {
            let g = p.geometry();
            g.format == cfg.format && g.width == cfg.width && g.height == cfg.height && p.backend() == kind
        });
        if !same {
            if let Some(mut old) = state.publisher.take() {
                // Subscribers see ProducerGone, then reconnect to the new ring.
                if let Err(e) = old.close() {
                    gst::warning!(CAT, imp = self, "closing the previous ring: {e}");
                }
            }
            let publisher = Publisher::create(&path, cfg).map_err(|e| {
                gst::element_imp_error!(
                    self,
                    gst::ResourceError::OpenWrite,
                    ["cannot serve a ring at {}: {}", path, e]
                );
                gst::loggable_error!(CAT, "cannot serve a ring at {path}: {e}")
            })?;
            gst::info!(
                CAT,
                imp = self,
                "serving {} {}x{} on {path} ({} backend)",
                info.format().to_str(),
                info.width(),
                info.height(),
                publisher.backend().name()
            );
            *lock(&self.stats) = Some(publisher.stats());
            state.publisher = Some(publisher);
            state.waited = false;
        }
        state.info = Some(info);
        Ok(())
    }

    fn render(&self, buffer: &gst::Buffer) -> Result<gst::FlowSuccess, gst::FlowError> {
        if !lock(&self.state).waited {
            self.wait_for_subscribers()?;
        }
        let mut state = lock(&self.state);
        tracing::trace!(target: "vramring::publish", "sink: render");
        let info = state.info.clone().ok_or(gst::FlowError::NotNegotiated)?;
        let frame = if state.cuda.is_some() {
            Input::Cuda(MappedCuda::map(buffer.as_ref(), &info).map_err(|e| {
                gst::element_imp_error!(self, gst::StreamError::Format, ["{}", e]);
                gst::FlowError::Error
            })?)
        } else {
            Input::System(
                gst_video::VideoFrameRef::from_buffer_ref_readable(buffer.as_ref(), &info).map_err(|_| {
                    gst::element_imp_error!(
                        self,
                        gst::StreamError::Format,
                        ["cannot map the buffer as {}", info.format().to_str()]
                    );
                    gst::FlowError::Error
                })?,
            )
        };
        tracing::trace!(target: "vramring::publish", "sink: buffer mapped");
        let meta = self.frame_meta(buffer.as_ref(), &info);
        let State { publisher, cuda, .. } = &mut *state;
        let publisher = publisher.as_mut().ok_or(gst::FlowError::NotNegotiated)?;
        loop {
            match publisher.loan(SLICE) {
                Ok(slot) => {
                    tracing::trace!(target: "vramring::publish", "sink: slot loaned");
                    let done = match (&frame, cuda.as_mut()) {
                        (Input::Cuda(src), Some(copier)) => self.copy_and_publish_cuda(slot, copier, src, meta),
                        (Input::System(frame), _) => self.fill_and_publish(slot, frame, meta),
                        (Input::Cuda(_), None) => Err(gst::FlowError::NotNegotiated),
                    };
                    // After the publish: the counters are not on the frame's path.
                    *lock(&self.stats) = Some(publisher.stats());
                    return done;
                }
                // A lossless subscriber still holds the slot: it frees it or
                // is evicted past its lease; go on waiting unless flushing.
                Err(Error::LosslessBlocked { .. } | Error::Timeout(..)) => {
                    *lock(&self.stats) = Some(publisher.stats());
                    if self.flushing.load(Ordering::Acquire) {
                        return Err(gst::FlowError::Flushing);
                    }
                }
                Err(e) => {
                    gst::element_imp_error!(self, gst::ResourceError::Write, ["cannot loan a slot: {}", e]);
                    return Err(gst::FlowError::Error);
                }
            }
        }
    }

    fn caps(&self, filter: Option<&gst::Caps>) -> Option<gst::Caps> {
        let caps = if self.cuda_possible() {
            video::template_caps_with_cuda()
        } else {
            video::template_caps()
        };
        Some(match filter {
            Some(f) => f.intersect_with_mode(&caps, gst::CapsIntersectMode::First),
            None => caps,
        })
    }

    fn query(&self, query: &mut gst::QueryRef) -> bool {
        if let gst::QueryViewMut::Context(q) = query.view_mut() {
            if q.context_type() == cuda::CONTEXT_TYPE && self.cuda_possible() {
                let ordinal = lock(&self.settings).cuda_device_id;
                match Primary::get(ordinal) {
                    Ok(p) => {
                        if p.answer_context_query(self.obj().upcast_ref(), query) {
                            gst::debug!(
                                CAT,
                                imp = self,
                                "gave upstream the primary CUDA context of device {ordinal}"
                            );
                            return true;
                        }
                    }
                    Err(e) => gst::debug!(CAT, imp = self, "no CUDA context to share: {e}"),
                }
            }
        }
        BaseSinkImplExt::parent_query(self, query)
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
