//! The decoder session: the parser, the hardware decoder, the context lock and
//! the stream on one device's primary context, from creation to teardown.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::Arc;

use super::parser::{on_decode, on_display, on_sequence, State};
use super::{check, library, sys, DecodedFrame, DecoderOptions, StreamInfo};
use crate::memory::cuda::{ContextGuard, CuContext, CuDevice, CuStream, Driver, RealDriver};
use crate::{Error, Result};

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
