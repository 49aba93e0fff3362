//! What a bench's processes share through files: a block of memory both
//! map `MAP_SHARED` (control words, flags, a futex, frame data), and
//! samples a role process writes for its orchestrator to read back.

use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64};

use crate::R;

/// A file mapped `MAP_SHARED` by every process of a measurement (in
/// `/dev/shm` for a shmem-backed page, which the driver can pin); read and
/// written through atomics only.
#[derive(Debug)]
pub struct SharedMap(memmap2::MmapRaw);

impl SharedMap {
    /// Creates (or truncates) `path` with `len` zero bytes and maps it.
    pub fn create(path: &Path, len: usize) -> R<SharedMap> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        f.set_len(len as u64)?;
        SharedMap::open(path, None)
    }

    /// Maps the file at `path` another process made: its first `len`
    /// bytes, or all of it.
    pub fn open(path: &Path, len: Option<usize>) -> R<SharedMap> {
        let f = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
        let mut options = memmap2::MmapOptions::new();
        if let Some(len) = len {
            options.len(len);
        }
        Ok(SharedMap(options.map_raw(&f)?))
    }

    /// The mapping's first byte (page aligned).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.0.as_mut_ptr()
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    /// The `k`-th 8-byte word.
    ///
    /// # Panics
    /// Past the mapping's end.
    pub fn word(&self, k: usize) -> &AtomicU64 {
        assert!((k + 1) * 8 <= self.len(), "word {k} of a {}-byte map", self.len());
        // SAFETY: in bounds (checked), 8-byte aligned (the mapping is page
        // aligned); the mapping lives as long as `self`; AtomicU64 is valid
        // for any bits.
        unsafe { &*(self.0.as_ptr().add(k * 8) as *const AtomicU64) }
    }

    /// The first 4 bytes as a 32-bit word (a futex); whoever uses it does
    /// not use word 0 otherwise.
    pub fn word32(&self) -> &AtomicU32 {
        assert!(self.len() >= 4);
        // SAFETY: the first 4 bytes of the mapping, 4-byte aligned; valid
        // for any bits; it lives as long as `self`.
        unsafe { &*(self.0.as_ptr() as *const AtomicU32) }
    }
}

/// Writes `samples` to `path` as little-endian u64s (a role process's
/// results, read back by the orchestrator with [`read_samples`]).
pub fn write_samples(path: &Path, samples: &[u64]) -> R<()> {
    let mut bytes = Vec::with_capacity(samples.len() * 8);
    for s in samples {
        bytes.extend_from_slice(&s.to_le_bytes());
    }
    std::fs::write(path, bytes)?;
    Ok(())
}

/// The u64s [`write_samples`] wrote to `path`.
pub fn read_samples(path: &Path) -> R<Vec<u64>> {
    Ok(std::fs::read(path)?
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn two_maps_of_one_file_share_their_words_and_samples_round_trip() {
        let dir = std::env::temp_dir().join(format!("vramring-benches-shm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ctl");
        let a = SharedMap::create(&path, 4096).unwrap();
        let b = SharedMap::open(&path, Some(4096)).unwrap();
        assert_eq!((a.len(), b.len()), (4096, 4096));
        a.word(3).store(42, Ordering::Release);
        assert_eq!(b.word(3).load(Ordering::Acquire), 42);
        b.word32().store(7, Ordering::Release);
        assert_eq!(a.word32().load(Ordering::Acquire), 7);
        assert!(
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.word(512).load(Ordering::Relaxed))).is_err()
        );
        let samples = [0, 1, u64::MAX, 1 << 40];
        write_samples(&dir.join("s"), &samples).unwrap();
        assert_eq!(read_samples(&dir.join("s")).unwrap(), samples);
        drop((a, b));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
