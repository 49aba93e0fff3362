//! The real decode step: one NVDEC [`Decoder`] per camera, on the primary
//! context of the configured device (every camera's decoder and ring share
//! that one context), and the camera's frame ring, made at the first
//! picture (its size is the stream's) and kept across decoder resets and
//! input restarts, so its subscribers stay connected.
//!
//! The ring is in GPU memory ([`FrameMemory::Cuda`], the default): each
//! picture is one device-to-device copy into the loaned slot, committed on
//! the decoder's stream. With [`FrameMemory::Host`] (`[decoder] memory =
//! "host"`, or `--host-memory`) it is a host shared-memory ring: each
//! picture is copied device-to-host into the loaned slot (the decoder's
//! stream is synchronised) and committed from the CPU; readers that want
//! it on the GPU upload it themselves, the way a host-memory NVR works.
//!
//! Frames carry 16 bytes of user metadata: as `nvdec_producer` does, the
//! picture's index in display order within the current segment (u32 LE)
//! and the segment number (u32 LE); then the `CLOCK_MONOTONIC` time (u64
//! LE, ns) when the decoded picture reached this sink, before its copy into
//! the slot (the start of a decode-to-result latency that is the same
//! measure for a CUDA and a host ring: the frame's commit time comes after
//! a host ring's device-to-host copy, but before a CUDA ring's copy runs). A segment is one pass of a looped file,
//! or the run of a packet input between two resyncs; `tests/gpu_nvr.rs`
//! matches each frame of a file camera against the clip's reference digest
//! at that index. The first frame of every segment after the first carries
//! `FRAME_DISCONTINUITY` (a reader that compares frames starts again
//! there). pts: 90 kHz at the file's frame rate for a file, the packet's
//! pts for a packet ring.

use std::path::PathBuf;

use vramring::frame::FRAME_DISCONTINUITY;
use vramring::nvdec::{Codec, DecodedFrame, Decoder, DecoderOptions};
use vramring::{
    BackendChoice, BackendKind, Error, Format, FrameMeta, Policy, Publisher, PullAccess, RingConfig, ServeOptions,
};

use crate::nvr::config::{CameraConfig, CodecName, FrameMemory, Input, PolicyName, PullSetting, RingSettings};
use crate::nvr::supervisor::{Decode, DecodeError, Unit};

/// What the camera's decoder needs to be made again.
#[derive(Debug, Clone)]
pub struct DecoderSpec {
    /// Codec of the input.
    pub codec: Codec,
    /// CUDA device ordinal.
    pub device: u32,
    /// NVDEC display delay in pictures.
    pub display_delay: u32,
}

impl DecoderSpec {
    /// The spec of `cam`'s decoder.
    pub fn of(cam: &CameraConfig, device: u32, display_delay: u32) -> DecoderSpec {
        DecoderSpec {
            codec: match cam.codec {
                CodecName::H264 => Codec::H264,
                CodecName::Hevc => Codec::Hevc,
            },
            device,
            display_delay,
        }
    }

    /// Makes a decoder.
    ///
    /// # Errors
    /// As [`Decoder::new`]: `DecoderUnavailable` without libnvcuvid,
    /// `CudaUnavailable` without a driver.
    pub fn make(&self) -> vramring::Result<Decoder> {
        Decoder::new(
            DecoderOptions::new(self.codec)
                .device(self.device)
                .display_delay(self.display_delay),
        )
    }
}

/// The camera's ring and the numbering of its frames.
struct Output {
    name: String,
    socket: PathBuf,
    ring: RingSettings,
    device: u32,
    memory: FrameMemory,
    publisher: Option<Publisher>,
    index: u32,
    segment: u32,
    /// The next frame starts a new segment.
    discontinuity: bool,
    /// pts of the next frame of a file (90 kHz), `None` for packets.
    file_pts: Option<f64>,
    pts_step: f64,
    published: u64,
    loan_timeouts: u64,
}

/// An NVDEC decoder and the camera's ring.
pub struct NvdecStage {
    spec: DecoderSpec,
    decoder: Option<Decoder>,
    out: Output,
}

impl NvdecStage {
    /// Makes the camera's decoder (its ring, in `memory`, comes with the
    /// first picture).
    ///
    /// # Errors
    /// As [`DecoderSpec::make`].
    pub fn new(cam: &CameraConfig, spec: DecoderSpec, memory: FrameMemory) -> vramring::Result<NvdecStage> {
        let decoder = spec.make()?;
        let (file_pts, fps) = match &cam.input {
            Input::File { fps, .. } => (Some(0.0), if *fps > 0.0 { *fps } else { 30.0 }),
            Input::Packets { .. } => (None, 30.0),
        };
        Ok(NvdecStage {
            out: Output {
                name: cam.name.clone(),
                socket: cam.output.clone(),
                ring: cam.ring.clone(),
                device: spec.device,
                memory,
                publisher: None,
                index: 0,
                segment: 0,
                discontinuity: false,
                file_pts,
                pts_step: 90_000.0 / fps,
                published: 0,
                loan_timeouts: 0,
            },
            spec,
            decoder: Some(decoder),
        })
    }
}

fn failed(e: Error) -> DecodeError {
    DecodeError(e.to_string())
}

impl Decode for NvdecStage {
    fn decode(&mut self, au: &[u8], unit: &Unit) -> Result<u64, DecodeError> {
        let before = self.out.published;
        let out = &mut self.out;
        let dec = self.decoder.as_mut().ok_or_else(|| DecodeError("no decoder".into()))?;
        dec.decode(au, Some(unit.pts), &mut |f| out.publish(f))
            .map_err(failed)?;
        Ok(self.out.published - before)
    }

    fn end_of_stream(&mut self) -> Result<u64, DecodeError> {
        let before = self.out.published;
        let out = &mut self.out;
        if let Some(dec) = self.decoder.as_mut() {
            dec.flush(&mut |f| out.publish(f)).map_err(failed)?;
        }
        self.out.new_segment();
        Ok(self.out.published - before)
    }

    fn reset(&mut self) -> Result<(), DecodeError> {
        if let Some(mut old) = self.decoder.take() {
            // A decoder in an unknown state: its teardown may fail too;
            // what matters is the new one.
            if let Err(e) = old.close() {
                eprintln!("nvr_decoder: {}: closing the old decoder: {e}", self.out.name);
            }
        }
        self.decoder = Some(self.spec.make().map_err(failed)?);
        self.out.new_segment();
        Ok(())
    }

    fn dropped(&self) -> u64 {
        self.out.loan_timeouts
    }

    fn subscribers(&self) -> u32 {
        self.out.publisher.as_ref().map_or(0, |p| p.stats().subscribers)
    }
}

impl Drop for NvdecStage {
    fn drop(&mut self) {
        if let Some(mut d) = self.decoder.take() {
            if let Err(e) = d.close() {
                eprintln!("nvr_decoder: {}: closing the decoder: {e}", self.out.name);
            }
        }
        if let Some(mut p) = self.out.publisher.take() {
            if let Err(e) = p.close() {
                eprintln!("nvr_decoder: {}: closing the ring: {e}", self.out.name);
            }
        }
    }
}

impl Output {
    fn new_segment(&mut self) {
        if self.index > 0 {
            self.segment = self.segment.wrapping_add(1);
            self.index = 0;
            self.discontinuity = true;
        }
    }

    fn ring_config(&self, width: u32, height: u32) -> RingConfig {
        let r = &self.ring;
        RingConfig::new(Format::Nv12, width, height)
            .slots(r.slots)
            .backend(match self.memory {
                FrameMemory::Cuda => BackendChoice::Cuda(self.device),
                FrameMemory::Host => BackendChoice::Host,
            })
            .policy(match r.policy {
                PolicyName::Overwrite => Policy::Overwrite,
                PolicyName::Lossless => Policy::Lossless,
            })
            .pull(match &r.pull {
                PullSetting::Auto => PullAccess::Auto,
                PullSetting::Anyone => PullAccess::Anyone,
                PullSetting::Nobody => PullAccess::Nobody,
                PullSetting::Uids(u) => PullAccess::Uids(u.clone()),
            })
            .max_subscribers(r.max_subscribers)
            .socket_mode(r.socket_mode)
    }

    /// The sink: (re)makes the ring when the picture size is new, then one
    /// copy into a loaned slot and its commit: device to device and the
    /// commit behind it on the decoder's stream (CUDA ring), or device to
    /// host, waited for, then committed (host ring).
    fn publish(&mut self, f: &DecodedFrame<'_>) -> vramring::Result<()> {
        let decoded_ns = vramring::monotonic_ns();
        let size = (f.width(), f.height());
        let same = self
            .publisher
            .as_ref()
            .is_some_and(|p| (p.geometry().width, p.geometry().height) == size);
        if !same {
            if let Some(mut old) = self.publisher.take() {
                eprintln!(
                    "nvr_decoder: {}: the picture size changed to {}x{}; making its ring again (subscribers reconnect)",
                    self.name, size.0, size.1
                );
                old.close()?;
            }
            self.publisher = Some(Publisher::create(&self.socket, self.ring_config(size.0, size.1))?);
        }
        let publisher = self.publisher.as_mut().expect("made above");
        let pts = match self.file_pts.as_mut() {
            Some(next) => {
                let v = *next as i64;
                *next += self.pts_step;
                v
            }
            None => f.timestamp(),
        };
        let mut user = [0u8; 16];
        user[..4].copy_from_slice(&self.index.to_le_bytes());
        user[4..8].copy_from_slice(&self.segment.to_le_bytes());
        user[8..].copy_from_slice(&decoded_ns.to_le_bytes());
        // Every decoded picture takes its index, published or not.
        self.index = self.index.wrapping_add(1);
        let flags = if self.discontinuity { FRAME_DISCONTINUITY } else { 0 };
        let meta = FrameMeta::pts(pts).with_flags(flags).with_user(&user)?;
        let mut slot = match publisher.loan(self.ring.loan_timeout) {
            Ok(s) => s,
            // Lossless readers held every slot past the timeout: this frame
            // is dropped, the camera goes on.
            Err(Error::Timeout(..) | Error::LosslessBlocked { .. }) => {
                self.loan_timeouts += 1;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        f.copy_to_slot(&mut slot)?;
        if slot.backend() == BackendKind::Cuda {
            // SAFETY: the decoder's stream belongs to the primary context of
            // the ring's device and stays live for this call.
            unsafe { slot.publish_cuda(meta, f.stream()) }?;
        } else {
            slot.publish(meta)?;
        }
        self.published += 1;
        self.discontinuity = false;
        Ok(())
    }
}
