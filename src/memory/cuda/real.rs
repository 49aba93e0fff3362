//! [`RealDriver`]: the CUDA driver library, loaded at run time.
//!
//! The library is found with `cudarc::driver::sys` (`is_culib_present`,
//! `culib`), so a machine without CUDA builds and runs every CPU test, and
//! asking for the real driver there gives [`Error::CudaUnavailable`], never a
//! panic. The entry points are resolved here, all at once, into a table of
//! `extern "C"` function pointers that return `CUresult` as a `u32`:
//! a missing symbol is an error rather than cudarc's lazy panic, and a code
//! from a newer driver than the bindings know is matched as an integer, never
//! read into a Rust enum.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void, CStr};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;

use super::driver::{
    code, Access, CuContext, CuDevice, CuFunction, CuGraphExec, CuModule, CuStream, DResult, DevicePtr, Driver,
    DriverError, KernelNode, MemHandle,
};
use crate::error::{Error, Result};

/// `CUmemLocation`: `{ CUmemLocationType type; int id; }`.
#[repr(C)]
#[derive(Clone, Copy)]
struct MemLocation {
    type_: c_uint,
    id: c_int,
}

/// `CUmemAllocationProp` (CUDA 12 and 13 share this layout).
#[repr(C)]
#[derive(Clone, Copy)]
struct MemAllocationProp {
    type_: c_uint,
    requested_handle_types: c_uint,
    location: MemLocation,
    win32_handle_meta_data: *mut c_void,
    compression_type: u8,
    gpu_direct_rdma_capable: u8,
    usage: u16,
    reserved: [u8; 4],
}

/// `CUDA_KERNEL_NODE_PARAMS_v1`, what the unversioned `cuGraphAddKernelNode`
/// entry point takes.
#[repr(C)]
#[derive(Clone, Copy)]
struct KernelNodeParams {
    func: sys::CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

/// `CUmemAccessDesc`: `{ CUmemLocation location; CUmemAccess_flags flags; }`.
#[repr(C)]
#[derive(Clone, Copy)]
struct MemAccessDesc {
    location: MemLocation,
    flags: c_uint,
}

const _: () = assert!(std::mem::size_of::<MemLocation>() == std::mem::size_of::<sys::CUmemLocation>());
const _: () = assert!(std::mem::size_of::<MemAllocationProp>() == std::mem::size_of::<sys::CUmemAllocationProp>());
const _: () = assert!(std::mem::size_of::<MemAccessDesc>() == std::mem::size_of::<sys::CUmemAccessDesc>());
const _: () = assert!(std::mem::size_of::<sys::CUuuid>() == 16);
const _: () = assert!(std::mem::size_of::<KernelNodeParams>() == 56);

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
const ALLOCATION_TYPE_PINNED: c_uint = 1;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const HANDLE_TYPE_POSIX_FD: c_uint = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_TYPE_DEVICE: c_uint = 1;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM`.
const GRANULARITY_MINIMUM: c_uint = 0;
/// `CU_MEMHOSTREGISTER_DEVICEMAP`.
const HOST_REGISTER_DEVICEMAP: c_uint = 2;
/// `CU_MEMHOSTREGISTER_READ_ONLY`.
const HOST_REGISTER_READ_ONLY: c_uint = 8;
/// `CU_STREAM_WAIT_VALUE_GEQ`.
const STREAM_WAIT_VALUE_GEQ: c_uint = 0;
/// `CU_STREAM_WRITE_VALUE_DEFAULT`.
const STREAM_WRITE_VALUE_DEFAULT: c_uint = 0;
/// `CU_STREAM_NON_BLOCKING`.
const STREAM_NON_BLOCKING: c_uint = 1;

type Ctx = sys::CUcontext;
type Strm = sys::CUstream;

/// The entry points, resolved once.
#[derive(Clone, Copy)]
struct Table {
    init: unsafe extern "C" fn(c_uint) -> u32,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> u32,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> u32,
    device_get_uuid: unsafe extern "C" fn(*mut sys::CUuuid, c_int) -> u32,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_uint, c_int) -> u32,
    primary_ctx_retain: unsafe extern "C" fn(*mut Ctx, c_int) -> u32,
    primary_ctx_release: unsafe extern "C" fn(c_int) -> u32,
    ctx_get_current: unsafe extern "C" fn(*mut Ctx) -> u32,
    ctx_push_current: unsafe extern "C" fn(Ctx) -> u32,
    ctx_pop_current: unsafe extern "C" fn(*mut Ctx) -> u32,
    ctx_get_device: unsafe extern "C" fn(*mut c_int) -> u32,
    ctx_synchronize: unsafe extern "C" fn() -> u32,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> u32,
    mem_get_allocation_granularity: unsafe extern "C" fn(*mut usize, *const MemAllocationProp, c_uint) -> u32,
    mem_create: unsafe extern "C" fn(*mut c_ulonglong, usize, *const MemAllocationProp, c_ulonglong) -> u32,
    mem_export_to_shareable_handle: unsafe extern "C" fn(*mut c_void, c_ulonglong, c_uint, c_ulonglong) -> u32,
    mem_import_from_shareable_handle: unsafe extern "C" fn(*mut c_ulonglong, *mut c_void, c_uint) -> u32,
    mem_address_reserve: unsafe extern "C" fn(*mut u64, usize, usize, u64, c_ulonglong) -> u32,
    mem_address_free: unsafe extern "C" fn(u64, usize) -> u32,
    mem_map: unsafe extern "C" fn(u64, usize, usize, c_ulonglong, c_ulonglong) -> u32,
    mem_unmap: unsafe extern "C" fn(u64, usize) -> u32,
    mem_set_access: unsafe extern "C" fn(u64, usize, *const MemAccessDesc, usize) -> u32,
    mem_release: unsafe extern "C" fn(c_ulonglong) -> u32,
    mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> u32,
    mem_free: unsafe extern "C" fn(u64) -> u32,
    stream_create: unsafe extern "C" fn(*mut Strm, c_uint) -> u32,
    stream_destroy: unsafe extern "C" fn(Strm) -> u32,
    stream_synchronize: unsafe extern "C" fn(Strm) -> u32,
    stream_query: unsafe extern "C" fn(Strm) -> u32,
    stream_wait_value64: unsafe extern "C" fn(Strm, u64, u64, c_uint) -> u32,
    stream_write_value64: unsafe extern "C" fn(Strm, u64, u64, c_uint) -> u32,
    stream_batch_mem_op: unsafe extern "C" fn(Strm, c_uint, *mut sys::CUstreamBatchMemOpParams, c_uint) -> u32,
    memcpy_dtod_async: unsafe extern "C" fn(u64, u64, usize, Strm) -> u32,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> u32,
    memset_d8: unsafe extern "C" fn(u64, u8, usize) -> u32,
    memset_d32_async: unsafe extern "C" fn(u64, c_uint, usize, Strm) -> u32,
    mem_host_register: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> u32,
    mem_host_unregister: unsafe extern "C" fn(*mut c_void) -> u32,
    mem_host_get_device_pointer: unsafe extern "C" fn(*mut u64, *mut c_void, c_uint) -> u32,
    module_load_data: unsafe extern "C" fn(*mut sys::CUmodule, *const c_void) -> u32,
    module_unload: unsafe extern "C" fn(sys::CUmodule) -> u32,
    module_get_function: unsafe extern "C" fn(*mut sys::CUfunction, sys::CUmodule, *const std::ffi::c_char) -> u32,
    graph_create: unsafe extern "C" fn(*mut sys::CUgraph, c_uint) -> u32,
    graph_add_kernel_node: unsafe extern "C" fn(
        *mut sys::CUgraphNode,
        sys::CUgraph,
        *const sys::CUgraphNode,
        usize,
        *const KernelNodeParams,
    ) -> u32,
    graph_instantiate: unsafe extern "C" fn(*mut sys::CUgraphExec, sys::CUgraph, c_ulonglong) -> u32,
    graph_destroy: unsafe extern "C" fn(sys::CUgraph) -> u32,
    graph_launch: unsafe extern "C" fn(sys::CUgraphExec, Strm) -> u32,
    graph_exec_destroy: unsafe extern "C" fn(sys::CUgraphExec) -> u32,
    #[allow(clippy::type_complexity)]
    launch_kernel: unsafe extern "C" fn(
        sys::CUfunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Strm,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> u32,
}

/// The CUDA driver. Cheap to share (`Arc`), usable from any thread.
pub struct RealDriver {
    t: Table,
}

impl std::fmt::Debug for RealDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RealDriver")
    }
}

fn to_usize(v: u64, call: &'static str) -> DResult<usize> {
    usize::try_from(v).map_err(|_| DriverError {
        call,
        code: code::INVALID_VALUE,
    })
}

impl RealDriver {
    /// The process's driver, loaded and initialised (`cuInit`) on first use.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] when no CUDA driver library is installed,
    /// it lacks an entry point the backend needs, or `cuInit` fails (no
    /// device, driver/kernel-module mismatch).
    pub fn shared() -> Result<Arc<RealDriver>> {
        static SHARED: OnceLock<std::result::Result<Arc<RealDriver>, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| RealDriver::load().map(Arc::new))
            .clone()
            .map_err(Error::CudaUnavailable)
    }

    fn load() -> std::result::Result<RealDriver, String> {
        // SAFETY: `is_culib_present` only tries to open the library by name.
        if !unsafe { sys::is_culib_present() } {
            return Err("no CUDA driver library (libcuda.so) was found".into());
        }
        // SAFETY: the library is present (checked just above), so `culib`
        // opens it instead of panicking; the handle lives for the process.
        let lib = unsafe { sys::culib() };
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the field's type is this entry point's prototype in
                // `cuda.h` with `CUresult` as `u32` (a C enum is an `int`) and
                // enum parameters as `c_uint`; the library outlives the pointer.
                let s = unsafe { lib.get($name.as_bytes()) };
                match s {
                    Ok(s) => *s,
                    Err(e) => return Err(format!("the CUDA driver lacks {}: {e}", $name)),
                }
            }};
        }
        let t = Table {
            init: sym!("cuInit"),
            device_get_count: sym!("cuDeviceGetCount"),
            device_get: sym!("cuDeviceGet"),
            device_get_uuid: sym!("cuDeviceGetUuid_v2"),
            device_get_attribute: sym!("cuDeviceGetAttribute"),
            primary_ctx_retain: sym!("cuDevicePrimaryCtxRetain"),
            primary_ctx_release: sym!("cuDevicePrimaryCtxRelease_v2"),
            ctx_get_current: sym!("cuCtxGetCurrent"),
            ctx_push_current: sym!("cuCtxPushCurrent_v2"),
            ctx_pop_current: sym!("cuCtxPopCurrent_v2"),
            ctx_get_device: sym!("cuCtxGetDevice"),
            ctx_synchronize: sym!("cuCtxSynchronize"),
            mem_get_info: sym!("cuMemGetInfo_v2"),
            mem_get_allocation_granularity: sym!("cuMemGetAllocationGranularity"),
            mem_create: sym!("cuMemCreate"),
            mem_export_to_shareable_handle: sym!("cuMemExportToShareableHandle"),
            mem_import_from_shareable_handle: sym!("cuMemImportFromShareableHandle"),
            mem_address_reserve: sym!("cuMemAddressReserve"),
            mem_address_free: sym!("cuMemAddressFree"),
            mem_map: sym!("cuMemMap"),
            mem_unmap: sym!("cuMemUnmap"),
            mem_set_access: sym!("cuMemSetAccess"),
            mem_release: sym!("cuMemRelease"),
            mem_alloc: sym!("cuMemAlloc_v2"),
            mem_free: sym!("cuMemFree_v2"),
            stream_create: sym!("cuStreamCreate"),
            stream_destroy: sym!("cuStreamDestroy_v2"),
            stream_synchronize: sym!("cuStreamSynchronize"),
            stream_query: sym!("cuStreamQuery"),
            stream_wait_value64: sym!("cuStreamWaitValue64_v2"),
            stream_write_value64: sym!("cuStreamWriteValue64_v2"),
            stream_batch_mem_op: sym!("cuStreamBatchMemOp_v2"),
            memcpy_dtod_async: sym!("cuMemcpyDtoDAsync_v2"),
            memcpy_dtoh: sym!("cuMemcpyDtoH_v2"),
            memset_d8: sym!("cuMemsetD8_v2"),
            memset_d32_async: sym!("cuMemsetD32Async"),
            mem_host_register: sym!("cuMemHostRegister_v2"),
            mem_host_unregister: sym!("cuMemHostUnregister"),
            mem_host_get_device_pointer: sym!("cuMemHostGetDevicePointer_v2"),
            module_load_data: sym!("cuModuleLoadData"),
            module_unload: sym!("cuModuleUnload"),
            module_get_function: sym!("cuModuleGetFunction"),
            launch_kernel: sym!("cuLaunchKernel"),
            graph_create: sym!("cuGraphCreate"),
            // The first version's ABI (CUDA 10+), whose parameter block
            // `KernelNodeParams` mirrors.
            graph_add_kernel_node: sym!("cuGraphAddKernelNode"),
            graph_instantiate: sym!("cuGraphInstantiateWithFlags"),
            graph_destroy: sym!("cuGraphDestroy"),
            graph_launch: sym!("cuGraphLaunch"),
            graph_exec_destroy: sym!("cuGraphExecDestroy"),
        };
        let d = RealDriver { t };
        d.init().map_err(|e| format!("{e}"))?;
        Ok(d)
    }

    fn prop(dev: CuDevice) -> MemAllocationProp {
        MemAllocationProp {
            type_: ALLOCATION_TYPE_PINNED,
            requested_handle_types: HANDLE_TYPE_POSIX_FD,
            location: MemLocation {
                type_: LOCATION_TYPE_DEVICE,
                id: dev,
            },
            win32_handle_meta_data: std::ptr::null_mut(),
            compression_type: 0,
            gpu_direct_rdma_capable: 0,
            usage: 0,
            reserved: [0; 4],
        }
    }
}

impl Driver for RealDriver {
    fn init(&self) -> DResult<()> {
        // SAFETY: `cuInit` takes flags by value; 0 is the only valid value.
        DriverError::check("cuInit", unsafe { (self.t.init)(0) })
    }

    fn device_count(&self) -> DResult<i32> {
        let mut n: c_int = 0;
        // SAFETY: out-parameter is a valid `int`.
        DriverError::check("cuDeviceGetCount", unsafe { (self.t.device_get_count)(&mut n) })?;
        Ok(n)
    }

    fn device_get(&self, ordinal: i32) -> DResult<CuDevice> {
        let mut d: c_int = 0;
        // SAFETY: out-parameter is a valid `int`; the driver checks the ordinal.
        DriverError::check("cuDeviceGet", unsafe { (self.t.device_get)(&mut d, ordinal) })?;
        Ok(d)
    }

    fn device_uuid(&self, dev: CuDevice) -> DResult<[u8; 16]> {
        let mut u = sys::CUuuid { bytes: [0; 16] };
        // SAFETY: out-parameter is a valid `CUuuid`; the driver checks `dev`.
        DriverError::check("cuDeviceGetUuid_v2", unsafe { (self.t.device_get_uuid)(&mut u, dev) })?;
        Ok(u.bytes.map(|b| b as u8))
    }

    fn device_attribute(&self, attr: u32, dev: CuDevice) -> DResult<i32> {
        let mut v: c_int = 0;
        // SAFETY: out-parameter is a valid `int`; the driver checks `attr` and `dev`.
        DriverError::check("cuDeviceGetAttribute", unsafe {
            (self.t.device_get_attribute)(&mut v, attr, dev)
        })?;
        Ok(v)
    }

    fn primary_ctx_retain(&self, dev: CuDevice) -> DResult<CuContext> {
        let mut c: Ctx = std::ptr::null_mut();
        // SAFETY: out-parameter is a valid `CUcontext`; the driver checks `dev`.
        DriverError::check("cuDevicePrimaryCtxRetain", unsafe {
            (self.t.primary_ctx_retain)(&mut c, dev)
        })?;
        Ok(CuContext::from_raw(c))
    }

    fn primary_ctx_release(&self, dev: CuDevice) -> DResult<()> {
        // SAFETY: takes the device by value; the driver checks it and the refcount.
        DriverError::check("cuDevicePrimaryCtxRelease_v2", unsafe {
            (self.t.primary_ctx_release)(dev)
        })
    }

    fn ctx_get_current(&self) -> DResult<Option<CuContext>> {
        let mut c: Ctx = std::ptr::null_mut();
        // SAFETY: out-parameter is a valid `CUcontext`.
        DriverError::check("cuCtxGetCurrent", unsafe { (self.t.ctx_get_current)(&mut c) })?;
        Ok((!c.is_null()).then(|| CuContext::from_raw(c)))
    }

    unsafe fn ctx_push_current(&self, ctx: CuContext) -> DResult<()> {
        // SAFETY: the caller passes a live context of this driver (trait contract).
        DriverError::check("cuCtxPushCurrent_v2", unsafe {
            (self.t.ctx_push_current)(ctx.as_raw())
        })
    }

    fn ctx_pop_current(&self) -> DResult<Option<CuContext>> {
        let mut c: Ctx = std::ptr::null_mut();
        // SAFETY: out-parameter is a valid `CUcontext`.
        DriverError::check("cuCtxPopCurrent_v2", unsafe { (self.t.ctx_pop_current)(&mut c) })?;
        Ok((!c.is_null()).then(|| CuContext::from_raw(c)))
    }

    fn ctx_get_device(&self) -> DResult<CuDevice> {
        let mut d: c_int = 0;
        // SAFETY: out-parameter is a valid `int`.
        DriverError::check("cuCtxGetDevice", unsafe { (self.t.ctx_get_device)(&mut d) })?;
        Ok(d)
    }

    fn ctx_synchronize(&self) -> DResult<()> {
        // SAFETY: no arguments; acts on the current context.
        DriverError::check("cuCtxSynchronize", unsafe { (self.t.ctx_synchronize)() })
    }

    fn mem_get_info(&self) -> DResult<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-parameters are valid `size_t`s.
        DriverError::check("cuMemGetInfo_v2", unsafe {
            (self.t.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    fn mem_granularity(&self, dev: CuDevice) -> DResult<u64> {
        let prop = Self::prop(dev);
        let mut g = 0usize;
        // SAFETY: out-parameter is a valid `size_t`; `prop` is a fully
        // initialised `CUmemAllocationProp` that outlives the call.
        DriverError::check("cuMemGetAllocationGranularity", unsafe {
            (self.t.mem_get_allocation_granularity)(&mut g, &prop, GRANULARITY_MINIMUM)
        })?;
        Ok(g as u64)
    }

    fn mem_create(&self, bytes: u64, dev: CuDevice) -> DResult<MemHandle> {
        let size = to_usize(bytes, "cuMemCreate")?;
        let prop = Self::prop(dev);
        let mut h: c_ulonglong = 0;
        // SAFETY: out-parameter is a valid handle slot; `prop` is fully
        // initialised and outlives the call; flags must be 0.
        DriverError::check("cuMemCreate", unsafe { (self.t.mem_create)(&mut h, size, &prop, 0) })?;
        Ok(MemHandle(h))
    }

    unsafe fn mem_export_fd(&self, handle: MemHandle) -> DResult<OwnedFd> {
        let mut fd: c_int = -1;
        // SAFETY: for the POSIX FD handle type the out-parameter is an `int`;
        // `handle` is live (trait contract); flags must be 0.
        DriverError::check("cuMemExportToShareableHandle", unsafe {
            (self.t.mem_export_to_shareable_handle)((&mut fd as *mut c_int).cast(), handle.0, HANDLE_TYPE_POSIX_FD, 0)
        })?;
        if fd < 0 {
            return Err(DriverError {
                call: "cuMemExportToShareableHandle",
                code: code::UNKNOWN,
            });
        }
        // SAFETY: the driver returned a new descriptor that nothing else owns;
        // the caller owns it from here (CUDA docs: the application closes it).
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn mem_import_fd(&self, fd: BorrowedFd<'_>) -> DResult<MemHandle> {
        let mut h: c_ulonglong = 0;
        // For the POSIX FD handle type the "OS handle" argument is the
        // descriptor's value cast to a pointer, not a pointer to it. The driver
        // does not take ownership: `fd` stays the caller's.
        let os = fd.as_raw_fd() as isize as *mut c_void;
        // SAFETY: out-parameter is a valid handle slot; `fd` is open for the call.
        DriverError::check("cuMemImportFromShareableHandle", unsafe {
            (self.t.mem_import_from_shareable_handle)(&mut h, os, HANDLE_TYPE_POSIX_FD)
        })?;
        Ok(MemHandle(h))
    }

    fn mem_address_reserve(&self, bytes: u64, align: u64) -> DResult<DevicePtr> {
        let (size, align) = (
            to_usize(bytes, "cuMemAddressReserve")?,
            to_usize(align, "cuMemAddressReserve")?,
        );
        let mut p: u64 = 0;
        // SAFETY: out-parameter is a valid `CUdeviceptr`; no fixed address, flags 0.
        DriverError::check("cuMemAddressReserve", unsafe {
            (self.t.mem_address_reserve)(&mut p, size, align, 0, 0)
        })?;
        Ok(p)
    }

    unsafe fn mem_address_free(&self, ptr: DevicePtr, bytes: u64) -> DResult<()> {
        let size = to_usize(bytes, "cuMemAddressFree")?;
        // SAFETY: the range was reserved by this driver and is unmapped (trait contract).
        DriverError::check("cuMemAddressFree", unsafe { (self.t.mem_address_free)(ptr, size) })
    }

    unsafe fn mem_map(&self, ptr: DevicePtr, bytes: u64, handle: MemHandle) -> DResult<()> {
        let size = to_usize(bytes, "cuMemMap")?;
        // SAFETY: range reserved and handle live (trait contract); offset and flags 0.
        DriverError::check("cuMemMap", unsafe { (self.t.mem_map)(ptr, size, 0, handle.0, 0) })
    }

    unsafe fn mem_unmap(&self, ptr: DevicePtr, bytes: u64) -> DResult<()> {
        let size = to_usize(bytes, "cuMemUnmap")?;
        // SAFETY: the range is a mapping made by the caller (trait contract).
        DriverError::check("cuMemUnmap", unsafe { (self.t.mem_unmap)(ptr, size) })
    }

    unsafe fn mem_set_access(&self, ptr: DevicePtr, bytes: u64, dev: CuDevice, access: Access) -> DResult<()> {
        let size = to_usize(bytes, "cuMemSetAccess")?;
        let desc = MemAccessDesc {
            location: MemLocation {
                type_: LOCATION_TYPE_DEVICE,
                id: dev,
            },
            flags: access.flags(),
        };
        // SAFETY: one initialised descriptor that outlives the call; the range
        // is mapped by the caller (trait contract).
        DriverError::check("cuMemSetAccess", unsafe {
            (self.t.mem_set_access)(ptr, size, &desc, 1)
        })
    }

    unsafe fn mem_release(&self, handle: MemHandle) -> DResult<()> {
        // SAFETY: the handle is live (trait contract).
        DriverError::check("cuMemRelease", unsafe { (self.t.mem_release)(handle.0) })
    }

    fn mem_alloc(&self, bytes: u64) -> DResult<DevicePtr> {
        let size = to_usize(bytes, "cuMemAlloc_v2")?;
        let mut p: u64 = 0;
        // SAFETY: out-parameter is a valid `CUdeviceptr`.
        DriverError::check("cuMemAlloc_v2", unsafe { (self.t.mem_alloc)(&mut p, size) })?;
        Ok(p)
    }

    unsafe fn mem_free(&self, ptr: DevicePtr) -> DResult<()> {
        // SAFETY: `ptr` came from `mem_alloc` and no work uses it (trait contract).
        DriverError::check("cuMemFree_v2", unsafe { (self.t.mem_free)(ptr) })
    }

    fn stream_create_non_blocking(&self) -> DResult<CuStream> {
        let mut s: Strm = std::ptr::null_mut();
        // SAFETY: out-parameter is a valid `CUstream`.
        DriverError::check("cuStreamCreate", unsafe {
            (self.t.stream_create)(&mut s, STREAM_NON_BLOCKING)
        })?;
        Ok(CuStream::from_raw(s))
    }

    unsafe fn stream_destroy(&self, stream: CuStream) -> DResult<()> {
        // SAFETY: the stream is live (trait contract).
        DriverError::check("cuStreamDestroy_v2", unsafe {
            (self.t.stream_destroy)(stream.as_raw())
        })
    }

    unsafe fn stream_synchronize(&self, stream: CuStream) -> DResult<()> {
        // SAFETY: the stream is live (trait contract).
        DriverError::check("cuStreamSynchronize", unsafe {
            (self.t.stream_synchronize)(stream.as_raw())
        })
    }

    unsafe fn memcpy_dtod_async(&self, dst: DevicePtr, src: DevicePtr, bytes: u64, stream: CuStream) -> DResult<()> {
        let n = to_usize(bytes, "cuMemcpyDtoDAsync_v2")?;
        // SAFETY: both ranges are device memory the caller owns and the
        // stream is live (trait contract).
        DriverError::check("cuMemcpyDtoDAsync_v2", unsafe {
            (self.t.memcpy_dtod_async)(dst, src, n, stream.as_raw())
        })
    }

    unsafe fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> DResult<()> {
        // SAFETY: `dst` is a writable host buffer of exactly the length
        // passed; `src` is device memory the caller owns (trait contract).
        DriverError::check("cuMemcpyDtoH_v2", unsafe {
            (self.t.memcpy_dtoh)(dst.as_mut_ptr().cast(), src, dst.len())
        })
    }

    unsafe fn memset_d8(&self, dst: DevicePtr, value: u8, bytes: u64) -> DResult<()> {
        let n = to_usize(bytes, "cuMemsetD8_v2")?;
        // SAFETY: the range is device memory the caller owns (trait contract).
        DriverError::check("cuMemsetD8_v2", unsafe { (self.t.memset_d8)(dst, value, n) })
    }

    unsafe fn memset_d32_async(&self, dst: DevicePtr, value: u32, words: u64, stream: CuStream) -> DResult<()> {
        let n = to_usize(words, "cuMemsetD32Async")?;
        // SAFETY: the range is device memory the caller owns and the stream
        // is live (trait contract).
        DriverError::check("cuMemsetD32Async", unsafe {
            (self.t.memset_d32_async)(dst, value, n, stream.as_raw())
        })
    }

    unsafe fn mem_host_register(&self, ptr: *mut c_void, bytes: u64) -> DResult<()> {
        let n = to_usize(bytes, "cuMemHostRegister_v2")?;
        // SAFETY: the range is mapped host memory that stays mapped until
        // it is unregistered (trait contract).
        DriverError::check("cuMemHostRegister_v2", unsafe {
            (self.t.mem_host_register)(ptr, n, HOST_REGISTER_DEVICEMAP)
        })
    }

    unsafe fn mem_host_register_read_only(&self, ptr: *const c_void, bytes: u64) -> DResult<()> {
        let n = to_usize(bytes, "cuMemHostRegister_v2")?;
        // SAFETY: the range is mapped host memory that stays mapped until
        // it is unregistered (trait contract); READ_ONLY makes the driver
        // pin it without asking for write access.
        DriverError::check("cuMemHostRegister_v2", unsafe {
            (self.t.mem_host_register)(ptr.cast_mut(), n, HOST_REGISTER_DEVICEMAP | HOST_REGISTER_READ_ONLY)
        })
    }

    unsafe fn stream_wait_value_geq(&self, stream: CuStream, addr: DevicePtr, value: u64) -> DResult<()> {
        // SAFETY: a live stream and device-visible memory that outlives the
        // wait (trait contract).
        DriverError::check("cuStreamWaitValue64_v2", unsafe {
            (self.t.stream_wait_value64)(stream.as_raw(), addr, value, STREAM_WAIT_VALUE_GEQ)
        })
    }

    unsafe fn stream_write_value64(&self, stream: CuStream, addr: DevicePtr, value: u64) -> DResult<()> {
        // SAFETY: a live stream and device memory of this context that
        // outlives the write (trait contract).
        DriverError::check("cuStreamWriteValue64_v2", unsafe {
            (self.t.stream_write_value64)(stream.as_raw(), addr, value, STREAM_WRITE_VALUE_DEFAULT)
        })
    }

    unsafe fn stream_write_values64(&self, stream: CuStream, writes: &[(DevicePtr, u64)]) -> DResult<()> {
        let Ok(count) = c_uint::try_from(writes.len()) else {
            return DriverError::check("cuStreamBatchMemOp_v2", code::INVALID_VALUE);
        };
        if count == 0 || count > 255 {
            return DriverError::check("cuStreamBatchMemOp_v2", code::INVALID_VALUE);
        }
        let mut ops: Vec<sys::CUstreamBatchMemOpParams> = writes
            .iter()
            .map(|&(address, v)| sys::CUstreamBatchMemOpParams {
                writeValue: sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st {
                    operation: sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_64,
                    address,
                    __bindgen_anon_1:
                        sys::CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st__bindgen_ty_1 {
                            value64: v,
                        },
                    flags: STREAM_WRITE_VALUE_DEFAULT,
                    alias: 0,
                },
            })
            .collect();
        // SAFETY: a live stream and device-visible memory that outlives the
        // writes (trait contract); `ops` holds `count` write operations
        // (the union member the operation names is the one initialised)
        // and lives across the call, which copies them.
        DriverError::check("cuStreamBatchMemOp_v2", unsafe {
            (self.t.stream_batch_mem_op)(stream.as_raw(), count, ops.as_mut_ptr(), 0)
        })
    }

    unsafe fn stream_query(&self, stream: CuStream) -> DResult<bool> {
        // SAFETY: a live stream (trait contract).
        match unsafe { (self.t.stream_query)(stream.as_raw()) } {
            code::NOT_READY => Ok(false),
            c => DriverError::check("cuStreamQuery", c).map(|()| true),
        }
    }

    unsafe fn mem_host_unregister(&self, ptr: *mut c_void) -> DResult<()> {
        // SAFETY: `ptr` was registered and no work uses it (trait contract).
        DriverError::check("cuMemHostUnregister", unsafe { (self.t.mem_host_unregister)(ptr) })
    }

    unsafe fn mem_host_device_pointer(&self, ptr: *mut c_void) -> DResult<DevicePtr> {
        let mut d: u64 = 0;
        // SAFETY: out-parameter is a valid `CUdeviceptr`; `ptr` lies in
        // registered memory (trait contract); flags must be 0.
        DriverError::check("cuMemHostGetDevicePointer_v2", unsafe {
            (self.t.mem_host_get_device_pointer)(&mut d, ptr, 0)
        })?;
        Ok(d)
    }

    fn module_load_data(&self, image: &CStr) -> DResult<CuModule> {
        let mut m: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: out-parameter is a valid `CUmodule`; `image` is a
        // NUL-terminated PTX text that outlives the call.
        DriverError::check("cuModuleLoadData", unsafe {
            (self.t.module_load_data)(&mut m, image.as_ptr().cast())
        })?;
        Ok(CuModule::from_raw(m))
    }

    unsafe fn module_unload(&self, module: CuModule) -> DResult<()> {
        // SAFETY: the module is live (trait contract).
        DriverError::check("cuModuleUnload", unsafe { (self.t.module_unload)(module.as_raw()) })
    }

    unsafe fn module_get_function(&self, module: CuModule, name: &CStr) -> DResult<CuFunction> {
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: out-parameter is a valid `CUfunction`; the module is live
        // (trait contract); `name` is NUL-terminated.
        DriverError::check("cuModuleGetFunction", unsafe {
            (self.t.module_get_function)(&mut f, module.as_raw(), name.as_ptr())
        })?;
        Ok(CuFunction::from_raw(f))
    }

    unsafe fn launch_kernel(
        &self,
        f: CuFunction,
        grid: u32,
        block: u32,
        stream: CuStream,
        params: &mut [*mut c_void],
    ) -> DResult<()> {
        // SAFETY: `params` holds one valid pointer per kernel parameter and
        // the function and stream are live (the caller's contract); no extra.
        DriverError::check("cuLaunchKernel", unsafe {
            (self.t.launch_kernel)(
                f.as_raw(),
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                stream.as_raw(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    unsafe fn graph_of_kernels(&self, nodes: &[KernelNode]) -> DResult<CuGraphExec> {
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; flags must be 0.
        DriverError::check("cuGraphCreate", unsafe { (self.t.graph_create)(&mut graph, 0) })?;
        let made = (|| {
            let mut prev: Option<sys::CUgraphNode> = None;
            for n in nodes {
                let mut values = n.params.clone();
                let mut ptrs: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
                let p = KernelNodeParams {
                    func: n.function.as_raw(),
                    grid: [n.grid, 1, 1],
                    block: [n.block, 1, 1],
                    shared_mem_bytes: 0,
                    kernel_params: ptrs.as_mut_ptr(),
                    extra: std::ptr::null_mut(),
                };
                let mut node: sys::CUgraphNode = std::ptr::null_mut();
                let (deps, ndeps) = match &prev {
                    Some(d) => (d as *const sys::CUgraphNode, 1),
                    None => (std::ptr::null(), 0),
                };
                // SAFETY: `graph` is live; `deps` points at `ndeps` nodes of
                // it; `p` names a live kernel whose parameters are these
                // 64-bit values (this method's contract), which the driver
                // copies before returning.
                DriverError::check("cuGraphAddKernelNode", unsafe {
                    (self.t.graph_add_kernel_node)(&mut node, graph, deps, ndeps, &p)
                })?;
                prev = Some(node);
            }
            let mut exec: sys::CUgraphExec = std::ptr::null_mut();
            // SAFETY: `graph` is live and complete; no flags.
            DriverError::check("cuGraphInstantiateWithFlags", unsafe {
                (self.t.graph_instantiate)(&mut exec, graph, 0)
            })?;
            Ok(CuGraphExec::from_raw(exec))
        })();
        // SAFETY: made above; an instantiated graph does not need it.
        let destroyed = DriverError::check("cuGraphDestroy", unsafe { (self.t.graph_destroy)(graph) });
        match (made, destroyed) {
            (Ok(exec), Ok(())) => Ok(exec),
            (Ok(exec), Err(e)) => {
                // SAFETY: instantiated above; never launched.
                if let Err(xe) = unsafe { self.graph_exec_destroy(exec) } {
                    tracing::warn!(error = %xe, "destroying a graph instance after a failed cuGraphDestroy");
                }
                Err(e)
            }
            (Err(e), _) => Err(e),
        }
    }

    unsafe fn graph_launch(&self, exec: CuGraphExec, stream: CuStream) -> DResult<()> {
        // SAFETY: the caller's contract (live exec and stream).
        DriverError::check("cuGraphLaunch", unsafe {
            (self.t.graph_launch)(exec.as_raw(), stream.as_raw())
        })
    }

    unsafe fn graph_exec_destroy(&self, exec: CuGraphExec) -> DResult<()> {
        // SAFETY: the caller's contract (live, nothing pending).
        DriverError::check("cuGraphExecDestroy", unsafe {
            (self.t.graph_exec_destroy)(exec.as_raw())
        })
    }
}
