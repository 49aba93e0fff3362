//! Where `vramringsrc`'s frames go out: the memory decided per ring (CUDA
//! or system), the buffer made of a frame (or a kept frame lent as it is),
//! and its timestamps.

use std::time::Duration;

use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_video::prelude::*;
use vramring::{Error, Subscriber};

use super::{OutputMemory, RingKey, Settings, VramringSrc, CAT};
use crate::cuda::{self, Filler, Primary};
use crate::element::lock;
use crate::source::kept::{self, Facts, Lent};
use crate::source::TimestampMode;
use crate::trailer::FrameTrailer;
use crate::video;

/// The caps (with or without the CUDA memory feature) and video info of a
/// ring's frames, kept while the geometry, framerate and aspect ratio stay
/// (made afresh, they cost about 2 µs a frame).
pub(super) struct Shape {
    geometry: vramring::Geometry,
    fps: (u32, u32),
    par: (u32, u32),
    cuda: bool,
    caps: gst::Caps,
    info: gst_video::VideoInfo,
}

impl Shape {
    /// `cache` made to fit a frame of `geometry` with `trailer`.
    fn of<'a>(
        cache: &'a mut Option<Shape>,
        geometry: &vramring::Geometry,
        trailer: Option<FrameTrailer>,
        cuda: bool,
    ) -> Result<&'a Shape, Error> {
        let (fps, par) = trailer.map_or(((0, 1), (1, 1)), |t| (t.fps, t.par));
        let fits = |s: &Shape| s.geometry == *geometry && s.fps == fps && s.par == par && s.cuda == cuda;
        if !cache.as_ref().is_some_and(fits) {
            let bad = |what: String| Error::Config(what);
            let mut caps = video::caps_for(geometry, fps, par)
                .ok_or_else(|| bad(format!("the ring's format {} is not raw video", geometry.format.name())))?;
            let info = gst_video::VideoInfo::from_caps(&caps).map_err(|_| bad(format!("caps {caps}")))?;
            if cuda {
                caps.make_mut()
                    .set_features(0, Some(gst::CapsFeatures::new([cuda::CUDA_MEMORY_FEATURE])));
            }
            *cache = Some(Shape {
                geometry: *geometry,
                fps,
                par,
                cuda,
                caps,
                info,
            });
        }
        cache.as_ref().ok_or(Error::Closed)
    }
}

impl VramringSrc {
    /// Whether the frames of a ring of `key` go out in CUDA memory, and
    /// in which GPU's primary context: a CUDA ring, CUDA memory usable
    /// here (libgstcuda-1.0 and the driver), the ring's GPU found, and
    /// downstream taking `video/x-raw(memory:CUDAMemory)` of the ring's
    /// format and size. Otherwise system memory, as for a host ring.
    pub(super) fn decide(&self, key: RingKey, uuid: Option<[u8; 16]>, s: &Settings) -> Option<&'static Primary> {
        let (backend, format, width, height) = key;
        if backend != vramring::BackendKind::Cuda || !cuda::available() {
            return None;
        }
        let vformat = video::video_format(format)?;
        let probe = gst_video::VideoCapsBuilder::new()
            .features([cuda::CUDA_MEMORY_FEATURE])
            .format(vformat)
            .width(width as i32)
            .height(height as i32)
            .build();
        let peer = self.obj().src_pad().peer_query_caps(Some(&probe));
        if peer.is_empty() {
            gst::info!(CAT, imp = self, "downstream takes no CUDA memory: system memory out");
            return None;
        }
        let ordinal = match uuid.map(cuda::ordinal_of) {
            Some(Ok(o)) => o,
            Some(Err(e)) => {
                gst::warning!(CAT, imp = self, "the CUDA ring's GPU: {e}; system memory out");
                return None;
            }
            None => s.cuda_device_id,
        };
        match Primary::get(ordinal) {
            Ok(p) => {
                gst::info!(
                    CAT,
                    imp = self,
                    "CUDA memory out, in the primary context of GPU {ordinal}"
                );
                Some(p)
            }
            Err(e) => {
                gst::warning!(
                    CAT,
                    imp = self,
                    "no primary context of GPU {ordinal}: {e}; system memory out"
                );
                None
            }
        }
    }

    /// The frame as a buffer of GStreamer's default layout for its caps:
    /// with `cuda`, a `GstCudaMemory` buffer of `filler`'s pool (made or
    /// remade for the caps), else system memory.
    pub(super) fn to_buffer(
        &self,
        frame: &vramring::Frame<'_>,
        facts: &Facts,
        scratch: &mut Vec<u8>,
        cuda: Option<(&'static Primary, &mut Option<Filler>)>,
        shape: &mut Option<Shape>,
        s: &Settings,
    ) -> Result<(gst::Buffer, gst::Caps), Error> {
        let geometry = facts.geometry;
        let trailer = FrameTrailer::decode(&facts.user);
        let bad = |what: String| Error::Config(what);
        let device = cuda.and_then(|c| frame.device().map(|v| (c, v)));
        let Shape { caps, info, .. } = Shape::of(shape, &geometry, trailer, device.is_some())?;
        let (caps, info) = (caps.clone(), info);
        if let Some(((primary, filler), view)) = device {
            if filler.as_ref().is_none_or(|f| f.info() != info) {
                *filler = None;
                *filler = Some(Filler::new(primary, &caps).map_err(bad)?);
            }
            let f = filler.as_mut().ok_or_else(|| bad("no CUDA pool".into()))?;
            // SAFETY: the view is the subscriber's own copy of the frame
            // (or its push buffer), device memory of the ring's GPU (the
            // primary context's: `decide` found it by the ring's UUID),
            // which nothing rewrites before the next `Subscriber::next`;
            // `fill` returns only once its copy is done.
            let mut buffer = unsafe { f.fill(view.as_raw(), view.len(), &geometry) }.map_err(bad)?;
            self.stamp(&mut buffer, facts, trailer, s)?;
            return Ok((buffer, caps));
        }
        let src: &[u8] = match frame.host_bytes() {
            Some(b) => b,
            None => {
                scratch.resize(frame.len() as usize, 0);
                frame.copy_to_host(scratch)?;
                scratch
            }
        };
        let mut buffer = Self::system_copy(src, info, &geometry)?;
        self.stamp(&mut buffer, facts, trailer, s)?;
        Ok((buffer, caps))
    }

    /// A buffer of GStreamer's default layout for `info` holding the frame
    /// `src` (laid out as `geometry`).
    fn system_copy(
        src: &[u8],
        info: &gst_video::VideoInfo,
        geometry: &vramring::Geometry,
    ) -> Result<gst::Buffer, Error> {
        let bad = |what: String| Error::Config(what);
        let mut buffer = gst::Buffer::with_size(info.size()).map_err(|_| bad("cannot allocate a buffer".into()))?;
        {
            let bref = buffer
                .get_mut()
                .ok_or_else(|| bad("a fresh buffer is not writable".into()))?;
            let mut vf = gst_video::VideoFrameRef::from_buffer_ref_writable(bref, info)
                .map_err(|_| bad("cannot map the buffer".into()))?;
            let planes: Vec<(usize, usize)> = (0..vf.n_planes())
                .map(|k| {
                    (
                        vf.plane_stride()[k as usize].max(0) as usize,
                        vf.plane_data(k).map_or(0, <[u8]>::len),
                    )
                })
                .collect();
            let plan = video::plan(&planes, geometry, false).map_err(|e| bad(e.0))?;
            for (k, p) in plan.iter().enumerate() {
                let dst = vf.plane_data_mut(k as u32).map_err(|_| bad(format!("plane {k}")))?;
                video::copy_plane(src, dst, p).map_err(|e| bad(e.0))?;
            }
        }
        Ok(buffer)
    }

    /// Where a frame of this ring goes out: CUDA memory in the primary
    /// context of `Some` GPU, or system memory. Decided per ring by
    /// [`VramringSrc::decide`]; a frame of another ring (a reconnect to a
    /// publisher of another format or size, within one read) keeps CUDA
    /// output, on the new ring's GPU, without asking downstream again (a
    /// caps filter for CUDA memory would refuse system memory), and system
    /// output stays system memory for this frame (the next step decides
    /// afresh).
    pub(super) fn output_for(output: &mut Option<OutputMemory>, facts: &Facts) -> Option<&'static Primary> {
        let g = &facts.geometry;
        let key = (facts.backend, g.format, g.width, g.height);
        match *output {
            Some(o) if o.key == key => o.cuda,
            Some(o) if o.cuda.is_some() => {
                let cuda = (key.0 == vramring::BackendKind::Cuda)
                    .then(|| cuda::ordinal_of(facts.device_uuid).ok())
                    .flatten()
                    .and_then(|n| Primary::get(n).ok());
                *output = Some(OutputMemory { key, cuda });
                cuda
            }
            _ => None,
        }
    }

    /// A latest source reading a queue (zero-copy): the newest frame queued
    /// now, kept, or `None` when nothing is. The frames passed over are let
    /// go (their buffers come back at the next read) and counted in
    /// `superseded`; an error is kept for the next read.
    pub(super) fn newest(
        sub: &mut Subscriber,
        superseded: &mut u64,
        deferred: &mut Option<Error>,
    ) -> Option<(vramring::FrameHold, Facts)> {
        let mut newest: Option<(vramring::FrameHold, Facts)> = None;
        loop {
            match sub.next(Duration::ZERO) {
                Ok(frame) => {
                    let Some(hold) = frame.hold() else {
                        // Not a queued push frame: cannot be, for the
                        // options this source subscribes with. Counted,
                        // not lost silently.
                        *superseded += 1;
                        break;
                    };
                    let mut facts = Facts::of(&frame);
                    if let Some((_, older)) = newest.take() {
                        *superseded += 1;
                        facts.skipped += older.skipped + 1;
                    }
                    newest = Some((hold, facts));
                }
                Err(Error::Timeout(..)) => break,
                Err(e) => {
                    *deferred = Some(e);
                    break;
                }
            }
        }
        newest
    }

    /// The kept frame `hold` as a buffer without a copy: CUDA memory around
    /// the push buffer (`cuda`), or system memory that is the host push
    /// buffer, in the ring's layout (a video meta says it). System memory
    /// in a layout downstream cannot read (no video meta, not GStreamer's
    /// default) is copied.
    pub(super) fn kept_buffer(
        &self,
        hold: Lent,
        facts: &Facts,
        cuda: Option<&'static Primary>,
        video_meta: bool,
        shape: &mut Option<Shape>,
        s: &Settings,
    ) -> Result<(gst::Buffer, gst::Caps), Error> {
        let geometry = facts.geometry;
        let trailer = FrameTrailer::decode(&facts.user);
        let bad = |what: String| Error::Config(what);
        let Shape { caps, info, .. } = Shape::of(shape, &geometry, trailer, cuda.is_some())?;
        // A plain copy of `info` with the ring's offsets, strides and size.
        let layout = &kept::ring_info(info, &geometry);
        let caps = caps.clone();
        // Downstream's answer on the video meta was for the caps last sent:
        // the first frame of new caps goes out before they are negotiated.
        // Looked at only for system memory in the ring's own layout.
        let meta_read = || video_meta && lock(&self.published).caps.as_ref() == Some(&caps);
        if cuda.is_none() && !kept::default_layout(info, &geometry) && !meta_read() {
            let src: &[u8] = hold.as_ref();
            let mut buffer = Self::system_copy(src, info, &geometry)?;
            self.stamp(&mut buffer, facts, trailer, s)?;
            return Ok((buffer, caps));
        }
        let mem = match cuda {
            Some(primary) => {
                let ptr = hold
                    .device()
                    .ok_or_else(|| bad("a kept frame of a CUDA ring has no device memory".into()))?
                    .as_raw();
                // SAFETY: `ptr` is the subscriber's push buffer, device
                // memory of the ring's GPU mapped in its primary context
                // (`decide` found `primary` by the ring's UUID), at least
                // `frame_bytes` long (the layout's size); the publisher
                // does not write it while `hold`, which the memory owns,
                // lives.
                unsafe { primary.wrap(layout, ptr, hold) }.map_err(bad)?
            }
            None => kept::host_memory(hold).ok_or_else(|| bad("a kept frame of a host ring has no bytes".into()))?,
        };
        let mut buffer = gst::Buffer::new();
        {
            let b = buffer
                .get_mut()
                .ok_or_else(|| bad("a fresh buffer is not writable".into()))?;
            b.append_memory(mem);
            kept::add_ring_meta(b, info, layout).map_err(bad)?;
        }
        self.stamp(&mut buffer, facts, trailer, s)?;
        Ok((buffer, caps))
    }

    /// Sets the buffer's timestamps and offset from the frame.
    fn stamp(
        &self,
        buffer: &mut gst::Buffer,
        frame: &Facts,
        trailer: Option<FrameTrailer>,
        s: &Settings,
    ) -> Result<(), Error> {
        {
            let b = buffer
                .get_mut()
                .ok_or_else(|| Error::Config("a fresh buffer is not writable".into()))?;
            let pts = match s.timestamp_mode {
                TimestampMode::Clock => {
                    let mono = trailer.and_then(|t| t.presentation).unwrap_or(frame.commit_ns);
                    crate::clock::monotonic_to_running_time(self.obj().upcast_ref(), mono)
                }
                TimestampMode::Pts => u64::try_from(frame.pts).ok().map(gst::ClockTime::from_nseconds),
            };
            b.set_pts(pts);
            b.set_duration(trailer.and_then(|t| t.duration).map(gst::ClockTime::from_nseconds));
            b.set_offset(frame.seq);
        }
        Ok(())
    }
}
