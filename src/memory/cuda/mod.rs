//! The CUDA backend: one VMM allocation holds the slot pool, exported as a
//! POSIX file descriptor, imported and mapped once per subscriber.
//!
//! Layers, as cudarc's `sys` / `result` / `safe`:
//!
//! 1. [`Driver`]: one method per driver call, `Result`-returning, with two
//!    implementations: [`RealDriver`] (the driver library, loaded at run
//!    time) and `FakeDriver` (host memory, fault injection, context
//!    tracking; in `vramring-testkit`) for tests without a GPU.
//! 2. [`ContextGuard`]: the ring's context current for a scope, the caller's
//!    context (nothing, or a foreign one) current again afterwards.
//! 3. Owners: [`CudaPool`] (the publisher's pool, an
//!    [`crate::memory::ExportedPool`]), [`CudaImport`] (a subscriber's
//!    mapping, own stream and own buffer, an [`crate::memory::ImportedPool`]).
//!
//! # Teardown
//! Every owner releases what it holds with its own context pushed, whatever
//! the caller has current, and restores the caller's context. Teardown runs
//! in dependency phases (streams quiesce before the memory they may touch is
//! unmapped; the primary context reference goes last). A handle is
//! forgotten only after the driver confirmed its release, so a failed
//! `close()` returns the error with everything still alive reachable and can
//! be called again; `Drop` makes one best-effort `close()` and logs. A
//! constructor that fails part-way unwinds what it made the same way.
//!
//! # Devices
//! Devices are matched by UUID, never by ordinal: `CUDA_VISIBLE_DEVICES`
//! and container device lists renumber GPUs per process.

mod commit;
mod context;
mod driver;
mod import;
mod mapping;
pub(crate) use mapping::VmmMapping;
mod pool;
mod real;

use std::os::fd::OwnedFd;
use std::sync::Arc;

pub use commit::{
    CommitDesc, CommitGraph, COMMIT_AT_KERNEL, COMMIT_GRAPH_WITHIN, COMMIT_KERNEL, FETCH_KERNEL, MAX_FANOUT,
    RING_ENTRIES,
};
pub use context::{with_context, ContextGuard};
pub use driver::{
    attr, code, error_name, Access, CuContext, CuDevice, CuFunction, CuGraphExec, CuModule, CuStream, DResult,
    DevicePtr, Driver, DriverError, KernelNode, MemHandle,
};
pub use import::CudaImport;
pub use pool::CudaPool;
pub use real::RealDriver;

use crate::error::{Error, Result};
use crate::lifecycle::memwatch::{effective_free_bytes, mem_available_bytes, FreeMemoryProbe};
use crate::memory::{ExportedPool, ImportedPool};

/// Which GPU a pool goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceSelector {
    /// The device with this ordinal in this process.
    Ordinal(i32),
    /// The device with this UUID.
    Uuid([u8; 16]),
}

/// A GPU as [`probe`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Ordinal in this process.
    pub ordinal: CuDevice,
    /// UUID.
    pub uuid: [u8; 16],
    /// Supports virtual memory management (`cuMemCreate`, `cuMemMap`).
    pub vmm: bool,
    /// Supports exporting allocations as POSIX file descriptors.
    pub posix_fd: bool,
    /// Integrated GPU (shares host memory).
    pub integrated: bool,
}

impl DeviceInfo {
    /// Whether the backend can put a ring on this device.
    pub fn usable(&self) -> bool {
        self.vmm && self.posix_fd
    }
}

/// `uuid` as `nvidia-smi -L` prints it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn format_uuid(uuid: &[u8; 16]) -> String {
    let h: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The ordinal, in this process, of the device whose UUID is `uuid`.
///
/// # Errors
/// [`Error::DeviceNotVisible`] when no visible device has that UUID;
/// [`Error::Driver`] when the driver cannot list devices.
pub fn find_device_by_uuid<D: Driver>(driver: &D, uuid: &[u8; 16]) -> Result<CuDevice> {
    let count = driver.device_count()?;
    for ordinal in 0..count {
        let dev = driver.device_get(ordinal)?;
        if driver.device_uuid(dev)? == *uuid {
            return Ok(dev);
        }
    }
    Err(Error::DeviceNotVisible {
        uuid: format_uuid(uuid),
    })
}

/// The device `sel` names and its UUID.
pub fn resolve_device<D: Driver>(driver: &D, sel: DeviceSelector) -> Result<(CuDevice, [u8; 16])> {
    match sel {
        DeviceSelector::Ordinal(ordinal) => {
            let count = driver.device_count()?;
            if !(0..count).contains(&ordinal) {
                return Err(Error::Config(format!(
                    "CUDA device ordinal {ordinal} does not exist here ({count} visible)"
                )));
            }
            let dev = driver.device_get(ordinal)?;
            Ok((dev, driver.device_uuid(dev)?))
        }
        DeviceSelector::Uuid(uuid) => Ok((find_device_by_uuid(driver, &uuid)?, uuid)),
    }
}

/// The capabilities of every device `driver` sees.
///
/// # Errors
/// [`Error::Driver`] when a query fails.
pub fn probe_with<D: Driver>(driver: &D) -> Result<Vec<DeviceInfo>> {
    driver.init()?;
    let count = driver.device_count()?;
    let mut out = Vec::with_capacity(count.max(0) as usize);
    for ordinal in 0..count {
        let dev = driver.device_get(ordinal)?;
        out.push(DeviceInfo {
            ordinal: dev,
            uuid: driver.device_uuid(dev)?,
            vmm: driver.device_attribute(attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev)? != 0,
            posix_fd: driver.device_attribute(attr::HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev)? != 0,
            integrated: driver.device_attribute(attr::INTEGRATED, dev)? != 0,
        })
    }
    Ok(out)
}

/// The GPUs of this machine, through the real driver.
///
/// # Errors
/// [`Error::CudaUnavailable`] without a usable CUDA driver; [`Error::Driver`]
/// when a query fails.
pub fn probe() -> Result<Vec<DeviceInfo>> {
    probe_with(&*RealDriver::shared()?)
}

/// Whether the CUDA backend can run here: a driver is installed and some GPU
/// supports VMM with POSIX file descriptor handles. What `--backend auto`
/// asks. Never panics.
pub fn cuda_usable() -> bool {
    probe().is_ok_and(|devs| devs.iter().any(DeviceInfo::usable))
}

/// Free memory of `dev` by the integrated-GPU rule
/// ([`effective_free_bytes`]), read with `ctx` (a live context on `dev`)
/// pushed.
///
/// # Safety
/// `ctx` is a live context of `driver` on device `dev`.
///
/// # Errors
/// [`Error::Driver`] when a query fails.
pub unsafe fn device_free_bytes<D: Driver>(driver: &D, ctx: CuContext, dev: CuDevice) -> Result<u64> {
    let integrated = driver.device_attribute(attr::INTEGRATED, dev)? != 0;
    // SAFETY: `ctx` is live (this function's contract).
    let (free, _total) = unsafe { context::with_context(driver, ctx, |d| Ok(d.mem_get_info()?)) }?;
    let available = if integrated { mem_available_bytes() } else { None };
    Ok(effective_free_bytes(free, available, integrated))
}

/// A [`FreeMemoryProbe`] for the [`MemoryWatchdog`](crate::lifecycle::MemoryWatchdog)
/// reading the free memory of `pool`'s device by the integrated-GPU rule.
/// The probe holds its own primary-context reference, released when the
/// probe is dropped.
///
/// # Errors
/// [`Error::Driver`] when the context cannot be retained.
pub fn free_memory_probe<D: Driver>(driver: Arc<D>, dev: CuDevice) -> Result<FreeMemoryProbe> {
    struct Probe<D: Driver> {
        driver: Arc<D>,
        dev: CuDevice,
        ctx: CuContext,
    }
    impl<D: Driver> Drop for Probe<D> {
        fn drop(&mut self) {
            if let Err(e) = self.driver.primary_ctx_release(self.dev) {
                tracing::warn!(error = %e, "releasing the free-memory probe's context reference");
            }
        }
    }
    let ctx = driver.primary_ctx_retain(dev)?;
    let p = Probe { driver, dev, ctx };
    Ok(Box::new(move || {
        // SAFETY: `p.ctx` is retained by `p` for as long as the closure lives.
        unsafe { device_free_bytes(&*p.driver, p.ctx, p.dev) }.ok()
    }))
}

/// The largest allocation granularity a push subscriber's buffers may be
/// rounded up to: what the publisher accepts past the bytes the buffers
/// need (current GPUs use 2 MiB).
pub const MAX_GRANULARITY: u64 = 32 << 20;

/// A pool on the GPU with this process's ordinal `ordinal`, through the real
/// driver, for the publisher.
///
/// # Errors
/// As [`CudaPool::create`].
pub(crate) fn create_pool(ordinal: u32, bytes: u64, graph: CommitGraph) -> Result<Box<dyn ExportedPool>> {
    let ordinal = i32::try_from(ordinal).map_err(|_| Error::Config(format!("CUDA device ordinal {ordinal}")))?;
    let mut pool = CudaPool::create_default(ordinal, bytes)?;
    pool.set_commit_graph(graph);
    Ok(Box::new(pool))
}

/// The import of a publisher's pool `fd` of `bytes` bytes on the GPU with
/// UUID `device_uuid`, through the real driver, for a subscriber. Closes `fd`.
///
/// # Errors
/// As [`CudaImport::import`].
pub fn import_pool(fd: OwnedFd, bytes: u64, device_uuid: [u8; 16], writable: bool) -> Result<Box<dyn ImportedPool>> {
    Ok(Box::new(CudaImport::import_default(fd, bytes, device_uuid, writable)?))
}

/// A push-only subscriber's CUDA side on the GPU `device_uuid` (no pool).
///
/// # Errors
/// As [`CudaImport::push_only`].
pub fn push_only(device_uuid: [u8; 16]) -> Result<Box<dyn ImportedPool>> {
    Ok(Box::new(CudaImport::push_only(RealDriver::shared()?, device_uuid)?))
}

/// `v` rounded up to a multiple of `to` (a power of two or any nonzero).
pub(crate) fn round_up(v: u64, to: u64) -> Option<u64> {
    v.checked_next_multiple_of(to.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_print_as_nvidia_smi_does() {
        let u = [0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(format_uuid(&u), "GPU-12345678-9abc-def0-0102-030405060708");
    }

    #[test]
    fn the_real_driver_is_an_error_not_a_panic_without_cuda() {
        // On a machine with a GPU this loads the driver; without one it
        // must fail cleanly.
        match RealDriver::shared() {
            Ok(_) => {}
            Err(Error::CudaUnavailable(msg)) => assert!(!msg.is_empty()),
            Err(e) => panic!("unexpected error {e}"),
        }
        let _ = cuda_usable();
    }
}
