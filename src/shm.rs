//! memfd-backed shared regions: create, seal, map, and typed access to the
//! `#[repr(C)]` atomics structs of [`crate::layout`].

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use memmap2::{MmapOptions, MmapRaw};
use rustix::fs::{MemfdFlags, SealFlags};

use crate::error::{Error, IoContext, Result};

/// Types that are made only of atomics (and padding), so a `&T` over memory
/// that another process writes is sound.
///
/// # Safety
/// Implementors are `#[repr(C)]`, contain only `Atomic*` fields (or arrays
/// of them, or other `SharedPlain` types), and are valid for every bit
/// pattern, including all zeroes.
pub unsafe trait SharedPlain {}

// SAFETY: each of these is #[repr(C)] of atomics only; every bit pattern is a
// valid value (see crate::layout).
unsafe impl SharedPlain for crate::layout::RingHeader {}
// SAFETY: as above.
unsafe impl SharedPlain for crate::layout::SlotDesc {}
// SAFETY: as above.
unsafe impl SharedPlain for crate::layout::SubsHeader {}
// SAFETY: as above.
unsafe impl SharedPlain for crate::layout::SubEntry {}
// SAFETY: as above.
unsafe impl SharedPlain for crate::layout::ClientLine {}

/// A mapping of a memfd (or any file descriptor) shared with peers.
///
/// Holds the mapping only through [`MmapRaw`]: no `&[u8]` or `&mut [u8]` is
/// ever built over bytes a peer can write.
pub struct Region {
    map: MmapRaw,
    len: usize,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("ptr", &self.map.as_ptr())
            .field("len", &self.len)
            .finish()
    }
}

/// Seals on a region that only its creator may write.
pub const SEALS_READ_ONLY: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::FUTURE_WRITE)
    .union(SealFlags::SEAL);
/// Seals on a region that peers may write but nobody may resize.
pub const SEALS_FIXED_SIZE: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW).union(SealFlags::SEAL);

impl Region {
    /// Creates a zeroed memfd of `len` bytes and maps it read-write.
    pub fn create(name: &str, len: u64) -> Result<(Region, OwnedFd)> {
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .ctx(|| format!("memfd_create({name})"))?;
        rustix::fs::ftruncate(&fd, len).ctx(|| format!("ftruncate memfd {name} to {len} bytes"))?;
        let region = Region::map(fd.as_fd(), len, true)?;
        Ok((region, fd))
    }

    /// Adds `seals` to a memfd this process created.
    pub fn seal(fd: BorrowedFd<'_>, seals: SealFlags) -> Result<()> {
        rustix::fs::fcntl_add_seals(fd, seals).ctx(|| "sealing a memfd".into())
    }

    /// Maps `len` bytes of `fd`, read-only unless `writable`.
    ///
    /// Refuses a file shorter than `len`, so no access through the mapping
    /// can fault past its end.
    pub fn map(fd: BorrowedFd<'_>, len: u64, writable: bool) -> Result<Region> {
        let st = rustix::fs::fstat(fd).ctx(|| "fstat of a shared region".into())?;
        if (st.st_size as u64) < len {
            return Err(Error::LayoutMismatch(format!(
                "shared region is {} bytes, {len} are needed",
                st.st_size
            )));
        }
        let ulen = usize::try_from(len).map_err(|_| Error::LayoutMismatch(format!("region of {len} bytes")))?;
        if ulen == 0 {
            return Err(Error::LayoutMismatch("empty shared region".into()));
        }
        let mut opts = MmapOptions::new();
        opts.len(ulen);
        let raw = fd_raw(fd);
        let map = if writable {
            opts.map_raw(raw)
        } else {
            opts.map_raw_read_only(raw)
        }
        .ctx(|| {
            format!(
                "mmap of {len} bytes ({})",
                if writable { "read-write" } else { "read-only" }
            )
        })?;
        Ok(Region { map, len: ulen })
    }

    /// A new, read-only open file description of the memfd `fd` (through
    /// `/proc/self/fd`), to send to a peer: `mmap(PROT_WRITE, MAP_SHARED)`,
    /// `write`, `ftruncate` and `fallocate` through it fail with `EACCES` or
    /// `EBADF` whatever the seals. Seals remain the guarantee: a memfd's
    /// inode is mode 0777, so a peer could reopen it read-write through its
    /// own `/proc`; `F_SEAL_FUTURE_WRITE` is what stops that.
    ///
    /// # Errors
    /// [`Error::Io`] when `/proc` is not mounted or the reopen fails.
    pub fn reopen_read_only(fd: BorrowedFd<'_>) -> Result<OwnedFd> {
        let path = format!("/proc/self/fd/{}", fd_raw(fd));
        rustix::fs::open(
            path.as_str(),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ctx(|| format!("reopening {path} read-only (is /proc mounted?)"))
    }

    /// Checks that a peer's memfd carries at least `seals`, so it cannot be
    /// shrunk under our mapping.
    pub fn require_seals(fd: BorrowedFd<'_>, seals: SealFlags) -> Result<()> {
        let have = rustix::fs::fcntl_get_seals(fd).ctx(|| "F_GET_SEALS on a peer's memfd".into())?;
        if !have.contains(seals) {
            return Err(Error::LayoutMismatch(format!(
                "peer memfd seals {have:?} lack {seals:?}"
            )));
        }
        Ok(())
    }

    /// Bytes mapped (a region is never empty: `map` refuses length 0).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// First mapped byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// The `T` at byte `offset`.
    ///
    /// # Panics
    /// When `T` does not fit at `offset` or `offset` is misaligned: callers
    /// compute offsets from validated sizes, so this is a bug, not bad input.
    pub fn at<T: SharedPlain>(&self, offset: usize) -> &T {
        let end = offset.checked_add(std::mem::size_of::<T>()).expect("offset overflow");
        assert!(
            end <= self.len,
            "shared struct at {offset} overruns a {}-byte region",
            self.len
        );
        let ptr = self.map.as_ptr().wrapping_add(offset);
        assert_eq!(ptr as usize % std::mem::align_of::<T>(), 0, "misaligned shared struct");
        // SAFETY: in bounds and aligned (checked above); T is SharedPlain, so
        // any bytes are a valid T and a shared reference to atomics is sound
        // while peers write them; the mapping lives as long as `self`.
        unsafe { &*(ptr as *const T) }
    }

    /// `count` consecutive `T`s starting at byte `offset`.
    ///
    /// # Panics
    /// As [`Region::at`].
    pub fn slice<T: SharedPlain>(&self, offset: usize, count: usize) -> &[T] {
        let bytes = count.checked_mul(std::mem::size_of::<T>()).expect("size overflow");
        let end = offset.checked_add(bytes).expect("offset overflow");
        assert!(
            end <= self.len,
            "shared array at {offset} overruns a {}-byte region",
            self.len
        );
        let ptr = self.map.as_ptr().wrapping_add(offset);
        assert_eq!(ptr as usize % std::mem::align_of::<T>(), 0, "misaligned shared array");
        // SAFETY: as in `at`, for `count` elements.
        unsafe { std::slice::from_raw_parts(ptr as *const T, count) }
    }
}

fn fd_raw(fd: BorrowedFd<'_>) -> std::os::fd::RawFd {
    use std::os::fd::AsRawFd;
    // FFI boundary: memmap2 takes a raw descriptor; `fd` outlives the call
    // and the mapping does not need it afterwards.
    fd.as_raw_fd()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::SlotDesc;
    use std::sync::atomic::Ordering;

    #[test]
    fn sealed_region_cannot_be_mapped_writable_by_a_peer() {
        let (region, fd) = Region::create("t", 4096).unwrap();
        region.at::<SlotDesc>(0).seq.store(7, Ordering::Relaxed);
        Region::seal(fd.as_fd(), SEALS_READ_ONLY).unwrap();
        assert!(Region::map(fd.as_fd(), 4096, true).is_err());
        let ro = Region::map(fd.as_fd(), 4096, false).unwrap();
        assert_eq!(ro.at::<SlotDesc>(0).seq.load(Ordering::Relaxed), 7);
        Region::require_seals(fd.as_fd(), SEALS_READ_ONLY).unwrap();
        assert!(rustix::fs::ftruncate(&fd, 100).is_err(), "sealed memfd must not shrink");
    }

    #[test]
    fn short_file_is_refused_before_mapping() {
        let (_r, fd) = Region::create("t", 4096).unwrap();
        assert!(matches!(
            Region::map(fd.as_fd(), 8192, false),
            Err(Error::LayoutMismatch(_))
        ));
    }

    #[test]
    #[should_panic(expected = "overruns")]
    fn out_of_bounds_struct_is_caught() {
        let (r, _fd) = Region::create("t", 4096).unwrap();
        let _ = r.at::<SlotDesc>(4096 - 64);
    }
}
