//! Raw video through a frame ring: `vramringsink` to `vramringsrc` and to
//! the Rust subscriber, a Rust publisher to `vramringsrc`, a publisher
//! restart and a caps change.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use gst::prelude::*;
use vramring::ServeOptions;
use vramring::{
    BackendChoice, ClientOptions, Format, FrameMeta, Mode, Policy, Publisher, RingConfig, Subscriber, SubscriberOptions,
};

/// What `videotestsrc` makes for `caps` (`n` frames), straight into an appsink.
fn reference(caps: &str, n: usize) -> Vec<Vec<Vec<u8>>> {
    let p = play(&format!(
        "videotestsrc num-buffers={n} pattern=smpte ! {caps} ! appsink name=sink sync=false"
    ));
    let frames = pull(&p, n).iter().map(|s| sample_pixels(s).1).collect();
    stop(&p);
    frames
}

/// A Rust subscriber connected to `path`, tried until [`WAIT`] runs out.
fn subscribe(path: &std::path::Path, opts: SubscriberOptions) -> Subscriber {
    let deadline = Instant::now() + WAIT;
    loop {
        match Subscriber::connect(path, opts.clone()) {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("no publisher at {} within {WAIT:?}: {e}", path.display()),
        }
    }
}

/// `videotestsrc` through `vramringsink` reaches `vramringsrc` and a Rust
/// subscriber bit for bit, for `format` at `width` x `height`.
fn sink_to_src_and_subscriber(format: &str, width: u32, height: u32, n: usize) {
    init();
    let (_dir, path) = socket("frames");
    let caps = format!("video/x-raw,format={format},width={width},height={height},framerate=30/1");
    let expected = reference(&caps, n);
    let gst_format = gst_video::VideoFormat::from_string(format);

    let sink = play(&format!(
        "videotestsrc num-buffers={n} pattern=smpte ! {caps} ! vramringsink socket-path={} policy=lossless wait-subscribers=2 lossless-lease=60000 sync=false",
        path.display()
    ));
    let src = play(&format!(
        "vramringsrc socket-path={} lossless=true timeout=20000 ! appsink name=sink sync=false",
        path.display()
    ));
    let rust = {
        let path = path.clone();
        std::thread::spawn(move || {
            let mut sub = subscribe(&path, SubscriberOptions::default().name("rust").lossless(true));
            (0..n)
                .map(|_| {
                    let f = sub.next(WAIT).expect("a frame");
                    let bytes = f.host_bytes().expect("a host ring");
                    (f.pts(), ring_pixels(bytes, f.geometry(), gst_format))
                })
                .collect::<Vec<_>>()
        })
    };

    let got = pull(&src, n);
    for (i, (sample, want)) in got.iter().zip(&expected).enumerate() {
        let (info, planes) = sample_pixels(sample);
        assert_eq!(
            (info.format(), info.width(), info.height()),
            (gst_format, width, height)
        );
        assert_eq!(
            info.fps(),
            gst::Fraction::new(30, 1),
            "the framerate travels in the trailer"
        );
        assert!(planes == *want, "vramringsrc frame {i} differs from videotestsrc's");
    }
    let from_rust = rust.join().expect("the Rust subscriber");
    for (i, ((pts, planes), want)) in from_rust.iter().zip(&expected).enumerate() {
        assert!(planes == want, "Rust subscriber frame {i} differs from videotestsrc's");
        assert_eq!(
            *pts,
            i as i64 * 1_000_000_000 / 30,
            "frame {i}'s pts is the buffer's, in ns"
        );
    }
    wait_eos(&sink);
    stop(&sink);
    stop(&src);
}

#[test]
fn nv12_frames_arrive_bit_exact_in_vramringsrc_and_the_rust_subscriber() {
    sink_to_src_and_subscriber("NV12", 320, 240, 30);
}

#[test]
fn every_ring_format_arrives_bit_exact_at_odd_sizes() {
    for format in ["NV12", "P010_10LE", "GRAY8", "RGB", "RGBA"] {
        sink_to_src_and_subscriber(format, 161, 91, 5);
    }
}

/// Publishes `n` frames of the test pattern on `publisher` once a subscriber
/// is there; returns each frame's pixels as written.
fn publish_pattern(publisher: &mut Publisher, n: u64, first_pts: i64) -> Vec<Vec<Vec<u8>>> {
    let deadline = Instant::now() + WAIT;
    while publisher.stats().subscribers == 0 {
        assert!(Instant::now() < deadline, "no subscriber within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut written = Vec::new();
    for i in 0..n {
        let mut slot = publisher.loan(WAIT).expect("a slot");
        let seq = slot.seq();
        let geometry = *slot.geometry();
        let bytes = slot.bytes_mut().expect("a host slot");
        vramring_testkit::pattern::fill(bytes, seq);
        written.push(ring_pixels(bytes, &geometry, gst_video::VideoFormat::Nv12));
        slot.publish(FrameMeta::pts(first_pts + i as i64)).expect("published");
    }
    written
}

/// A lossless host ring whose lease is long: a reader that a loaded
/// machine leaves unscheduled for a second is not evicted (these tests
/// check frames, not the lease).
fn ring(width: u32, height: u32) -> RingConfig {
    RingConfig::new(Format::Nv12, width, height)
        .slots(4)
        .backend(BackendChoice::Host)
        .policy(Policy::Lossless)
        .lossless_lease(std::time::Duration::from_secs(60))
}

#[test]
fn a_rust_publisher_feeds_vramringsrc_frame_for_frame() {
    init();
    let (_dir, path) = socket("rust-pub");
    let mut publisher = Publisher::create(&path, ring(64, 48)).expect("a ring");
    let src = play(&format!(
        "vramringsrc socket-path={} lossless=true timestamp-mode=pts ! appsink name=sink sync=false",
        path.display()
    ));
    let written = publish_pattern(&mut publisher, 12, 1000);
    let got = pull(&src, 12);
    for (i, (sample, want)) in got.iter().zip(&written).enumerate() {
        let (info, planes) = sample_pixels(sample);
        assert_eq!((info.width(), info.height()), (64, 48));
        assert!(planes == *want, "frame {i} differs from what the publisher wrote");
        let buffer = sample.buffer().expect("a buffer");
        assert_eq!(buffer.offset(), i as u64 + 1, "the offset is the frame's seq");
        assert_eq!(
            buffer.pts(),
            Some(gst::ClockTime::from_nseconds(1000 + i as u64)),
            "timestamp-mode=pts"
        );
    }
    stop(&src);
}

#[test]
fn vramringsrc_follows_a_publisher_restart_with_new_caps() {
    init();
    let (_dir, path) = socket("restart");
    let src = play(&format!(
        "vramringsrc name=src socket-path={} lossless=true timeout=20000 ! appsink name=sink sync=false",
        path.display()
    ));
    let mut first = Publisher::create(&path, ring(64, 48)).expect("the first ring");
    let before = publish_pattern(&mut first, 5, 0);
    let got_before = pull(&src, 5);
    first.close().expect("the first publisher closes");
    drop(first);

    let mut second = Publisher::create(&path, ring(96, 64)).expect("the second ring");
    let after = publish_pattern(&mut second, 5, 0);
    let got_after = pull(&src, 5);

    for (i, (s, want)) in got_before.iter().zip(&before).enumerate() {
        let (info, planes) = sample_pixels(s);
        assert_eq!((info.width(), info.height()), (64, 48));
        assert!(planes == *want, "first publisher's frame {i} differs");
    }
    for (i, (s, want)) in got_after.iter().zip(&after).enumerate() {
        let (info, planes) = sample_pixels(s);
        assert_eq!((info.width(), info.height()), (96, 64), "new caps after the restart");
        assert!(planes == *want, "second publisher's frame {i} differs");
    }
    let first_after = got_after[0].buffer().expect("a buffer");
    assert!(
        first_after.flags().contains(gst::BufferFlags::DISCONT),
        "the first frame after the gap is DISCONT"
    );
    let stats = src
        .by_name("src")
        .expect("the source")
        .property::<gst::Structure>("stats");
    assert_eq!(stats.get::<u64>("reconnects").ok(), Some(1), "{stats}");
    assert_eq!(stats.get::<u64>("delivered").ok(), Some(10), "{stats}");
    stop(&src);
}

#[test]
fn a_caps_change_recreates_the_ring_and_subscribers_follow() {
    init();
    let (_dir, path) = socket("caps-change");
    let pipeline = gst::Pipeline::new();
    let appsrc = gst_app::AppSrc::builder().format(gst::Format::Time).build();
    let sink = gst::ElementFactory::make("vramringsink")
        .property("socket-path", path.to_str().expect("a UTF-8 path"))
        .property("sync", false)
        .build()
        .expect("vramringsink");
    pipeline.add_many([appsrc.upcast_ref(), &sink]).expect("elements add");
    appsrc.link(&sink).expect("appsrc links to the sink");
    pipeline.set_state(gst::State::Playing).expect("plays");

    let push = |w: u32, h: u32, fill: u8, pts: u64| {
        let info = gst_video::VideoInfo::builder(gst_video::VideoFormat::Gray8, w, h)
            .build()
            .expect("info");
        appsrc.set_caps(Some(&info.to_caps().expect("caps")));
        let mut buffer = gst::Buffer::from_mut_slice(vec![fill; info.size()]);
        buffer
            .get_mut()
            .expect("writable")
            .set_pts(gst::ClockTime::from_nseconds(pts));
        appsrc.push_buffer(buffer).expect("pushed");
    };
    // The first caps make the ring; a subscriber joins it.
    push(32, 16, 1, 0);
    let mut sub = subscribe(&path, SubscriberOptions::default().mode(Mode::Latest).reconnect(true));
    assert_eq!((sub.geometry().width, sub.geometry().height), (32, 16));
    // New caps: the ring is made again at the same path, of the new size.
    let deadline = Instant::now() + WAIT;
    let mut pts = 1;
    let seen = loop {
        assert!(Instant::now() < deadline, "the subscriber never saw the new ring");
        push(48, 24, 7, pts);
        pts += 1;
        match sub.next(Duration::from_millis(200)) {
            Ok(f) if f.geometry().width == 48 => break (f.geometry().height, f.host_bytes().expect("host")[0]),
            Ok(_) | Err(vramring::Error::Timeout(..)) | Err(vramring::Error::ProducerGone { .. }) => continue,
            Err(e) => panic!("reading after the caps change: {e}"),
        }
    };
    assert_eq!(seen, (24, 7));
    assert!(
        sub.stats().reconnects >= 1,
        "the subscriber reconnected to the new ring"
    );
    assert_no_error(&pipeline);
    stop(&pipeline);
}

/// Publishes one frame at a time until the source behind `sink` has put
/// one out, and returns it: from then on the source is reading.
fn first_sample(publisher: &mut Publisher, sink: &gst_app::AppSink) -> gst::Sample {
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "the source put out no frame");
        publish_pattern(publisher, 1, 0);
        if let Some(sample) = sink.try_pull_sample(gst::ClockTime::from_mseconds(50)) {
            return sample;
        }
    }
}

/// Pulls from `sink` until it has a sample of the newest frame, publishing
/// one more at a time (frames that found the source behind are never
/// delivered). Each sample goes through `check` and is let go at once (a
/// zero-copy source's kept buffer would hold its queue); returns each one's
/// seq and whether it was DISCONT, in order.
fn until_newest(
    publisher: &mut Publisher,
    sink: &gst_app::AppSink,
    mut check: impl FnMut(&gst::BufferRef),
) -> Vec<(u64, bool)> {
    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    loop {
        while let Some(sample) = sink.try_pull_sample(gst::ClockTime::from_mseconds(50)) {
            let buffer = sample.buffer().expect("a buffer");
            check(buffer);
            got.push((buffer.offset(), buffer.flags().contains(gst::BufferFlags::DISCONT)));
        }
        let newest = publisher.next_seq() - 1;
        if got.last().map(|g| g.0) == Some(newest) {
            return got;
        }
        assert!(Instant::now() < deadline, "the source never caught up: {got:?}");
        publish_pattern(publisher, 1, 0);
    }
}

#[test]
fn frames_a_sequential_source_never_received_are_posted_as_qos_and_counted() {
    init();
    let (_dir, path) = socket("drops");
    let cfg = RingConfig::new(Format::Nv12, 64, 48)
        .slots(2)
        .backend(BackendChoice::Host);
    let mut publisher = Publisher::create(&path, cfg).expect("a ring");
    // The appsink holds one buffer and blocks the source's next push, so
    // until the test pulls, the source reads at most two frames.
    let src = play(&format!(
        "vramringsrc name=src socket-path={} mode=sequential ! appsink name=sink sync=false max-buffers=1",
        path.display()
    ));
    let sink = appsink(&src);
    let first = first_sample(&mut publisher, &sink);
    let first = first.buffer().expect("a buffer").offset();
    // 12 frames on a 2-slot ring while the source can read at most two and
    // keep two in its ring: at least 8 are overwritten before it reads them.
    publish_pattern(&mut publisher, 12, 0);
    let got = until_newest(&mut publisher, &sink, |_| {});
    let seqs: Vec<u64> = got.iter().map(|g| g.0).collect();
    // The gap may come right after `first`: a source slow to wake reads
    // nothing of the burst until it is over.
    let mut prev = first;
    let after_gap = got
        .iter()
        .find(|g| std::mem::replace(&mut prev, g.0) + 1 < g.0)
        .unwrap_or_else(|| panic!("the source skipped the overwritten frames: {first} then {seqs:?}"));
    assert!(after_gap.1, "the buffer after the gap is DISCONT: {got:?}");

    // Each QoS message carries the count so far; the last one, posted
    // before the last buffer after a gap left the source, has them all.
    let bus = src.bus().expect("a bus");
    let mut last = None;
    while let Some(msg) = bus.pop_filtered(&[gst::MessageType::Qos]) {
        let gst::MessageView::Qos(qos) = msg.view() else {
            unreachable!("filtered on QoS")
        };
        match qos.stats().1 {
            gst::GenericFormattedValue::Buffers(Some(n)) => last = Some(*n),
            other => panic!("dropped counted in buffers, not {other:?}"),
        }
    }
    let dropped = last.expect("a QoS message for the dropped frames");
    let newest = *seqs.last().expect("a frame");
    // Every frame after the first is delivered or counted.
    assert_eq!(dropped, newest - first - seqs.len() as u64, "{seqs:?}");
    assert!(dropped >= 8, "QoS reports {dropped} dropped frames");
    let stats = src
        .by_name("src")
        .expect("the source")
        .property::<gst::Structure>("stats");
    assert_eq!(stats.get::<u64>("dropped").ok(), Some(dropped), "{stats}");
    stop(&src);
}

#[test]
fn a_cuda_ring_for_system_memory_is_refused_with_a_reason() {
    init();
    let (_dir, path) = socket("cuda");
    let p = play(&format!(
        "videotestsrc num-buffers=1 ! video/x-raw,format=NV12,width=64,height=48 ! vramringsink backend=cuda socket-path={}",
        path.display()
    ));
    let msg = p
        .bus()
        .expect("a bus")
        .timed_pop_filtered(gst::ClockTime::from_seconds(WAIT.as_secs()), &[gst::MessageType::Error])
        .expect("an error: system memory cannot go to a CUDA ring in this build");
    let gst::MessageView::Error(e) = msg.view() else {
        unreachable!("filtered on errors")
    };
    assert!(
        e.debug().unwrap_or_default().contains("memory:CUDAMemory")
            || e.error().to_string().contains("memory:CUDAMemory"),
        "{e:?}"
    );
    assert!(!path.exists(), "no ring was served");
    stop(&p);
}

/// Pulls samples from `src` until frame `last` comes, checking each
/// against what the publisher `written` for its seq; returns their seqs.
fn frames_through(src: &gst::Pipeline, written: &[Vec<Vec<u8>>], last: u64) -> Vec<u64> {
    let mut seqs = Vec::new();
    while seqs.last() != Some(&last) {
        let sample = pull(src, 1).pop().expect("a sample");
        let seq = sample.buffer().expect("a buffer").offset();
        let (_, planes) = sample_pixels(&sample);
        assert!(
            planes == written[seq as usize - 1],
            "frame {seq} differs from what was written"
        );
        seqs.push(seq);
    }
    seqs
}

#[test]
fn delivery_auto_falls_back_to_push_when_the_publisher_refuses_pull() {
    init();
    let (_dir, path) = socket("push");
    let cfg = RingConfig::new(Format::Nv12, 64, 48)
        .backend(BackendChoice::Host)
        .pull(vramring::PullAccess::Nobody);
    let mut publisher = Publisher::create(&path, cfg).expect("a push-only ring");
    let src = play(&format!(
        "vramringsrc name=src socket-path={} delivery=auto ! appsink name=sink sync=false",
        path.display()
    ));
    let written = publish_pattern(&mut publisher, 12, 0);
    // A latest reader may skip frames; every frame it gets is whole and is
    // the frame of its seq, and the newest one comes.
    frames_through(&src, &written, 12);
    let stats = src
        .by_name("src")
        .expect("the source")
        .property::<gst::Structure>("stats");
    assert!(
        stats.get::<u64>("pushed").expect("a pushed field") >= 1,
        "frames came by push: {stats}"
    );
    stop(&src);
}

/// `delivery=push` serves every read mode: a lossless source is pushed
/// every frame from its first one, in order and whole.
#[test]
fn a_lossless_push_source_gets_every_frame_in_order() {
    init();
    let (_dir, path) = socket("lossless-push");
    let mut publisher =
        Publisher::create(&path, ring(64, 48).pull(vramring::PullAccess::Nobody)).expect("a push-only ring");
    let src = play(&format!(
        "vramringsrc name=src socket-path={} lossless=true delivery=push ! appsink name=sink sync=false",
        path.display()
    ));
    let written = publish_pattern(&mut publisher, 12, 0);
    // The stream starts at the first frame pushed after the source's
    // buffers were attached; from there on nothing is skipped.
    let seqs = frames_through(&src, &written, 12);
    let first = seqs[0];
    assert_eq!(
        seqs,
        (first..=12).collect::<Vec<_>>(),
        "every frame from the first, in order"
    );
    let stats = src
        .by_name("src")
        .expect("the source")
        .property::<gst::Structure>("stats");
    assert_eq!(stats.get::<u64>("pushed").ok(), Some(seqs.len() as u64), "{stats}");
    assert_eq!(stats.get::<u64>("dropped").ok(), Some(0), "{stats}");
    stop(&src);
}

/// `zero-copy` (the default) with a queue read by push: each buffer is
/// the subscriber's own push buffer (memory GStreamer did not allocate),
/// and a buffer kept downstream stays whole while later frames flow (as
/// many as the source's queue has room for: a lossless publisher waits for
/// the kept buffer beyond that); with
/// `zero-copy=false` every buffer is a copy in system memory. 512 wide: the
/// ring's pitch is GStreamer's default stride, so the appsink (which
/// asks for no video meta) can take the ring's layout as it is.
#[test]
fn a_queued_push_source_hands_downstream_its_push_buffers_and_a_kept_one_stays_whole() {
    init();
    for zero_copy in [true, false] {
        let (_dir, path) = socket(&format!("zero-copy-{zero_copy}"));
        let mut publisher = Publisher::create(&path, ring(512, 64)).expect("a ring");
        let src = play(&format!(
            "vramringsrc name=src socket-path={} lossless=true delivery=push zero-copy={zero_copy} ! appsink name=sink sync=false max-buffers=2",
            path.display()
        ));
        // Published from another thread: a lossless ring waits for the
        // source, which waits for the appsink to be read.
        // The stream starts at the first frame pushed after the source's
        // buffers were mapped (ADR 0026): the frame kept is the one after.
        let writer = std::thread::spawn(move || publish_pattern(&mut publisher, 60, 0));
        let mut kept: Option<gst::Sample> = None;
        let mut got = Vec::new();
        let mut checked = false;
        while got.last() != Some(&60) {
            let sample = pull(&src, 1).pop().expect("a sample");
            let buffer = sample.buffer().expect("a buffer");
            let ours = buffer.peek_memory(0).is_type("RustGlobalAllocatorMemory");
            assert_eq!(
                ours, zero_copy,
                "zero-copy={zero_copy}: the push buffer itself, or a copy"
            );
            let seq = buffer.offset();
            got.push(seq);
            if seq == got[0] + 1 {
                kept = Some(sample);
            } else if seq == got[0] + 4 {
                // Three frames went by: its bytes are still the kept
                // frame's (the pattern of a seq is checked against the seq).
                let sample = kept.take().expect("the frame after the first came");
                let bytes = sample.buffer().expect("a buffer").map_readable().expect("readable");
                vramring_testkit::pattern::verify(&bytes, got[0] + 1).expect("the kept frame is whole");
                checked = true;
            }
        }
        let written = writer.join().expect("the writer");
        assert!(checked, "the stream began at frame {}, too late to keep one", got[0]);
        assert_eq!(got, (got[0]..=60).collect::<Vec<_>>(), "every frame, in order");
        assert_eq!(written.len(), 60);
        stop(&src);
    }
}

/// A host ring 640 wide (its pitch, 1024, is not GStreamer's default
/// stride) read by push into `videoconvert`, which reads a video meta:
/// the first frame is a copy (its caps start the negotiation that asks
/// downstream), every later buffer is the push buffer itself in the ring's
/// layout, and the I420 that comes out holds the frames' pixels.
#[test]
fn a_host_push_source_hands_a_video_meta_reader_its_push_buffers_in_the_rings_layout() {
    init();
    let (_dir, path) = socket("video-meta");
    let mut publisher = Publisher::create(&path, ring(640, 48)).expect("a ring");
    let src = play(&format!(
        "vramringsrc name=src socket-path={} lossless=true delivery=push ! videoconvert ! \
         video/x-raw,format=I420 ! appsink name=sink sync=false max-buffers=2",
        path.display()
    ));
    let wrapped = Arc::new(Mutex::new(Vec::new()));
    {
        let wrapped = wrapped.clone();
        let pad = src
            .by_name("src")
            .and_then(|e| e.static_pad("src"))
            .expect("the source's pad");
        pad.add_probe(gst::PadProbeType::BUFFER, move |_, info| {
            if let Some(b) = info.buffer() {
                let ours = b.peek_memory(0).is_type("RustGlobalAllocatorMemory");
                wrapped.lock().expect("not poisoned").push((b.offset(), ours));
            }
            gst::PadProbeReturn::Ok
        });
    }
    let writer = std::thread::spawn(move || publish_pattern(&mut publisher, 20, 0));
    let mut samples = Vec::new();
    while samples
        .last()
        .map(|s: &gst::Sample| s.buffer().expect("a buffer").offset())
        != Some(20)
    {
        samples.extend(pull(&src, 1));
    }
    let written = writer.join().expect("the writer");
    for sample in &samples {
        let seq = sample.buffer().expect("a buffer").offset();
        let (_, planes) = sample_pixels(sample);
        let nv12 = &written[seq as usize - 1];
        let (u, v): (Vec<u8>, Vec<u8>) = nv12[1].chunks(2).map(|c| (c[0], c[1])).unzip();
        assert!(
            planes == [nv12[0].clone(), u, v],
            "frame {seq} differs from what was written"
        );
    }
    let wrapped = wrapped.lock().expect("not poisoned").clone();
    assert!(wrapped.len() > 1, "{wrapped:?}");
    assert!(
        !wrapped[0].1,
        "the first buffer goes out before its caps are negotiated: a copy"
    );
    assert!(
        wrapped[1..].iter().all(|&(_, ours)| ours),
        "after the first, every buffer is the push buffer: {wrapped:?}"
    );
    stop(&src);
}

/// A 512×64 NV12 host ring of 16 slots (512 wide: the ring's pitch is
/// GStreamer's default stride) and `vramringsrc delivery=push ! appsink
/// <sink_props>` reading it, playing.
fn push_source(name: &str, sink_props: &str) -> (tempfile::TempDir, Publisher, gst::Pipeline) {
    init();
    let (dir, path) = socket(name);
    let cfg = RingConfig::new(Format::Nv12, 512, 64)
        .slots(16)
        .backend(BackendChoice::Host);
    let publisher = Publisher::create(&path, cfg).expect("a ring");
    let src = play(&format!(
        "vramringsrc name=src socket-path={} delivery=push ! appsink name=sink sync=false {sink_props}",
        path.display()
    ));
    (dir, publisher, src)
}

/// `delivery=push` in `mode=latest` with zero-copy: the source reads a
/// queue and, at each read, passes over every frame but the newest,
/// counting them as dropped. Downstream blocked (an appsink of one buffer,
/// not read) while ten frames are published: once it reads again, the
/// source jumps to the newest frame it was pushed; every frame after the
/// first is either delivered or counted, and each delivered one is whole
/// and the subscriber's own push buffer.
#[test]
fn a_latest_push_source_drains_its_queue_to_the_newest_frame() {
    let (_dir, mut publisher, src) = push_source("latest-push", "max-buffers=1");
    let sink = appsink(&src);
    let first = first_sample(&mut publisher, &sink).buffer().expect("a buffer").offset();
    // Ten frames while downstream takes none: the source holds at most
    // two (one in the appsink, one in its push), the rest wait in its
    // queue; then it is at the newest again.
    publish_pattern(&mut publisher, 10, 0);
    let got = until_newest(&mut publisher, &sink, |buffer| {
        let seq = buffer.offset();
        assert!(
            buffer.peek_memory(0).is_type("RustGlobalAllocatorMemory"),
            "frame {seq} was copied"
        );
        let bytes = buffer.map_readable().expect("readable");
        vramring_testkit::pattern::verify(&bytes, seq).expect("a whole frame");
    });
    let seqs: Vec<u64> = got.iter().map(|g| g.0).collect();
    // From `first` on: a source slow to wake may read nothing of the
    // burst until it is over, and pass over it all at once.
    let read: Vec<u64> = std::iter::once(first).chain(seqs.iter().copied()).collect();
    assert!(read.windows(2).all(|w| w[0] < w[1]), "in seq order: {read:?}");
    assert!(
        read.windows(2).any(|w| w[1] > w[0] + 1),
        "the source passed over the frames behind the newest: {read:?}"
    );
    let stats = src
        .by_name("src")
        .expect("the source")
        .property::<gst::Structure>("stats");
    let newest = *seqs.last().expect("a frame");
    // Every frame after the first is delivered or counted.
    let passed_over = newest - first - seqs.len() as u64;
    assert_eq!(stats.get::<u64>("dropped").ok(), Some(passed_over), "{seqs:?} {stats}");
    assert_eq!(
        stats.get::<u64>("delivered").ok(),
        Some(seqs.len() as u64 + 1),
        "{stats}"
    );
    stop(&src);
}

/// A downstream that keeps every buffer it is lent (an encoder with
/// lookahead, a queue that fills) leaves a zero-copy source's queue no
/// room: the source warns, subscribes again and copies from then on, and
/// frames keep coming instead of the pipeline stalling. The warning is
/// posted without the source's lock: a bus sync handler that reads the
/// source's stats on it does not deadlock the streaming thread.
#[test]
fn a_source_whose_lent_buffers_are_all_kept_falls_back_to_copies() {
    let (_dir, mut publisher, src) = push_source("starved", "");
    let sink = appsink(&src);
    let warned = std::sync::Arc::new(std::sync::Mutex::new(None::<gst::Structure>));
    let element = src.by_name("src").expect("the source").downgrade();
    let seen = warned.clone();
    src.bus().expect("a bus").set_sync_handler(move |_, msg| {
        if let gst::MessageView::Warning(w) = msg.view() {
            if w.error().to_string().contains("copying frames") {
                let stats = element.upgrade().map(|e| e.property::<gst::Structure>("stats"));
                *seen.lock().expect("unpoisoned") = stats;
            }
        }
        gst::BusSyncReply::Pass
    });
    let mut kept = vec![first_sample(&mut publisher, &sink)];
    let deadline = Instant::now() + WAIT;
    while kept.len() < 24 {
        assert!(
            Instant::now() < deadline,
            "the source stalled after {} frames",
            kept.len()
        );
        publish_pattern(&mut publisher, 1, 0);
        kept.extend(sink.try_pull_sample(gst::ClockTime::from_mseconds(20)));
    }
    let lent = |s: &gst::Sample| {
        s.buffer()
            .expect("a buffer")
            .peek_memory(0)
            .is_type("RustGlobalAllocatorMemory")
    };
    assert!(lent(&kept[0]), "the first frames are lent");
    assert!(!lent(kept.last().expect("a sample")), "the last ones are copies");
    for sample in &kept {
        let buffer = sample.buffer().expect("a buffer");
        let bytes = buffer.map_readable().expect("readable");
        vramring_testkit::pattern::verify(&bytes, buffer.offset()).expect("every kept frame is whole");
    }
    let stats = warned.lock().expect("unpoisoned").take();
    assert!(stats.is_some(), "a warning says why, and the stats could be read on it");
    drop(kept);
    stop(&src);
}

/// A pad template's caps: CUDA memory first, then system memory, and
/// nothing else.
fn assert_cuda_memory_first(template: &gst::Caps) {
    let features: Vec<bool> = template
        .iter_with_features()
        .map(|(_, f)| f.contains("memory:CUDAMemory"))
        .collect();
    assert_eq!(
        features,
        [true, false],
        "CUDA memory first, then system memory: {template}"
    );
}

#[test]
fn the_sink_template_offers_cuda_memory_first_and_backend_host_never_does() {
    init();
    let sink = gst::ElementFactory::make("vramringsink")
        .property_from_str("backend", "host")
        .build()
        .expect("a vramringsink");
    assert_cuda_memory_first(sink.pad_template("sink").expect("a sink template").caps());
    let pad = sink.static_pad("sink").expect("a sink pad");
    let caps = pad.query_caps(None);
    assert!(!caps.is_empty());
    assert!(
        caps.iter_with_features().all(|(_, f)| !f.contains("memory:CUDAMemory")),
        "backend=host offers system memory only: {caps}"
    );
}

/// A host ring has no device memory: even an appsink that takes anything
/// (CUDA memory included) gets system memory from it.
#[test]
fn the_source_template_offers_cuda_memory_first_and_a_host_ring_gives_system_memory() {
    init();
    let probe = gst::ElementFactory::make("vramringsrc").build().expect("a vramringsrc");
    assert_cuda_memory_first(probe.pad_template("src").expect("a src template").caps());
    let (_dir, path) = socket("host-any");
    let mut publisher = Publisher::create(&path, ring(64, 48)).expect("a ring");
    let src = play(&format!(
        "vramringsrc name=vsrc socket-path={} lossless=true ! appsink name=sink sync=false",
        path.display()
    ));
    publish_pattern(&mut publisher, 2, 0);
    let got = pull(&src, 2);
    for sample in &got {
        let caps = sample.caps().expect("caps");
        assert!(
            caps.iter_with_features().all(|(_, f)| !f.contains("memory:CUDAMemory")),
            "a host ring gives system memory: {caps}"
        );
    }
    stop(&src);
}

/// The `stats` property answers while the streaming thread waits: here a
/// sink waiting for a slot that a lossless reader holds (a 30 s lease). A
/// read that waited for the sink's state would return only after the
/// eviction, with the reader gone.
#[test]
fn the_sink_reports_its_stats_while_it_waits_for_a_lossless_reader() {
    init();
    let (_dir, path) = socket("stats-while-waiting");
    let sink = play(&format!(
        "videotestsrc num-buffers=5 ! video/x-raw,format=NV12,width=64,height=48 ! vramringsink name=vsink socket-path={} policy=lossless slots=2 lossless-lease=30000 wait-subscribers=1 sync=false",
        path.display()
    ));
    // Connected, it reads nothing: the sink publishes two frames, then waits.
    let mut reader = subscribe(&path, SubscriberOptions::default().name("idle").lossless(true));
    let vsink = sink.by_name("vsink").expect("the sink");
    let deadline = Instant::now() + WAIT;
    let stats = loop {
        let stats = vsink.property::<gst::Structure>("stats");
        if stats.get::<u64>("lossless-waits").unwrap_or(0) > 0 {
            break stats;
        }
        assert!(Instant::now() < deadline, "the sink never waited: {stats}");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(stats.get::<u64>("published").ok(), Some(2), "{stats}");
    assert_eq!(
        stats.get::<u64>("evictions").ok(),
        Some(0),
        "read during the wait: {stats}"
    );
    assert_eq!(stats.get::<u32>("subscribers").ok(), Some(1), "{stats}");
    for _ in 0..5 {
        reader.next(WAIT).expect("every frame, once the reader reads");
    }
    stop(&sink);
}
