//! Without `libnvcuvid` the decoder is a typed, actionable error, never a
//! panic: the library is pointed at a path that does not exist
//! (`use_library`, or `VRAMRING_NVCUVID` for the example), so this runs the same on CI and on a GPU
//! machine. The library is loaded once per process, so the in-process check
//! is the only one here that opens it; the producer example runs as a child.

use vramring_testkit::procs as common;

use std::process::Command;

use vramring::nvdec::{available, use_library, Codec, Decoder, DecoderOptions};
use vramring::Error;

const MISSING: &str = "/nonexistent/libnvcuvid.so.1";

#[test]
fn a_missing_libnvcuvid_is_decoder_unavailable_naming_the_library() {
    match use_library(MISSING) {
        Err(Error::DecoderUnavailable(msg)) => assert!(msg.contains(MISSING), "message names the library: {msg}"),
        other => panic!("a missing library must be DecoderUnavailable, got {other:?}"),
    }
    assert!(!available(), "available() must be false without the library");
    assert!(
        matches!(use_library("libnvcuvid.so.1"), Err(Error::Config(_))),
        "a second name after the library was opened is refused"
    );
    match Decoder::new(DecoderOptions::new(Codec::H264)) {
        Err(Error::DecoderUnavailable(msg)) => {
            assert!(msg.contains(MISSING), "message names the library: {msg}");
            assert!(msg.contains("NVIDIA driver"), "message says where it comes from: {msg}");
        }
        Err(e) => panic!("expected DecoderUnavailable, got {e}"),
        Ok(_) => panic!("a decoder was made without its library"),
    }
}

#[test]
fn nvdec_producer_without_libnvcuvid_exits_3_with_the_reason() {
    let dir = common::TempDir::new("nvdec-unavailable");
    let out = Command::new(common::example("nvdec_producer"))
        .args(["--socket"])
        .arg(dir.join("cam.sock"))
        .env("VRAMRING_NVCUVID", MISSING)
        .output()
        .expect("running nvdec_producer");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "exit code 3 (no NVDEC here); stderr: {err}");
    assert!(
        err.contains("NVDEC hardware decoder is not usable here") && err.contains(MISSING),
        "stderr says why, as a sentence: {err}"
    );
    assert!(!err.contains("panicked"), "no panic: {err}");
}
