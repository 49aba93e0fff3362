//! [`VmmMapping`]: one VMM allocation (made here or imported from a file
//! descriptor), its reserved range and its mapping, released phase by phase.
//! Used for push delivery: a subscriber's own buffers (made here, exported)
//! and the publisher's view of them (imported, mapped read-write).

use std::os::fd::{AsFd, OwnedFd};

use super::driver::{Access, CuDevice, DevicePtr, Driver, MemHandle};
use super::round_up;
use crate::error::{Error, Result};

/// An allocation handle, a reserved range and the mapping of one into the
/// other. Every method must run with the owning context current (the caller
/// pushes it); [`VmmMapping::release`] forgets each handle only once the
/// driver confirmed its release, so it can be retried after an error.
#[derive(Debug, Default)]
pub(crate) struct VmmMapping {
    handle: Option<MemHandle>,
    va: Option<DevicePtr>,
    mapped: bool,
    bytes: u64,
}

impl VmmMapping {
    /// Base device address; 0 when not mapped.
    pub(crate) fn addr(&self) -> DevicePtr {
        if self.mapped {
            self.va.unwrap_or(0)
        } else {
            0
        }
    }

    /// Whether the allocation is mapped.
    pub(crate) fn is_mapped(&self) -> bool {
        self.mapped
    }

    /// Bytes mapped.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether anything is still held.
    pub(crate) fn is_live(&self) -> bool {
        self.handle.is_some() || self.va.is_some() || self.mapped
    }

    /// Makes an exportable allocation of at least `bytes` on `dev`, maps it
    /// read-write, and exports it. The returned descriptor is the caller's
    /// (the CUDA docs leave closing an exported descriptor to the
    /// application). On error, `self` keeps what was made, for `release`.
    pub(crate) fn create_exported<D: Driver>(&mut self, d: &D, bytes: u64, dev: CuDevice) -> Result<OwnedFd> {
        let g = d.mem_granularity(dev)?;
        self.bytes = round_up(bytes.max(1), g).ok_or(Error::TooLarge {
            len: bytes as usize,
            max: usize::MAX,
        })?;
        let h = d.mem_create(self.bytes, dev)?;
        self.handle = Some(h);
        // SAFETY: `h` is live (just created).
        let fd = unsafe { d.mem_export_fd(h) }?;
        self.map(d, g, dev, Access::ReadWrite)?;
        Ok(fd)
    }

    /// Imports the allocation `fd` of `bytes` bytes and maps it with
    /// `access` for `dev`. `fd` stays the caller's (import does not take
    /// ownership). On error, `self` keeps what was made, for `release`.
    pub(crate) fn import<D: Driver>(
        &mut self,
        d: &D,
        fd: &OwnedFd,
        bytes: u64,
        dev: CuDevice,
        access: Access,
    ) -> Result<()> {
        let g = d.mem_granularity(dev)?;
        if bytes == 0 || round_up(bytes, g) != Some(bytes) {
            return Err(Error::LayoutMismatch(format!(
                "allocation of {bytes} bytes is not a whole number of {g}-byte granules"
            )));
        }
        self.bytes = bytes;
        self.handle = Some(d.mem_import_fd(fd.as_fd())?);
        self.map(d, g, dev, access)
    }

    fn map<D: Driver>(&mut self, d: &D, granularity: u64, dev: CuDevice, access: Access) -> Result<()> {
        let h = self.handle.ok_or(Error::Closed)?;
        let va = d.mem_address_reserve(self.bytes, granularity)?;
        self.va = Some(va);
        // SAFETY: `va` is a fresh reservation of `bytes`; `h` is live.
        unsafe { d.mem_map(va, self.bytes, h) }?;
        self.mapped = true;
        // SAFETY: `[va, va + bytes)` is the mapping just made.
        unsafe { d.mem_set_access(va, self.bytes, dev, access) }?;
        Ok(())
    }

    /// Unmaps, frees the range, releases the handle, in that order. The
    /// caller has made sure no GPU work still touches the mapping.
    pub(crate) fn release<D: Driver>(&mut self, d: &D) -> Result<()> {
        if self.mapped {
            let va = self.va.ok_or(Error::Closed)?;
            // SAFETY: our mapping of `bytes`, idle (caller's contract).
            unsafe { d.mem_unmap(va, self.bytes) }?;
            self.mapped = false;
        }
        if let Some(va) = self.va {
            // SAFETY: our reservation, unmapped above.
            unsafe { d.mem_address_free(va, self.bytes) }?;
            self.va = None;
        }
        if let Some(h) = self.handle {
            // SAFETY: our handle, no longer mapped.
            unsafe { d.mem_release(h) }?;
            self.handle = None;
        }
        Ok(())
    }
}
