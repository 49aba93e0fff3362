//! CUDA memory through the plugin, on a GPU with GStreamer's nvcodec
//! elements (`nvh264dec`, `cudaupload`, `cudadownload`: GStreamer 1.28
//! built by `shared/vendor/gstreamer/build.sh`; see `gst/bench/README.md`).
//! Every test is ignored without one:
//! `cargo test -p gst-plugin-vramring --test gpu_cuda -- --ignored`.
//!
//! * `nvh264dec_frames_reach_a_rust_subscriber_bit_exact`: `nvh264dec`
//!   negotiates `memory:CUDAMemory` with `vramringsink` unasked (the CUDA
//!   structure comes first on its template), the ring is a CUDA ring, and
//!   every frame a Rust `Subscriber` reads has the MD5 that ffmpeg's
//!   software decoder wrote into `tests/data/clip.nv12.framemd5`.
//! * `cudaupload_frames_cross_a_cuda_ring_bit_exact_*`: `videotestsrc !
//!   cudaupload ! vramringsink` (CUDA memory, a CUDA ring) reaches
//!   `vramringsrc ! cudaupload ! cudadownload ! appsink` bit for bit, for
//!   NV12, P010 and RGBA at even and odd sizes; once with upstream in the
//!   primary context the sink hands out (the copy on the memory's stream)
//!   and once with a context of GStreamer's own making set on the pipeline
//!   (`cuMemcpy3DPeerAsync` on the sink's stream, fenced by events).
//! * `vramringsrc_hands_cuda_memory_of_a_rust_publishers_frames_bit_exact`:
//!   a Rust `Publisher` on a CUDA ring writes the test pattern on the GPU;
//!   `vramringsrc ! cudadownload ! appsink` negotiates
//!   `memory:CUDAMemory` out of `vramringsrc` (a device-to-device copy into
//!   a `GstCudaBufferPool` buffer) and every frame's pixels are the
//!   pattern's.
//! * `nvh264dec_frames_cross_two_pipelines_in_cuda_memory_bit_exact`:
//!   `nvh264dec ! vramringsink` → `vramringsrc ! cudadownload ! appsink`,
//!   CUDA memory on both sides, every frame against `clip.nv12.framemd5`.
//! * `vramringsrc_feeds_nvh264enc_in_cuda_memory`: `vramringsrc !
//!   nvh264enc` negotiates CUDA memory and encodes every decoded frame once.

mod common;

use std::path::Path;

use common::*;
use gst::prelude::*;
use md5::{Digest, Md5};
use vramring::{BackendChoice, BackendKind, ClientOptions, Format, Policy, Publisher, RingConfig, SubscriberOptions};
use vramring_testkit::data::{framemd5, path as data};

/// Whether the sink pad of the element named `name` in `p` negotiated
/// CUDA memory.
fn negotiated_cuda(p: &gst::Pipeline, name: &str) -> bool {
    let caps = p
        .by_name(name)
        .and_then(|e| e.static_pad("sink"))
        .and_then(|pad| pad.current_caps())
        .unwrap_or_else(|| panic!("{name} has negotiated caps"));
    caps.features(0).is_some_and(|f| f.contains("memory:CUDAMemory"))
}

fn subscribe(path: &Path) -> vramring::Subscriber {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        match vramring::Subscriber::connect(path, SubscriberOptions::default().name("rust").lossless(true)) {
            Ok(s) => return s,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("no publisher at {} within {WAIT:?}: {e}", path.display()),
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn nvh264dec_frames_reach_a_rust_subscriber_bit_exact() {
    init();
    let refs = framemd5(&data("clip.nv12.framemd5"));
    let (_dir, path) = socket("nvdec");
    let sink = play(&format!(
        "filesrc location={} ! h264parse ! nvh264dec ! vramringsink name=vsink socket-path={} policy=lossless wait-subscribers=1 sync=false",
        data("clip.h264").display(),
        path.display()
    ));
    let mut sub = subscribe(&path);
    assert_eq!(sub.backend(), BackendKind::Cuda, "CUDA memory input makes a CUDA ring");
    let mut host = Vec::new();
    for (i, want) in refs.iter().enumerate() {
        let f = sub.next(WAIT).unwrap_or_else(|e| {
            assert_no_error(&sink);
            panic!("frame {i} of {}: {e}", refs.len())
        });
        host.resize(f.len() as usize, 0);
        f.copy_to_host(&mut host).expect("the frame copies to the host");
        let mut h = Md5::new();
        for plane in ring_pixels(&host, f.geometry(), gst_video::VideoFormat::Nv12) {
            h.update(&plane);
        }
        let got = format!("{:x}", h.finalize());
        assert_eq!(&got, want, "frame {i} differs from ffmpeg's decode");
        if i == 0 {
            assert!(
                negotiated_cuda(&sink, "vsink"),
                "nvh264dec and vramringsink negotiated CUDA memory"
            );
        }
    }
    wait_eos(&sink);
    stop(&sink);
}

/// `n` frames of `caps` from `videotestsrc` (a moving pattern), uploaded
/// to CUDA memory into `vramringsink`, read back through `vramringsrc !
/// cudaupload ! cudadownload`; with `foreign`, the publishing pipeline
/// gets a CUDA context GStreamer made (not the sink's primary one) before
/// it starts.
fn through_a_cuda_ring(format: &str, width: u32, height: u32, foreign: bool) {
    init();
    let n = 12;
    let caps = format!("video/x-raw,format={format},width={width},height={height},framerate=30/1");
    let pattern = format!("videotestsrc num-buffers={n} pattern=smpte horizontal-speed=3");
    let expected: Vec<Vec<Vec<u8>>> = {
        let p = play(&format!("{pattern} ! {caps} ! appsink name=sink sync=false"));
        let v = pull(&p, n).iter().map(|s| sample_pixels(s).1).collect();
        stop(&p);
        v
    };
    let (_dir, path) = socket("cuda");
    let line = format!(
        "{pattern} ! {caps} ! cudaupload name=up ! video/x-raw(memory:CUDAMemory) ! vramringsink name=vsink socket-path={} policy=lossless wait-subscribers=1 sync=false",
        path.display()
    );
    let sink = gst::parse::launch(&line)
        .expect("the publishing pipeline")
        .downcast::<gst::Pipeline>()
        .expect("a pipeline");
    if foreign {
        // A context of GStreamer's own making (cuCtxCreate), taken from a
        // pipeline that made it, set on ours before anything queries.
        let donor = gst::parse::launch("videotestsrc num-buffers=1 ! cudaupload name=up ! fakesink")
            .expect("a donor pipeline")
            .downcast::<gst::Pipeline>()
            .expect("a pipeline");
        donor.set_state(gst::State::Paused).expect("the donor pauses");
        let _ = donor.state(gst::ClockTime::from_seconds(WAIT.as_secs()));
        let ctx = donor
            .by_name("up")
            .and_then(|e| e.context("gst.cuda.context"))
            .expect("cudaupload made a CUDA context");
        sink.set_context(&ctx);
        stop(&donor);
    }
    sink.set_state(gst::State::Playing).expect("the publisher starts");
    let src = play(&format!(
        "vramringsrc socket-path={} lossless=true timeout=20000 ! cudaupload ! cudadownload ! {caps} ! appsink name=sink sync=false",
        path.display()
    ));
    let got = pull(&src, n);
    assert!(
        negotiated_cuda(&sink, "vsink"),
        "cudaupload and vramringsink negotiated CUDA memory"
    );
    for (i, (sample, want)) in got.iter().zip(&expected).enumerate() {
        let (info, planes) = sample_pixels(sample);
        assert_eq!((info.width(), info.height()), (width, height));
        assert!(
            planes == *want,
            "{format} {width}x{height} frame {i} differs from videotestsrc's"
        );
    }
    wait_eos(&sink);
    stop(&sink);
    stop(&src);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cudaupload_frames_cross_a_cuda_ring_bit_exact_in_the_sinks_context() {
    through_a_cuda_ring("NV12", 320, 240, false);
    through_a_cuda_ring("NV12", 321, 241, false);
    through_a_cuda_ring("P010_10LE", 162, 91, false);
    through_a_cuda_ring("RGBA", 161, 91, false);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cudaupload_frames_cross_a_cuda_ring_bit_exact_from_a_foreign_context() {
    through_a_cuda_ring("NV12", 320, 240, true);
    through_a_cuda_ring("RGBA", 161, 91, true);
}

/// Whether the src pad of the element named `name` in `p` negotiated CUDA
/// memory.
fn src_negotiated_cuda(p: &gst::Pipeline, name: &str) -> bool {
    let caps = p
        .by_name(name)
        .and_then(|e| e.static_pad("src"))
        .and_then(|pad| pad.current_caps())
        .unwrap_or_else(|| panic!("{name} has negotiated caps"));
    caps.features(0).is_some_and(|f| f.contains("memory:CUDAMemory"))
}

/// An NV12 ring on GPU 0 (`cfg` gives slots and policy) written by a Rust
/// `Publisher`, and `vramringsrc <props> ! cudadownload ! appsink` reading
/// it; keep the directory for the socket's life.
struct CudaRingSource {
    _dir: tempfile::TempDir,
    publisher: Publisher,
    gpu: vramring_testkit::gpu::GpuTestPattern,
    src: gst::Pipeline,
}

impl CudaRingSource {
    fn new(name: &str, cfg: RingConfig, props: &str) -> CudaRingSource {
        init();
        let (dir, path) = socket(name);
        let (width, height) = (cfg.width, cfg.height);
        let publisher = Publisher::create(&path, cfg.backend(BackendChoice::Cuda(0))).expect("a CUDA ring on GPU 0");
        assert_eq!(publisher.backend(), BackendKind::Cuda);
        let gpu = vramring_testkit::gpu::GpuTestPattern::for_uuid(publisher.info().device_uuid())
            .expect("the GPU test pattern");
        let caps = format!("video/x-raw,format=NV12,width={width},height={height}");
        let src = play(&format!(
            "vramringsrc name=vsrc socket-path={} {props} timestamp-mode=pts timeout=20000 ! cudadownload ! {caps} ! appsink name=sink sync=false",
            path.display()
        ));
        CudaRingSource {
            _dir: dir,
            publisher,
            gpu,
            src,
        }
    }

    /// Writes the test pattern of the next seq on the GPU and publishes it;
    /// returns the seq and the pixels written.
    fn write(&mut self) -> (u64, Vec<Vec<u8>>) {
        let mut slot = self.publisher.loan(WAIT).expect("a slot");
        let seq = slot.seq();
        let geometry = *slot.geometry();
        let len = slot.device_mut().expect("a device slot").len() as usize;
        let mut host = vec![0u8; len];
        vramring_testkit::pattern::fill(&mut host, seq);
        let pixels = ring_pixels(&host, &geometry, gst_video::VideoFormat::Nv12);
        vramring_testkit::gpu::fill_cuda(&self.gpu, slot, seq).expect("the pattern is written and published");
        (seq, pixels)
    }
}

fn cuda_ring_to_vramringsrc(width: u32, height: u32) {
    let n = 12u64;
    let cfg = RingConfig::new(Format::Nv12, width, height)
        .slots(4)
        .policy(Policy::Lossless);
    let mut ring = CudaRingSource::new("cuda-src", cfg, "lossless=true");
    let src = ring.src.clone();
    // Wait for the subscriber: a lossless publisher keeps every frame for it.
    let deadline = std::time::Instant::now() + WAIT;
    while ring.publisher.stats().subscribers == 0 {
        assert!(std::time::Instant::now() < deadline, "vramringsrc did not subscribe");
        assert_no_error(&src);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let written: Vec<_> = (0..n).map(|_| ring.write().1).collect();
    let got = pull(&src, n as usize);
    assert!(src_negotiated_cuda(&src, "vsrc"), "vramringsrc put out CUDA memory");
    for (i, (sample, want)) in got.iter().zip(&written).enumerate() {
        let (info, planes) = sample_pixels(sample);
        assert_eq!((info.width(), info.height()), (width, height));
        assert!(
            planes == *want,
            "{width}x{height} frame {i} differs from the pattern the publisher wrote"
        );
    }
    stop(&src);
    ring.publisher.close().expect("the publisher closes");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn vramringsrc_hands_cuda_memory_of_a_rust_publishers_frames_bit_exact() {
    cuda_ring_to_vramringsrc(320, 240);
    cuda_ring_to_vramringsrc(321, 241);
}

/// `vramringsrc` as it comes on a CUDA ring (`mode=latest`,
/// `zero-copy=true`, ADR 0028): it subscribes by push into a queue and
/// hands downstream its push buffers as CUDA memory. Once frames arrive by
/// push (the publisher maps the source's buffers at a publish after the
/// handshake; until then they are pulled), every frame it delivers is the
/// one the publisher wrote for that seq, bit-exact after `cudadownload`,
/// in seq order, and every one arrived by push. A size whose layout
/// GStreamer's CUDA elements would misread (`wrapped` false: ADR 0028) is
/// copied instead: the source subscribes as a latest reader and pulls.
fn zero_copy_latest_source(width: u32, height: u32, wrapped: bool) {
    let mut ring = CudaRingSource::new("zero-copy", RingConfig::new(Format::Nv12, width, height).slots(8), "");
    let src = ring.src.clone();
    let sink = appsink(&src);
    let vsrc = src.by_name("vsrc").expect("the source");
    let counters = || {
        let stats = vsrc.property::<gst::Structure>("stats");
        let get = |k| stats.get::<u64>(k).unwrap_or_else(|_| panic!("{k} in {stats}"));
        (get("pushed"), get("delivered"), stats.to_string())
    };
    let mut written = std::collections::HashMap::new();
    let deadline = std::time::Instant::now() + WAIT;
    // A frame every 20 ms until frames come by push: the first ones may go
    // to the subscription the source makes before it knows its output, or
    // be pulled before the publisher has mapped the push buffers.
    let mut warm = 0;
    while wrapped && counters().0 == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no frame came by push: {}",
            counters().2
        );
        assert_no_error(&src);
        warm = ring.write().0;
        let _ = sink.try_pull_sample(gst::ClockTime::from_mseconds(20));
    }
    // Counted from here: frames written from now on (one written before
    // may still be on its way downstream, counted already).
    let (pushed0, delivered0, _) = counters();
    let mut got = Vec::new();
    while got.len() < 10 {
        assert!(std::time::Instant::now() < deadline, "only {} frames came", got.len());
        assert_no_error(&src);
        let (seq, pixels) = ring.write();
        written.insert(seq, pixels);
        if let Some(sample) = sink.try_pull_sample(gst::ClockTime::from_mseconds(20)) {
            if sample.buffer().expect("a buffer").offset() > warm {
                got.push(sample);
            }
        }
    }
    assert!(src_negotiated_cuda(&src, "vsrc"), "vramringsrc put out CUDA memory");
    let mut last = 0;
    for sample in &got {
        let seq = sample.buffer().expect("a buffer").offset();
        assert!(seq > last, "frames in seq order");
        last = seq;
        let (_, planes) = sample_pixels(sample);
        assert!(
            Some(&planes) == written.get(&seq),
            "{width}x{height} frame {seq} differs from the pattern the publisher wrote"
        );
    }
    let (pushed, delivered, stats) = counters();
    assert!(delivered - delivered0 >= got.len() as u64, "{stats}");
    if wrapped {
        assert!(
            pushed - pushed0 >= delivered - delivered0,
            "every frame delivered since push began came by push: {stats}, from pushed={pushed0} delivered={delivered0}"
        );
    } else {
        assert_eq!(pushed, 0, "a copied source pulls: {stats}");
    }
    stop(&src);
    ring.publisher.close().expect("the publisher closes");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_zero_copy_vramringsrc_hands_out_its_push_buffers_bit_exact() {
    zero_copy_latest_source(320, 240, true);
    zero_copy_latest_source(321, 241, false);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn nvh264dec_frames_cross_two_pipelines_in_cuda_memory_bit_exact() {
    init();
    let refs = framemd5(&data("clip.nv12.framemd5"));
    let (_dir, path) = socket("nvdec-src");
    let sink = play(&format!(
        "filesrc location={} ! h264parse ! nvh264dec ! vramringsink name=vsink socket-path={} policy=lossless wait-subscribers=1 sync=false",
        data("clip.h264").display(),
        path.display()
    ));
    let src = play(&format!(
        "vramringsrc name=vsrc socket-path={} lossless=true timeout=20000 ! cudadownload ! video/x-raw,format=NV12 ! appsink name=sink sync=false",
        path.display()
    ));
    let got = pull(&src, refs.len());
    assert!(
        negotiated_cuda(&sink, "vsink"),
        "nvh264dec ! vramringsink in CUDA memory"
    );
    assert!(src_negotiated_cuda(&src, "vsrc"), "vramringsrc put out CUDA memory");
    for (i, (sample, want)) in got.iter().zip(&refs).enumerate() {
        let mut h = Md5::new();
        for plane in sample_pixels(sample).1 {
            h.update(&plane);
        }
        assert_eq!(
            &format!("{:x}", h.finalize()),
            want,
            "frame {i} differs from ffmpeg's decode"
        );
    }
    wait_eos(&sink);
    stop(&sink);
    stop(&src);
}

/// `vramringsrc` feeds an encoder in CUDA memory: `nvh264dec !
/// vramringsink` → `vramringsrc ! nvh264enc`, every decoded frame encoded
/// once, the source's output negotiated as `memory:CUDAMemory` (no
/// download between the ring and NVENC).
#[test]
#[ignore = "needs a CUDA GPU with NVENC (Hopper has none: gst/bench/run.sh does not run it there)"]
fn vramringsrc_feeds_nvh264enc_in_cuda_memory() {
    init();
    let frames = framemd5(&data("clip.nv12.framemd5")).len();
    let (_dir, path) = socket("nvenc");
    let sink = play(&format!(
        "filesrc location={} ! h264parse ! nvh264dec ! vramringsink name=vsink socket-path={} policy=lossless wait-subscribers=1 sync=false",
        data("clip.h264").display(),
        path.display()
    ));
    // timeout: the source ends the stream 2 s after the publisher goes.
    let src = play(&format!(
        "vramringsrc name=vsrc socket-path={} lossless=true timeout=2000 ! nvh264enc ! h264parse ! video/x-h264,stream-format=byte-stream,alignment=au ! appsink name=sink sync=false",
        path.display()
    ));
    wait_eos(&sink);
    assert!(
        negotiated_cuda(&sink, "vsink"),
        "nvh264dec ! vramringsink in CUDA memory"
    );
    assert!(
        src_negotiated_cuda(&src, "vsrc"),
        "vramringsrc ! nvh264enc in CUDA memory"
    );
    stop(&sink);
    let encoded: Vec<_> = pull_all(&src).iter().map(access_unit).collect();
    assert_eq!(encoded.len(), frames, "one access unit per decoded frame");
    assert!(encoded[0].1, "the encoded stream starts at a keyframe");
    assert!(encoded.iter().all(|(au, _)| !au.is_empty()));
    stop(&src);
}
