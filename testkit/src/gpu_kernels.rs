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
const PTX: &CStr = c"
//
// vramring test pattern kernels (see src/testpattern.rs)
//
.version 7.0
.target sm_52
.address_size 64

// mix32(word index %i, seq lo * golden %g, seq hi %h) -> %o, scratch %t
// o = fmix32(g ^ (i + h))

.visible .entry vramring_fill(
    .param .u64 p_dst,
    .param .u32 p_n,
    .param .u64 p_seq
)
{
    .reg .pred %p<4>;
    .reg .b32 %r<20>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [p_dst];
    ld.param.u32 %r1, [p_n];
    ld.param.u64 %rd2, [p_seq];
    cvta.to.global.u64 %rd1, %rd1;
    cvt.u32.u64 %r2, %rd2;
    shr.u64 %rd3, %rd2, 32;
    cvt.u32.u64 %r3, %rd3;
    mul.lo.u32 %r4, %r2, -1640531535;
    mov.u32 %r5, %ctaid.x;
    mov.u32 %r6, %ntid.x;
    mov.u32 %r7, %tid.x;
    mad.lo.u32 %r8, %r5, %r6, %r7;
    mov.u32 %r9, %nctaid.x;
    mul.lo.u32 %r10, %r9, %r6;
    setp.ne.u32 %p1, %r8, 0;
    @%p1 bra FILL_BODY;
    st.global.u32 [%rd1], %r2;
    st.global.u32 [%rd1+4], %r3;
    st.global.u32 [%rd1+12], %r1;
FILL_BODY:
    mov.u32 %r11, 0;
    add.u32 %r12, %r8, 4;
FILL_LOOP:
    setp.ge.u32 %p2, %r12, %r1;
    @%p2 bra FILL_DONE;
    add.u32 %r13, %r12, %r3;
    xor.b32 %r13, %r13, %r4;
    shr.u32 %r14, %r13, 16;
    xor.b32 %r13, %r13, %r14;
    mul.lo.u32 %r13, %r13, -2048144789;
    shr.u32 %r14, %r13, 13;
    xor.b32 %r13, %r13, %r14;
    mul.lo.u32 %r13, %r13, -1028477387;
    shr.u32 %r14, %r13, 16;
    xor.b32 %r13, %r13, %r14;
    mul.wide.u32 %rd4, %r12, 4;
    add.u64 %rd5, %rd1, %rd4;
    st.global.u32 [%rd5], %r13;
    add.u32 %r11, %r11, %r13;
    add.u32 %r12, %r12, %r10;
    bra FILL_LOOP;
FILL_DONE:
    shfl.sync.bfly.b32 %r15, %r11, 16, 31, -1;
    add.u32 %r11, %r11, %r15;
    shfl.sync.bfly.b32 %r15, %r11, 8, 31, -1;
    add.u32 %r11, %r11, %r15;
    shfl.sync.bfly.b32 %r15, %r11, 4, 31, -1;
    add.u32 %r11, %r11, %r15;
    shfl.sync.bfly.b32 %r15, %r11, 2, 31, -1;
    add.u32 %r11, %r11, %r15;
    shfl.sync.bfly.b32 %r15, %r11, 1, 31, -1;
    add.u32 %r11, %r11, %r15;
    and.b32 %r16, %r7, 31;
    setp.ne.u32 %p3, %r16, 0;
    @%p3 bra FILL_END;
    red.global.add.u32 [%rd1+8], %r11;
FILL_END:
    ret;
}

.visible .entry vramring_verify(
    .param .u64 p_src,
    .param .u32 p_n,
    .param .u64 p_out
)
{
    .reg .pred %p<6>;
    .reg .b32 %r<24>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [p_src];
    ld.param.u32 %r1, [p_n];
    ld.param.u64 %rd2, [p_out];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    ld.global.u32 %r2, [%rd1];
    ld.global.u32 %r3, [%rd1+4];
    mul.lo.u32 %r4, %r2, -1640531535;
    mov.u32 %r5, %ctaid.x;
    mov.u32 %r6, %ntid.x;
    mov.u32 %r7, %tid.x;
    mad.lo.u32 %r8, %r5, %r6, %r7;
    mov.u32 %r9, %nctaid.x;
    mul.lo.u32 %r10, %r9, %r6;
    mov.u32 %r11, 0;
    mov.u32 %r17, 0;
    setp.ne.u32 %p1, %r8, 0;
    @%p1 bra VERIFY_BODY;
    ld.global.u32 %r18, [%rd1+12];
    setp.ne.u32 %p4, %r18, %r1;
    selp.u32 %r17, 1, 0, %p4;
    ld.global.u32 %r19, [%rd1+8];
    st.global.u32 [%rd2+8], %r19;
    st.global.u32 [%rd2+12], %r2;
    st.global.u32 [%rd2+16], %r3;
VERIFY_BODY:
    add.u32 %r12, %r8, 4;
VERIFY_LOOP:
    setp.ge.u32 %p2, %r12, %r1;
    @%p2 bra VERIFY_DONE;
    add.u32 %r13, %r12, %r3;
    xor.b32 %r13, %r13, %r4;
    shr.u32 %r14, %r13, 16;
    xor.b32 %r13, %r13, %r14;
    mul.lo.u32 %r13, %r13, -2048144789;
    shr.u32 %r14, %r13, 13;
    xor.b32 %r13, %r13, %r14;
    mul.lo.u32 %r13, %r13, -1028477387;
    shr.u32 %r14, %r13, 16;
    xor.b32 %r13, %r13, %r14;
    mul.wide.u32 %rd4, %r12, 4;
    add.u64 %rd5, %rd1, %rd4;
    ld.global.u32 %r20, [%rd5];
    setp.ne.u32 %p3, %r20, %r13;
    selp.u32 %r21, 1, 0, %p3;
    add.u32 %r17, %r17, %r21;
    add.u32 %r11, %r11, %r20;
    add.u32 %r12, %r12, %r10;
    bra VERIFY_LOOP;
VERIFY_DONE:
    shfl.sync.bfly.b32 %r15, %r11, 16, 31, -1;
    add.u32 %r11, %r11, %r15;
    shfl.sync.bfly.b32 %r15, %r11, 8, 31, -1;
    add.u32 %r11, %r11, %r15;
    shfl.sync.bfly.b32 %r15, %r11, 4, 31, -1;
    add.u32 %r11, %r11, %r15;
    shfl.sync.bfly.b32 %r15, %r11, 2, 31, -1;
    add.u32 %r11, %r11, %r15;
    shfl.sync.bfly.b32 %r15, %r11, 1, 31, -1;
    add.u32 %r11, %r11, %r15;
    shfl.sync.bfly.b32 %r15, %r17, 16, 31, -1;
    add.u32 %r17, %r17, %r15;
    shfl.sync.bfly.b32 %r15, %r17, 8, 31, -1;
    add.u32 %r17, %r17, %r15;
    shfl.sync.bfly.b32 %r15, %r17, 4, 31, -1;
    add.u32 %r17, %r17, %r15;
    shfl.sync.bfly.b32 %r15, %r17, 2, 31, -1;
    add.u32 %r17, %r17, %r15;
    shfl.sync.bfly.b32 %r15, %r17, 1, 31, -1;
    add.u32 %r17, %r17, %r15;
    and.b32 %r16, %r7, 31;
    setp.ne.u32 %p5, %r16, 0;
    @%p5 bra VERIFY_END;
    red.global.add.u32 [%rd2], %r17;
    red.global.add.u32 [%rd2+4], %r11;
VERIFY_END:
    ret;
}
";

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
