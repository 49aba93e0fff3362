//! The stream-order commit kernel: push copies and the commit of a frame in
//! one launch, enqueued behind the frame's writes on the writer's stream.
//!
//! One launch of `vramring_commit` reads the slot once and writes it into up
//! to [`MAX_FANOUT`] push targets (16-byte vectors, grid-stride). Each
//! block synchronises (`bar.sync`), then its thread 0 fences at device
//! scope (`membar.gl`, cumulative over the block's stores it synchronised
//! with, as cooperative groups' grid sync does) and counts the block done
//! on a counter word; the last block to finish (the classic
//! threadfence-reduction pattern) issues a system-scope fence
//! (`membar.sys`), stores the frame's seq into the pool's gate word when
//! the ring has one (device memory, ADR 0011: queued pull copies wait on
//! it, and may start from here on), then into each target's `push_seq`
//! word and into the slot's seq word, then fences again and stores
//! `global_seq`. Those words live in the publisher's host shared memory,
//! registered with `cuMemHostRegister` and reached through its device
//! mapping, so a subscriber polling them on the CPU sees them the moment
//! the GPU has stored them, with no CPU work in the publisher. The two
//! system fences give the order the protocol needs (PROTOCOL.md §10.1): the
//! frame's bytes and every push copy, then the push and slot seqs, then
//! `global_seq`.
//!
//! The counter words (64 of them, indexed by `seq % 64`, reset by the last
//! block) are a small device allocation of the publisher's; commits of one
//! ring are ordered on the GPU (the publisher waits for the previous commit
//! when the writer's stream changes), so a word is never shared by two
//! launches in flight.

use std::ffi::{c_void, CStr};

use super::driver::{CuFunction, CuModule, CuStream, DResult, DevicePtr, Driver};

/// Name of the commit kernel.
pub(crate) const COMMIT_KERNEL: &str = "vramring_commit";

/// Push targets one launch writes; more take several launches, only the
/// last of which stores the slot seq and `global_seq`.
pub const MAX_FANOUT: usize = 8;

/// Counter words, one per `seq % COUNTERS`.
const COUNTERS: u64 = 64;
const THREADS: u32 = 256;
const MAX_BLOCKS: u32 = 2048;

/// The kernel's one parameter, by value (192 bytes, as the PTX reads it).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CommitDesc {
    /// Device address of the slot's first byte.
    pub(crate) src: DevicePtr,
    /// 16-byte vectors to copy into each target.
    pub(crate) vecs: u64,
    /// Targets in `dst` / `push_seq` (at most [`MAX_FANOUT`]).
    pub(crate) count: u64,
    /// The frame's seq.
    pub(crate) seq: u64,
    /// Device address of the counter words.
    pub(crate) counter: DevicePtr,
    /// Device address of the slot's seq word (registered host memory), or 0.
    pub(crate) slot_seq: DevicePtr,
    /// Device address of `global_seq` (registered host memory), or 0.
    pub(crate) global_seq: DevicePtr,
    /// Device address of the pool's gate word (device memory), or 0.
    pub(crate) gate: DevicePtr,
    /// Device addresses of the targets' buffers.
    pub(crate) dst: [DevicePtr; MAX_FANOUT],
    /// Device addresses of the targets' `push_seq` words (registered host memory).
    pub(crate) push_seq: [DevicePtr; MAX_FANOUT],
}

const _: () = assert!(std::mem::size_of::<CommitDesc>() == 192);
const _: () = assert!(std::mem::offset_of!(CommitDesc, dst) == 64);
const _: () = assert!(std::mem::offset_of!(CommitDesc, push_seq) == 128);

/// The PTX. Register map: %rd1 src, %rd2 vecs, %rd3 count, %rd4 seq,
/// %rd5 counters, %rd6 slot seq word, %rd7 global seq word, %rd8 gate word,
/// %rd10-17 dst,
/// %rd20-27 push seq words; %p0-7 "target j exists".
const PTX: &CStr = c"
//
// vramring stream-order commit (see src/memory/cuda/commit.rs)
//
.version 7.0
.target sm_70
.address_size 64

.visible .entry vramring_commit(
    .param .align 8 .b8 p_desc[192]
)
{
    .reg .pred %p<16>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<48>;

    ld.param.u64 %rd1, [p_desc+0];
    ld.param.u64 %rd2, [p_desc+8];
    ld.param.u64 %rd3, [p_desc+16];
    ld.param.u64 %rd4, [p_desc+24];
    ld.param.u64 %rd5, [p_desc+32];
    ld.param.u64 %rd6, [p_desc+40];
    ld.param.u64 %rd7, [p_desc+48];
    ld.param.u64 %rd8, [p_desc+56];
    ld.param.u64 %rd10, [p_desc+64];
    ld.param.u64 %rd11, [p_desc+72];
    ld.param.u64 %rd12, [p_desc+80];
    ld.param.u64 %rd13, [p_desc+88];
    ld.param.u64 %rd14, [p_desc+96];
    ld.param.u64 %rd15, [p_desc+104];
    ld.param.u64 %rd16, [p_desc+112];
    ld.param.u64 %rd17, [p_desc+120];
    ld.param.u64 %rd20, [p_desc+128];
    ld.param.u64 %rd21, [p_desc+136];
    ld.param.u64 %rd22, [p_desc+144];
    ld.param.u64 %rd23, [p_desc+152];
    ld.param.u64 %rd24, [p_desc+160];
    ld.param.u64 %rd25, [p_desc+168];
    ld.param.u64 %rd26, [p_desc+176];
    ld.param.u64 %rd27, [p_desc+184];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd5, %rd5;
    cvta.to.global.u64 %rd6, %rd6;
    cvta.to.global.u64 %rd7, %rd7;
    cvta.to.global.u64 %rd8, %rd8;
    cvta.to.global.u64 %rd10, %rd10;
    cvta.to.global.u64 %rd11, %rd11;
    cvta.to.global.u64 %rd12, %rd12;
    cvta.to.global.u64 %rd13, %rd13;
    cvta.to.global.u64 %rd14, %rd14;
    cvta.to.global.u64 %rd15, %rd15;
    cvta.to.global.u64 %rd16, %rd16;
    cvta.to.global.u64 %rd17, %rd17;
    cvta.to.global.u64 %rd20, %rd20;
    cvta.to.global.u64 %rd21, %rd21;
    cvta.to.global.u64 %rd22, %rd22;
    cvta.to.global.u64 %rd23, %rd23;
    cvta.to.global.u64 %rd24, %rd24;
    cvta.to.global.u64 %rd25, %rd25;
    cvta.to.global.u64 %rd26, %rd26;
    cvta.to.global.u64 %rd27, %rd27;
    setp.gt.u64 %p0, %rd3, 0;
    setp.gt.u64 %p1, %rd3, 1;
    setp.gt.u64 %p2, %rd3, 2;
    setp.gt.u64 %p3, %rd3, 3;
    setp.gt.u64 %p4, %rd3, 4;
    setp.gt.u64 %p5, %rd3, 5;
    setp.gt.u64 %p6, %rd3, 6;
    setp.gt.u64 %p7, %rd3, 7;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd30, %r1, %r2;
    cvt.u64.u32 %rd31, %r3;
    add.u64 %rd30, %rd30, %rd31;
    mul.wide.u32 %rd32, %r4, %r2;
COMMIT_LOOP:
    setp.ge.u64 %p8, %rd30, %rd2;
    @%p8 bra COMMIT_COPIED;
    shl.b64 %rd33, %rd30, 4;
    add.u64 %rd34, %rd1, %rd33;
    ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd34];
    add.u64 %rd35, %rd10, %rd33;
    @%p0 st.global.v4.u32 [%rd35], {%r5, %r6, %r7, %r8};
    add.u64 %rd35, %rd11, %rd33;
    @%p1 st.global.v4.u32 [%rd35], {%r5, %r6, %r7, %r8};
    add.u64 %rd35, %rd12, %rd33;
    @%p2 st.global.v4.u32 [%rd35], {%r5, %r6, %r7, %r8};
    add.u64 %rd35, %rd13, %rd33;
    @%p3 st.global.v4.u32 [%rd35], {%r5, %r6, %r7, %r8};
    add.u64 %rd35, %rd14, %rd33;
    @%p4 st.global.v4.u32 [%rd35], {%r5, %r6, %r7, %r8};
    add.u64 %rd35, %rd15, %rd33;
    @%p5 st.global.v4.u32 [%rd35], {%r5, %r6, %r7, %r8};
    add.u64 %rd35, %rd16, %rd33;
    @%p6 st.global.v4.u32 [%rd35], {%r5, %r6, %r7, %r8};
    add.u64 %rd35, %rd17, %rd33;
    @%p7 st.global.v4.u32 [%rd35], {%r5, %r6, %r7, %r8};
    add.u64 %rd30, %rd30, %rd32;
    bra COMMIT_LOOP;
COMMIT_COPIED:
    bar.sync 0;
    setp.ne.u32 %p9, %r3, 0;
    @%p9 bra COMMIT_DONE;
    membar.gl;
    and.b64 %rd36, %rd4, 63;
    shl.b64 %rd36, %rd36, 2;
    add.u64 %rd37, %rd5, %rd36;
    atom.global.add.u32 %r9, [%rd37], 1;
    sub.u32 %r10, %r4, 1;
    setp.ne.u32 %p10, %r9, %r10;
    @%p10 bra COMMIT_DONE;
    st.global.u32 [%rd37], 0;
    membar.sys;
    setp.ne.u64 %p13, %rd8, 0;
    @%p13 st.volatile.global.u64 [%rd8], %rd4;
    @%p0 st.volatile.global.u64 [%rd20], %rd4;
    @%p1 st.volatile.global.u64 [%rd21], %rd4;
    @%p2 st.volatile.global.u64 [%rd22], %rd4;
    @%p3 st.volatile.global.u64 [%rd23], %rd4;
    @%p4 st.volatile.global.u64 [%rd24], %rd4;
    @%p5 st.volatile.global.u64 [%rd25], %rd4;
    @%p6 st.volatile.global.u64 [%rd26], %rd4;
    @%p7 st.volatile.global.u64 [%rd27], %rd4;
    setp.ne.u64 %p11, %rd6, 0;
    @%p11 st.volatile.global.u64 [%rd6], %rd4;
    membar.sys;
    setp.ne.u64 %p12, %rd7, 0;
    @%p12 st.volatile.global.u64 [%rd7], %rd4;
    membar.sys;
COMMIT_DONE:
    ret;
}
";

/// The commit kernel loaded into a context, with its counter words. Made
/// and released with that context current (the pool pushes it).
#[derive(Debug)]
pub(crate) struct CommitKernel {
    module: Option<CuModule>,
    function: CuFunction,
    counters: Option<DevicePtr>,
}

impl CommitKernel {
    /// Loads the kernel and makes its zeroed counter words, in the current
    /// context; on failure releases what it made.
    pub(crate) fn load<D: Driver>(d: &D) -> DResult<CommitKernel> {
        let module = d.module_load_data(PTX)?;
        let made = (|| {
            let name = std::ffi::CString::new(COMMIT_KERNEL).unwrap_or_default();
            // SAFETY: `module` was just loaded by this driver.
            let function = unsafe { d.module_get_function(module, &name) }?;
            let counters = d.mem_alloc(COUNTERS * 4)?;
            // SAFETY: `counters` was just allocated with this many bytes.
            if let Err(e) = unsafe { d.memset_d8(counters, 0, COUNTERS * 4) } {
                // SAFETY: allocated above, unused.
                if let Err(fe) = unsafe { d.mem_free(counters) } {
                    tracing::warn!(error = %fe, "freeing the commit counters after a failed memset");
                }
                return Err(e);
            }
            Ok((function, counters))
        })();
        match made {
            Ok((function, counters)) => Ok(CommitKernel {
                module: Some(module),
                function,
                counters: Some(counters),
            }),
            Err(e) => {
                // SAFETY: loaded above; nothing of it runs.
                if let Err(ue) = unsafe { d.module_unload(module) } {
                    tracing::warn!(error = %ue, "unloading the commit kernel after a failed load");
                }
                Err(e)
            }
        }
    }

    /// Enqueues one launch on `stream`. `desc.counter` is filled in here.
    ///
    /// # Safety
    /// The kernel's context is current; every address in `desc` is live
    /// device memory (or registered host memory) that stays valid until
    /// the launch has completed; the source is 16-byte aligned and
    /// readable, each target 16-byte aligned and writable for
    /// `desc.vecs * 16` bytes.
    pub(crate) unsafe fn launch<D: Driver>(&self, d: &D, stream: CuStream, mut desc: CommitDesc) -> DResult<()> {
        desc.counter = self.counters.unwrap_or(0);
        let blocks = u32::try_from(desc.vecs.div_ceil(u64::from(THREADS)))
            .unwrap_or(MAX_BLOCKS)
            .clamp(1, MAX_BLOCKS);
        let mut params = [(&mut desc as *mut CommitDesc).cast::<c_void>()];
        // SAFETY: the one parameter is a `CommitDesc`, as the PTX declares
        // it; the addresses in it are valid (this function's contract).
        unsafe { d.launch_kernel(self.function, blocks, THREADS, stream, &mut params) }
    }

    /// Frees the counters and unloads the module, in the current context
    /// (the kernel's); every launch has completed. Retryable.
    pub(crate) fn release<D: Driver>(&mut self, d: &D) -> DResult<()> {
        if let Some(c) = self.counters {
            // SAFETY: allocated by `load`; the caller synchronised the context.
            unsafe { d.mem_free(c) }?;
            self.counters = None;
        }
        if let Some(m) = self.module {
            // SAFETY: loaded by `load`; no launch is pending.
            unsafe { d.module_unload(m) }?;
            self.module = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_has_the_layout_the_ptx_reads() {
        let d = CommitDesc::default();
        let base = &d as *const CommitDesc as usize;
        let at = |p: *const u64| p as usize - base;
        assert_eq!(at(&d.src), 0);
        assert_eq!(at(&d.vecs), 8);
        assert_eq!(at(&d.count), 16);
        assert_eq!(at(&d.seq), 24);
        assert_eq!(at(&d.counter), 32);
        assert_eq!(at(&d.slot_seq), 40);
        assert_eq!(at(&d.global_seq), 48);
        assert_eq!(at(&d.gate), 56);
        assert_eq!(at(&d.dst[7]), 120);
        assert_eq!(at(&d.push_seq[0]), 128);
        assert_eq!(at(&d.push_seq[7]), 184);
        let ptx = PTX.to_str().unwrap();
        assert!(ptx.contains("[p_desc+56]"), "the gate word is not read");
        for (k, off) in (64..192).step_by(8).enumerate() {
            assert!(
                ptx.contains(&format!("[p_desc+{off}]")),
                "target word {k} at +{off} is not read"
            );
        }
        assert!(ptx.contains(".param .align 8 .b8 p_desc[192]"));
    }
}
