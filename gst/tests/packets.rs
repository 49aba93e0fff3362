//! Access units through a packet ring: `vramringpacketsink` to
//! `vramringpacketsrc`, and to the Rust packet subscriber.

mod common;

use std::time::{Duration, Instant};

use common::*;
use gst::prelude::*;
use vramring::packet::{PacketSubscriber, PacketSubscriberOptions};
use vramring::ClientOptions;

const PARSE: &str = "h264parse ! video/x-h264,stream-format=byte-stream,alignment=au";

#[test]
fn h264_access_units_round_trip_unit_for_unit() {
    init();
    let (_dir, path) = socket("packets");
    let clip = clip();
    let reference = play(&format!(
        "filesrc location={} ! {PARSE} ! appsink name=sink sync=false",
        clip.display()
    ));
    let want: Vec<_> = pull_all(&reference).iter().map(access_unit).collect();
    stop(&reference);
    assert!(want.len() >= 100, "the clip parses into {} access units", want.len());

    let sink = play(&format!(
        "filesrc location={} ! {PARSE} ! vramringpacketsink name=psink socket-path={} wait-subscribers=2 lossless-lease=60000 sync=false",
        clip.display(),
        path.display()
    ));
    let src = play(&format!(
        "vramringpacketsrc socket-path={} lossless=true timeout=20000 ! appsink name=sink sync=false",
        path.display()
    ));
    let n = want.len();
    let rust = {
        let path = path.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + WAIT;
            let mut sub = loop {
                match PacketSubscriber::connect(&path, PacketSubscriberOptions::new().name("rust").lossless(true)) {
                    Ok(s) => break s,
                    Err(e) => {
                        assert!(Instant::now() < deadline, "no packet publisher within {WAIT:?}: {e}");
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            };
            let mut buf = Vec::new();
            let mut out = Vec::new();
            for _ in 0..n {
                let p = sub.next_copy(&mut buf, WAIT).expect("a packet");
                out.push((buf[..p.len].to_vec(), p.is_key()));
            }
            let mut params = Vec::new();
            sub.codec_params(&mut params).expect("codec parameters");
            (out, params, sub.info().codec)
        })
    };
    let got: Vec<_> = pull(&src, n).iter().map(access_unit).collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g.0 == w.0,
            "access unit {i} differs ({} bytes against {})",
            g.0.len(),
            w.0.len()
        );
        assert_eq!(g.1, w.1, "access unit {i}'s keyframe flag");
    }
    let caps = common::appsink(&src)
        .static_pad("sink")
        .expect("a sink pad")
        .current_caps()
        .expect("caps");
    assert_eq!(
        caps.structure(0).map(|s| s.name().to_string()).as_deref(),
        Some("video/x-h264")
    );

    let (from_rust, params, codec) = rust.join().expect("the Rust subscriber");
    for (i, (g, w)) in from_rust.iter().zip(&want).enumerate() {
        assert!(g.0 == w.0, "Rust subscriber's access unit {i} differs");
        assert_eq!(g.1, w.1, "Rust subscriber's keyframe flag {i}");
    }
    assert_eq!(
        codec,
        u32::from_le_bytes(*b"H264"),
        "the ring's codec is the FourCC H264"
    );
    assert!(
        !params.is_empty(),
        "the keyframes' SPS and PPS are the ring's codec parameters"
    );
    let first_key = &want.iter().find(|w| w.1).expect("a keyframe").0;
    let sps_pps = vramring::packet::annexb::parameter_sets(first_key);
    assert_eq!(params, sps_pps, "the codec parameters are the keyframe's SPS and PPS");
    wait_eos(&sink);
    stop(&sink);
    stop(&src);
}

/// `n` frames of `videotestsrc` encoded as H.265 (an IDR every 10 frames,
/// parameter sets only before the first), as an Annex-B file in `dir`.
fn h265_clip(dir: &std::path::Path, n: u32) -> std::path::PathBuf {
    let path = dir.join("clip.h265");
    let p = play(&format!(
        "videotestsrc num-buffers={n} ! video/x-raw,width=320,height=240,framerate=30/1 ! x265enc key-int-max=10 speed-preset=ultrafast ! h265parse ! video/x-h265,stream-format=byte-stream ! filesink location={}",
        path.display()
    ));
    wait_eos(&p);
    stop(&p);
    path
}

const PARSE_H265: &str = "h265parse ! video/x-h265,stream-format=byte-stream,alignment=au";

#[test]
fn h265_access_units_round_trip_and_a_late_joiner_gets_the_parameter_sets() {
    init();
    let (dir, path) = socket("h265");
    let clip = h265_clip(dir.path(), 40);
    let reference = play(&format!(
        "filesrc location={} ! {PARSE_H265} ! appsink name=sink sync=false",
        clip.display()
    ));
    let want: Vec<_> = pull_all(&reference).iter().map(access_unit).collect();
    stop(&reference);
    assert_eq!(want.len(), 40, "one access unit per frame");
    let keys: Vec<usize> = (0..want.len()).filter(|&i| want[i].1).collect();
    assert!(keys.len() >= 3, "keyframes at {keys:?}");

    let sink = play(&format!(
        "filesrc location={} ! {PARSE_H265} ! vramringpacketsink socket-path={} wait-subscribers=1 lossless-lease=60000 sync=false",
        clip.display(),
        path.display()
    ));
    let src = play(&format!(
        "vramringpacketsrc socket-path={} lossless=true timeout=20000 ! appsink name=sink sync=false",
        path.display()
    ));
    let got: Vec<_> = pull(&src, want.len()).iter().map(access_unit).collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g == w,
            "access unit {i} differs ({} bytes against {})",
            g.0.len(),
            w.0.len()
        );
    }
    let caps = appsink(&src)
        .static_pad("sink")
        .expect("a sink pad")
        .current_caps()
        .expect("caps");
    assert_eq!(
        caps.structure(0).map(|s| s.name().to_string()).as_deref(),
        Some("video/x-h265")
    );
    wait_eos(&sink);

    // Everything is written and the ring still holds it: a subscriber that
    // joins now starts at the last keyframe, which carries no parameter
    // sets; the source prepends the ring's (VPS, SPS, PPS of the first).
    let last_key = &want[*keys.last().expect("a keyframe")].0;
    let late = play(&format!(
        "vramringpacketsrc socket-path={} ! appsink name=sink sync=false",
        path.display()
    ));
    let first = access_unit(&pull(&late, 1)[0]);
    assert!(first.1, "the late joiner starts at a keyframe");
    assert!(first.0.ends_with(last_key), "it is the last keyframe");
    let params = &first.0[..first.0.len() - last_key.len()];
    assert!(!params.is_empty(), "the keyframe got the parameter sets");
    assert!(
        want[keys[0]].0.starts_with(params) || want[keys[0]].0.windows(params.len()).any(|w| w == params),
        "they are the first keyframe's"
    );
    let nal_types: Vec<u8> = vramring::packet::annexb::nal_units(params)
        .into_iter()
        .map(|(s, _)| {
            let sc = vramring::packet::annexb::start_code_len(&params[s..]).expect("a start code");
            (params[s + sc] >> 1) & 0x3f
        })
        .collect();
    assert_eq!(nal_types, vec![32, 33, 34], "VPS, SPS and PPS");
    stop(&late);
    stop(&sink);
    stop(&src);
}
