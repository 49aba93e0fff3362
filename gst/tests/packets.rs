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
        "filesrc location={} ! {PARSE} ! vramringpacketsink name=psink socket-path={} wait-subscribers=2 sync=false",
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
