//! The GPU floor under the benches: checked driver calls, device 0's
//! primary context made current, a [`Gpu`] (a non-blocking stream in that
//! context, allocations, copies), PTX modules and launches, and the empty
//! kernel whose launch is the floor under a stream-order publish
//! ([`Floor`]).
//!
//! Every call is the CUDA driver's, through `cudarc`'s raw bindings; the
//! primary context is the one the vramring pool uses too, so what these
//! helpers allocate and enqueue lives in the ring's context.

use std::ffi::{c_void, CStr};

use cudarc::driver::sys;

use crate::R;

/// `Ok` when the driver call `call` returned `CUDA_SUCCESS`.
pub fn ck(call: &str, r: sys::CUresult) -> R<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {r:?}").into())
    }
}

/// Initialises the driver and makes device 0's primary context current on
/// this thread. The context stays retained for the life of the process.
pub fn make_primary_current() -> R<()> {
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        ck("cuInit", sys::cuInit(0))?;
        let mut dev = 0;
        ck("cuDeviceGet", sys::cuDeviceGet(&mut dev, 0))?;
        let mut ctx = std::ptr::null_mut();
        ck("cuDevicePrimaryCtxRetain", sys::cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
        ck("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx))?;
    }
    Ok(())
}

/// Device 0's name, or "unknown" where the driver cannot say.
pub fn gpu_name() -> String {
    let mut name = [0 as std::ffi::c_char; 128];
    // SAFETY: valid buffer of 128 chars; device 0 after cuInit.
    let ok = unsafe {
        sys::cuInit(0) == sys::CUresult::CUDA_SUCCESS
            && sys::cuDeviceGetName(name.as_mut_ptr(), 128, 0) == sys::CUresult::CUDA_SUCCESS
    };
    if !ok {
        return "unknown".into();
    }
    // SAFETY: the driver wrote a NUL-terminated string into `name`.
    unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned()
}

/// Device 0's primary context, current on the thread that made it, and a
/// non-blocking stream in it. Its allocations and the stream live as long
/// as the process unless freed ([`Gpu::free`], [`Gpu::close`]).
#[derive(Debug)]
pub struct Gpu {
    pub stream: sys::CUstream,
}

// SAFETY: a stream handle is valid on every thread of the process; a
// thread that uses it makes the primary context current first
// (`make_primary_current`), as the benches' threads do.
unsafe impl Send for Gpu {}

impl Gpu {
    /// Makes device 0's primary context current on this thread and
    /// creates a non-blocking stream in it.
    pub fn init() -> R<Gpu> {
        make_primary_current()?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the primary context is current.
        unsafe {
            ck(
                "cuStreamCreate",
                sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32),
            )?;
        }
        Ok(Gpu { stream })
    }

    /// `bytes` of device memory, not initialised.
    pub fn alloc(&self, bytes: usize) -> R<sys::CUdeviceptr> {
        let mut p = 0;
        // SAFETY: valid out-pointer; the primary context is current.
        unsafe { ck("cuMemAlloc", sys::cuMemAlloc_v2(&mut p, bytes))? };
        Ok(p)
    }

    /// `bytes` of device memory, every byte set to `value` (`cuMemsetD8`).
    pub fn alloc_filled(&self, bytes: usize, value: u8) -> R<sys::CUdeviceptr> {
        let p = self.alloc(bytes)?;
        // SAFETY: `p` is a live allocation of `bytes` in the current context.
        unsafe { ck("cuMemsetD8", sys::cuMemsetD8_v2(p, value, bytes))? };
        Ok(p)
    }

    /// Frees an allocation of [`Gpu::alloc`].
    ///
    /// # Safety
    /// `p` came from `alloc` or `alloc_filled` and no work still pending
    /// on the GPU uses it.
    pub unsafe fn free(&self, p: sys::CUdeviceptr) -> R<()> {
        // SAFETY: the caller's contract.
        unsafe { ck("cuMemFree", sys::cuMemFree_v2(p)) }
    }

    /// Enqueues the copy of `bytes` from `src` to `dst` on the stream
    /// (`cuMemcpyDtoDAsync`).
    ///
    /// # Safety
    /// Both are live device memory of the current context, `bytes` long
    /// at least, and stay live until the copy has completed.
    pub unsafe fn copy(&self, dst: sys::CUdeviceptr, src: sys::CUdeviceptr, bytes: usize) -> R<()> {
        // SAFETY: the caller's contract; our live stream.
        unsafe {
            ck(
                "cuMemcpyDtoDAsync",
                sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream),
            )
        }
    }

    /// Waits until the stream's work has completed.
    pub fn sync(&self) -> R<()> {
        // SAFETY: our own live stream.
        unsafe { ck("cuStreamSynchronize", sys::cuStreamSynchronize(self.stream)) }
    }

    /// Waits for the stream, then destroys it.
    pub fn close(self) -> R<()> {
        self.sync()?;
        // SAFETY: our own stream, idle; nothing uses it after.
        unsafe { ck("cuStreamDestroy", sys::cuStreamDestroy_v2(self.stream)) }
    }
}

/// Registers `len` bytes of host memory at `ptr` with the driver
/// (`cuMemHostRegister` with `flags`), pinned for DMA.
///
/// # Safety
/// `ptr..ptr + len` is live, page-aligned memory of this process that
/// stays mapped while registered; a context is current.
pub unsafe fn register_host(ptr: *mut c_void, len: usize, flags: u32) -> R<()> {
    // SAFETY: the caller's contract.
    unsafe { ck("cuMemHostRegister", sys::cuMemHostRegister_v2(ptr, len, flags)) }
}

/// Unregisters host memory [`register_host`] registered at `ptr`.
///
/// # Safety
/// `ptr` was registered in the current context and no pending GPU work
/// uses it.
pub unsafe fn unregister_host(ptr: *mut c_void) -> R<()> {
    // SAFETY: the caller's contract.
    unsafe { ck("cuMemHostUnregister", sys::cuMemHostUnregister(ptr)) }
}

/// The device address of registered host memory at `ptr`
/// (`cuMemHostGetDevicePointer`).
///
/// # Safety
/// `ptr` lies in memory registered with `CU_MEMHOSTREGISTER_DEVICEMAP`
/// ([`register_host`]) in the current context.
pub unsafe fn host_device_ptr(ptr: *mut c_void) -> R<sys::CUdeviceptr> {
    let mut d = 0;
    // SAFETY: the caller's contract; a valid out-pointer.
    unsafe {
        ck(
            "cuMemHostGetDevicePointer",
            sys::cuMemHostGetDevicePointer_v2(&mut d, ptr, 0),
        )?
    };
    Ok(d)
}

/// A PTX module loaded in the current context, unloaded on drop.
#[derive(Debug)]
pub struct Module(sys::CUmodule);

impl Module {
    /// Loads (and JIT-compiles) `ptx` in the current context.
    pub fn load(ptx: &CStr) -> R<Module> {
        let mut module = std::ptr::null_mut();
        // SAFETY: a NUL-terminated PTX image and a valid out-pointer.
        unsafe {
            ck(
                "cuModuleLoadData",
                sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()),
            )?
        };
        Ok(Module(module))
    }

    /// The kernel `name` of this module.
    pub fn function(&self, name: &CStr) -> R<sys::CUfunction> {
        let mut f = std::ptr::null_mut();
        // SAFETY: our live module, a NUL-terminated name, a valid out-pointer.
        unsafe {
            ck(
                "cuModuleGetFunction",
                sys::cuModuleGetFunction(&mut f, self.0, name.as_ptr()),
            )?
        };
        Ok(f)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded by `load`; its owners let their launches complete
        // before they drop it. A failure at teardown is ignored.
        unsafe { sys::cuModuleUnload(self.0) };
    }
}

/// Launches `f` on `stream`: `grid` blocks of `block` threads, no shared
/// memory (`cuLaunchKernel`).
///
/// # Safety
/// `f` is a live kernel of the current context whose parameters are
/// exactly those `params` point at, and what they address is valid for
/// the kernel; `stream` is live in that context.
pub unsafe fn launch(
    f: sys::CUfunction,
    grid: u32,
    block: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> R<()> {
    // SAFETY: the caller's contract.
    unsafe {
        ck(
            "cuLaunchKernel",
            sys::cuLaunchKernel(
                f,
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
        )
    }
}

/// An empty kernel, `vramring_floor`, with the commit kernel's parameter
/// (192 bytes by value): what one launch costs the producer's CPU, the
/// floor under vramring's stream-order publish (which is one such launch
/// plus the protocol's own work).
pub const FLOOR_PTX: &CStr = c"
.version 7.0
.target sm_70
.address_size 64
.visible .entry vramring_floor(.param .align 8 .b8 p_desc[192])
{
    ret;
}
";

/// [`FLOOR_PTX`]'s kernel, loaded, with a 192-byte descriptor to pass it.
#[derive(Debug)]
pub struct Floor {
    pub function: sys::CUfunction,
    /// The descriptor passed by value (zeros).
    pub desc: [u64; 24],
    _module: Module,
}

impl Floor {
    /// Loads the kernel in the current context.
    pub fn load() -> R<Floor> {
        let module = Module::load(FLOOR_PTX)?;
        let function = module.function(c"vramring_floor")?;
        Ok(Floor {
            function,
            desc: [0; 24],
            _module: module,
        })
    }

    /// Launches it, one block of 256 threads, as a publish launches its
    /// commit kernel.
    ///
    /// # Safety
    /// `stream` is live in the context the kernel was loaded in.
    pub unsafe fn launch(&mut self, stream: sys::CUstream) -> R<()> {
        let mut params = [self.desc.as_mut_ptr().cast::<c_void>()];
        // SAFETY: the kernel takes one 192-byte parameter, which `desc` is;
        // the caller's stream.
        unsafe { launch(self.function, 1, 256, stream, &mut params) }
    }

    /// Launches it `n` times on `gpu`'s stream, one launch every
    /// `interval_ns` from now (spinning in between, as a paced producer
    /// does), and returns this thread's CPU time per launch (ns,
    /// [`thread_cpu_ns`](crate::clock::thread_cpu_ns) around the call);
    /// waits for the launches before it returns.
    pub fn paced_cpu(&mut self, gpu: &Gpu, interval_ns: u64, n: u64) -> R<Vec<u64>> {
        use crate::clock::{now_ns, spin_until_ns, thread_cpu_ns};
        let mut cpu = Vec::with_capacity(n as usize);
        let start = now_ns();
        for k in 0..n {
            spin_until_ns(start + k * interval_ns);
            let c0 = thread_cpu_ns();
            // SAFETY: `gpu`'s live stream, in the current (primary) context
            // the kernel was loaded in.
            unsafe { self.launch(gpu.stream)? };
            cpu.push(thread_cpu_ns() - c0);
        }
        gpu.sync()?;
        Ok(cpu)
    }
}
