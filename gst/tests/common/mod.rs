//! What the plugin's tests share: registering the plugin, pipelines with
//! bounded waits, socket paths in a temporary directory, and frames reduced
//! to the bytes that carry pixels.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Once;
use std::time::{Duration, Instant};

use gst::prelude::*;
use gst_video::prelude::*;

/// The longest any single wait in these tests lasts.
pub const WAIT: Duration = Duration::from_secs(20);

/// Initialises GStreamer and registers the plugin statically, once.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        gst::init().expect("GStreamer initialises");
        gstvramring::plugin_register_static().expect("the plugin registers");
    });
}

/// A fresh temporary directory and a socket path in it.
pub fn socket(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join(format!("{name}.sock"));
    (dir, path)
}

/// A pipeline from a launch line, set to PLAYING.
pub fn play(line: &str) -> gst::Pipeline {
    let p = gst::parse::launch(line)
        .unwrap_or_else(|e| panic!("pipeline {line:?}: {e}"))
        .downcast::<gst::Pipeline>()
        .expect("a pipeline");
    p.set_state(gst::State::Playing)
        .unwrap_or_else(|e| panic!("pipeline {line:?} does not start: {e:?}"));
    p
}

/// The appsink named `sink` in `p`.
pub fn appsink(p: &gst::Pipeline) -> gst_app::AppSink {
    p.by_name("sink")
        .expect("an element named sink")
        .downcast::<gst_app::AppSink>()
        .expect("an appsink")
}

/// Panics with the first error message on `p`'s bus, if there is one
/// (other messages on the bus are dropped).
pub fn assert_no_error(p: &gst::Pipeline) {
    let bus = p.bus().expect("a bus");
    while let Some(msg) = bus.pop_filtered(&[gst::MessageType::Error]) {
        if let gst::MessageView::Error(e) = msg.view() {
            panic!(
                "error from {:?}: {} ({:?})",
                e.src().map(|s| s.path_string()),
                e.error(),
                e.debug()
            );
        }
    }
}

/// Pulls `n` samples from the appsink named `sink`, each within [`WAIT`],
/// failing with the pipeline's error if one was posted.
pub fn pull(p: &gst::Pipeline, n: usize) -> Vec<gst::Sample> {
    let sink = appsink(p);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        match sink.try_pull_sample(gst::ClockTime::from_seconds(WAIT.as_secs())) {
            Some(s) => out.push(s),
            None => {
                assert_no_error(p);
                panic!("sample {i} of {n} did not come within {WAIT:?}");
            }
        }
    }
    out
}

/// Waits for end of stream on `p`'s bus, failing on an error.
pub fn wait_eos(p: &gst::Pipeline) {
    let bus = p.bus().expect("a bus");
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no end of stream within {WAIT:?}");
        let Some(msg) = bus.timed_pop_filtered(
            gst::ClockTime::from_mseconds(left.as_millis() as u64),
            &[gst::MessageType::Eos, gst::MessageType::Error],
        ) else {
            continue;
        };
        match msg.view() {
            gst::MessageView::Eos(_) => return,
            gst::MessageView::Error(e) => panic!("error before end of stream: {} ({:?})", e.error(), e.debug()),
            _ => {}
        }
    }
}

/// Stops `p`.
pub fn stop(p: &gst::Pipeline) {
    p.set_state(gst::State::Null).expect("the pipeline stops");
}

/// Each plane's (bytes per row that carry pixels, rows) for a frame of
/// `format`, `width` x `height`.
pub fn pixel_rows(format: gst_video::VideoFormat, width: u32, height: u32) -> Vec<(usize, usize)> {
    let (w, h) = (width as usize, height as usize);
    let (cw, ch) = (w.div_ceil(2), h.div_ceil(2));
    use gst_video::VideoFormat as F;
    match format {
        F::Nv12 => vec![(w, h), (cw * 2, ch)],
        F::I420 => vec![(w, h), (cw, ch), (cw, ch)],
        F::P01010le => vec![(w * 2, h), (cw * 4, ch)],
        F::Gray8 => vec![(w, h)],
        F::Rgb => vec![(w * 3, h)],
        F::Rgba => vec![(w * 4, h)],
        other => panic!("no test layout for {other:?}"),
    }
}

/// A sample's pixels, plane by plane, rows packed (strides and padding
/// left out), with its format and size.
pub fn sample_pixels(sample: &gst::Sample) -> (gst_video::VideoInfo, Vec<Vec<u8>>) {
    let caps = sample.caps().expect("caps");
    let info = gst_video::VideoInfo::from_caps(caps).expect("raw video caps");
    let buffer = sample.buffer().expect("a buffer");
    let frame = gst_video::VideoFrameRef::from_buffer_ref_readable(buffer, &info).expect("a mappable frame");
    let rows = pixel_rows(info.format(), info.width(), info.height());
    let planes = rows
        .iter()
        .enumerate()
        .map(|(k, &(row_bytes, n))| {
            let data = frame.plane_data(k as u32).expect("a plane");
            let stride = frame.plane_stride()[k] as usize;
            (0..n)
                .flat_map(|r| data[r * stride..r * stride + row_bytes].iter().copied())
                .collect()
        })
        .collect();
    (info, planes)
}

/// A ring frame's pixels, plane by plane, rows packed.
pub fn ring_pixels(bytes: &[u8], geometry: &vramring::Geometry, format: gst_video::VideoFormat) -> Vec<Vec<u8>> {
    let rows = pixel_rows(format, geometry.width, geometry.height);
    geometry
        .planes()
        .iter()
        .zip(rows)
        .map(|(p, (row_bytes, n))| {
            (0..n)
                .flat_map(|r| {
                    let at = p.offset as usize + r * p.pitch as usize;
                    bytes[at..at + row_bytes].iter().copied()
                })
                .collect()
        })
        .collect()
}

/// The directory holding a copy of the built plugin library, for
/// `GST_PLUGIN_PATH` (the target directory holds other libraries too).
pub fn plugin_dir() -> tempfile::TempDir {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("target/<profile>/deps");
    let candidates = [
        deps.join("libgstvramring.so"),
        deps.parent().expect("target/<profile>").join("libgstvramring.so"),
    ];
    let lib = candidates
        .iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("libgstvramring.so not found in {candidates:?}"));
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::copy(lib, dir.path().join("libgstvramring.so")).expect("the plugin copies");
    dir
}

/// Pulls samples from the appsink named `sink` until end of stream, each
/// within [`WAIT`].
pub fn pull_all(p: &gst::Pipeline) -> Vec<gst::Sample> {
    let sink = appsink(p);
    let mut out = Vec::new();
    loop {
        match sink.try_pull_sample(gst::ClockTime::from_seconds(WAIT.as_secs())) {
            Some(s) => out.push(s),
            None if sink.is_eos() => return out,
            None => {
                assert_no_error(p);
                panic!(
                    "no sample nor end of stream within {WAIT:?} after {} samples",
                    out.len()
                );
            }
        }
    }
}

/// A sample's bytes and whether it is a keyframe (no DELTA_UNIT flag).
pub fn access_unit(sample: &gst::Sample) -> (Vec<u8>, bool) {
    let buffer = sample.buffer().expect("a buffer");
    let map = buffer.map_readable().expect("readable");
    (map.to_vec(), !buffer.flags().contains(gst::BufferFlags::DELTA_UNIT))
}

/// The clip the library's tests ship: 300 H.264 access units, an IDR every 30.
pub fn clip() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/clip.h264")
}
