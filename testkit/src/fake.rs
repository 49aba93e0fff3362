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

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_void, CStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

use vramring::seam::cuda::{
    attr, code, Access, CommitDesc, CuContext, CuDevice, CuFunction, CuGraphExec, CuModule, CuStream, DResult,
    DevicePtr, Driver, DriverError, KernelNode, MemHandle, COMMIT_AT_KERNEL, COMMIT_KERNEL, FETCH_KERNEL, RING_ENTRIES,
};
use vramring::seam::shm::Region;

use crate::gpu_kernels as pattern;

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

struct Backing {
    region: Region,
    fd: OwnedFd,
}

struct HandleRec {
    backing: Arc<Backing>,
    owner: Option<CuContext>,
    /// Device whose memory `cuMemCreate` used; `None` for an import.
    created_on: Option<CuDevice>,
}

struct MapRec {
    len: u64,
    backing: Arc<Backing>,
    access: Option<Access>,
    owner: Option<CuContext>,
}

struct AllocRec {
    mem: Vec<u8>,
    owner: Option<CuContext>,
}

#[derive(Default)]
struct State {
    devices: Vec<FakeDevice>,
    initialized: bool,
    calls: u64,
    fail_at: Option<u64>,
    fail_nth: HashMap<&'static str, u64>,
    per_call: HashMap<&'static str, u64>,
    fail_code: u32,
    log: Vec<CallRecord>,
    stacks: HashMap<ThreadId, Vec<CuContext>>,
    primary: BTreeMap<CuDevice, u32>,
    foreign: Vec<CuContext>,
    next_id: u64,
    used: HashMap<CuDevice, u64>,
    handles: BTreeMap<u64, HandleRec>,
    reservations: BTreeMap<u64, (u64, Option<CuContext>)>,
    mappings: BTreeMap<u64, MapRec>,
    allocs: BTreeMap<u64, AllocRec>,
    streams: BTreeMap<u64, Option<CuContext>>,
    modules: BTreeMap<u64, Option<CuContext>>,
    functions: BTreeMap<u64, (u64, String)>,
    /// Graph instances: their nodes (kernel name, 64-bit parameters), in
    /// order, and the context they were made in.
    graphs: BTreeMap<u64, (Vec<GraphNode>, Option<CuContext>)>,
    /// Registered host memory: fake device address -> (host address, bytes, owner).
    host_regs: BTreeMap<u64, (usize, u64, Option<CuContext>)>,
    /// Registered host memory the device may only read (device addresses).
    read_only_regs: Vec<u64>,
    /// Streams blocked on a `cuStreamWaitValue64`, with what they wait for
    /// and the copies enqueued behind the wait.
    blocked: HashMap<u64, Blocked>,
}

/// A kernel node of a fake graph: the kernel's name, its 64-bit parameters.
type GraphNode = (String, Vec<u64>);

/// A stream waiting on the GPU for a word to reach a value.
struct Blocked {
    addr: DevicePtr,
    value: u64,
    /// `(dst, src, bytes)` of each copy enqueued behind the wait.
    copies: Vec<(DevicePtr, DevicePtr, u64)>,
}

const PRIMARY_BASE: u64 = 0xC0_0000;
/// The error the fake returns where a real driver would block for good
/// (synchronising a stream whose wait can never be met).
pub const FAKE_WOULD_HANG: u32 = 0xFA4E;
const FOREIGN_BASE: u64 = 0xF0_0000;
const VA_BASE: u64 = 0x7000_0000_0000;
const ALLOC_BASE: u64 = 0x6000_0000_0000;
/// Fake device addresses of registered host memory (1 TiB apart).
const HOST_REG_BASE: u64 = 0x5000_0000_0000;

fn primary_of(dev: CuDevice) -> CuContext {
    CuContext::from_bits(PRIMARY_BASE + dev as u64)
}

impl State {
    fn current(&self) -> Option<CuContext> {
        self.stacks
            .get(&std::thread::current().id())
            .and_then(|s| s.last().copied())
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn device_of(&self, ctx: CuContext) -> Option<CuDevice> {
        let b = ctx.to_bits();
        if (PRIMARY_BASE..PRIMARY_BASE + self.devices.len() as u64).contains(&b) {
            Some((b - PRIMARY_BASE) as CuDevice)
        } else if self.foreign.contains(&ctx) {
            Some(0)
        } else {
            None
        }
    }

    fn ctx_valid(&self, ctx: CuContext) -> bool {
        match self.device_of(ctx) {
            Some(dev) if ctx == primary_of(dev) => self.primary.get(&dev).is_some_and(|&n| n > 0),
            Some(_) => true,
            None => false,
        }
    }

    fn need_ctx(&self, call: &'static str) -> DResult<CuContext> {
        match self.current() {
            Some(c) if self.ctx_valid(c) => Ok(c),
            _ => Err(DriverError {
                call,
                code: code::INVALID_CONTEXT,
            }),
        }
    }

    fn dev(&self, call: &'static str, dev: CuDevice) -> DResult<&FakeDevice> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or(DriverError {
                call,
                code: code::INVALID_DEVICE,
            })
    }

    /// Host address of `[ptr, ptr+len)`, checking access.
    fn resolve(&mut self, call: &'static str, ptr: DevicePtr, len: u64, write: bool) -> DResult<*mut u8> {
        let bad = DriverError {
            call,
            code: code::ILLEGAL_ADDRESS,
        };
        let end = ptr.checked_add(len).ok_or(bad)?;
        if let Some((&start, m)) = self.mappings.range(..=ptr).next_back() {
            if end <= start + m.len {
                return match m.access {
                    Some(Access::ReadWrite) => Ok(m.backing.region.as_ptr().wrapping_add((ptr - start) as usize)),
                    Some(Access::Read) if !write => Ok(m.backing.region.as_ptr().wrapping_add((ptr - start) as usize)),
                    _ => Err(bad),
                };
            }
        }
        if let Some((&start, a)) = self.allocs.range_mut(..=ptr).next_back() {
            if end <= start + a.mem.len() as u64 {
                return Ok(a.mem.as_mut_ptr().wrapping_add((ptr - start) as usize));
            }
        }
        if let Some((&start, &(host, len, _))) = self.host_regs.range(..=ptr).next_back() {
            if end <= start + len && !(write && self.read_only_regs.contains(&start)) {
                return Ok((host as *mut u8).wrapping_add((ptr - start) as usize));
            }
        }
        Err(bad)
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

impl Driver for FakeDriver {
    fn init(&self) -> DResult<()> {
        let (mut st, _) = self.enter("cuInit")?;
        st.initialized = true;
        Ok(())
    }

    fn device_count(&self) -> DResult<i32> {
        let (st, _) = self.enter("cuDeviceGetCount")?;
        Ok(st.devices.len() as i32)
    }

    fn device_get(&self, ordinal: i32) -> DResult<CuDevice> {
        let (st, _) = self.enter("cuDeviceGet")?;
        st.dev("cuDeviceGet", ordinal)?;
        Ok(ordinal)
    }

    fn device_uuid(&self, dev: CuDevice) -> DResult<[u8; 16]> {
        let (st, _) = self.enter("cuDeviceGetUuid_v2")?;
        Ok(st.dev("cuDeviceGetUuid_v2", dev)?.uuid)
    }

    fn device_attribute(&self, a: u32, dev: CuDevice) -> DResult<i32> {
        let (st, _) = self.enter("cuDeviceGetAttribute")?;
        let d = st.dev("cuDeviceGetAttribute", dev)?;
        Ok(match a {
            attr::INTEGRATED => i32::from(d.integrated),
            attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED => i32::from(d.vmm),
            attr::HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED => i32::from(d.posix_fd),
            attr::MPS_ENABLED => i32::from(d.mps),
            attr::READ_ONLY_HOST_REGISTER_SUPPORTED | attr::CAN_USE_64_BIT_STREAM_MEM_OPS => i32::from(d.stream_waits),
            _ => {
                return Err(DriverError {
                    call: "cuDeviceGetAttribute",
                    code: code::INVALID_VALUE,
                })
            }
        })
    }

    fn primary_ctx_retain(&self, dev: CuDevice) -> DResult<CuContext> {
        let (mut st, _) = self.enter("cuDevicePrimaryCtxRetain")?;
        st.dev("cuDevicePrimaryCtxRetain", dev)?;
        *st.primary.entry(dev).or_insert(0) += 1;
        Ok(primary_of(dev))
    }

    fn primary_ctx_release(&self, dev: CuDevice) -> DResult<()> {
        const CALL: &str = "cuDevicePrimaryCtxRelease_v2";
        let (mut st, rec) = self.enter(CALL)?;
        Self::release_owner(&mut st, rec, None);
        match st.primary.get_mut(&dev) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Ok(())
            }
            _ => Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_CONTEXT)),
        }
    }

    fn ctx_get_current(&self) -> DResult<Option<CuContext>> {
        let (st, _) = self.enter("cuCtxGetCurrent")?;
        Ok(st.current())
    }

    unsafe fn ctx_push_current(&self, ctx: CuContext) -> DResult<()> {
        let (mut st, rec) = self.enter("cuCtxPushCurrent_v2")?;
        if !st.ctx_valid(ctx) {
            return Err(Self::fail_rec(
                &mut st,
                rec,
                DriverError {
                    call: "cuCtxPushCurrent_v2",
                    code: code::INVALID_CONTEXT,
                },
            ));
        }
        st.stacks.entry(std::thread::current().id()).or_default().push(ctx);
        Ok(())
    }

    fn ctx_pop_current(&self) -> DResult<Option<CuContext>> {
        let (mut st, rec) = self.enter("cuCtxPopCurrent_v2")?;
        match st.stacks.get_mut(&std::thread::current().id()).and_then(Vec::pop) {
            Some(c) => Ok(Some(c)),
            None => Err(Self::fail_rec(
                &mut st,
                rec,
                DriverError {
                    call: "cuCtxPopCurrent_v2",
                    code: code::INVALID_CONTEXT,
                },
            )),
        }
    }

    fn ctx_get_device(&self) -> DResult<CuDevice> {
        let (st, _) = self.enter("cuCtxGetDevice")?;
        let c = st.need_ctx("cuCtxGetDevice")?;
        st.device_of(c).ok_or(DriverError {
            call: "cuCtxGetDevice",
            code: code::INVALID_CONTEXT,
        })
    }

    fn ctx_synchronize(&self) -> DResult<()> {
        let (st, _) = self.enter("cuCtxSynchronize")?;
        st.need_ctx("cuCtxSynchronize")?;
        Ok(())
    }

    fn mem_get_info(&self) -> DResult<(u64, u64)> {
        let (st, _) = self.enter("cuMemGetInfo_v2")?;
        let c = st.need_ctx("cuMemGetInfo_v2")?;
        let dev = st.device_of(c).unwrap_or(0);
        let d = st.dev("cuMemGetInfo_v2", dev)?;
        let used = st.used.get(&dev).copied().unwrap_or(0);
        Ok((d.free.saturating_sub(used), d.total))
    }

    fn mem_granularity(&self, dev: CuDevice) -> DResult<u64> {
        let (st, _) = self.enter("cuMemGetAllocationGranularity")?;
        let d = st.dev("cuMemGetAllocationGranularity", dev)?;
        if !d.vmm {
            return Err(DriverError {
                call: "cuMemGetAllocationGranularity",
                code: code::NOT_SUPPORTED,
            });
        }
        Ok(d.granularity)
    }

    fn mem_create(&self, bytes: u64, dev: CuDevice) -> DResult<MemHandle> {
        const CALL: &str = "cuMemCreate";
        let (mut st, rec) = self.enter(CALL)?;
        let owner = st.need_ctx(CALL).map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        let d = st.dev(CALL, dev)?.clone();
        let used = st.used.get(&dev).copied().unwrap_or(0);
        if !d.vmm || !d.posix_fd {
            return Err(Self::fail_code(&mut st, rec, CALL, code::NOT_SUPPORTED));
        }
        if bytes == 0 || bytes % d.granularity != 0 {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_VALUE));
        }
        if used + bytes > d.free {
            return Err(Self::fail_code(&mut st, rec, CALL, code::OUT_OF_MEMORY));
        }
        let backing = Self::new_backing(bytes).map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        *st.used.entry(dev).or_insert(0) += bytes;
        let id = st.id();
        st.handles.insert(
            id,
            HandleRec {
                backing: Arc::new(backing),
                owner: Some(owner),
                created_on: Some(dev),
            },
        );
        Ok(MemHandle(id))
    }

    unsafe fn mem_export_fd(&self, handle: MemHandle) -> DResult<OwnedFd> {
        const CALL: &str = "cuMemExportToShareableHandle";
        let (mut st, rec) = self.enter(CALL)?;
        let Some(h) = st.handles.get(&handle.0) else {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_HANDLE));
        };
        // The caller owns the new descriptor, as with the real driver.
        let fd = h.backing.fd.try_clone();
        fd.map_err(|_| Self::fail_code(&mut st, rec, CALL, code::UNKNOWN))
    }

    fn mem_import_fd(&self, fd: BorrowedFd<'_>) -> DResult<MemHandle> {
        const CALL: &str = "cuMemImportFromShareableHandle";
        let (mut st, rec) = self.enter(CALL)?;
        let owner = st.need_ctx(CALL).map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        let bad = DriverError {
            call: CALL,
            code: code::INVALID_VALUE,
        };
        let len = match rustix::fs::fstat(fd) {
            Ok(s) if s.st_size > 0 => s.st_size as u64,
            _ => return Err(Self::fail_rec(&mut st, rec, bad)),
        };
        // Like the driver, keep our own reference and leave `fd` to the caller.
        let Ok(own) = fd.try_clone_to_owned() else {
            return Err(Self::fail_rec(&mut st, rec, bad));
        };
        let Ok(region) = Region::map(own.as_fd(), len, true) else {
            return Err(Self::fail_rec(&mut st, rec, bad));
        };
        let id = st.id();
        st.handles.insert(
            id,
            HandleRec {
                backing: Arc::new(Backing { region, fd: own }),
                owner: Some(owner),
                created_on: None,
            },
        );
        Ok(MemHandle(id))
    }

    fn mem_address_reserve(&self, bytes: u64, align: u64) -> DResult<DevicePtr> {
        const CALL: &str = "cuMemAddressReserve";
        let (mut st, rec) = self.enter(CALL)?;
        let owner = st.need_ctx(CALL).map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        let align = align.max(2 << 20);
        let next = st
            .reservations
            .iter()
            .map(|(&s, &(l, _))| s + l)
            .max()
            .unwrap_or(VA_BASE);
        let start = next.div_ceil(align) * align + align;
        st.reservations.insert(start, (bytes, Some(owner)));
        Ok(start)
    }

    unsafe fn mem_address_free(&self, ptr: DevicePtr, bytes: u64) -> DResult<()> {
        const CALL: &str = "cuMemAddressFree";
        let (mut st, rec) = self.enter(CALL)?;
        let Some(&(len, owner)) = st.reservations.get(&ptr) else {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_VALUE));
        };
        Self::release_owner(&mut st, rec, owner);
        if len != bytes || st.mappings.range(ptr..ptr + len).next().is_some() {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_VALUE));
        }
        st.reservations.remove(&ptr);
        Ok(())
    }

    unsafe fn mem_map(&self, ptr: DevicePtr, bytes: u64, handle: MemHandle) -> DResult<()> {
        const CALL: &str = "cuMemMap";
        let (mut st, rec) = self.enter(CALL)?;
        let owner = st.current();
        let inside = st
            .reservations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&s, &(l, _))| ptr + bytes <= s + l);
        let backing = st.handles.get(&handle.0).map(|h| Arc::clone(&h.backing));
        match backing {
            Some(b) if inside && b.region.len() as u64 == bytes && !st.mappings.contains_key(&ptr) => {
                st.mappings.insert(
                    ptr,
                    MapRec {
                        len: bytes,
                        backing: b,
                        access: None,
                        owner,
                    },
                );
                Ok(())
            }
            _ => Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_VALUE)),
        }
    }

    unsafe fn mem_unmap(&self, ptr: DevicePtr, bytes: u64) -> DResult<()> {
        const CALL: &str = "cuMemUnmap";
        let (mut st, rec) = self.enter(CALL)?;
        let Some(m) = st.mappings.get(&ptr) else {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_VALUE));
        };
        let (len, owner) = (m.len, m.owner);
        Self::release_owner(&mut st, rec, owner);
        if len != bytes {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_VALUE));
        }
        st.mappings.remove(&ptr);
        Ok(())
    }

    unsafe fn mem_set_access(&self, ptr: DevicePtr, bytes: u64, dev: CuDevice, access: Access) -> DResult<()> {
        const CALL: &str = "cuMemSetAccess";
        let (mut st, rec) = self.enter(CALL)?;
        if st.dev(CALL, dev).is_err() {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_DEVICE));
        }
        match st.mappings.get_mut(&ptr) {
            Some(m) if m.len == bytes => {
                m.access = Some(access);
                Ok(())
            }
            _ => Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_VALUE)),
        }
    }

    unsafe fn mem_release(&self, handle: MemHandle) -> DResult<()> {
        const CALL: &str = "cuMemRelease";
        let (mut st, rec) = self.enter(CALL)?;
        let Some(h) = st.handles.remove(&handle.0) else {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_HANDLE));
        };
        Self::release_owner(&mut st, rec, h.owner);
        // Memory made here stops counting as used once its handle is
        // released (the driver frees it once it is also unmapped).
        if let Some(dev) = h.created_on {
            let len = h.backing.region.len() as u64;
            if let Some(u) = st.used.get_mut(&dev) {
                *u = u.saturating_sub(len);
            }
        }
        Ok(())
    }

    fn mem_alloc(&self, bytes: u64) -> DResult<DevicePtr> {
        const CALL: &str = "cuMemAlloc_v2";
        let (mut st, rec) = self.enter(CALL)?;
        let owner = st.need_ctx(CALL).map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        let Ok(n) = usize::try_from(bytes) else {
            return Err(Self::fail_code(&mut st, rec, CALL, code::OUT_OF_MEMORY));
        };
        let start = st
            .allocs
            .iter()
            .map(|(&s, a)| s + a.mem.len() as u64)
            .max()
            .unwrap_or(ALLOC_BASE);
        let start = start.div_ceil(256) * 256 + 256;
        st.allocs.insert(
            start,
            AllocRec {
                mem: vec![0; n],
                owner: Some(owner),
            },
        );
        Ok(start)
    }

    unsafe fn mem_free(&self, ptr: DevicePtr) -> DResult<()> {
        const CALL: &str = "cuMemFree_v2";
        let (mut st, rec) = self.enter(CALL)?;
        let Some(a) = st.allocs.remove(&ptr) else {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_VALUE));
        };
        Self::release_owner(&mut st, rec, a.owner);
        Ok(())
    }

    fn stream_create_non_blocking(&self) -> DResult<CuStream> {
        const CALL: &str = "cuStreamCreate";
        let (mut st, rec) = self.enter(CALL)?;
        let owner = st.need_ctx(CALL).map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        let id = 0x5000_0000 + st.id();
        st.streams.insert(id, Some(owner));
        Ok(CuStream::from_bits(id))
    }

    unsafe fn stream_destroy(&self, stream: CuStream) -> DResult<()> {
        const CALL: &str = "cuStreamDestroy_v2";
        let (mut st, rec) = self.enter(CALL)?;
        let Some(owner) = st.streams.remove(&stream.to_bits()) else {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_HANDLE));
        };
        Self::release_owner(&mut st, rec, owner);
        Ok(())
    }

    unsafe fn stream_synchronize(&self, stream: CuStream) -> DResult<()> {
        const CALL: &str = "cuStreamSynchronize";
        let (mut st, rec) = self.enter(CALL)?;
        if Self::advance(&mut st, stream.to_bits())? {
            // A real driver would block here for good: the word never comes.
            return Err(Self::fail_code(&mut st, rec, CALL, FAKE_WOULD_HANG));
        }
        // The null stream and foreign streams (the user's) are accepted.
        if stream.to_bits() >= 0x5000_0000
            && stream.to_bits() < 0x6000_0000
            && !st.streams.contains_key(&stream.to_bits())
        {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_HANDLE));
        }
        Ok(())
    }

    unsafe fn memcpy_dtod_async(&self, dst: DevicePtr, src: DevicePtr, bytes: u64, stream: CuStream) -> DResult<()> {
        const CALL: &str = "cuMemcpyDtoDAsync_v2";
        let (mut st, rec) = self.enter(CALL)?;
        if let Some(b) = st.blocked.get_mut(&stream.to_bits()) {
            b.copies.push((dst, src, bytes));
            return Ok(());
        }
        let s = st
            .resolve(CALL, src, bytes, false)
            .map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        let d = st
            .resolve(CALL, dst, bytes, true)
            .map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        // SAFETY: both ranges were resolved to live host memory held by the
        // locked state; `copy` allows overlap.
        unsafe { std::ptr::copy(s, d, bytes as usize) };
        Ok(())
    }

    unsafe fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> DResult<()> {
        const CALL: &str = "cuMemcpyDtoH_v2";
        let (mut st, rec) = self.enter(CALL)?;
        let s = st
            .resolve(CALL, src, dst.len() as u64, false)
            .map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        // SAFETY: `s` is valid for `dst.len()` bytes (resolved above) and
        // cannot overlap the caller's exclusive `dst`.
        unsafe { std::ptr::copy_nonoverlapping(s, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn memset_d8(&self, dst: DevicePtr, value: u8, bytes: u64) -> DResult<()> {
        const CALL: &str = "cuMemsetD8_v2";
        let (mut st, rec) = self.enter(CALL)?;
        let d = st
            .resolve(CALL, dst, bytes, true)
            .map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        // SAFETY: `d` is valid for `bytes` writable bytes (resolved above).
        unsafe { std::ptr::write_bytes(d, value, bytes as usize) };
        Ok(())
    }

    unsafe fn memset_d32_async(&self, dst: DevicePtr, value: u32, words: u64, _stream: CuStream) -> DResult<()> {
        const CALL: &str = "cuMemsetD32Async";
        let (mut st, rec) = self.enter(CALL)?;
        for i in 0..words {
            Self::write_u32(&mut st, CALL, dst + 4 * i, value).map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        }
        Ok(())
    }

    unsafe fn mem_host_register(&self, ptr: *mut c_void, bytes: u64) -> DResult<()> {
        const CALL: &str = "cuMemHostRegister_v2";
        let (mut st, rec) = self.enter(CALL)?;
        let owner = st.need_ctx(CALL).map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        let host = ptr as usize;
        let overlaps = st
            .host_regs
            .values()
            .any(|&(h, len, _)| host < h + len as usize && h < host + bytes as usize);
        if ptr.is_null() || bytes == 0 || overlaps {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_VALUE));
        }
        let dev = HOST_REG_BASE + (st.id() << 40);
        st.host_regs.insert(dev, (host, bytes, Some(owner)));
        Ok(())
    }

    unsafe fn mem_host_register_read_only(&self, ptr: *const c_void, bytes: u64) -> DResult<()> {
        // SAFETY: forwarded contract; the fake only records the range.
        unsafe { self.mem_host_register(ptr.cast_mut(), bytes) }?;
        let mut st = self.lock();
        let dev = st
            .host_regs
            .iter()
            .find(|(_, &(h, _, _))| h == ptr as usize)
            .map(|(&d, _)| d);
        if let Some(d) = dev {
            st.read_only_regs.push(d);
        }
        Ok(())
    }

    unsafe fn stream_wait_value_geq(&self, stream: CuStream, addr: DevicePtr, value: u64) -> DResult<()> {
        const CALL: &str = "cuStreamWaitValue64_v2";
        let (mut st, rec) = self.enter(CALL)?;
        let id = stream.to_bits();
        Self::known_stream(&mut st, rec, CALL, id)?;
        // The word must be device-visible now, as the real driver requires.
        st.resolve(CALL, addr, 8, false)
            .map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        if st.blocked.contains_key(&id) {
            // A second wait behind a pending one: not something the crate does.
            return Err(Self::fail_code(&mut st, rec, CALL, code::NOT_SUPPORTED));
        }
        st.blocked.insert(
            id,
            Blocked {
                addr,
                value,
                copies: Vec::new(),
            },
        );
        Self::advance(&mut st, id)?;
        Ok(())
    }

    unsafe fn stream_write_value64(&self, stream: CuStream, addr: DevicePtr, value: u64) -> DResult<()> {
        const CALL: &str = "cuStreamWriteValue64_v2";
        let (mut st, rec) = self.enter(CALL)?;
        if st.blocked.contains_key(&stream.to_bits()) {
            // Behind a pending wait: not something the publisher does.
            return Err(Self::fail_code(&mut st, rec, CALL, code::NOT_SUPPORTED));
        }
        // The publisher's streams run their work at once here.
        Self::write_u64(&mut st, CALL, addr, value).map_err(|e| Self::fail_rec(&mut st, rec, e))
    }

    unsafe fn stream_write_values64(&self, stream: CuStream, writes: &[(DevicePtr, u64)]) -> DResult<()> {
        const CALL: &str = "cuStreamBatchMemOp_v2";
        let (mut st, rec) = self.enter(CALL)?;
        if st.blocked.contains_key(&stream.to_bits()) || writes.is_empty() || writes.len() > 255 {
            return Err(Self::fail_code(&mut st, rec, CALL, code::NOT_SUPPORTED));
        }
        // Every address is checked before anything is stored: a batch the
        // driver refuses stores nothing.
        for &(addr, _) in writes {
            st.resolve(CALL, addr, 8, true)
                .map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        }
        for &(addr, v) in writes {
            Self::write_u64(&mut st, CALL, addr, v).map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        }
        Ok(())
    }

    unsafe fn stream_query(&self, stream: CuStream) -> DResult<bool> {
        const CALL: &str = "cuStreamQuery";
        let (mut st, rec) = self.enter(CALL)?;
        let id = stream.to_bits();
        Self::known_stream(&mut st, rec, CALL, id)?;
        Ok(!Self::advance(&mut st, id)?)
    }

    unsafe fn mem_host_unregister(&self, ptr: *mut c_void) -> DResult<()> {
        const CALL: &str = "cuMemHostUnregister";
        let (mut st, rec) = self.enter(CALL)?;
        let found = st
            .host_regs
            .iter()
            .find(|(_, &(h, _, _))| h == ptr as usize)
            .map(|(&d, &(_, _, o))| (d, o));
        let Some((dev, owner)) = found else {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_VALUE));
        };
        if st.blocked.values().any(|b| (dev..dev + (1 << 40)).contains(&b.addr)) {
            // The GPU would read unmapped memory: a fault that kills the
            // context (and, under MPS, its neighbours).
            return Err(Self::fail_code(&mut st, rec, CALL, code::ILLEGAL_ADDRESS));
        }
        st.host_regs.remove(&dev);
        st.read_only_regs.retain(|&d| d != dev);
        Self::release_owner(&mut st, rec, owner);
        Ok(())
    }

    unsafe fn mem_host_device_pointer(&self, ptr: *mut c_void) -> DResult<DevicePtr> {
        const CALL: &str = "cuMemHostGetDevicePointer_v2";
        let (mut st, rec) = self.enter(CALL)?;
        let p = ptr as usize;
        let found = st
            .host_regs
            .iter()
            .find(|(_, &(h, len, _))| (h..h + len as usize).contains(&p))
            .map(|(&d, &(h, _, _))| d + (p - h) as u64);
        found.ok_or_else(|| Self::fail_code(&mut st, rec, CALL, code::INVALID_VALUE))
    }

    fn module_load_data(&self, image: &CStr) -> DResult<CuModule> {
        const CALL: &str = "cuModuleLoadData";
        let (mut st, rec) = self.enter(CALL)?;
        let owner = st.need_ctx(CALL).map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        if !image.to_bytes().windows(8).any(|w| w == b".version") {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_IMAGE));
        }
        let id = 0x4000_0000 + st.id();
        st.modules.insert(id, Some(owner));
        Ok(CuModule::from_bits(id))
    }

    unsafe fn module_unload(&self, module: CuModule) -> DResult<()> {
        const CALL: &str = "cuModuleUnload";
        let (mut st, rec) = self.enter(CALL)?;
        let Some(owner) = st.modules.remove(&module.to_bits()) else {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_HANDLE));
        };
        Self::release_owner(&mut st, rec, owner);
        st.functions.retain(|_, (m, _)| *m != module.to_bits());
        Ok(())
    }

    unsafe fn module_get_function(&self, module: CuModule, name: &CStr) -> DResult<CuFunction> {
        const CALL: &str = "cuModuleGetFunction";
        let (mut st, rec) = self.enter(CALL)?;
        let name = name.to_string_lossy().into_owned();
        if !st.modules.contains_key(&module.to_bits()) {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_HANDLE));
        }
        if ![
            pattern::FILL_KERNEL,
            pattern::VERIFY_KERNEL,
            COMMIT_KERNEL,
            COMMIT_AT_KERNEL,
            FETCH_KERNEL,
        ]
        .contains(&name.as_str())
        {
            return Err(Self::fail_code(&mut st, rec, CALL, code::NOT_FOUND));
        }
        let id = 0x3000_0000 + st.id();
        st.functions.insert(id, (module.to_bits(), name));
        Ok(CuFunction::from_bits(id))
    }

    unsafe fn launch_kernel(
        &self,
        f: CuFunction,
        _grid: u32,
        _block: u32,
        _stream: CuStream,
        params: &mut [*mut c_void],
    ) -> DResult<()> {
        const CALL: &str = "cuLaunchKernel";
        let (mut st, rec) = self.enter(CALL)?;
        let Some((_, name)) = st.functions.get(&f.to_bits()).cloned() else {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_HANDLE));
        };
        // SAFETY: the caller passes the kernel's parameters (trait contract).
        unsafe { Self::emulate(&mut st, &name, params) }.map_err(|e| Self::fail_rec(&mut st, rec, e))
    }

    unsafe fn graph_of_kernels(&self, nodes: &[KernelNode]) -> DResult<CuGraphExec> {
        const CALL: &str = "cuGraphInstantiateWithFlags";
        let (mut st, rec) = self.enter(CALL)?;
        let owner = st.need_ctx(CALL).map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        let mut made = Vec::with_capacity(nodes.len());
        for n in nodes {
            let Some((_, name)) = st.functions.get(&n.function.to_bits()).cloned() else {
                return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_HANDLE));
            };
            made.push((name, n.params.clone()));
        }
        let id = 0x2000_0000 + st.id();
        st.graphs.insert(id, (made, Some(owner)));
        Ok(CuGraphExec::from_bits(id))
    }

    unsafe fn graph_launch(&self, exec: CuGraphExec, stream: CuStream) -> DResult<()> {
        const CALL: &str = "cuGraphLaunch";
        let (mut st, rec) = self.enter(CALL)?;
        st.need_ctx(CALL).map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        // Like `launch_kernel`, the fake runs the work at once, on no stream.
        let _ = stream;
        let Some((nodes, _)) = st.graphs.get(&exec.to_bits()).cloned() else {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_HANDLE));
        };
        for (name, words) in &nodes {
            Self::emulate_replay(&mut st, name, words).map_err(|e| Self::fail_rec(&mut st, rec, e))?;
        }
        Ok(())
    }

    unsafe fn graph_exec_destroy(&self, exec: CuGraphExec) -> DResult<()> {
        const CALL: &str = "cuGraphExecDestroy";
        let (mut st, rec) = self.enter(CALL)?;
        let Some((_, owner)) = st.graphs.remove(&exec.to_bits()) else {
            return Err(Self::fail_code(&mut st, rec, CALL, code::INVALID_HANDLE));
        };
        Self::release_owner(&mut st, rec, owner);
        Ok(())
    }
}
