//! [`GpuTestPattern`]: writes and checks the crate's test pattern
//! ([`crate::pattern`]) on the GPU, on a stream of its own in a device's
//! primary context — the context the ring's pool and a subscriber's buffers
//! live in. For examples, tests and benchmarks.

use std::sync::Arc;

use vramring::cuda::{DeviceView, DeviceViewMut, Stream};
use vramring::seam::cuda::{
    resolve_device, with_context, CuContext, CuDevice, CuStream, DeviceSelector, Driver, RealDriver,
};
use vramring::{Error, Frame, FrameMeta, Result, SlotMut};

use crate::gpu_kernels::{PatternCheck, PatternKernels};
use crate::pattern::PatternError;

/// Pattern kernels plus a non-blocking stream in the primary context of one
/// device. Released (stream, kernels, context reference, in that order) by
/// [`GpuTestPattern::close`] or on drop, with that context pushed.
pub struct GpuTestPattern<D: Driver = RealDriver> {
    driver: Arc<D>,
    device: CuDevice,
    ctx: Option<CuContext>,
    stream: Option<CuStream>,
    kernels: Option<PatternKernels<D>>,
}

impl<D: Driver> std::fmt::Debug for GpuTestPattern<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuTestPattern")
            .field("device", &self.device)
            .field("open", &self.ctx.is_some())
            .finish()
    }
}

impl GpuTestPattern<RealDriver> {
    /// On the GPU with `uuid` (a ring's `device_uuid`), with the real driver.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`], [`Error::DeviceNotVisible`], [`Error::Driver`].
    pub fn for_uuid(uuid: [u8; 16]) -> Result<Self> {
        Self::new(RealDriver::shared()?, DeviceSelector::Uuid(uuid))
    }
}

impl<D: Driver> GpuTestPattern<D> {
    /// Loads the kernels and makes a stream on `device`.
    ///
    /// # Errors
    /// As [`GpuTestPattern::for_uuid`].
    pub fn new(driver: Arc<D>, device: DeviceSelector) -> Result<Self> {
        driver.init()?;
        let (dev, _) = resolve_device(&*driver, device)?;
        let mut g = GpuTestPattern {
            driver,
            device: dev,
            ctx: None,
            stream: None,
            kernels: None,
        };
        let built = (|| -> Result<()> {
            let ctx = g.driver.primary_ctx_retain(dev)?;
            g.ctx = Some(ctx);
            let mut stream = None;
            // SAFETY: `ctx` is retained by `g` until `close` releases it last.
            unsafe {
                with_context(&*g.driver, ctx, |d: &D| -> Result<()> {
                    stream = Some(d.stream_create_non_blocking()?);
                    Ok(())
                })
            }?;
            g.stream = stream;
            g.kernels = Some(PatternKernels::load(Arc::clone(&g.driver), dev)?);
            Ok(())
        })();
        match built {
            Ok(()) => Ok(g),
            Err(e) => {
                if let Err(ce) = g.close() {
                    tracing::warn!(error = %ce, "unwinding a GPU test pattern that failed to load");
                }
                Err(e)
            }
        }
    }

    fn parts(&self) -> Result<(&PatternKernels<D>, CuStream, CuContext)> {
        match (&self.kernels, self.stream, self.ctx) {
            (Some(k), Some(s), Some(c)) => Ok((k, s, c)),
            _ => Err(Error::Closed),
        }
    }

    /// The raw stream the fills run on: pass it to
    /// [`SlotMut::publish_cuda`](vramring::SlotMut::publish_cuda).
    ///
    /// # Errors
    /// [`Error::Closed`].
    pub fn stream(&self) -> Result<Stream<'_>> {
        // SAFETY: the stream lives until `close`, which takes `&mut self`.
        Ok(unsafe { Stream::from_raw(self.parts()?.1.as_raw()) })
    }

    /// Enqueues the pattern of `seq` into `dst` (a loaned slot's device
    /// memory, in this device's primary context) on this pattern's stream:
    /// commit the slot on [`GpuTestPattern::stream`] so the commit follows it.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad length; [`Error::Driver`].
    pub fn fill(&self, dst: &mut DeviceViewMut<'_>, seq: u64) -> Result<()> {
        let (k, s, _) = self.parts()?;
        // SAFETY: `dst` is writable device memory of the primary context for
        // as long as its loan, which the caller commits on this stream.
        unsafe { k.fill(dst.as_raw(), dst.len(), seq, s) }
    }

    /// Checks `src` (device memory of this device's primary context) on the
    /// GPU and waits for the verdict.
    ///
    /// # Errors
    /// [`Error::Driver`].
    pub fn verify(&self, src: &DeviceView<'_>) -> Result<PatternCheck> {
        let (k, s, _) = self.parts()?;
        // SAFETY: `src` is readable device memory of the primary context
        // while it is borrowed, and the verdict is waited for.
        unsafe { k.verify(src.as_raw(), src.len(), s) }
    }

    /// Releases the stream, the kernels and the context reference, with the
    /// context pushed. Retryable; idempotent after success.
    ///
    /// # Errors
    /// The first driver call that failed.
    pub fn close(&mut self) -> Result<()> {
        let Some(ctx) = self.ctx else { return Ok(()) };
        if let Some(s) = self.stream {
            let body = |d: &D| -> Result<()> {
                // SAFETY: our live stream.
                unsafe { d.stream_synchronize(s) }?;
                // SAFETY: our live stream, idle.
                unsafe { d.stream_destroy(s) }?;
                Ok(())
            };
            // SAFETY: `ctx` is retained until the last phase below.
            unsafe { with_context(&*self.driver, ctx, body) }?;
            self.stream = None;
        }
        if let Some(k) = self.kernels.as_mut() {
            k.close()?;
            self.kernels = None;
        }
        self.driver.primary_ctx_release(self.device)?;
        self.ctx = None;
        Ok(())
    }
}

impl<D: Driver> Drop for GpuTestPattern<D> {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, "GPU test pattern dropped without a successful close");
        }
    }
}

/// Writes the test pattern of `seq` into a loaned slot of a CUDA ring on
/// `gpu`'s stream and commits it in that stream's order, returning the
/// published seq.
///
/// # Errors
/// The kernel launch's or the commit's.
pub fn fill_cuda(gpu: &GpuTestPattern, mut slot: SlotMut<'_>, seq: u64) -> Result<u64> {
    gpu.fill(&mut slot.device_mut()?, seq)?;
    // SAFETY: `gpu.stream()` is a live stream of the ring's context.
    unsafe { slot.publish_cuda(FrameMeta::pts(seq as i64), gpu.stream()?) }
}

/// Checks a frame copied into the subscriber's own GPU buffer: the outer
/// error is "could not check", the inner one a torn or wrong frame.
///
/// # Errors
/// The kernel launch's or the read-back's.
pub fn verify_cuda(gpu: &GpuTestPattern, frame: &Frame<'_>) -> Result<std::result::Result<(), PatternError>> {
    let view = frame
        .device()
        .ok_or_else(|| Error::Config("a host frame has no device memory to check".into()))?;
    let c = gpu.verify(&view)?;
    if c.is_intact(frame.seq()) {
        return Ok(Ok(()));
    }
    Ok(Err(if c.mismatches == 0 && c.checksum_ok {
        PatternError::WrongSeq {
            expected: frame.seq(),
            found: c.seq,
        }
    } else {
        PatternError::Corrupt {
            seq: c.seq,
            mismatches: c.mismatches.into(),
            checksum_ok: c.checksum_ok,
        }
    }))
}
