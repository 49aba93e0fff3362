//! The `Driver` calls of the fake: each checks its arguments and the current
//! context like the real driver, then acts on host memory.

use std::ffi::{c_void, CStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use vramring::seam::cuda::{
    attr, code, Access, CuContext, CuDevice, CuFunction, CuGraphExec, CuModule, CuStream, DResult, DevicePtr, Driver,
    DriverError, KernelNode, MemHandle, COMMIT_AT_KERNEL, COMMIT_KERNEL, FETCH_KERNEL,
};
use vramring::seam::shm::Region;

use crate::gpu_kernels as pattern;

use super::state::*;
use super::{FakeDriver, FAKE_WOULD_HANG};

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
