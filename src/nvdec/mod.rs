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

mod decoded_frame;
mod decoder;
mod options;
mod parser;
mod sys;

use std::sync::OnceLock;

use crate::memory::cuda::{DriverError, RealDriver};
use crate::{Error, Result};

pub use decoded_frame::DecodedFrame;
pub use decoder::Decoder;
pub use options::{Codec, DecoderOptions, StreamInfo};

/// The library the process opens, once: the one [`use_library`] named, or
/// the default names at the first decoder.
static LIB: OnceLock<std::result::Result<sys::Nvcuvid, String>> = OnceLock::new();

fn library() -> Result<&'static sys::Nvcuvid> {
    LIB.get_or_init(|| sys::Nvcuvid::load(None))
        .as_ref()
        .map_err(|e| Error::DecoderUnavailable(e.clone()))
}

/// Opens `name` (a path or a soname) as the process's NVDEC library instead
/// of `libnvcuvid.so.1`, for a driver installed outside the loader's search
/// path. Call it before the first [`Decoder::new`] or [`available`]: the
/// process opens NVDEC once, and whichever comes first decides.
///
/// # Errors
/// [`Error::DecoderUnavailable`] when `name` does not open (later decoders
/// get the same error); [`Error::Config`] when the library was already
/// opened.
pub fn use_library(name: impl Into<String>) -> Result<()> {
    let name = name.into();
    let mut opened_here = false;
    let lib = LIB.get_or_init(|| {
        opened_here = true;
        sys::Nvcuvid::load(Some(&name))
    });
    if !opened_here {
        return Err(Error::Config(format!(
            "NVDEC's library was already opened; use_library({name:?}) must come before the first decoder"
        )));
    }
    lib.as_ref()
        .map(|_| ())
        .map_err(|e| Error::DecoderUnavailable(e.clone()))
}

/// Whether NVDEC can be used here: `libnvcuvid` and the CUDA driver load.
/// Does not create anything on the GPU.
pub fn available() -> bool {
    library().is_ok() && RealDriver::shared().is_ok()
}

fn check(call: &'static str, code: u32) -> Result<()> {
    DriverError::check(call, code).map_err(Error::from)
}
