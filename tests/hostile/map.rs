//! A shared mapping of a descriptor a subscriber received, with bounds-
//! checked atomic access (the other side writes it concurrently).

#![allow(dead_code)]

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};

/// `MAP_SHARED` mapping of a whole file.
pub struct Map {
    ptr: *mut u8,
    len: usize,
    writable: bool,
}

// SAFETY: the mapping is only reached through atomics.
unsafe impl Send for Map {}
// SAFETY: as above.
unsafe impl Sync for Map {}

impl Map {
    /// Maps `len` bytes of `fd`, writable or not. The error is the kernel's
    /// refusal (e.g. `EACCES` for a read-only descriptor, `EPERM` for a
    /// write-sealed memfd).
    pub fn new(fd: BorrowedFd<'_>, len: u64, writable: bool) -> Result<Map, Errno> {
        if len == 0 {
            return Err(Errno::INVAL);
        }
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: a fresh mapping at an address the kernel picks; nothing
        // else in this process aliases it.
        let ptr = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len as usize, prot, MapFlags::SHARED, fd, 0)? };
        Ok(Map {
            ptr: ptr.cast(),
            len: len as usize,
            writable,
        })
    }
    /// Whether the mapping is writable.
    pub fn writable(&self) -> bool {
        self.writable
    }
    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }
    /// The u32 at `off`, if in bounds and aligned.
    pub fn u32(&self, off: usize) -> Option<&AtomicU32> {
        (off % 4 == 0 && off + 4 <= self.len).then(|| {
            // SAFETY: in bounds and aligned (checked), inside a live mapping.
            unsafe { AtomicU32::from_ptr(self.ptr.add(off).cast()) }
        })
    }
    /// The u64 at `off`, if in bounds and aligned.
    pub fn u64(&self, off: usize) -> Option<&AtomicU64> {
        (off % 8 == 0 && off + 8 <= self.len).then(|| {
            // SAFETY: in bounds and aligned (checked), inside a live mapping.
            unsafe { AtomicU64::from_ptr(self.ptr.add(off).cast()) }
        })
    }
    /// Reads the u32 at `off`.
    pub fn read32(&self, off: usize) -> Option<u32> {
        self.u32(off).map(|a| a.load(Ordering::Acquire))
    }
    /// Reads the u64 at `off`.
    pub fn read64(&self, off: usize) -> Option<u64> {
        self.u64(off).map(|a| a.load(Ordering::Acquire))
    }
    /// Stores `v` at `off` (u32).
    pub fn write32(&self, off: usize, v: u32) {
        if !self.writable {
            return;
        }
        if let Some(a) = self.u32(off) {
            a.store(v, Ordering::Release);
        }
    }
    /// Stores `v` at `off` (u64).
    pub fn write64(&self, off: usize, v: u64) {
        if !self.writable {
            return;
        }
        if let Some(a) = self.u64(off) {
            a.store(v, Ordering::Release);
        }
    }
    /// A copy of `len` bytes at `off` (clamped to the mapping). The other
    /// side may write them meanwhile: the caller validates afterwards.
    pub fn copy_out(&self, off: usize, len: usize) -> Vec<u8> {
        let len = len.min(self.len.saturating_sub(off));
        let mut out = vec![0u8; len];
        // SAFETY: `off + len <= self.len`, inside a live mapping, into our
        // own buffer. A racy copy of shared bytes, validated by the caller
        // with the slot's seqlock as the protocol says (PROTOCOL.md §11).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), out.as_mut_ptr(), len) };
        out
    }
    /// Writes `byte` over every `step`-th byte of the mapping.
    pub fn scribble(&self, byte: u8, step: usize) {
        if !self.writable {
            return;
        }
        let mut off = 0;
        while off < self.len {
            // SAFETY: `off < len`, inside a live mapping; atomics, as the
            // other side reads it concurrently.
            unsafe { AtomicU8::from_ptr(self.ptr.add(off)) }.store(byte, Ordering::Relaxed);
            off += step.max(1);
        }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no reference into it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
    }
}
