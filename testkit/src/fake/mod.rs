//! [`FakeDriver`]: the driver API over host memory, for tests without a GPU.
//!
//! * **Memory.** `cuMemCreate` makes a memfd; `cuMemExportToShareableHandle`
//!   returns a duplicate of it, so an import in another `FakeDriver` (another
//!   "process", in the same test process or a child) maps the same bytes.
//!   Device addresses are integers in a fake address space; copies, memsets
//!   and the pattern kernels resolve them to the host mappings behind them
//!   and fail with `CUDA_ERROR_ILLEGAL_ADDRESS` outside a mapping, before
//!   `cuMemSetAccess`, or on a write through a read-only mapping.
//! * **Contexts.** Per-thread context stacks, primary contexts with a
//!   reference count, and foreign contexts ([`FakeDriver::foreign_context`])
//!   that stand for another library's context. Every resource records the
//!   context that was current when it was made (its owner).
//! * **Faults.** [`FakeDriver::fail_at`] fails the Nth call counted over all
//!   functions; [`FakeDriver::fail_nth`] the Nth call of one function. A
//!   failed call has no effect.
//! * **Records.** Every call is logged with the context current at the time
//!   ([`FakeDriver::log`]); every release also names the owner of what it
//!   released ([`FakeDriver::releases`]). [`FakeDriver::leaks`] lists every
//!   live handle, mapping, reservation, stream, allocation, module and
//!   primary-context reference.
//!
//! Files: this one (the devices, the records and the test-facing API),
//! `state` (what the fake driver keeps), `driver` (the `Driver` calls).

mod driver;
mod state;

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

use vramring::seam::cuda::{
    code, CommitDesc, CuContext, CuDevice, DResult, DevicePtr, DriverError, COMMIT_AT_KERNEL, COMMIT_KERNEL,
    FETCH_KERNEL, RING_ENTRIES,
};
use vramring::seam::shm::Region;

use crate::gpu_kernels as pattern;

use state::*;

/// The error the fake returns where a real driver would block for good
/// (synchronising a stream whose wait can never be met).
pub const FAKE_WOULD_HANG: u32 = 0xFA4E;

/// One fake GPU.
#[derive(Debug, Clone)]
pub struct FakeDevice {
    /// Its UUID.
    pub uuid: [u8; 16],
    /// `cuMemGetInfo` total.
    pub total: u64,
    /// `cuMemGetInfo` free before anything is allocated.
    pub free: u64,
    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
    pub vmm: bool,
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`.
    pub posix_fd: bool,
    /// `CU_DEVICE_ATTRIBUTE_INTEGRATED`.
    pub integrated: bool,
    /// Allocation granularity.
    pub granularity: u64,
    /// `CU_DEVICE_ATTRIBUTE_MPS_ENABLED`.
    pub mps: bool,
    /// `CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED` and
    /// `CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS`.
    pub stream_waits: bool,
}

impl FakeDevice {
    /// A discrete GPU with 16 GiB, VMM and POSIX FD handles, 2 MiB granularity.
    pub fn discrete(uuid: [u8; 16]) -> Self {
        FakeDevice {
            uuid,
            total: 16 << 30,
            free: 16 << 30,
            vmm: true,
            posix_fd: true,
            integrated: false,
            granularity: 2 << 20,
            mps: false,
            stream_waits: true,
        }
    }
}

/// One logged driver call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallRecord {
    /// 1-based index over all calls of this driver.
    pub index: u64,
    /// The driver function.
    pub call: &'static str,
    /// Context current on the calling thread.
    pub current: Option<CuContext>,
    /// Whether the call failed (injected or real).
    pub failed: bool,
    /// For a release: the context that owned what it released (`None` for
    /// a release of something not bound to a context, such as a primary
    /// context reference).
    pub owner: Option<Option<CuContext>>,
}

/// Resources still alive in a [`FakeDriver`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Leaks {
    /// Allocation handles (`cuMemCreate` / import) not released.
    pub handles: Vec<u64>,
    /// Mappings not unmapped: start address.
    pub mappings: Vec<u64>,
    /// Address reservations not freed: start address.
    pub reservations: Vec<u64>,
    /// Streams not destroyed.
    pub streams: Vec<u64>,
    /// `cuMemAlloc` allocations not freed.
    pub allocations: Vec<u64>,
    /// Modules not unloaded.
    pub modules: Vec<u64>,
    /// Primary contexts still retained: (device, references).
    pub primary_contexts: Vec<(CuDevice, u32)>,
    /// Host memory still registered (`cuMemHostRegister`): host address.
    pub host_registrations: Vec<u64>,
    /// Graph instances not destroyed.
    pub graphs: Vec<u64>,
}

impl Leaks {
    /// Nothing is alive.
    pub fn is_empty(&self) -> bool {
        *self == Leaks::default()
    }
}

/// The fake driver. See the module documentation.
pub struct FakeDriver {
    st: Mutex<State>,
}

impl std::fmt::Debug for FakeDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FakeDriver")
    }
}

impl FakeDriver {
    /// A fake process that sees `devices`, in ordinal order.
    pub fn new(devices: Vec<FakeDevice>) -> Arc<Self> {
        Arc::new(FakeDriver {
            st: Mutex::new(State {
                devices,
                fail_code: code::UNKNOWN,
                ..State::default()
            }),
        })
    }

    /// A fake process that sees one discrete GPU with UUID `uuid`.
    pub fn with_one_gpu(uuid: [u8; 16]) -> Arc<Self> {
        Self::new(vec![FakeDevice::discrete(uuid)])
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while locked cannot leave the state half-updated in a way
        // later assertions rely on; keep going with the data.
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts, logs and maybe fails a call; returns the locked state and the
    /// index of the call's log record.
    fn enter(&self, call: &'static str) -> DResult<(MutexGuard<'_, State>, usize)> {
        let mut st = self.lock();
        st.calls += 1;
        let index = st.calls;
        let nth = {
            let n = st.per_call.entry(call).or_insert(0);
            *n += 1;
            *n
        };
        let current = st.current();
        let inject = st.fail_at == Some(index) || st.fail_nth.get(call) == Some(&nth);
        let uninit = !st.initialized && call != "cuInit";
        st.log.push(CallRecord {
            index,
            call,
            current,
            failed: inject || uninit,
            owner: None,
        });
        let rec = st.log.len() - 1;
        if inject {
            let code = st.fail_code;
            return Err(DriverError { call, code });
        }
        if uninit {
            return Err(DriverError {
                call,
                code: code::NOT_INITIALIZED,
            });
        }
        Ok((st, rec))
    }

    fn release_owner(st: &mut State, rec: usize, owner: Option<CuContext>) {
        st.log[rec].owner = Some(owner);
    }

    /// [`FakeDriver::fail_rec`] of a new error `code` from `call`.
    fn fail_code(st: &mut State, rec: usize, call: &'static str, code: u32) -> DriverError {
        Self::fail_rec(st, rec, DriverError { call, code })
    }

    fn fail_rec(st: &mut State, rec: usize, e: DriverError) -> DriverError {
        st.log[rec].failed = true;
        e
    }

    /// Fails the `index`th call (1-based, counted over every function since
    /// this driver was made) with `CUDA_ERROR_UNKNOWN`, once.
    pub fn fail_at(&self, index: u64) {
        self.lock().fail_at = Some(index);
    }

    /// Fails the `nth` call (1-based) of function `call` (e.g. `"cuMemMap"`), once.
    pub fn fail_nth(&self, call: &'static str, nth: u64) {
        self.lock().fail_nth.insert(call, nth);
    }

    /// The `CUresult` injected failures return (default `CUDA_ERROR_UNKNOWN`).
    pub fn set_fail_code(&self, code: u32) {
        self.lock().fail_code = code;
    }

    /// Calls made so far.
    pub fn calls(&self) -> u64 {
        self.lock().calls
    }

    /// Every call so far.
    pub fn log(&self) -> Vec<CallRecord> {
        self.lock().log.clone()
    }

    /// Every release call so far (calls that released a context-owned
    /// resource, whether they succeeded or not).
    pub fn releases(&self) -> Vec<CallRecord> {
        self.lock().log.iter().filter(|r| r.owner.is_some()).cloned().collect()
    }

    /// Streams blocked on a `cuStreamWaitValue64` whose value has not come.
    pub fn blocked_streams(&self) -> usize {
        let mut st = self.lock();
        let ids: Vec<u64> = st.blocked.keys().copied().collect();
        ids.into_iter()
            .filter(|&id| Self::advance(&mut st, id).unwrap_or(true))
            .count()
    }

    /// Everything still alive.
    pub fn leaks(&self) -> Leaks {
        let st = self.lock();
        Leaks {
            handles: st.handles.keys().copied().collect(),
            mappings: st.mappings.keys().copied().collect(),
            reservations: st.reservations.keys().copied().collect(),
            streams: st.streams.keys().copied().collect(),
            allocations: st.allocs.keys().copied().collect(),
            modules: st.modules.keys().copied().collect(),
            primary_contexts: st
                .primary
                .iter()
                .filter(|(_, &n)| n > 0)
                .map(|(&d, &n)| (d, n))
                .collect(),
            host_registrations: st.host_regs.values().map(|&(h, _, _)| h as u64).collect(),
            graphs: st.graphs.keys().copied().collect(),
        }
    }

    /// A context made by someone else (another library) on device 0.
    /// Not counted as a leak.
    pub fn foreign_context(&self) -> CuContext {
        let mut st = self.lock();
        let ctx = CuContext::from_bits(FOREIGN_BASE + st.foreign.len() as u64);
        st.foreign.push(ctx);
        ctx
    }

    /// Replaces the top of this thread's context stack (`cuCtxSetCurrent`),
    /// without counting a call.
    pub fn set_current(&self, ctx: Option<CuContext>) {
        let mut st = self.lock();
        let stack = st.stacks.entry(std::thread::current().id()).or_default();
        stack.pop();
        stack.extend(ctx);
    }

    /// This thread's current context, without counting a call.
    pub fn current(&self) -> Option<CuContext> {
        self.lock().current()
    }

    /// This thread's context stack depth, without counting a call.
    pub fn stack_depth(&self) -> usize {
        self.lock().stacks.get(&std::thread::current().id()).map_or(0, Vec::len)
    }

    /// The primary context a `cuDevicePrimaryCtxRetain` of `dev` returns.
    pub fn primary_context(dev: CuDevice) -> CuContext {
        primary_of(dev)
    }

    fn new_backing(len: u64) -> DResult<Backing> {
        let (region, fd) = Region::create("vramring-fake-vmm", len).map_err(|_| DriverError {
            call: "cuMemCreate",
            code: code::OUT_OF_MEMORY,
        })?;
        Ok(Backing { region, fd })
    }

    /// `CUDA_ERROR_INVALID_HANDLE` (logged as a failure) unless `id` is a
    /// live stream of this driver.
    fn known_stream(st: &mut State, rec: usize, call: &'static str, id: u64) -> DResult<()> {
        if st.streams.contains_key(&id) {
            return Ok(());
        }
        Err(Self::fail_code(st, rec, call, code::INVALID_HANDLE))
    }

    /// Runs a blocked stream's work if its word has reached the value;
    /// `true` while it is still blocked.
    fn advance(st: &mut State, stream: u64) -> DResult<bool> {
        const CALL: &str = "cuStreamWaitValue64_v2";
        let Some(b) = st.blocked.get(&stream) else {
            return Ok(false);
        };
        let (addr, value) = (b.addr, b.value);
        let p = st.resolve(CALL, addr, 8, false)?;
        // SAFETY: `p` is 8 readable bytes of registered memory (resolved);
        // the publisher stores this word atomically.
        let now = unsafe { (*p.cast::<std::sync::atomic::AtomicU64>()).load(std::sync::atomic::Ordering::Acquire) };
        if now < value {
            return Ok(true);
        }
        let Some(b) = st.blocked.remove(&stream) else {
            return Ok(false);
        };
        for (dst, src, bytes) in b.copies {
            let s = st.resolve(CALL, src, bytes, false)?;
            let d = st.resolve(CALL, dst, bytes, true)?;
            // SAFETY: both ranges resolved to live host memory held by the
            // locked state; `copy` allows overlap.
            unsafe { std::ptr::copy(s, d, bytes as usize) };
        }
        Ok(false)
    }

    fn read_u32(st: &mut State, call: &'static str, ptr: DevicePtr) -> DResult<u32> {
        let p = st.resolve(call, ptr, 4, false)?;
        // SAFETY: `resolve` checked that 4 bytes at `p` lie in a live host
        // mapping or allocation held by `st`, which is locked.
        Ok(unsafe { std::ptr::read_unaligned(p.cast::<u32>()) })
    }

    fn write_u64(st: &mut State, call: &'static str, ptr: DevicePtr, v: u64) -> DResult<()> {
        let p = st.resolve(call, ptr, 8, true)?;
        // SAFETY: `resolve` checked that 8 writable bytes at `p` lie in a
        // live host mapping, allocation or registration held by `st`.
        unsafe { std::ptr::write_unaligned(p.cast::<u64>(), v) };
        Ok(())
    }

    /// The commit kernel on the host: every copy, then the gate word and the
    /// seq words, as the PTX's last block stores them.
    fn emulate_commit(st: &mut State, d: &CommitDesc) -> DResult<()> {
        const CALL: &str = "cuLaunchKernel";
        let len = d.vecs.checked_mul(16).ok_or(DriverError {
            call: CALL,
            code: code::INVALID_VALUE,
        })?;
        let count = d.count as usize;
        if count > d.dst.len() {
            return Err(DriverError {
                call: CALL,
                code: code::INVALID_VALUE,
            });
        }
        if len > 0 {
            let src = st.resolve(CALL, d.src, len, false)?;
            for &dst in &d.dst[..count] {
                let dp = st.resolve(CALL, dst, len, true)?;
                // SAFETY: both ranges were resolved to live host memory held
                // by the locked state; `copy` allows overlap.
                unsafe { std::ptr::copy(src, dp, len as usize) };
            }
        }
        if d.gate != 0 {
            Self::write_u64(st, CALL, d.gate, d.seq)?;
        }
        for &w in &d.push_seq[..count] {
            Self::write_u64(st, CALL, w, d.seq)?;
        }
        for w in [d.slot_seq, d.global_seq] {
            if w != 0 {
                Self::write_u64(st, CALL, w, d.seq)?;
            }
        }
        Ok(())
    }

    /// The replayed graph's kernels on the host: the fetch kernel (ring,
    /// state) copies ring entry `count % RING_ENTRIES` into the state's
    /// descriptor (at +64) and counts one more; the commit-at kernel runs
    /// the commit with the descriptor at its parameter.
    fn emulate_replay(st: &mut State, name: &str, words: &[u64]) -> DResult<()> {
        const CALL: &str = "cuGraphLaunch";
        const DESC: u64 = std::mem::size_of::<CommitDesc>() as u64;
        let bad = DriverError {
            call: CALL,
            code: code::INVALID_VALUE,
        };
        match (name == FETCH_KERNEL, words) {
            (true, &[ring, state]) => {
                let p = st.resolve(CALL, state, 8, false)?;
                // SAFETY: 8 readable bytes (resolved), state locked.
                let count = unsafe { std::ptr::read_unaligned(p.cast::<u64>()) };
                let entry = ring + (count % RING_ENTRIES as u64) * DESC;
                let s = st.resolve(CALL, entry, DESC, false)?;
                let d = st.resolve(CALL, state + 64, DESC, true)?;
                // SAFETY: both ranges resolved to live memory held by the
                // locked state; `copy` allows overlap.
                unsafe { std::ptr::copy(s, d, DESC as usize) };
                Self::write_u64(st, CALL, state, count + 1)
            }
            (false, &[at]) => {
                let p = st.resolve(CALL, at, DESC, false)?;
                // SAFETY: a descriptor's bytes (resolved); any bit pattern
                // is a valid `CommitDesc`.
                let d = unsafe { std::ptr::read_unaligned(p.cast::<CommitDesc>()) };
                Self::emulate_commit(st, &d)
            }
            _ => Err(bad),
        }
    }

    fn write_u32(st: &mut State, call: &'static str, ptr: DevicePtr, v: u32) -> DResult<()> {
        let p = st.resolve(call, ptr, 4, true)?;
        // SAFETY: as in `read_u32`, and the range is writable.
        unsafe { std::ptr::write_unaligned(p.cast::<u32>(), v) };
        Ok(())
    }

    /// Runs a pattern kernel on the host, as the PTX would on the device.
    ///
    /// # Safety
    /// `params` points to values of the kernel's parameter types.
    unsafe fn emulate(st: &mut State, name: &str, params: &[*mut c_void]) -> DResult<()> {
        const CALL: &str = "cuLaunchKernel";
        let bad = DriverError {
            call: CALL,
            code: code::INVALID_VALUE,
        };
        if name == COMMIT_KERNEL {
            if params.len() != 1 {
                return Err(bad);
            }
            // SAFETY: the commit kernel's one parameter is a `CommitDesc`.
            let d = unsafe { *(params[0] as *const CommitDesc) };
            return Self::emulate_commit(st, &d);
        }
        if name == COMMIT_AT_KERNEL || name == FETCH_KERNEL {
            // SAFETY: both take 64-bit parameters only.
            let words: Vec<u64> = params.iter().map(|&p| unsafe { *(p as *const u64) }).collect();
            return Self::emulate_replay(st, name, &words);
        }
        if params.len() != 3 {
            return Err(bad);
        }
        // SAFETY: per the kernels' signatures: (u64 ptr, u32 words, u64 seq or counter).
        let (base, n, third) = unsafe {
            (
                *(params[0] as *const u64),
                *(params[1] as *const u32),
                *(params[2] as *const u64),
            )
        };
        match name {
            pattern::FILL_KERNEL => {
                let mut sum = 0u32;
                for i in 4..n {
                    let w = pattern::word(third, i);
                    Self::write_u32(st, CALL, base + 4 * i as u64, w)?;
                    sum = sum.wrapping_add(w);
                }
                let w2 = Self::read_u32(st, CALL, base + 8)?;
                Self::write_u32(st, CALL, base + 8, w2.wrapping_add(sum))?;
                Self::write_u32(st, CALL, base, third as u32)?;
                Self::write_u32(st, CALL, base + 4, (third >> 32) as u32)?;
                Self::write_u32(st, CALL, base + 12, n)?;
                Ok(())
            }
            pattern::VERIFY_KERNEL => {
                let seq = Self::read_u32(st, CALL, base)? as u64 | (Self::read_u32(st, CALL, base + 4)? as u64) << 32;
                let (mut bad_words, mut sum) = (0u32, 0u32);
                for i in 4..n {
                    let w = Self::read_u32(st, CALL, base + 4 * i as u64)?;
                    bad_words += u32::from(w != pattern::word(seq, i));
                    sum = sum.wrapping_add(w);
                }
                bad_words += u32::from(Self::read_u32(st, CALL, base + 12)? != n);
                let c0 = Self::read_u32(st, CALL, third)?;
                Self::write_u32(st, CALL, third, c0.wrapping_add(bad_words))?;
                let c1 = Self::read_u32(st, CALL, third + 4)?;
                Self::write_u32(st, CALL, third + 4, c1.wrapping_add(sum))?;
                let w2 = Self::read_u32(st, CALL, base + 8)?;
                Self::write_u32(st, CALL, third + 8, w2)?;
                Self::write_u32(st, CALL, third + 12, seq as u32)?;
                Self::write_u32(st, CALL, third + 16, (seq >> 32) as u32)?;
                Ok(())
            }
            _ => Err(DriverError {
                call: CALL,
                code: code::NOT_FOUND,
            }),
        }
    }
}
