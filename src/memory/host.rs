//! The host backend: the slot pool is a memfd; a subscriber's copy is a
//! `memcpy` into its own page-aligned buffer.
//!
//! A product backend for CPU-only pipelines, and the backend CI runs the whole
//! protocol on.

use std::os::fd::{AsFd, OwnedFd};

use memmap2::MmapMut;

use crate::error::{Error, IoContext, Result};
use crate::memory::{check_range, BackendKind, ExportedPool, ImportedPool, OwnBuffer, WriteCompletion};
use crate::shm::{Region, SEALS_FIXED_SIZE, SEALS_READ_ONLY};

/// The publisher's memfd pool.
#[derive(Debug)]
pub struct HostPool {
    region: Region,
    fd: OwnedFd,
    bytes: u64,
    targets: Vec<(u64, Region)>,
    next_target: u64,
}

impl HostPool {
    /// Creates a zeroed pool of `bytes` bytes, sealed against resizing and,
    /// unless `peers_may_write`, against every write but through this
    /// process's own mapping (`F_SEAL_FUTURE_WRITE`): then no subscriber
    /// can write the pool, whatever descriptor it holds.
    ///
    /// # Errors
    /// [`Error::Io`] when the memfd cannot be created, sealed or mapped.
    pub fn create_with(bytes: u64, peers_may_write: bool) -> Result<Self> {
        let (region, fd) = Region::create("vramring-pool", bytes)?;
        let seals = if peers_may_write {
            SEALS_FIXED_SIZE
        } else {
            SEALS_READ_ONLY
        };
        Region::seal(fd.as_fd(), seals)?;
        Ok(HostPool {
            region,
            fd,
            bytes,
            targets: Vec::new(),
            next_target: 1,
        })
    }
}

impl ExportedPool for HostPool {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }
    fn pool_bytes(&self) -> u64 {
        self.bytes
    }
    fn device_uuid(&self) -> [u8; 16] {
        [0; 16]
    }
    fn export_fd(&self) -> Result<OwnedFd> {
        self.fd.try_clone().ctx(|| "dup of the pool memfd".into())
    }
    fn export_read_only_fd(&self) -> Result<OwnedFd> {
        Region::reopen_read_only(self.fd.as_fd())
    }
    fn base_addr(&self) -> u64 {
        self.region.as_ptr() as u64
    }
    fn complete_writes(&self, completion: WriteCompletion) -> Result<()> {
        match completion {
            // CPU stores are ordered before the commit by the Release store
            // of the slot seq; nothing else to wait for.
            WriteCompletion::Host => Ok(()),
            WriteCompletion::CudaStream(_) => Err(Error::WrongBackend {
                what: "completing writes on a CUDA stream",
                backend: "host",
            }),
        }
    }
    fn attach_target(&mut self, fd: &OwnedFd, bytes: u64) -> Result<u64> {
        Region::require_seals(fd.as_fd(), rustix::fs::SealFlags::SHRINK)?;
        let region = Region::map(fd.as_fd(), bytes, true)?;
        let id = self.next_target;
        self.next_target += 1;
        self.targets.push((id, region));
        Ok(id)
    }
    fn push_copy(
        &mut self,
        id: u64,
        dst_offset: u64,
        src_offset: u64,
        len: u64,
        completion: WriteCompletion,
    ) -> Result<()> {
        self.complete_writes(completion)?;
        let (_, dst) = self.targets.iter().find(|(t, _)| *t == id).ok_or(Error::Closed)?;
        check_range("push buffer", dst_offset, len, dst.len() as u64)?;
        check_range("pool", src_offset, len, self.region.len() as u64)?;
        // SAFETY: both ranges are inside their mappings (checked above) and
        // in different mappings, so they do not overlap. The subscriber only
        // reads the target buffer, and not while it holds it (push-hold
        // protocol), so no one else writes these bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.region.as_ptr().add(src_offset as usize),
                dst.as_ptr().add(dst_offset as usize),
                len as usize,
            );
        }
        Ok(())
    }
    fn detach_target(&mut self, id: u64) -> Result<()> {
        self.targets.retain(|(t, _)| *t != id);
        Ok(())
    }
    fn close(&mut self) -> Result<()> {
        self.targets.clear();
        Ok(())
    }
}

/// A subscriber's mapping of a host pool and its own buffer.
#[derive(Debug)]
pub struct HostImport {
    /// The pool; `None` for a push-only subscriber.
    region: Option<Region>,
    writable: bool,
    dest: Option<MmapMut>,
    dest_len: usize,
    push: Option<(Region, u64)>,
}

impl HostImport {
    /// Maps `bytes` of the pool `fd` (read-only unless `writable`).
    ///
    /// # Errors
    /// [`Error::LayoutMismatch`] when the memfd is shorter than `bytes` or
    /// can be resized; [`Error::Io`] when mapping fails.
    pub fn import(fd: OwnedFd, bytes: u64, writable: bool) -> Result<Self> {
        Region::require_seals(fd.as_fd(), rustix::fs::SealFlags::SHRINK)?;
        let region = Region::map(fd.as_fd(), bytes, writable)?;
        // The mapping keeps the memory alive; the descriptor is not needed.
        drop(fd);
        Ok(HostImport {
            region: Some(region),
            writable,
            dest: None,
            dest_len: 0,
            push: None,
        })
    }
}

impl HostImport {
    /// A push-only subscriber's side: no pool (a push subscriber never
    /// receives it), only the buffers [`ImportedPool::alloc_push`] makes.
    pub fn push_only() -> Self {
        HostImport {
            region: None,
            writable: false,
            dest: None,
            dest_len: 0,
            push: None,
        }
    }

    fn pool(&self) -> Result<&Region> {
        self.region.as_ref().ok_or(Error::WrongBackend {
            what: "pulling a frame",
            backend: "push-only",
        })
    }
}

impl ImportedPool for HostImport {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }
    fn base_addr(&self) -> u64 {
        self.region.as_ref().map_or(0, |r| r.as_ptr() as u64)
    }
    fn pool_bytes(&self) -> u64 {
        self.region.as_ref().map_or(0, |r| r.len() as u64)
    }
    fn writable(&self) -> bool {
        self.writable
    }
    fn copy_out(&mut self, src_offset: u64, len: u64) -> Result<()> {
        let src = self.pool()?.as_ptr();
        check_range("pool", src_offset, len, self.pool_bytes())?;
        let len = usize::try_from(len).map_err(|_| Error::TooLarge {
            len: usize::MAX,
            max: usize::MAX,
        })?;
        if self.dest.as_ref().is_none_or(|d| d.len() < len) {
            self.dest = Some(MmapMut::map_anon(len.max(1)).ctx(|| format!("anonymous buffer of {len} bytes"))?);
        }
        let dest = self.dest.as_mut().ok_or(Error::Closed)?;
        // SAFETY: the source range is inside the mapping (checked above) and
        // the destination holds at least `len` bytes; they do not overlap
        // (private anonymous map vs shared map). The producer may write the
        // source concurrently: the bytes are treated as untrusted and the
        // caller validates the slot seq after this copy (seqlock rule), so
        // no torn result is ever handed out.
        unsafe {
            std::ptr::copy_nonoverlapping(src.add(src_offset as usize), dest.as_mut_ptr(), len);
        }
        self.dest_len = len;
        Ok(())
    }
    fn complete(&mut self) -> Result<()> {
        Ok(())
    }
    fn dest_addr(&self) -> u64 {
        self.dest.as_ref().map_or(0, |d| d.as_ptr() as u64)
    }
    fn dest_host(&self) -> Option<&[u8]> {
        Some(self.dest.as_ref().map_or(&[][..], |d| &d[..self.dest_len]))
    }
    fn alloc_push(&mut self, count: u32, stride: u64) -> Result<(OwnedFd, u64)> {
        let bytes = stride
            .checked_mul(u64::from(count))
            .filter(|&b| b > 0)
            .ok_or_else(|| Error::Config(format!("{count} push buffers of {stride} bytes")))?;
        let (region, fd) = Region::create("vramring-push", bytes)?;
        Region::seal(fd.as_fd(), SEALS_FIXED_SIZE)?;
        self.push = Some((region, stride));
        Ok((fd, bytes))
    }
    fn push_addr(&self, k: usize) -> u64 {
        self.push
            .as_ref()
            .map_or(0, |(r, stride)| r.as_ptr() as u64 + k as u64 * stride)
    }
    fn push_host(&self, k: usize, len: usize) -> Option<&[u8]> {
        let (r, stride) = self.push.as_ref()?;
        let off = (k as u64).checked_mul(*stride)?;
        if off.checked_add(len as u64)? > r.len() as u64 || len as u64 > *stride {
            return None;
        }
        // SAFETY: in bounds of our mapping (checked above). The publisher
        // writes buffer `k` only while we do not hold it (push-hold
        // protocol); the caller holds it for the lifetime of the slice.
        Some(unsafe { std::slice::from_raw_parts(r.as_ptr().add(off as usize), len) })
    }
    fn read_own(&self, buf: OwnBuffer, dst: &mut [u8]) -> Result<()> {
        let src = match buf {
            OwnBuffer::Dest => self.dest_host(),
            OwnBuffer::Push(k) => self.push_host(k, dst.len()),
        };
        match src {
            Some(src) if src.len() >= dst.len() => {
                dst.copy_from_slice(&src[..dst.len()]);
                Ok(())
            }
            _ => Err(Error::LayoutMismatch(format!(
                "{} bytes asked of the subscriber's own {buf:?} buffer, which is shorter",
                dst.len()
            ))),
        }
    }
    fn close(&mut self) -> Result<()> {
        self.dest = None;
        self.push = None;
        Ok(())
    }
}
