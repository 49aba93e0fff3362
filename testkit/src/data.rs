//! The test data in the workspace's `tests/data`: clips and their
//! reference decodes, found the same way by every test and bench.

use std::path::{Path, PathBuf};

/// `tests/data/<name>` of the workspace, or `$VRAMRING_TEST_DATA/<name>`
/// when set (a GPU machine running staged binaries from another checkout),
/// made absolute: tests write it into configs read from other folders.
pub fn path(name: &str) -> PathBuf {
    match std::env::var_os("VRAMRING_TEST_DATA") {
        Some(d) => std::path::absolute(&d).unwrap_or_else(|_| PathBuf::from(d)).join(name),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name),
    }
}

/// The per-frame MD5s of an ffmpeg framemd5 file, in display order.
///
/// # Panics
/// When the file cannot be read (a test without its data cannot go on).
pub fn framemd5(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.rsplit(',').next().expect("a hash field").trim().to_owned())
        .collect()
}
