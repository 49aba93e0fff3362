//! What the fake driver keeps: backings, handles, mappings, allocations,
//! contexts, streams and graphs, behind one lock.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread::ThreadId;

use vramring::seam::cuda::{code, Access, CuContext, CuDevice, DResult, DevicePtr, DriverError};
use vramring::seam::shm::Region;

use super::{CallRecord, FakeDevice};

pub(super) struct Backing {
    pub(super) region: Region,
    pub(super) fd: OwnedFd,
}

pub(super) struct HandleRec {
    pub(super) backing: Arc<Backing>,
    pub(super) owner: Option<CuContext>,
    /// Device whose memory `cuMemCreate` used; `None` for an import.
    pub(super) created_on: Option<CuDevice>,
}

pub(super) struct MapRec {
    pub(super) len: u64,
    pub(super) backing: Arc<Backing>,
    pub(super) access: Option<Access>,
    pub(super) owner: Option<CuContext>,
}

pub(super) struct AllocRec {
    pub(super) mem: Vec<u8>,
    pub(super) owner: Option<CuContext>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) devices: Vec<FakeDevice>,
    pub(super) initialized: bool,
    pub(super) calls: u64,
    pub(super) fail_at: Option<u64>,
    pub(super) fail_nth: HashMap<&'static str, u64>,
    pub(super) per_call: HashMap<&'static str, u64>,
    pub(super) fail_code: u32,
    pub(super) log: Vec<CallRecord>,
    pub(super) stacks: HashMap<ThreadId, Vec<CuContext>>,
    pub(super) primary: BTreeMap<CuDevice, u32>,
    pub(super) foreign: Vec<CuContext>,
    pub(super) next_id: u64,
    pub(super) used: HashMap<CuDevice, u64>,
    pub(super) handles: BTreeMap<u64, HandleRec>,
    pub(super) reservations: BTreeMap<u64, (u64, Option<CuContext>)>,
    pub(super) mappings: BTreeMap<u64, MapRec>,
    pub(super) allocs: BTreeMap<u64, AllocRec>,
    pub(super) streams: BTreeMap<u64, Option<CuContext>>,
    pub(super) modules: BTreeMap<u64, Option<CuContext>>,
    pub(super) functions: BTreeMap<u64, (u64, String)>,
    /// Graph instances: their nodes (kernel name, 64-bit parameters), in
    /// order, and the context they were made in.
    pub(super) graphs: BTreeMap<u64, (Vec<GraphNode>, Option<CuContext>)>,
    /// Registered host memory: fake device address -> (host address, bytes, owner).
    pub(super) host_regs: BTreeMap<u64, (usize, u64, Option<CuContext>)>,
    /// Registered host memory the device may only read (device addresses).
    pub(super) read_only_regs: Vec<u64>,
    /// Streams blocked on a `cuStreamWaitValue64`, with what they wait for
    /// and the copies enqueued behind the wait.
    pub(super) blocked: HashMap<u64, Blocked>,
}

/// A kernel node of a fake graph: the kernel's name, its 64-bit parameters.
pub(super) type GraphNode = (String, Vec<u64>);

/// A stream waiting on the GPU for a word to reach a value.
pub(super) struct Blocked {
    pub(super) addr: DevicePtr,
    pub(super) value: u64,
    /// `(dst, src, bytes)` of each copy enqueued behind the wait.
    pub(super) copies: Vec<(DevicePtr, DevicePtr, u64)>,
}

pub(super) const PRIMARY_BASE: u64 = 0xC0_0000;
pub(super) const FOREIGN_BASE: u64 = 0xF0_0000;
pub(super) const VA_BASE: u64 = 0x7000_0000_0000;
pub(super) const ALLOC_BASE: u64 = 0x6000_0000_0000;
/// Fake device addresses of registered host memory (1 TiB apart).
pub(super) const HOST_REG_BASE: u64 = 0x5000_0000_0000;

pub(super) fn primary_of(dev: CuDevice) -> CuContext {
    CuContext::from_bits(PRIMARY_BASE + dev as u64)
}

impl State {
    pub(super) fn current(&self) -> Option<CuContext> {
        self.stacks
            .get(&std::thread::current().id())
            .and_then(|s| s.last().copied())
    }

    pub(super) fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(super) fn device_of(&self, ctx: CuContext) -> Option<CuDevice> {
        let b = ctx.to_bits();
        if (PRIMARY_BASE..PRIMARY_BASE + self.devices.len() as u64).contains(&b) {
            Some((b - PRIMARY_BASE) as CuDevice)
        } else if self.foreign.contains(&ctx) {
            Some(0)
        } else {
            None
        }
    }

    pub(super) fn ctx_valid(&self, ctx: CuContext) -> bool {
        match self.device_of(ctx) {
            Some(dev) if ctx == primary_of(dev) => self.primary.get(&dev).is_some_and(|&n| n > 0),
            Some(_) => true,
            None => false,
        }
    }

    pub(super) fn need_ctx(&self, call: &'static str) -> DResult<CuContext> {
        match self.current() {
            Some(c) if self.ctx_valid(c) => Ok(c),
            _ => Err(DriverError {
                call,
                code: code::INVALID_CONTEXT,
            }),
        }
    }

    pub(super) fn dev(&self, call: &'static str, dev: CuDevice) -> DResult<&FakeDevice> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or(DriverError {
                call,
                code: code::INVALID_DEVICE,
            })
    }

    /// Host address of `[ptr, ptr+len)`, checking access.
    pub(super) fn resolve(&mut self, call: &'static str, ptr: DevicePtr, len: u64, write: bool) -> DResult<*mut u8> {
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
