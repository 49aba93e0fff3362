//! [`PatternKernels`]: the crate's test pattern ([`crate::pattern`])
//! written and checked on the GPU by hand-written PTX, which the driver
//! compiles at load time (no `nvcc` needed).
//!
//! `fill` zeroes the checksum word with a 4-byte memset, then one launch
//! writes the body words, adds each warp's sum into `w[2]` with
//! `red.global.add.u32`, and (thread 0) writes `w[0]`, `w[1]`, `w[3]`.
//! `verify` counts body words that differ from the pattern of the seq in
//! `w[0..2]` (plus one if `w[3]` is not the word count), sums the body, and
//! reads back a 20-byte result: mismatches, sum, `w[2]`, seq.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use vramring::seam::cuda::{with_context, CuContext, CuDevice, CuFunction, CuModule, CuStream, DevicePtr, Driver};
use vramring::{Error, Result};

pub(crate) use crate::pattern::word;

/// Name of the fill kernel.
pub(crate) const FILL_KERNEL: &str = "vramring_fill";
/// Name of the verify kernel.
pub(crate) const VERIFY_KERNEL: &str = "vramring_verify";

const THREADS: u32 = 256;
const MAX_BLOCKS: u32 = 4096;
/// Words of the verify result buffer: mismatches, body sum, w[2], seq lo, seq hi.
const RESULT_WORDS: usize = 5;

/// The PTX of both kernels. Constants are written as signed decimals, as
/// `nvcc` emits them: 0x9E3779B1 = -1640531535, 0x85EBCA6B = -2048144789,
/// 0xC2B2AE35 = -1028477387.
const PTX: &CStr = match CStr::from_bytes_with_nul(concat!(include_str!("pattern.ptx"), "\0").as_bytes()) {
    Ok(ptx) => ptx,
    Err(_) => panic!("pattern.ptx holds a NUL byte"),
};

/// What [`PatternKernels::verify`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatternCheck {
    /// The seq carried in the frame's first two words.
    pub seq: u64,
    /// Body words that differ from the pattern of `seq`, plus one if the
    /// word-count word is wrong.
    pub mismatches: u32,
    /// Whether the stored checksum equals the body's sum.
    pub checksum_ok: bool,
}

impl PatternCheck {
    /// Whether the frame is whole and carries `expected_seq`.
    pub fn is_intact(&self, expected_seq: u64) -> bool {
        self.mismatches == 0 && self.checksum_ok && self.seq == expected_seq
    }
}

/// The pattern kernels loaded into a device's primary context, with the
/// small device buffer `verify` reports through. Released by
/// [`close`](Self::close) (or drop) in that context.
pub struct PatternKernels<D: Driver> {
    driver: Arc<D>,
    device: CuDevice,
    ctx: Option<CuContext>,
    module: Option<CuModule>,
    fill: Option<CuFunction>,
    verify: Option<CuFunction>,
    result: Option<DevicePtr>,
}

impl<D: Driver> std::fmt::Debug for PatternKernels<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PatternKernels")
            .field("device", &self.device)
            .field("open", &self.ctx.is_some())
            .finish()
    }
}

fn words_of(len: u64) -> Result<u32> {
    match u32::try_from(len / 4) {
        Ok(n) if len % 4 == 0 && (4..u32::MAX - THREADS * MAX_BLOCKS).contains(&n) => Ok(n),
        _ => Err(Error::Config(format!(
            "a GPU pattern frame is a multiple of 4 bytes, at least 16, below 16 GiB; got {len}"
        ))),
    }
}

fn blocks_for(n: u32) -> u32 {
    (n.saturating_sub(4)).div_ceil(THREADS).clamp(1, MAX_BLOCKS)
}

impl<D: Driver> PatternKernels<D> {
    /// Loads the kernels into the primary context of `device`.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver rejects the PTX or an allocation
    /// fails; nothing stays allocated then.
    pub fn load(driver: Arc<D>, device: CuDevice) -> Result<Self> {
        driver.init()?;
        let mut k = PatternKernels {
            driver,
            device,
            ctx: None,
            module: None,
            fill: None,
            verify: None,
            result: None,
        };
        match k.build() {
            Ok(()) => Ok(k),
            Err(e) => {
                if let Err(ce) = k.close() {
                    tracing::warn!(error = %ce, "unwinding pattern kernels that failed to load; drop retries");
                }
                Err(e)
            }
        }
    }

    fn build(&mut self) -> Result<()> {
        let d = Arc::clone(&self.driver);
        let ctx = d.primary_ctx_retain(self.device)?;
        self.ctx = Some(ctx);
        let body = |d: &D| -> Result<_> {
            let m = d.module_load_data(PTX)?;
            self.module = Some(m);
            let fill = c"vramring_fill";
            let verify = c"vramring_verify";
            // SAFETY: `m` is the live module just loaded.
            self.fill = Some(unsafe { d.module_get_function(m, fill) }?);
            // SAFETY: as above.
            self.verify = Some(unsafe { d.module_get_function(m, verify) }?);
            self.result = Some(d.mem_alloc(4 * RESULT_WORDS as u64)?);
            Ok(())
        };
        // SAFETY: `ctx` is retained by `self` until `close` releases it last.
        unsafe { with_context(&*d, ctx, body) }
    }

    fn open(&self) -> Result<(CuContext, CuFunction, CuFunction, DevicePtr)> {
        match (self.ctx, self.fill, self.verify, self.result) {
            (Some(c), Some(f), Some(v), Some(r)) => Ok((c, f, v, r)),
            _ => Err(Error::Closed),
        }
    }

    /// Enqueues on `stream` the pattern of `seq` into the `len` bytes at `dst`.
    ///
    /// # Safety
    /// `[dst, dst+len)` is device memory this process may write from the
    /// device's primary context, not read or written by other work until the
    /// stream reaches this point; `stream` is a live stream.
    ///
    /// # Errors
    /// [`Error::Config`] for a length that is not a multiple of 4 or below
    /// 16; [`Error::Driver`] when the launch fails.
    pub unsafe fn fill(&self, dst: DevicePtr, len: u64, seq: u64, stream: CuStream) -> Result<()> {
        let (ctx, fill, _, _) = self.open()?;
        let mut n = words_of(len)?;
        let (mut dst_p, mut seq_p) = (dst, seq);
        let body = |d: &D| -> Result<_> {
            // SAFETY: `dst+8` is inside the caller's range (len >= 16).
            unsafe { d.memset_d32_async(dst + 8, 0, 1, stream) }?;
            let mut params: [*mut c_void; 3] = [
                (&mut dst_p as *mut u64).cast(),
                (&mut n as *mut u32).cast(),
                (&mut seq_p as *mut u64).cast(),
            ];
            // SAFETY: the three pointers point to (u64, u32, u64) values,
            // the kernel's parameters, alive across the call; the range
            // is the caller's (this function's contract).
            unsafe { d.launch_kernel(fill, blocks_for(n), THREADS, stream, &mut params) }?;
            Ok(())
        };
        // SAFETY: `ctx` is retained while open (checked above).
        unsafe { with_context(&*self.driver, ctx, body) }
    }

    /// Checks on `stream` the `len` bytes at `src` against the pattern of the
    /// seq they carry, waits for the result and returns it.
    ///
    /// # Safety
    /// `[src, src+len)` is device memory readable from the device's primary
    /// context; `stream` is a live stream.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad length; [`Error::Driver`] when a call fails.
    pub unsafe fn verify(&self, src: DevicePtr, len: u64, stream: CuStream) -> Result<PatternCheck> {
        let (ctx, _, verify, result) = self.open()?;
        let mut n = words_of(len)?;
        let (mut src_p, mut out_p) = (src, result);
        let body = |d: &D| -> Result<_> {
            // SAFETY: our result buffer of RESULT_WORDS words.
            unsafe { d.memset_d32_async(result, 0, RESULT_WORDS as u64, stream) }?;
            let mut params: [*mut c_void; 3] = [
                (&mut src_p as *mut u64).cast(),
                (&mut n as *mut u32).cast(),
                (&mut out_p as *mut u64).cast(),
            ];
            // SAFETY: (u64, u32, u64) parameters alive across the call;
            // the source is the caller's, the output ours.
            unsafe { d.launch_kernel(verify, blocks_for(n), THREADS, stream, &mut params) }?;
            // SAFETY: the caller's live stream. `cuMemcpyDtoH` does not
            // wait for a non-blocking stream, so wait here.
            unsafe { d.stream_synchronize(stream) }?;
            let mut raw = [0u8; 4 * RESULT_WORDS];
            // SAFETY: our result buffer holds exactly `raw.len()` bytes.
            unsafe { d.memcpy_dtoh(&mut raw, result) }?;
            Ok(raw)
        };
        // SAFETY: `ctx` is retained while open (checked above).
        let raw = unsafe { with_context(&*self.driver, ctx, body) }?;
        let w = |i: usize| u32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]]);
        Ok(PatternCheck {
            seq: w(3) as u64 | (w(4) as u64) << 32,
            mismatches: w(0),
            checksum_ok: w(1) == w(2),
        })
    }

    /// Releases the result buffer and unloads the module with the context
    /// pushed (caller's context restored), then releases the context
    /// reference. Idempotent after success; retry after an error.
    ///
    /// # Errors
    /// The first driver call that failed; what it failed to release is still held.
    pub fn close(&mut self) -> Result<()> {
        let Some(ctx) = self.ctx else { return Ok(()) };
        let d = Arc::clone(&self.driver);
        if self.result.is_some() || self.module.is_some() {
            let body = |d: &D| -> Result<_> {
                if let Some(r) = self.result {
                    // Kernels may still write the result buffer.
                    d.ctx_synchronize()?;
                    // SAFETY: our buffer, idle after the synchronise.
                    unsafe { d.mem_free(r) }?;
                    self.result = None;
                }
                if let Some(m) = self.module {
                    self.fill = None;
                    self.verify = None;
                    // SAFETY: our live module; no launch uses it any more.
                    unsafe { d.module_unload(m) }?;
                    self.module = None;
                }
                Ok(())
            };
            // SAFETY: `ctx` stays retained until the last phase below.
            unsafe { with_context(&*d, ctx, body) }?;
        }
        d.primary_ctx_release(self.device)?;
        self.ctx = None;
        Ok(())
    }
}

impl<D: Driver> Drop for PatternKernels<D> {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, "pattern kernels dropped without a successful close; resources leak");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeDriver;
    use vramring::seam::cuda::{CudaImport, CudaPool, DeviceSelector, ExportedPool, ImportedPool};

    #[test]
    fn the_ptx_names_both_kernels_and_the_pattern_constants() {
        let text = PTX.to_str().unwrap();
        for needle in [
            FILL_KERNEL,
            VERIFY_KERNEL,
            "-1640531535",
            "-2048144789",
            "-1028477387",
            "red.global.add.u32",
        ] {
            assert!(text.contains(needle), "PTX lacks {needle}");
        }
        assert_eq!(0x9E37_79B1u32 as i32, -1640531535);
        assert_eq!(0x85EB_CA6Bu32 as i32, -2048144789);
        assert_eq!(0xC2B2_AE35u32 as i32, -1028477387);
    }

    #[test]
    fn a_gpu_filled_frame_verifies_on_the_host_and_on_the_gpu() {
        let d = FakeDriver::with_one_gpu([1; 16]);
        let k = PatternKernels::load(Arc::clone(&d), 0).unwrap();
        let pool = CudaPool::create(Arc::clone(&d), DeviceSelector::Ordinal(0), 4096).unwrap();
        let base = pool.base_addr();
        // SAFETY: inside the pool's mapping; the fake's null stream.
        unsafe { k.fill(base, 4096, 0x1_0000_0009, CuStream::from_bits(0)) }.unwrap();
        // SAFETY: as above.
        let check = unsafe { k.verify(base, 4096, CuStream::from_bits(0)) }.unwrap();
        assert!(check.is_intact(0x1_0000_0009), "{check:?}");
        let mut host = vec![0u8; 4096];
        let imp = CudaImport::import(
            Arc::clone(&d),
            pool.export_fd().unwrap(),
            pool.pool_bytes(),
            [1; 16],
            false,
        )
        .unwrap();
        // SAFETY: the fake's import mapping of the same bytes.
        unsafe { d.memcpy_dtoh(&mut host, imp.base_addr()) }.unwrap();
        crate::pattern::verify(&host, 0x1_0000_0009).unwrap();
        // One flipped word is found.
        // SAFETY: inside the pool's mapping.
        unsafe { d.memset_d8(base + 100, 0xEE, 1) }.unwrap();
        // SAFETY: as above.
        let check = unsafe { k.verify(base, 4096, CuStream::from_bits(0)) }.unwrap();
        assert_eq!((check.mismatches, check.checksum_ok), (1, false));
    }

    #[test]
    fn lengths_that_do_not_hold_the_header_are_refused() {
        assert!(words_of(12).is_err());
        assert!(words_of(18).is_err());
        assert_eq!(words_of(16).unwrap(), 4);
        assert_eq!(blocks_for(4), 1);
        assert_eq!(blocks_for(4 + 257), 2);
    }
}
