//! The parser's callbacks: the sequence header checked against the GPU's caps
//! and the hardware decoder made, each picture decoded, each displayed picture
//! queued.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::panic::AssertUnwindSafe;

use super::{check, sys, Codec, StreamInfo};
use crate::{Error, Result};

/// The parser's callbacks' view of the decoder. Lives in a `Box` whose
/// address the parser holds as its user data.
pub(super) struct State {
    pub(super) lib: &'static sys::Nvcuvid,
    pub(super) codec: Codec,
    pub(super) lock: sys::CtxLock,
    pub(super) decoder: sys::VideoDecoder,
    pub(super) info: Option<StreamInfo>,
    pub(super) display_delay: u32,
    pub(super) extra_surfaces: u32,
    /// Pictures ready for display, in display order, not yet mapped.
    pub(super) pending: VecDeque<sys::ParserDispInfo>,
    /// The first error a callback met; reported by the parse call.
    pub(super) error: Option<Error>,
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

pub(super) unsafe extern "C" fn on_sequence(user: *mut c_void, format: *mut sys::VideoFormat) -> c_int {
    // SAFETY: called by the parser made in `Decoder::create_parser` with the
    // state pointer as user data (see `callback`); `format` is valid for the
    // call.
    unsafe { callback(user, |st| st.sequence(&*format).map(|n| n as c_int)) }
}

pub(super) unsafe extern "C" fn on_decode(user: *mut c_void, pic: *mut sys::PicParams) -> c_int {
    // SAFETY: as in `on_sequence`; `pic` is valid for the call.
    unsafe { callback(user, |st| st.decode(pic).map(|()| 1)) }
}

pub(super) unsafe extern "C" fn on_display(user: *mut c_void, disp: *mut sys::ParserDispInfo) -> c_int {
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
