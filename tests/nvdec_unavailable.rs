//! Without `libnvcuvid` the decoder is a typed, actionable error, never a
//! panic: the library is pointed at a path that does not exist
//! (`use_library`, or `VRAMRING_NVCUVID` for the example), so this runs the same on CI and on a GPU
//! machine. The library is loaded once per process, so the in-process check
//! is the only one here that opens it; the producer examples run as children.
//! `nvr_decoder` also refuses a bad config (exit 2) before it opens NVDEC.

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

/// A config for `nvr_decoder` with two file cameras, rings in `dir`.
fn nvr_config(dir: &common::TempDir) -> std::path::PathBuf {
    let clip = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/clip.h264");
    let text = format!(
        "[decoder]\nsocket_dir = {:?}\n[[camera]]\nname = \"a\"\ninput = {{ file = {clip:?}, loop = true }}\n[[camera]]\nname = \"b\"\ninput = {{ file = {clip:?} }}\n",
        dir.join("rings").display().to_string()
    );
    let path = dir.join("cameras.toml");
    std::fs::write(&path, text).expect("writing the config");
    path
}

#[test]
fn nvr_decoder_without_libnvcuvid_exits_3_with_the_reason() {
    let dir = common::TempDir::new("nvr-unavailable");
    for env in [Some(MISSING), None] {
        let mut cmd = Command::new(common::example("nvr_decoder"));
        cmd.arg("--config").arg(nvr_config(&dir));
        if let Some(lib) = env {
            cmd.env("VRAMRING_NVCUVID", lib);
        } else if vramring::nvdec::available() {
            // A GPU machine with NVDEC: only the named missing library applies.
            continue;
        }
        let out = cmd.output().expect("running nvr_decoder");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "exit code 3 (no NVDEC here); stderr: {err}");
        assert!(
            err.contains("NVDEC hardware decoder is not usable here") || err.contains("CUDA"),
            "stderr says why, as a sentence: {err}"
        );
        if env.is_some() {
            assert!(err.contains(MISSING), "names the library: {err}");
        }
        assert!(!err.contains("panicked"), "no panic: {err}");
        assert!(!dir.join("rings").join("a.sock").exists(), "no ring made");
    }
}

#[test]
fn nvr_decoder_refuses_a_bad_config_with_exit_2_before_touching_nvdec() {
    let dir = common::TempDir::new("nvr-badconfig");
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        "[[camera]]\nname = \"a\"\ninput = { file = \"x.h264\", packets = \"y.sock\" }\n",
    )
    .expect("writing the config");
    let out = Command::new(common::example("nvr_decoder"))
        .arg("--config")
        .arg(&path)
        .env("VRAMRING_NVCUVID", MISSING)
        .output()
        .expect("running nvr_decoder");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "exit code 2 (bad config); stderr: {err}");
    assert!(
        err.contains(&path.display().to_string()) && err.contains("camera \"a\"") && err.contains("not both"),
        "one sentence naming the file, the camera and the key: {err}"
    );
    assert!(!err.contains("panicked"), "no panic: {err}");
}

#[test]
fn nvr_decoder_check_lists_the_shipped_example_cameras_without_a_gpu() {
    let out = Command::new(common::example("nvr_decoder"))
        .arg("--config")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/nvr/cameras.example.toml"
        ))
        .arg("--check")
        .env("VRAMRING_NVCUVID", MISSING)
        .output()
        .expect("running nvr_decoder");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for cam in ["front:", "garage:", "yard:", "vramring top /tmp/vramring-nvr"] {
        assert!(text.contains(cam), "{cam}: {text}");
    }
}

#[test]
fn nvr_decoder_check_says_where_the_rings_live_from_the_memory_key_or_the_flag() {
    let dir = common::TempDir::new("nvr-memory");
    let check = |config: &std::path::Path, flag: bool| -> String {
        let mut cmd = Command::new(common::example("nvr_decoder"));
        cmd.arg("--config").arg(config).args(["--check", "--json"]);
        if flag {
            cmd.arg("--host-memory");
        }
        let out = cmd
            .env("VRAMRING_NVCUVID", MISSING)
            .output()
            .expect("running nvr_decoder");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text
            .lines()
            .filter_map(vramring_testkit::json::JsonLine::parse)
            .find(|j| j.get("event") == Some("config"))
            .unwrap_or_else(|| panic!("a config line: {text}"));
        line.get("memory").expect("memory").to_owned()
    };
    let plain = nvr_config(&dir);
    assert_eq!(check(&plain, false), "cuda", "GPU memory by default");
    assert_eq!(check(&plain, true), "host", "--host-memory");
    let host = dir.join("host.toml");
    let text = std::fs::read_to_string(&plain).expect("config");
    std::fs::write(&host, text.replacen("[decoder]\n", "[decoder]\nmemory = \"host\"\n", 1)).expect("config");
    assert_eq!(check(&host, false), "host", "[decoder] memory = \"host\"");
}
