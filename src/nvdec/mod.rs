//! A hardware video decoder producer: NVDEC decodes H.264 (or HEVC) access
//! units on the GPU, and each decoded picture goes into a loaned ring slot
//! with one device-to-device 2-D copy, never through the host.
//!
//! Feature `nvdec`. NVDEC is driven through `libnvcuvid`, which the NVIDIA
//! driver ships; it is opened at run time ([`sys`](self) module, see
//! `docs/adr/0005-nvdec-binding.md`), so this builds on a machine with no
//! CUDA toolkit and no Video Codec SDK. Where the library or a GPU is
//! missing, [`Decoder::new`] returns [`Error::DecoderUnavailable`] or
//! [`Error::CudaUnavailable`]; a stream the GPU cannot decode gives
//! [`Error::UnsupportedStream`]. [`use_library`] names the library to open
//! instead of `libnvcuvid.so.1` (a path, for a driver installed outside the
//! loader's search path); the examples take it from `VRAMRING_NVCUVID`.
//!
//! # How a frame travels
//! 1. [`Decoder::decode`] hands one access unit to NVDEC's parser, which
//!    calls back (on this thread, inside the call) to create the decoder at
//!    the first sequence header, to decode each picture, and to queue each
//!    picture for display in display order.
//! 2. For each queued picture the decoder maps the decoded surface
//!    (`cuvidMapVideoFrame64`, on the decoder's own stream) and calls your
//!    sink with a [`DecodedFrame`]: the surface's device address and pitch,
//!    the display (cropped) size, the packet's timestamp.
//! 3. In the sink, [`DecodedFrame::copy_to_slot`] enqueues one 2-D copy per
//!    plane (`cuMemcpy2DAsync`, surface pitch to slot pitch, cropped rows
//!    only) on the decoder's stream, and `SlotMut::publish_cuda` with
//!    [`DecodedFrame::stream`] enqueues the commit behind that copy.
//! 4. The surface is unmapped after the sink returns and the stream is idle.
//!
//! # Why not decode straight into slot memory
//! The plain NVDEC API offers no way to: `cuvidCreateDecoder` allocates its
//! decode surfaces itself (`ulNumDecodeSurfaces` of them, with a pitch and
//! layout of its choosing, coded size 1920x1088 for 1080p), the parser
//! cycles through them as the reference picture buffer (a surface stays a
//! reference after it was displayed, so handing it to subscribers would let
//! the next P-frame's reference be overwritten or vice versa), and
//! `cuvidMapVideoFrame64` returns a pointer into a driver-owned output
//! surface. There is no call that takes a caller's `CUdeviceptr` as the
//! output of a decode or map (`CUVIDPROCPARAMS::raw_output_dptr` is for the
//! raw-YUV input extension, not for decoding). So one copy per frame is the
//! minimum, and it runs on the copy engines at device bandwidth (about
//! 3 MB for a 1080p NV12 frame; see `docs/PERF.md`).
//!
//! # Contexts and teardown
//! The decoder uses the primary context of its device, the context the
//! CUDA ring pool uses, so slot addresses are valid on the decoder's
//! stream. Every NVDEC object (parser, decoder, context lock) and the stream
//! are made and destroyed with that context pushed, and the context is
//! released last (see `docs/adr` and the pool's teardown rule).
//!
//! # Example
//! ```no_run
//! use std::time::Duration;
//! use vramring::nvdec::{Codec, Decoder, DecoderOptions};
//! use vramring::{BackendChoice, Format, FrameMeta, Publisher, RingConfig};
//!
//! # fn main() -> vramring::Result<()> {
//! let stream = std::fs::read("tests/data/clip.h264").map_err(|e| vramring::Error::io("reading the clip", e))?;
//! // The whole file as one chunk; with whole access units per call (the
//! // default, see `examples/nvdec_producer.rs`) each picture decodes at once.
//! let mut decoder = Decoder::new(DecoderOptions::new(Codec::H264).access_units(false))?;
//! let mut ring: Option<Publisher> = None;
//! let mut sink = |f: &vramring::nvdec::DecodedFrame<'_>| -> vramring::Result<()> {
//!     if ring.is_none() {
//!         let cfg = RingConfig::new(Format::Nv12, f.width(), f.height()).backend(BackendChoice::Cuda(0));
//!         ring = Some(Publisher::create("/tmp/cam1.sock", cfg)?);
//!     }
//!     let publisher = ring.as_mut().expect("made above");
//!     let mut slot = publisher.loan(Duration::from_millis(100))?;
//!     f.copy_to_slot(&mut slot)?;
//!     // SAFETY: the decoder's stream is a live stream of the device's
//!     // primary context, the ring's context.
//!     unsafe { slot.publish_cuda(FrameMeta::pts(f.timestamp()), f.stream()) }?;
//!     Ok(())
//! };
//! decoder.decode(&stream, Some(0), &mut sink)?;
//! decoder.flush(&mut sink)?;
//! # Ok(()) }
//! ```

mod sys;

use std::collections::VecDeque;
use std::ffi::{c_int, c_uint, c_void};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};

use crate::memory::cuda::{ContextGuard, CuContext, CuDevice, CuStream, Driver, DriverError, RealDriver};
use crate::memory::view::{DeviceView, Stream};
use crate::{BackendKind, Error, Format, Result, SlotMut};

/// The codec of the elementary stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Codec {
    /// H.264 / AVC, Annex-B.
    H264,
    /// H.265 / HEVC, Annex-B.
    Hevc,
}

impl Codec {
    fn raw(self) -> c_uint {
        match self {
            Codec::H264 => sys::CODEC_H264,
            Codec::Hevc => sys::CODEC_HEVC,
        }
    }

    /// Name, as a person says it.
    pub const fn name(self) -> &'static str {
        match self {
            Codec::H264 => "H.264",
            Codec::Hevc => "HEVC",
        }
    }

    fn from_raw(raw: c_uint) -> String {
        match raw {
            sys::CODEC_H264 => "H.264".into(),
            sys::CODEC_HEVC => "HEVC".into(),
            sys::CODEC_AV1 => "AV1".into(),
            n => format!("codec {n}"),
        }
    }
}

impl std::str::FromStr for Codec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "h264" | "h.264" | "avc" => Ok(Codec::H264),
            "h265" | "h.265" | "hevc" => Ok(Codec::Hevc),
            other => Err(Error::Config(format!("unknown codec {other:?}: use h264 or hevc"))),
        }
    }
}

/// How to make a [`Decoder`].
#[derive(Debug, Clone)]
pub struct DecoderOptions {
    /// The stream's codec.
    pub codec: Codec,
    /// CUDA device ordinal (in this process) to decode on; use the ring's.
    pub device: u32,
    /// Pictures the parser may hold back before display (NVDEC's
    /// `ulMaxDisplayDelay`): 0 gives the lowest latency, 1 to 4 let decode
    /// run ahead of the copy out.
    pub display_delay: u32,
    /// Decode surfaces beyond the stream's minimum (headroom for the
    /// display delay and the copy out).
    pub extra_surfaces: u32,
    /// Whether each [`Decoder::decode`] call holds exactly one access unit
    /// (`CUVID_PKT_ENDOFPICTURE`: the picture decodes at once). With
    /// `false`, any chunking is fine and a picture decodes when the next
    /// one starts.
    pub access_units: bool,
    /// Units of the timestamps passed in, in Hz (the parser's
    /// `ulClockRate`); 90 kHz like the packet ring.
    pub clock_rate: u32,
}

impl DecoderOptions {
    /// Defaults for `codec`: device 0, display delay 1, 4 extra surfaces,
    /// whole access units, 90 kHz timestamps.
    pub fn new(codec: Codec) -> Self {
        DecoderOptions {
            codec,
            device: 0,
            display_delay: 1,
            extra_surfaces: 4,
            access_units: true,
            clock_rate: 90_000,
        }
    }
    /// Sets the device ordinal.
    pub fn device(mut self, ordinal: u32) -> Self {
        self.device = ordinal;
        self
    }
    /// Sets the display delay.
    pub fn display_delay(mut self, pictures: u32) -> Self {
        self.display_delay = pictures;
        self
    }
    /// Sets whether each decode call holds one whole access unit.
    pub fn access_units(mut self, yes: bool) -> Self {
        self.access_units = yes;
        self
    }
}

/// What the decoder learnt from the stream's sequence header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamInfo {
    /// The codec.
    pub codec: Codec,
    /// Coded size (macroblock-aligned, e.g. 1920x1088).
    pub coded_width: u32,
    /// Coded height.
    pub coded_height: u32,
    /// Display size after cropping (e.g. 1920x1080): the frames' size.
    pub width: u32,
    /// Display height.
    pub height: u32,
    /// Left edge of the display area in the coded picture.
    pub crop_left: u32,
    /// Top edge of the display area in the coded picture.
    pub crop_top: u32,
    /// Frame rate numerator from the stream (0 when unspecified).
    pub frame_rate_num: u32,
    /// Frame rate denominator from the stream (0 when unspecified).
    pub frame_rate_den: u32,
    /// Whether the sequence is progressive.
    pub progressive: bool,
    /// Decode surfaces allocated.
    pub surfaces: u32,
}

/// The library the process opens, once.
static LIB: OnceLock<std::result::Result<sys::Nvcuvid, String>> = OnceLock::new();
/// The name [`use_library`] gave, if any.
static LIB_NAME: OnceLock<String> = OnceLock::new();

fn library() -> Result<&'static sys::Nvcuvid> {
    LIB.get_or_init(|| sys::Nvcuvid::load(LIB_NAME.get().map(String::as_str)))
        .as_ref()
        .map_err(|e| Error::DecoderUnavailable(e.clone()))
}

/// Opens `name` (a path or a soname) instead of `libnvcuvid.so.1` when the
/// process first needs NVDEC, for a driver installed outside the loader's
/// search path. Call it before the first [`Decoder::new`] or [`available`].
///
/// # Errors
/// [`Error::Config`] once the library was opened or a name was already
/// given: the process opens NVDEC once.
pub fn use_library(name: impl Into<String>) -> Result<()> {
    let name = name.into();
    if LIB.get().is_some() {
        return Err(Error::Config(format!(
            "NVDEC's library was already opened; use_library({name:?}) must come before the first decoder"
        )));
    }
    LIB_NAME.set(name).map_err(|name| {
        Error::Config(format!(
            "NVDEC's library was already named; use_library({name:?}) comes once"
        ))
    })
}

/// Whether NVDEC can be used here: `libnvcuvid` and the CUDA driver load.
/// Does not create anything on the GPU.
pub fn available() -> bool {
    library().is_ok() && RealDriver::shared().is_ok()
}

fn check(call: &'static str, code: u32) -> Result<()> {
    DriverError::check(call, code).map_err(Error::from)
}

/// The parser's callbacks' view of the decoder. Lives in a `Box` whose
/// address the parser holds as its user data.
struct State {
    lib: &'static sys::Nvcuvid,
    codec: Codec,
    lock: sys::CtxLock,
    decoder: sys::VideoDecoder,
    info: Option<StreamInfo>,
    display_delay: u32,
    extra_surfaces: u32,
    /// Pictures ready for display, in display order, not yet mapped.
    pending: VecDeque<sys::ParserDispInfo>,
    /// The first error a callback met; reported by the parse call.
    error: Option<Error>,
}

impl State {
    /// The sequence callback: checks the stream against the GPU's decoder
    /// caps and creates the decoder (first time), or accepts a repeat of the
    /// same format (every keyframe's SPS, a new parser after a flush).
    fn sequence(&mut self, f: &sys::VideoFormat) -> Result<u32> {
        if f.chroma_format != sys::CHROMA_420 {
            let name = match f.chroma_format {
                0 => "monochrome",
                2 => "4:2:2",
                3 => "4:4:4",
                _ => "unknown",
            };
            return Err(Error::UnsupportedStream(format!(
                "{name} chroma; only 4:2:0 streams decode to NV12"
            )));
        }
        if f.bit_depth_luma_minus8 != 0 || f.bit_depth_chroma_minus8 != 0 {
            return Err(Error::UnsupportedStream(format!(
                "{}-bit video; only 8-bit streams decode to NV12",
                8 + u32::from(f.bit_depth_luma_minus8)
            )));
        }
        let a = f.display_area;
        if a.left < 0
            || a.top < 0
            || a.right <= a.left
            || a.bottom <= a.top
            || a.right as u32 > f.coded_width
            || a.bottom as u32 > f.coded_height
        {
            return Err(Error::UnsupportedStream(format!(
                "display area {a:?} does not fit the coded size {}x{}",
                f.coded_width, f.coded_height
            )));
        }
        let surfaces = (u32::from(f.min_num_decode_surfaces).max(1) + self.display_delay + self.extra_surfaces).min(32);
        let info = StreamInfo {
            codec: self.codec,
            coded_width: f.coded_width,
            coded_height: f.coded_height,
            width: (a.right - a.left) as u32 & !1,
            height: (a.bottom - a.top) as u32 & !1,
            crop_left: a.left as u32 & !1,
            crop_top: a.top as u32 & !1,
            frame_rate_num: f.frame_rate_num,
            frame_rate_den: f.frame_rate_den,
            progressive: f.progressive_sequence != 0,
            surfaces,
        };
        if let Some(old) = self.info {
            let same = old.coded_width == info.coded_width
                && old.coded_height == info.coded_height
                && (old.width, old.height, old.crop_left, old.crop_top)
                    == (info.width, info.height, info.crop_left, info.crop_top);
            if same {
                return Ok(old.surfaces);
            }
            return Err(Error::UnsupportedStream(format!(
                "the picture size changed mid-stream from {}x{} to {}x{}; make a new decoder (and ring) for the new size",
                old.width, old.height, info.width, info.height
            )));
        }
        let mut caps = sys::DecodeCaps {
            codec_type: f.codec,
            chroma_format: f.chroma_format,
            bit_depth_minus8: u32::from(f.bit_depth_luma_minus8),
            ..Default::default()
        };
        // SAFETY: `caps` is a valid `CUVIDDECODECAPS`; the device's context
        // is current (the parser calls back inside `Decoder::parse`, which
        // runs with it pushed).
        check("cuvidGetDecoderCaps", unsafe { (self.lib.get_decoder_caps)(&mut caps) })?;
        let what = format!("{} 4:2:0 8-bit", Codec::from_raw(f.codec));
        if caps.is_supported == 0 {
            return Err(Error::UnsupportedStream(format!(
                "{what} is not supported by this GPU's NVDEC"
            )));
        }
        if f.coded_width > caps.max_width
            || f.coded_height > caps.max_height
            || f.coded_width < u32::from(caps.min_width)
            || f.coded_height < u32::from(caps.min_height)
            || (f.coded_width / 16) * (f.coded_height / 16) > caps.max_mb_count
        {
            return Err(Error::UnsupportedStream(format!(
                "{what} at {}x{}: this GPU's NVDEC takes {}x{} to {}x{}, at most {} macroblocks",
                f.coded_width,
                f.coded_height,
                caps.min_width,
                caps.min_height,
                caps.max_width,
                caps.max_height,
                caps.max_mb_count
            )));
        }
        if caps.output_format_mask & (1 << sys::SURFACE_NV12) == 0 {
            return Err(Error::UnsupportedStream(format!(
                "{what}: this GPU's NVDEC has no NV12 output"
            )));
        }
        // Target size = coded size and no display-area crop: the surfaces
        // are the decoder's own pictures with no post-processing (no scaler
        // pass), and the copy out takes only the display rectangle.
        let mut ci = sys::DecodeCreateInfo {
            width: f.coded_width.into(),
            height: f.coded_height.into(),
            num_decode_surfaces: surfaces.into(),
            codec_type: f.codec,
            chroma_format: f.chroma_format,
            creation_flags: sys::CREATE_PREFER_CUVID,
            bit_depth_minus8: 0,
            intra_decode_only: 0,
            max_width: f.coded_width.into(),
            max_height: f.coded_height.into(),
            reserved1: 0,
            display_area: sys::ShortRect::default(),
            output_format: sys::SURFACE_NV12,
            deinterlace_mode: if info.progressive {
                sys::DEINTERLACE_WEAVE
            } else {
                sys::DEINTERLACE_ADAPTIVE
            },
            target_width: f.coded_width.into(),
            target_height: f.coded_height.into(),
            num_output_surfaces: 2,
            vid_lock: self.lock,
            target_rect: sys::ShortRect::default(),
            enable_histogram: 0,
            reserved2: [0; 4],
        };
        let mut dec: sys::VideoDecoder = std::ptr::null_mut();
        // SAFETY: `ci` is a valid `CUVIDDECODECREATEINFO` whose lock is live;
        // `dec` is a valid out-parameter; the context is current.
        check("cuvidCreateDecoder", unsafe {
            (self.lib.create_decoder)(&mut dec, &mut ci)
        })?;
        self.decoder = dec;
        self.info = Some(info);
        tracing::debug!(?info, "NVDEC decoder created");
        Ok(surfaces)
    }

    fn decode(&mut self, pic: *mut sys::PicParams) -> Result<()> {
        if self.decoder.is_null() {
            return Err(Error::UnsupportedStream(
                "a picture arrived before any sequence header; start the stream at a keyframe with its SPS/PPS".into(),
            ));
        }
        // SAFETY: `pic` is the parser's `CUVIDPICPARAMS` for this callback,
        // valid for its duration; the decoder is live; the context is current.
        check("cuvidDecodePicture", unsafe {
            (self.lib.decode_picture)(self.decoder, pic)
        })
    }
}

/// Runs `f` on the state behind the parser's user pointer, turning an
/// error or a panic into the callback's failure return (0).
///
/// # Safety
/// `user` is the `State` pointer the parser was made with, and no other
/// reference to that state is live (the parser calls back only inside
/// `cuvidParseVideoData`, which the decoder calls without holding one).
unsafe fn callback(user: *mut c_void, f: impl FnOnce(&mut State) -> Result<c_int>) -> c_int {
    // SAFETY: this function's contract.
    let st = unsafe { &mut *user.cast::<State>() };
    match std::panic::catch_unwind(AssertUnwindSafe(|| f(&mut *st))) {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            st.error.get_or_insert(e);
            0
        }
        Err(_) => {
            st.error
                .get_or_insert(Error::UnsupportedStream("a decoder callback panicked".into()));
            0
        }
    }
}

unsafe extern "C" fn on_sequence(user: *mut c_void, format: *mut sys::VideoFormat) -> c_int {
    // SAFETY: called by the parser made in `Decoder::create_parser` with the
    // state pointer as user data (see `callback`); `format` is valid for the
    // call.
    unsafe { callback(user, |st| st.sequence(&*format).map(|n| n as c_int)) }
}

unsafe extern "C" fn on_decode(user: *mut c_void, pic: *mut sys::PicParams) -> c_int {
    // SAFETY: as in `on_sequence`; `pic` is valid for the call.
    unsafe { callback(user, |st| st.decode(pic).map(|()| 1)) }
}

unsafe extern "C" fn on_display(user: *mut c_void, disp: *mut sys::ParserDispInfo) -> c_int {
    // SAFETY: as in `on_sequence`; `disp` is null (end of stream) or valid
    // for the call, and is copied out.
    unsafe {
        callback(user, |st| {
            if !disp.is_null() {
                st.pending.push_back(*disp);
            }
            Ok(1)
        })
    }
}

/// A decoded picture, mapped, valid during the sink call it is passed to.
#[derive(Debug)]
pub struct DecodedFrame<'d> {
    ptr: u64,
    pitch: u32,
    info: StreamInfo,
    timestamp: i64,
    stream: CuStream,
    memcpy2d: sys::Memcpy2DAsync,
    index: u64,
    _decoder: std::marker::PhantomData<&'d Decoder>,
}

/// Bytes from a plane's first displayed byte to its last: `rows - 1` pitches
/// and one row of `width`.
fn plane_span(rows: u64, pitch: u32, width: u32) -> u64 {
    rows.saturating_sub(1) * u64::from(pitch) + if rows == 0 { 0 } else { u64::from(width) }
}

impl DecodedFrame<'_> {
    /// Display width (cropped).
    pub fn width(&self) -> u32 {
        self.info.width
    }
    /// Display height (cropped).
    pub fn height(&self) -> u32 {
        self.info.height
    }
    /// Bytes per row of the decoded surface.
    pub fn pitch(&self) -> u32 {
        self.pitch
    }
    /// The stream's properties.
    pub fn info(&self) -> &StreamInfo {
        &self.info
    }
    /// The timestamp given with the access unit that held this picture.
    pub fn timestamp(&self) -> i64 {
        self.timestamp
    }
    /// Pictures output before this one by this decoder (display order).
    pub fn index(&self) -> u64 {
        self.index
    }
    /// The displayed luma plane: `height` rows of `width` bytes, `pitch`
    /// apart, from its first displayed byte.
    pub fn luma(&self) -> DeviceView<'_> {
        let rows = u64::from(self.height());
        DeviceView::new(self.luma_addr(), plane_span(rows, self.pitch, self.width()))
    }
    /// The displayed chroma plane (interleaved UV): `height / 2` rows of
    /// `width` bytes, `pitch` apart, from its first displayed byte.
    pub fn chroma(&self) -> DeviceView<'_> {
        let rows = u64::from(self.height() / 2);
        DeviceView::new(self.chroma_addr(), plane_span(rows, self.pitch, self.width()))
    }
    /// Device address of the first displayed luma byte.
    pub(crate) fn luma_addr(&self) -> u64 {
        self.ptr + u64::from(self.info.crop_top) * u64::from(self.pitch) + u64::from(self.info.crop_left)
    }
    /// Device address of the first displayed chroma (interleaved UV) byte:
    /// the chroma plane follows the luma plane's `coded_height` rows.
    pub(crate) fn chroma_addr(&self) -> u64 {
        let row = u64::from(self.info.coded_height) + u64::from(self.info.crop_top / 2);
        self.ptr + row * u64::from(self.pitch) + u64::from(self.info.crop_left)
    }
    /// The decoder's stream: the copies are enqueued on it; pass it to
    /// `SlotMut::publish_cuda`.
    pub fn stream(&self) -> Stream<'_> {
        // SAFETY: the decoder's stream outlives every frame it decodes.
        unsafe { Stream::from_raw(self.stream.as_raw()) }
    }

    /// Enqueues the copy of the displayed picture into `slot` (an NV12 slot
    /// of the same size): one 2-D copy per plane, surface pitch to slot
    /// pitch, on [`DecodedFrame::stream`]. On a CUDA ring, commit with
    /// `slot.publish_cuda(meta, frame.stream())`; on a host ring the copy is
    /// complete when this returns (the stream is synchronised) and
    /// `slot.publish(meta)` commits.
    ///
    /// The ring must be on the decoder's device.
    ///
    /// # Errors
    /// [`Error::Config`] when the slot is not NV12 of the frame's size;
    /// [`Error::Driver`] when the copy cannot be enqueued.
    pub fn copy_to_slot(&self, slot: &mut SlotMut<'_>) -> Result<()> {
        let g = *slot.geometry();
        if g.format != Format::Nv12 || g.width != self.width() || g.height != self.height() {
            return Err(Error::Config(format!(
                "the decoded frame is NV12 {}x{} but the ring's slots are {} {}x{}; make the ring NV12 of the decoded size",
                self.width(),
                self.height(),
                g.format.name(),
                g.width,
                g.height
            )));
        }
        let host = slot.backend() == BackendKind::Host;
        let planes = g.planes();
        let (y, uv) = (planes[0], planes[1]);
        let dst_y = slot.plane_addr(0)?;
        let dst_uv = slot.plane_addr(1)?;
        // SAFETY: both destination ranges are the slot's planes (rows x
        // pitch inside the slot, which this `&mut` loan owns), in device
        // memory of this device's primary context or in the host pool's
        // mapping; the sources are the mapped surface's display rectangle.
        unsafe {
            self.copy_plane(
                self.luma_addr(),
                dst_y,
                y.pitch,
                u64::from(self.width()),
                u64::from(self.height()),
                host,
            )?;
            self.copy_plane(
                self.chroma_addr(),
                dst_uv,
                uv.pitch,
                u64::from(self.width()),
                u64::from(self.height() / 2),
                host,
            )?;
        }
        if host {
            let d = RealDriver::shared()?;
            // SAFETY: the decoder's stream is live for this frame's lifetime.
            unsafe { d.stream_synchronize(self.stream) }?;
        }
        Ok(())
    }

    /// Copies the displayed picture into host memory, tightly packed (Y rows
    /// of `width` bytes, then UV rows), and waits for the copy: what a
    /// software decoder outputs as raw NV12.
    ///
    /// # Errors
    /// [`Error::Driver`] when the copy fails.
    pub fn copy_to_host(&self, out: &mut Vec<u8>) -> Result<()> {
        let (w, h) = (u64::from(self.width()), u64::from(self.height()));
        out.clear();
        out.resize((w * h * 3 / 2) as usize, 0);
        let base = out.as_mut_ptr() as u64;
        // SAFETY: `out` holds w*h*3/2 bytes: the Y rows at 0, the UV rows
        // at w*h, both packed with pitch w; the stream is synchronised
        // before `out` is touched again.
        unsafe {
            self.copy_plane(self.luma_addr(), base, w, w, h, true)?;
            self.copy_plane(self.chroma_addr(), base + w * h, w, w, h / 2, true)?;
            RealDriver::shared()?.stream_synchronize(self.stream)?;
        }
        Ok(())
    }

    /// One `cuMemcpy2DAsync` of `rows` rows of `width` bytes from the
    /// surface to `dst` (device or host) with pitch `dst_pitch`.
    ///
    /// # Safety
    /// `dst .. dst + dst_pitch * rows` is writable memory of that kind that
    /// no Rust reference covers until the stream has finished the copy.
    unsafe fn copy_plane(&self, src: u64, dst: u64, dst_pitch: u64, width: u64, rows: u64, host: bool) -> Result<()> {
        use cudarc::driver::sys::{CUmemorytype, CUDA_MEMCPY2D};
        let c = CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src,
            srcArray: std::ptr::null_mut(),
            srcPitch: self.pitch as usize,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: if host {
                CUmemorytype::CU_MEMORYTYPE_HOST
            } else {
                CUmemorytype::CU_MEMORYTYPE_DEVICE
            },
            dstHost: if host {
                dst as usize as *mut c_void
            } else {
                std::ptr::null_mut()
            },
            dstDevice: if host { 0 } else { dst },
            dstArray: std::ptr::null_mut(),
            dstPitch: dst_pitch as usize,
            WidthInBytes: width as usize,
            Height: rows as usize,
        };
        // SAFETY: `c` describes a copy from the mapped surface (valid until
        // unmap, which waits for the stream) to memory the caller vouches
        // for; the stream is the decoder's, live; the decoder's context is
        // current during the sink call.
        check("cuMemcpy2DAsync", unsafe {
            (self.memcpy2d)(&c, self.stream.as_raw().cast())
        })
    }
}

/// An NVDEC decoder: parser, hardware decoder, context lock and stream, on
/// the primary context of one device.
pub struct Decoder {
    driver: Arc<RealDriver>,
    lib: &'static sys::Nvcuvid,
    memcpy2d: sys::Memcpy2DAsync,
    device: CuDevice,
    /// Retained primary context; `None` after close.
    ctx: Option<CuContext>,
    stream: Option<CuStream>,
    parser: sys::VideoParser,
    state: *mut State,
    opts: DecoderOptions,
    output: u64,
}

// SAFETY: the raw pointers are NVDEC handles and the callback state, used
// only through `&mut self` with the context pushed on the calling thread;
// none of them is tied to the thread that made it.
unsafe impl Send for Decoder {}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("codec", &self.opts.codec)
            .field("device", &self.device)
            .field("info", &self.info())
            .field("output", &self.output)
            .finish()
    }
}

impl Decoder {
    /// Opens `libnvcuvid` and the CUDA driver, retains the device's primary
    /// context, and makes the context lock, a stream and the parser. The
    /// hardware decoder itself is made at the stream's first sequence
    /// header, when its size is known.
    ///
    /// # Errors
    /// [`Error::DecoderUnavailable`] without `libnvcuvid`;
    /// [`Error::CudaUnavailable`] without a CUDA driver; [`Error::Config`]
    /// for a device that does not exist; [`Error::Driver`] when a call fails.
    pub fn new(opts: DecoderOptions) -> Result<Decoder> {
        let lib = library()?;
        let memcpy2d = sys::memcpy2d_async().map_err(Error::CudaUnavailable)?;
        let driver = RealDriver::shared()?;
        let count = driver.device_count()?;
        if i64::from(opts.device) >= i64::from(count) {
            return Err(Error::Config(format!(
                "CUDA device {} does not exist here ({count} visible)",
                opts.device
            )));
        }
        let device = driver.device_get(opts.device as i32)?;
        let ctx = driver.primary_ctx_retain(device)?;
        let state = Box::into_raw(Box::new(State {
            lib,
            codec: opts.codec,
            lock: std::ptr::null_mut(),
            decoder: std::ptr::null_mut(),
            info: None,
            display_delay: opts.display_delay,
            extra_surfaces: opts.extra_surfaces,
            pending: VecDeque::new(),
            error: None,
        }));
        let mut d = Decoder {
            driver,
            lib,
            memcpy2d,
            device,
            ctx: Some(ctx),
            stream: None,
            parser: std::ptr::null_mut(),
            state,
            opts,
            output: 0,
        };
        // On error `d` drops here, releasing what was made, in its context.
        d.in_context(|d| {
            let mut lock: sys::CtxLock = std::ptr::null_mut();
            // SAFETY: `lock` is a valid out-parameter; `ctx` is retained.
            check("cuvidCtxLockCreate", unsafe {
                (d.lib.ctx_lock_create)(&mut lock, ctx.as_raw().cast())
            })?;
            // SAFETY: `state` is the live box made above; no reference to it
            // is held elsewhere.
            unsafe { (*d.state).lock = lock };
            d.stream = Some(d.driver.stream_create_non_blocking()?);
            d.create_parser()
        })?;
        Ok(d)
    }

    /// The stream's properties, once its first sequence header was decoded.
    pub fn info(&self) -> Option<StreamInfo> {
        // SAFETY: `state` is live until drop; only read here.
        unsafe { (*self.state).info }
    }

    /// Pictures output so far.
    pub fn output_count(&self) -> u64 {
        self.output
    }

    fn in_context<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let ctx = self.ctx.ok_or(Error::Closed)?;
        let driver = Arc::clone(&self.driver);
        // SAFETY: `ctx` is retained until `close`.
        let guard = unsafe { ContextGuard::push(&*driver, ctx) }?;
        let r = f(self);
        let restored = guard.restore();
        let v = r?;
        restored?;
        Ok(v)
    }

    /// Makes the parser. The context is current.
    fn create_parser(&mut self) -> Result<()> {
        let mut p = sys::ParserParams {
            codec_type: self.opts.codec.raw(),
            max_num_decode_surfaces: 1,
            clock_rate: self.opts.clock_rate,
            error_threshold: 0,
            max_display_delay: self.opts.display_delay,
            annexb_bits: 0,
            reserved1: [0; 4],
            user_data: self.state.cast(),
            sequence_callback: Some(on_sequence),
            decode_picture: Some(on_decode),
            display_picture: Some(on_display),
            get_operating_point: std::ptr::null_mut(),
            reserved2: [std::ptr::null_mut(); 6],
            ext_video_info: std::ptr::null_mut(),
        };
        let mut parser: sys::VideoParser = std::ptr::null_mut();
        // SAFETY: `p` is a valid `CUVIDPARSERPARAMS`; its user data is the
        // state box, which outlives the parser (destroyed first in close).
        check("cuvidCreateVideoParser", unsafe {
            (self.lib.create_video_parser)(&mut parser, &mut p)
        })?;
        self.parser = parser;
        Ok(())
    }

    /// Decodes one access unit (or chunk, see
    /// [`DecoderOptions::access_units`]) and calls `sink` for every picture
    /// that became ready for display, in display order. `timestamp` comes
    /// back in [`DecodedFrame::timestamp`] of the picture the unit held.
    ///
    /// # Errors
    /// [`Error::UnsupportedStream`] for a stream this GPU cannot decode;
    /// [`Error::Driver`] when an NVDEC or CUDA call fails; the sink's error.
    pub fn decode(
        &mut self,
        data: &[u8],
        timestamp: Option<i64>,
        sink: &mut dyn FnMut(&DecodedFrame<'_>) -> Result<()>,
    ) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let mut flags = 0;
        if self.opts.access_units {
            flags |= sys::PKT_ENDOFPICTURE;
        }
        if timestamp.is_some() {
            flags |= sys::PKT_TIMESTAMP;
        }
        let mut pkt = sys::SourceDataPacket {
            flags,
            payload_size: data.len() as _,
            payload: data.as_ptr(),
            timestamp: timestamp.unwrap_or(0),
        };
        self.in_context(|d| {
            d.parse(&mut pkt)?;
            d.drain(sink)
        })
    }

    /// Ends the stream: the parser outputs the pictures it still holds
    /// (`sink` gets them), and the next [`Decoder::decode`] starts a new
    /// stream (it must begin with a keyframe and its parameter sets) on the
    /// same hardware decoder, which is how a file is looped.
    ///
    /// # Errors
    /// As [`Decoder::decode`].
    pub fn flush(&mut self, sink: &mut dyn FnMut(&DecodedFrame<'_>) -> Result<()>) -> Result<()> {
        let mut pkt = sys::SourceDataPacket {
            flags: sys::PKT_ENDOFSTREAM,
            payload_size: 0,
            payload: std::ptr::null(),
            timestamp: 0,
        };
        self.in_context(|d| {
            d.parse(&mut pkt)?;
            d.drain(sink)?;
            d.destroy_parser()?;
            d.create_parser()
        })
    }

    /// One `cuvidParseVideoData`. The context is current.
    fn parse(&mut self, pkt: &mut sys::SourceDataPacket) -> Result<()> {
        if self.parser.is_null() {
            self.create_parser()?;
        }
        // SAFETY: the parser is live; `pkt` points at `data`, valid for the
        // call; the callbacks reach the state through the parser's user
        // pointer while this function holds no reference to it.
        let code = unsafe { (self.lib.parse_video_data)(self.parser, pkt) };
        // SAFETY: the parse call returned; nothing else references the state.
        let st = unsafe { &mut *self.state };
        if let Some(e) = st.error.take() {
            st.pending.clear();
            return Err(e);
        }
        check("cuvidParseVideoData", code)
    }

    /// Maps each picture ready for display, hands it to `sink`, waits for
    /// the stream and unmaps. The context is current.
    fn drain(&mut self, sink: &mut dyn FnMut(&DecodedFrame<'_>) -> Result<()>) -> Result<()> {
        let stream = self.stream.ok_or(Error::Closed)?;
        loop {
            // SAFETY: no other reference to the state is live here.
            let st = unsafe { &mut *self.state };
            let Some(disp) = st.pending.pop_front() else {
                return Ok(());
            };
            let (Some(info), false) = (st.info, st.decoder.is_null()) else {
                st.pending.clear();
                return Err(Error::UnsupportedStream(
                    "a picture was output before any sequence header".into(),
                ));
            };
            let decoder = st.decoder;
            let mut pp = sys::ProcParams {
                progressive_frame: disp.progressive_frame,
                second_field: disp.repeat_first_field + 1,
                top_field_first: disp.top_field_first,
                unpaired_field: c_int::from(disp.repeat_first_field < 0),
                reserved_flags: 0,
                reserved_zero: 0,
                raw_input_dptr: 0,
                raw_input_pitch: 0,
                raw_input_format: 0,
                raw_output_dptr: 0,
                raw_output_pitch: 0,
                reserved1: 0,
                output_stream: stream.as_raw().cast(),
                reserved: [0; 46],
                histogram_dptr: std::ptr::null_mut(),
                reserved2: [std::ptr::null_mut(); 1],
            };
            let (mut ptr, mut pitch) = (0u64, 0u32);
            // SAFETY: the decoder is live; `picture_index` came from its
            // parser; the out-parameters and `pp` are valid.
            let mapped = check("cuvidMapVideoFrame64", unsafe {
                (self.lib.map_video_frame64)(decoder, disp.picture_index, &mut ptr, &mut pitch, &mut pp)
            });
            if let Err(e) = mapped {
                st.pending.clear();
                return Err(e);
            }
            let frame = DecodedFrame {
                ptr,
                pitch,
                info,
                timestamp: disp.timestamp,
                stream,
                memcpy2d: self.memcpy2d,
                index: self.output,
                _decoder: std::marker::PhantomData,
            };
            let r = sink(&frame);
            // SAFETY: the stream is live; the surface goes back only after
            // every copy out of it has finished.
            let synced = unsafe { self.driver.stream_synchronize(stream) }.map_err(Error::from);
            // SAFETY: `ptr` was mapped above from this decoder.
            let unmapped = check("cuvidUnmapVideoFrame64", unsafe {
                (self.lib.unmap_video_frame64)(decoder, ptr)
            });
            self.output += 1;
            if let Err(e) = r.and(synced).and(unmapped) {
                // SAFETY: as above.
                unsafe { (*self.state).pending.clear() };
                return Err(e);
            }
        }
    }

    /// Destroys the parser. The context is current.
    fn destroy_parser(&mut self) -> Result<()> {
        if self.parser.is_null() {
            return Ok(());
        }
        // SAFETY: the parser is live and not in a parse call.
        check("cuvidDestroyVideoParser", unsafe {
            (self.lib.destroy_video_parser)(self.parser)
        })?;
        self.parser = std::ptr::null_mut();
        // SAFETY: no other reference to the state is live.
        unsafe { (*self.state).pending.clear() };
        Ok(())
    }

    /// Releases the parser, the decoder, the stream and the context lock in
    /// the decoder's context, then the context. Retryable after an error;
    /// idempotent after success.
    ///
    /// # Errors
    /// The first failing release; what failed stays for a retry.
    pub fn close(&mut self) -> Result<()> {
        if self.ctx.is_none() {
            return Ok(());
        }
        self.in_context(|d| {
            d.destroy_parser()?;
            // SAFETY: no other reference to the state is live.
            let st = unsafe { &mut *d.state };
            if !st.decoder.is_null() {
                // SAFETY: the decoder is live; its parser is gone.
                check("cuvidDestroyDecoder", unsafe { (d.lib.destroy_decoder)(st.decoder) })?;
                st.decoder = std::ptr::null_mut();
            }
            if let Some(s) = d.stream {
                // SAFETY: our stream; nothing is enqueued on it any more.
                unsafe { d.driver.stream_destroy(s) }?;
                d.stream = None;
            }
            if !st.lock.is_null() {
                // SAFETY: the lock is live and its decoder is gone.
                check("cuvidCtxLockDestroy", unsafe { (d.lib.ctx_lock_destroy)(st.lock) })?;
                st.lock = std::ptr::null_mut();
            }
            Ok(())
        })?;
        self.driver.primary_ctx_release(self.device)?;
        self.ctx = None;
        Ok(())
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, "closing the NVDEC decoder failed; its GPU objects leak");
        }
        // SAFETY: made by `Box::into_raw` in `new`; the parser that used it
        // is destroyed (or, after a failed close, never called again).
        drop(unsafe { Box::from_raw(self.state) });
    }
}
