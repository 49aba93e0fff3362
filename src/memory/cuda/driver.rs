//! The driver layer: one method per CUDA driver call the backend makes.
//!
//! [`Driver`] is the seam between the safe owner types ([`super::CudaPool`],
//! [`super::CudaImport`], the test kit's `PatternKernels`) and the driver. It has
//! two implementations: [`super::RealDriver`] (the CUDA driver library,
//! loaded at run time) and `FakeDriver` (`vramring-testkit`) (host memory, fault
//! injection, context tracking) for tests without a GPU.
//!
//! Every method returns `Result<_, DriverError>`; a `DriverError` becomes the
//! crate's [`Error::Driver`] through `?`.
//!
//! Handles ([`CuContext`], [`CuStream`], [`CuModule`], [`CuFunction`],
//! [`MemHandle`]) are plain integers here, so owner types are `Send` and the
//! fake can make its own. Methods that take a handle or a device address are
//! `unsafe`: the real driver dereferences handles and writes device memory,
//! which may alias host memory on systems with unified addressing.

use std::ffi::{c_void, CStr};
use std::os::fd::{BorrowedFd, OwnedFd};

use crate::error::Error;

/// A device address (`CUdeviceptr`).
pub type DevicePtr = u64;

/// A device ordinal in this process (`CUdevice`). Ordinals differ between
/// processes and containers; match devices by UUID.
pub type CuDevice = i32;

macro_rules! handle {
    ($(#[$m:meta])* $name:ident, $raw:ty) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(u64);

        impl $name {
            /// Wraps a raw driver handle.
            pub fn from_raw(raw: $raw) -> Self {
                $name(raw as usize as u64)
            }
            /// The raw driver handle, as the driver API takes it.
            pub fn as_raw(self) -> $raw {
                self.0 as usize as $raw
            }
            /// The handle as an integer (for logs and fakes).
            pub const fn to_bits(self) -> u64 {
                self.0
            }
            /// A handle from its integer value (for fakes).
            pub const fn from_bits(bits: u64) -> Self {
                $name(bits)
            }
        }
    };
}

handle!(
    /// A CUDA context (`CUcontext`).
    CuContext,
    cudarc::driver::sys::CUcontext
);
handle!(
    /// A CUDA stream (`CUstream`).
    CuStream,
    cudarc::driver::sys::CUstream
);
handle!(
    /// A loaded module (`CUmodule`).
    CuModule,
    cudarc::driver::sys::CUmodule
);
handle!(
    /// A kernel in a loaded module (`CUfunction`).
    CuFunction,
    cudarc::driver::sys::CUfunction
);
handle!(
    /// An instantiated graph (`CUgraphExec`).
    CuGraphExec,
    cudarc::driver::sys::CUgraphExec
);

/// One kernel node of a graph made by [`Driver::graph_of_kernels`]: one
/// dimension of `grid` blocks of `block` threads, every parameter a 64-bit
/// value (an address or a count), copied into the graph when it is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelNode {
    /// The kernel.
    pub function: CuFunction,
    /// Blocks.
    pub grid: u32,
    /// Threads per block.
    pub block: u32,
    /// The kernel's parameters, in order.
    pub params: Vec<u64>,
}

/// A physical allocation handle (`CUmemGenericAllocationHandle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemHandle(pub u64);

/// `CUresult` codes the crate names. The driver's codes are kept as `u32`
/// and matched, never converted into a Rust enum.
pub mod code {
    /// `CUDA_SUCCESS`.
    pub const SUCCESS: u32 = 0;
    /// `CUDA_ERROR_INVALID_VALUE`.
    pub const INVALID_VALUE: u32 = 1;
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub const OUT_OF_MEMORY: u32 = 2;
    /// `CUDA_ERROR_NOT_INITIALIZED`.
    pub const NOT_INITIALIZED: u32 = 3;
    /// `CUDA_ERROR_NO_DEVICE`.
    pub const NO_DEVICE: u32 = 100;
    /// `CUDA_ERROR_INVALID_DEVICE`.
    pub const INVALID_DEVICE: u32 = 101;
    /// `CUDA_ERROR_INVALID_IMAGE`.
    pub const INVALID_IMAGE: u32 = 200;
    /// `CUDA_ERROR_INVALID_CONTEXT`.
    pub const INVALID_CONTEXT: u32 = 201;
    /// `CUDA_ERROR_INVALID_HANDLE`.
    pub const INVALID_HANDLE: u32 = 400;
    /// `CUDA_ERROR_NOT_FOUND`.
    pub const NOT_FOUND: u32 = 500;
    /// `CUDA_ERROR_NOT_READY`.
    pub const NOT_READY: u32 = 600;
    /// `CUDA_ERROR_ILLEGAL_ADDRESS`.
    pub const ILLEGAL_ADDRESS: u32 = 700;
    /// `CUDA_ERROR_NOT_PERMITTED`.
    pub const NOT_PERMITTED: u32 = 800;
    /// `CUDA_ERROR_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: u32 = 801;
    /// `CUDA_ERROR_UNKNOWN`.
    pub const UNKNOWN: u32 = 999;
}

/// `CUdevice_attribute` codes the crate queries.
pub mod attr {
    /// `CU_DEVICE_ATTRIBUTE_INTEGRATED`.
    pub const INTEGRATED: u32 = 18;
    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
    pub const VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: u32 = 102;
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`.
    pub const HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: u32 = 103;
    /// `CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED`.
    pub const READ_ONLY_HOST_REGISTER_SUPPORTED: u32 = 113;
    /// `CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS` (CUDA 12 numbering).
    pub const CAN_USE_64_BIT_STREAM_MEM_OPS: u32 = 122;
    /// `CU_DEVICE_ATTRIBUTE_MPS_ENABLED` (CUDA 12.4+): contexts made on this
    /// device are shared through an MPS server.
    pub const MPS_ENABLED: u32 = 133;
}

/// Access a mapping grants to one device (`CUmemAccess_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// `CU_MEM_ACCESS_FLAGS_PROT_READ`.
    Read,
    /// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
    ReadWrite,
}

impl Access {
    /// The driver's `CUmemAccess_flags` value.
    pub const fn flags(self) -> u32 {
        match self {
            Access::Read => 1,
            Access::ReadWrite => 3,
        }
    }
}

/// A failed driver call: which call and the raw `CUresult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverError {
    /// The driver function, e.g. `"cuMemCreate"`.
    pub call: &'static str,
    /// The raw `CUresult`.
    pub code: u32,
}

impl DriverError {
    /// `Ok(())` for `CUDA_SUCCESS`, otherwise the error.
    pub fn check(call: &'static str, code: u32) -> DResult<()> {
        if code == code::SUCCESS {
            Ok(())
        } else {
            Err(DriverError { call, code })
        }
    }
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed with {} ({})", self.call, self.code, described(self.code))
    }
}

impl std::error::Error for DriverError {}

impl From<DriverError> for Error {
    fn from(e: DriverError) -> Self {
        Error::Driver {
            call: e.call,
            code: e.code,
            name: described(e.code),
        }
    }
}

/// Shorthand for a driver-layer result.
pub type DResult<T> = std::result::Result<T, DriverError>;

/// The driver's name for a `CUresult`, without calling the driver (error
/// paths must not depend on a driver that may be failing).
pub fn error_name(code: u32) -> &'static str {
    match code {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        46 => "CUDA_ERROR_DEVICES_UNAVAILABLE",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        200 => "CUDA_ERROR_INVALID_IMAGE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        209 => "CUDA_ERROR_NO_BINARY_FOR_GPU",
        218 => "CUDA_ERROR_INVALID_PTX",
        221 => "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
        222 => "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        304 => "CUDA_ERROR_OPERATING_SYSTEM",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        401 => "CUDA_ERROR_ILLEGAL_STATE",
        500 => "CUDA_ERROR_NOT_FOUND",
        600 => "CUDA_ERROR_NOT_READY",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        701 => "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        702 => "CUDA_ERROR_LAUNCH_TIMEOUT",
        719 => "CUDA_ERROR_LAUNCH_FAILED",
        800 => "CUDA_ERROR_NOT_PERMITTED",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        802 => "CUDA_ERROR_SYSTEM_NOT_READY",
        803 => "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        804 => "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        805 => "CUDA_ERROR_MPS_CONNECTION_FAILED",
        806 => "CUDA_ERROR_MPS_RPC_FAILURE",
        807 => "CUDA_ERROR_MPS_SERVER_NOT_READY",
        808 => "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
        809 => "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED",
        810 => "CUDA_ERROR_MPS_CLIENT_TERMINATED",
        999 => "CUDA_ERROR_UNKNOWN",
        _ => "unnamed CUresult",
    }
}

/// What a person can do about a `CUresult`, where the code alone does not
/// say: the MPS codes, which come from the deployment, not from vramring.
pub fn error_hint(code: u32) -> Option<&'static str> {
    Some(match code {
        805 => "this process could not reach the MPS control daemon or server: check CUDA_MPS_PIPE_DIRECTORY and that the daemon runs (docs/MPS.md)",
        807 => "the MPS server is not accepting clients: it is starting or recovering (retry shortly), or it runs as another user than this process (one UID for every client; docs/MPS.md)",
        808 => "the MPS server of this GPU serves no more client processes (every process with a CUDA context counts, and a GPU takes a fixed number: nvidia-cuda-mps-control(1)): run fewer CUDA processes on this GPU, e.g. one decoder process for many cameras (docs/MPS.md)",
        809 => "the GPU's work queues for MPS clients are used up: run fewer CUDA processes on this GPU, or lower CUDA_DEVICE_MAX_CONNECTIONS in each (docs/MPS.md)",
        810 => "the MPS server terminated this client: restart the process",
        _ => return None,
    })
}

/// The code's name, and what to do about it where [`error_hint`] says.
fn described(code: u32) -> String {
    match error_hint(code) {
        Some(h) => format!("{}; {h}", error_name(code)),
        None => error_name(code).to_owned(),
    }
}

/// One method per CUDA driver call the backend makes.
///
/// Context stacks are per thread, as in the driver: a push on one thread is
/// not seen by another.
///
/// # Safety contract of the `unsafe` methods
/// Every handle passed in was returned by this same driver and has not been
/// released; every device address range lies inside memory the caller owns
/// (a mapping it made, an allocation it made) and stays valid until the
/// stream work that uses it has completed; where a method writes device
/// memory, no Rust reference covers that memory.
pub trait Driver: Send + Sync + 'static {
    /// `cuInit(0)`.
    fn init(&self) -> DResult<()>;
    /// `cuDeviceGetCount`.
    fn device_count(&self) -> DResult<i32>;
    /// `cuDeviceGet`.
    fn device_get(&self, ordinal: i32) -> DResult<CuDevice>;
    /// `cuDeviceGetUuid_v2`.
    fn device_uuid(&self, dev: CuDevice) -> DResult<[u8; 16]>;
    /// `cuDeviceGetAttribute`; `attr` is a `CUdevice_attribute` code (see [`attr`]).
    fn device_attribute(&self, attr: u32, dev: CuDevice) -> DResult<i32>;
    /// `cuDevicePrimaryCtxRetain`.
    fn primary_ctx_retain(&self, dev: CuDevice) -> DResult<CuContext>;
    /// `cuDevicePrimaryCtxRelease_v2`.
    fn primary_ctx_release(&self, dev: CuDevice) -> DResult<()>;
    /// `cuCtxGetCurrent`; `None` when no context is current on this thread.
    fn ctx_get_current(&self) -> DResult<Option<CuContext>>;
    /// `cuCtxPushCurrent_v2`.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn ctx_push_current(&self, ctx: CuContext) -> DResult<()>;
    /// `cuCtxPopCurrent_v2`; returns the context popped.
    fn ctx_pop_current(&self) -> DResult<Option<CuContext>>;
    /// `cuCtxGetDevice` of the current context.
    fn ctx_get_device(&self) -> DResult<CuDevice>;
    /// `cuCtxSynchronize` of the current context.
    fn ctx_synchronize(&self) -> DResult<()>;
    /// `cuMemGetInfo_v2` of the current context's device: `(free, total)`.
    fn mem_get_info(&self) -> DResult<(u64, u64)>;
    /// `cuMemGetAllocationGranularity` (minimum) for pinned device memory on
    /// `dev` exportable as a POSIX file descriptor.
    fn mem_granularity(&self, dev: CuDevice) -> DResult<u64>;
    /// `cuMemCreate` of `bytes` pinned bytes on `dev`, exportable as a POSIX
    /// file descriptor.
    fn mem_create(&self, bytes: u64, dev: CuDevice) -> DResult<MemHandle>;
    /// `cuMemExportToShareableHandle` as `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
    /// The caller owns the returned descriptor; the allocation stays owned
    /// by `handle`.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn mem_export_fd(&self, handle: MemHandle) -> DResult<OwnedFd>;
    /// `cuMemImportFromShareableHandle` of a POSIX file descriptor. The driver
    /// does not take ownership of `fd`: the caller still owns and closes it.
    fn mem_import_fd(&self, fd: BorrowedFd<'_>) -> DResult<MemHandle>;
    /// `cuMemAddressReserve` of `bytes` aligned to `align`.
    fn mem_address_reserve(&self, bytes: u64, align: u64) -> DResult<DevicePtr>;
    /// `cuMemAddressFree`.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn mem_address_free(&self, ptr: DevicePtr, bytes: u64) -> DResult<()>;
    /// `cuMemMap` of the whole of `handle` (offset 0) at `ptr`.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn mem_map(&self, ptr: DevicePtr, bytes: u64, handle: MemHandle) -> DResult<()>;
    /// `cuMemUnmap`.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn mem_unmap(&self, ptr: DevicePtr, bytes: u64) -> DResult<()>;
    /// `cuMemSetAccess` for one device.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn mem_set_access(&self, ptr: DevicePtr, bytes: u64, dev: CuDevice, access: Access) -> DResult<()>;
    /// `cuMemRelease`.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn mem_release(&self, handle: MemHandle) -> DResult<()>;
    /// `cuMemAlloc_v2` in the current context.
    fn mem_alloc(&self, bytes: u64) -> DResult<DevicePtr>;
    /// `cuMemFree_v2`.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn mem_free(&self, ptr: DevicePtr) -> DResult<()>;
    /// `cuStreamCreate(CU_STREAM_NON_BLOCKING)` in the current context.
    fn stream_create_non_blocking(&self) -> DResult<CuStream>;
    /// `cuStreamDestroy_v2`.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn stream_destroy(&self, stream: CuStream) -> DResult<()>;
    /// `cuStreamSynchronize`.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn stream_synchronize(&self, stream: CuStream) -> DResult<()>;
    /// `cuMemcpyDtoDAsync_v2`.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn memcpy_dtod_async(&self, dst: DevicePtr, src: DevicePtr, bytes: u64, stream: CuStream) -> DResult<()>;
    /// `cuMemcpyDtoH_v2` of `dst.len()` bytes. Synchronous, but ordered only
    /// with blocking streams: synchronise a non-blocking stream first.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> DResult<()>;
    /// `cuMemsetD8_v2` (synchronous).
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn memset_d8(&self, dst: DevicePtr, value: u8, bytes: u64) -> DResult<()>;
    /// `cuMemsetD32Async` of `words` 32-bit words.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn memset_d32_async(&self, dst: DevicePtr, value: u32, words: u64, stream: CuStream) -> DResult<()>;
    /// `cuModuleLoadData` of a NUL-terminated PTX image, in the current context.
    fn module_load_data(&self, image: &CStr) -> DResult<CuModule>;
    /// `cuModuleUnload`.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn module_unload(&self, module: CuModule) -> DResult<()>;
    /// `cuModuleGetFunction`.
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn module_get_function(&self, module: CuModule, name: &CStr) -> DResult<CuFunction>;
    /// `cuMemHostRegister_v2` of `bytes` at `ptr` with
    /// `CU_MEMHOSTREGISTER_DEVICEMAP`: pins the pages and maps them for the
    /// device, in the current context.
    ///
    /// # Safety
    /// `ptr..ptr+bytes` is mapped host memory of this process that stays
    /// mapped until [`Driver::mem_host_unregister`].
    unsafe fn mem_host_register(&self, ptr: *mut c_void, bytes: u64) -> DResult<()>;
    /// `cuMemHostRegister_v2` with `CU_MEMHOSTREGISTER_DEVICEMAP |
    /// CU_MEMHOSTREGISTER_READ_ONLY`: as [`Driver::mem_host_register`], for
    /// memory this process may only read (a read-only mapping); the device
    /// may only read it either.
    ///
    /// # Safety
    /// As [`Driver::mem_host_register`].
    unsafe fn mem_host_register_read_only(&self, ptr: *const c_void, bytes: u64) -> DResult<()>;
    /// `cuStreamWaitValue64_v2(stream, addr, value, CU_STREAM_WAIT_VALUE_GEQ)`:
    /// work enqueued on `stream` after this waits on the GPU until the
    /// 64-bit word at `addr` is at least `value` (unsigned). Nothing bounds
    /// the wait: a value that never comes blocks the stream for good.
    ///
    /// # Safety
    /// The trait's safety contract; `addr` is device-visible memory (here:
    /// registered host memory) that stays registered and mapped while the
    /// wait may still be pending.
    unsafe fn stream_wait_value_geq(&self, stream: CuStream, addr: DevicePtr, value: u64) -> DResult<()>;
    /// `cuStreamWriteValue64_v2(stream, addr, value, CU_STREAM_WRITE_VALUE_DEFAULT)`:
    /// once every earlier operation on `stream` has completed, the GPU
    /// stores `value` into the 64-bit word at `addr` (behind a memory
    /// barrier, as the default flag gives).
    ///
    /// # Safety
    /// The trait's safety contract; `addr` is 8 writable bytes of device
    /// memory of this context that stay mapped until the write has run.
    unsafe fn stream_write_value64(&self, stream: CuStream, addr: DevicePtr, value: u64) -> DResult<()>;
    /// `cuStreamBatchMemOp_v2` of `CU_STREAM_MEM_OP_WRITE_VALUE_64`
    /// operations with the default flags: one operation on `stream` that,
    /// once every earlier operation on it has completed, stores each
    /// `(addr, value)` in the order given, each behind the same memory
    /// barrier as [`Driver::stream_write_value64`]. At most 255 writes.
    ///
    /// # Safety
    /// The trait's safety contract; each `addr` is 8 writable bytes of
    /// device memory (or registered host memory) of this context that stay
    /// mapped until the writes have run.
    unsafe fn stream_write_values64(&self, stream: CuStream, writes: &[(DevicePtr, u64)]) -> DResult<()>;
    /// `cuStreamQuery`: `true` when every operation enqueued on `stream`
    /// has completed, `false` while some is pending (`CUDA_ERROR_NOT_READY`).
    ///
    /// # Safety
    /// See the trait's safety contract.
    unsafe fn stream_query(&self, stream: CuStream) -> DResult<bool>;
    /// `cuMemHostUnregister`.
    ///
    /// # Safety
    /// `ptr` was registered with [`Driver::mem_host_register`] and no
    /// pending work uses it.
    unsafe fn mem_host_unregister(&self, ptr: *mut c_void) -> DResult<()>;
    /// `cuMemHostGetDevicePointer_v2`: the device address of registered
    /// host memory at `ptr`.
    ///
    /// # Safety
    /// `ptr` lies in memory registered with [`Driver::mem_host_register`].
    unsafe fn mem_host_device_pointer(&self, ptr: *mut c_void) -> DResult<DevicePtr>;
    /// `cuLaunchKernel` with no shared memory and no `extra`.
    ///
    /// # Safety
    /// The trait's safety contract, and: `params` holds one pointer per
    /// kernel parameter, in order, each to a value of that parameter's type,
    /// valid for the duration of the call.
    unsafe fn launch_kernel(
        &self,
        f: CuFunction,
        grid: u32,
        block: u32,
        stream: CuStream,
        params: &mut [*mut c_void],
    ) -> DResult<()>;
    /// A graph of `nodes`, each depending on the one before, instantiated
    /// in the current context (`cuGraphCreate`, `cuGraphAddKernelNode`,
    /// `cuGraphInstantiateWithFlags`; the graph itself is destroyed once
    /// instantiated, on failure too).
    ///
    /// # Safety
    /// The trait's safety contract, and: each node's kernel takes exactly
    /// `params.len()` 64-bit parameters.
    unsafe fn graph_of_kernels(&self, nodes: &[KernelNode]) -> DResult<CuGraphExec>;
    /// `cuGraphLaunch`: enqueues one run of `exec` on `stream`, after the
    /// stream's earlier work and the graph's earlier runs.
    ///
    /// # Safety
    /// `exec` is live; every address its nodes use is valid until the run
    /// completes.
    unsafe fn graph_launch(&self, exec: CuGraphExec, stream: CuStream) -> DResult<()>;
    /// `cuGraphExecDestroy`.
    ///
    /// # Safety
    /// `exec` is live and no run of it is pending.
    unsafe fn graph_exec_destroy(&self, exec: CuGraphExec) -> DResult<()>;
}
