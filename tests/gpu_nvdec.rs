//! NVDEC end to end on the GPU, proven bit for bit against a software
//! decoder: every NV12 frame must have the MD5 that
//! `ffmpeg -f framemd5 -pix_fmt nv12` (libavcodec's H.264 decoder on the CPU)
//! wrote into `tests/data/*.nv12.framemd5`.
//!
//! * `decoder_alone_matches_ffmpeg_on_both_clips`: the [`Decoder`] in this
//!   process, each picture copied to the host, both clips, two loops.
//! * `ring_subscribers_match_ffmpeg_pull_push_and_namespaced`: the
//!   `nvdec_producer` example publishes each clip twice into a lossless
//!   CUDA ring; three subscriber processes (pull lossless, push, and pull
//!   lossless in its own PID, IPC and mount namespaces) copy every frame
//!   they receive to the host, hash the displayed rows without pitch
//!   padding, and match the reference of the frame's index (carried in the
//!   frame's user metadata). Needs root for `unshare`.
//!
//! With `VRAMRING_NVDEC_PNG=path`, the second test also writes the 1080p
//! clip's frame 45, as received by the namespaced subscriber, as a PNG.

use vramring::ClientOptions;
use vramring_testkit::procs as common;

use vramring_testkit::data::{framemd5, path as data};
use vramring_testkit::finals;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{example, TempDir};
use finals::final_line;
use md5::{Digest, Md5};
use vramring::nvdec::{Codec, Decoder, DecoderOptions};
use vramring::seam::cuda::{find_device_by_uuid, ContextGuard, Driver, RealDriver};
use vramring::{Error, Subscriber, SubscriberOptions};

/// Selects the subscriber role in a re-executed test binary:
/// `socket|push-or-pull|reference|png-path-or-empty`.
const SUB_ENV: &str = "VRAMRING_NVDEC_SUB";
const SELF_TEST: &str = "ring_subscribers_match_ffmpeg_pull_push_and_namespaced";

struct Clip {
    file: &'static str,
    reference: &'static str,
    width: u32,
    height: u32,
}

const CLIPS: [Clip; 2] = [
    Clip {
        file: "clip.h264",
        reference: "clip.nv12.framemd5",
        width: 320,
        height: 240,
    },
    Clip {
        file: "clip1080.h264",
        reference: "clip1080.nv12.framemd5",
        width: 1920,
        height: 1080,
    },
];

fn md5_rows<'a>(rows: impl Iterator<Item = &'a [u8]>) -> String {
    let mut h = Md5::new();
    for r in rows {
        h.update(r);
    }
    format!("{:x}", h.finalize())
}

/// BT.601 limited-range NV12 to RGB, written as an 8-bit PNG.
fn write_png(path: &Path, w: usize, h: usize, luma: &[u8], lp: usize, chroma: &[u8], cp: usize) {
    let mut rgb = Vec::with_capacity(w * h * 3);
    for y in 0..h {
        for x in 0..w {
            let yy = f32::from(luma[y * lp + x]) - 16.0;
            let c = (y / 2) * cp + (x & !1);
            let u = f32::from(chroma[c]) - 128.0;
            let v = f32::from(chroma[c + 1]) - 128.0;
            let px = |f: f32| f.round().clamp(0.0, 255.0) as u8;
            rgb.push(px(1.164 * yy + 1.596 * v));
            rgb.push(px(1.164 * yy - 0.392 * u - 0.813 * v));
            rgb.push(px(1.164 * yy + 2.017 * u));
        }
    }
    let file = std::fs::File::create(path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w as u32, h as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut wr = enc.write_header().expect("png header");
    wr.write_image_data(&rgb).expect("png data");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn decoder_alone_matches_ffmpeg_on_both_clips() {
    for clip in &CLIPS {
        let refs = framemd5(&data(clip.reference));
        let stream = std::fs::read(data(clip.file)).expect("clip");
        let units = vramring::packet::annexb::access_units(&stream);
        let mut dec = Decoder::new(DecoderOptions::new(Codec::H264)).expect("an NVDEC decoder");
        let mut host = Vec::new();
        let mut got: Vec<String> = Vec::new();
        let mut sink = |f: &vramring::nvdec::DecodedFrame<'_>| -> vramring::Result<()> {
            assert_eq!((f.width(), f.height()), (clip.width, clip.height), "display size");
            f.copy_to_host(&mut host)?;
            let w = f.width() as usize;
            got.push(md5_rows(host.chunks(w)));
            Ok(())
        };
        for _ in 0..2 {
            for (k, au) in units.iter().enumerate() {
                dec.decode(au.bytes, Some(k as i64), &mut sink).expect("decode");
            }
            dec.flush(&mut sink).expect("flush");
        }
        let info = dec.info().expect("stream info");
        eprintln!(
            "{}: {} frames decoded, coded {}x{}, display {}x{}, {} surfaces; first frame md5 {} (ffmpeg {})",
            clip.file,
            got.len(),
            info.coded_width,
            info.coded_height,
            info.width,
            info.height,
            info.surfaces,
            got.first().map_or("-", String::as_str),
            refs[0]
        );
        dec.close().expect("close");
        assert_eq!(got.len(), 2 * refs.len(), "{}: frames out", clip.file);
        let bad: Vec<usize> = (0..got.len()).filter(|&i| got[i] != refs[i % refs.len()]).collect();
        assert!(
            bad.is_empty(),
            "{}: {} of {} frames differ from ffmpeg's, first at {}",
            clip.file,
            bad.len(),
            got.len(),
            bad[0]
        );
    }
}

/// The subscriber role: receives until the producer is gone, hashing each
/// frame, then prints a final JSON line.
fn subscriber(spec: &str) -> ! {
    let parts: Vec<&str> = spec.split('|').collect();
    let (socket, mode, refs, png_path) = (parts[0], parts[1], framemd5(Path::new(parts[2])), parts[3]);
    let push = mode == "push";
    let opts = if push {
        SubscriberOptions::default().push(true).name("nvdec-push")
    } else {
        SubscriberOptions::default().lossless(true).name("nvdec-pull")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut sub = loop {
        match Subscriber::connect(socket, opts.clone()) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("connecting to {socket}: {e}"),
        }
    };
    let d = RealDriver::shared().expect("driver");
    let dev = find_device_by_uuid(&*d, &sub.info().device_uuid()).expect("the ring's GPU");
    let ctx = d.primary_ctx_retain(dev).expect("primary context");
    let g = *sub.geometry();
    let (y, uv) = (g.planes()[0], g.planes()[1]);
    let mut host = vec![0u8; g.frame_bytes as usize];
    let (mut received, mut matched, mut mismatched, mut pushed) = (0u64, 0u64, 0u64, 0u64);
    let mut first_bad = String::new();
    let mut loops = std::collections::BTreeSet::new();
    let mut wrote_png = false;
    loop {
        let f = match sub.next(Duration::from_secs(20)) {
            Ok(f) => f,
            Err(Error::ProducerGone { .. }) => break,
            Err(e) => panic!("{mode} subscriber: {e}"),
        };
        let user = f.user();
        let idx = u32::from_le_bytes(user[..4].try_into().expect("8 user bytes")) as usize;
        let lp = u32::from_le_bytes(user[4..8].try_into().expect("8 user bytes"));
        pushed += u64::from(f.pushed());
        {
            // SAFETY: `ctx` is retained above, released at the end.
            let guard = unsafe { ContextGuard::push(&*d, ctx) }.expect("push context");
            // SAFETY: `f.addr()` is this subscriber's copy of the frame
            // (`frame_bytes` long) in its primary context, valid until the
            // next `next`.
            unsafe { d.memcpy_dtoh(&mut host, f.device().expect("a CUDA frame").as_raw()) }
                .expect("device to host copy");
            guard.restore().expect("restore context");
        }
        let w = g.width as usize;
        let rows = (0..g.height as usize)
            .map(|r| &host[y.offset as usize + r * y.pitch as usize..][..w])
            .chain((0..g.height as usize / 2).map(|r| &host[uv.offset as usize + r * uv.pitch as usize..][..w]));
        let h = md5_rows(rows);
        received += 1;
        loops.insert(lp);
        if refs.get(idx) == Some(&h) {
            matched += 1;
        } else {
            mismatched += 1;
            if first_bad.is_empty() {
                first_bad = format!("frame {idx} loop {lp}: {h} vs {:?}", refs.get(idx));
            }
        }
        if !png_path.is_empty() && !wrote_png && idx == 45 {
            write_png(
                Path::new(png_path),
                w,
                g.height as usize,
                &host[y.offset as usize..],
                y.pitch as usize,
                &host[uv.offset as usize..],
                uv.pitch as usize,
            );
            wrote_png = true;
        }
    }
    drop(sub);
    d.primary_ctx_release(dev).expect("release");
    println!(
        "{{\"event\":\"final\",\"mode\":\"{mode}\",\"received\":{received},\"matched\":{matched},\"mismatched\":{mismatched},\"pushed\":{pushed},\"loops\":{},\"first_bad\":\"{first_bad}\"}}",
        loops.len()
    );
    std::process::exit(0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn ring_subscribers_match_ffmpeg_pull_push_and_namespaced() {
    if let Ok(spec) = std::env::var(SUB_ENV) {
        subscriber(&spec);
    }
    let d = RealDriver::shared().expect("a CUDA driver");
    let free_before = common::gpu_free_bytes(&d);
    let png = std::env::var("VRAMRING_NVDEC_PNG").unwrap_or_default();
    let flags =
        std::env::var("VRAMRING_TEST_UNSHARE").unwrap_or_else(|_| "--pid --ipc --mount --fork --mount-proc".into());
    for clip in &CLIPS {
        let dir = TempDir::new(&format!("nvdec-{}", clip.file));
        let socket = dir.join("cam.sock").display().to_string();
        let refs = framemd5(&data(clip.reference));
        let n = refs.len() as u64;
        let t = Instant::now();
        let producer = Command::new(example("nvdec_producer"))
            .args(["--socket", &socket, "--input"])
            .arg(data(clip.file))
            .args([
                "--lossless",
                "--fps",
                "60",
                "--loops",
                "2",
                "--wait-subscribers",
                "3",
                "--json",
                "--report-ms",
                "0",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("producer");
        let reference_path = data(clip.reference).display().to_string();
        let sub = |mode: &str, namespaced: bool, png: &str| {
            let exe = std::env::current_exe().expect("exe");
            let mut cmd = if namespaced {
                let mut c = Command::new("unshare");
                c.args(flags.split_whitespace()).arg(exe);
                c
            } else {
                Command::new(exe)
            };
            cmd.args(["--exact", SELF_TEST, "--include-ignored", "--nocapture"])
                .env(SUB_ENV, format!("{socket}|{mode}|{reference_path}|{png}"))
                .stdout(Stdio::piped())
                .spawn()
                .expect("subscriber")
        };
        let png_here = if clip.width == 1920 { png.as_str() } else { "" };
        let subs = vec![
            ("pull", sub("pull", false, "")),
            ("push", sub("push", false, "")),
            ("namespaced-pull", sub("pull", true, png_here)),
        ];
        let p = final_line(&format!("{} producer", clip.file), producer);
        assert_eq!(p.u64("published"), Some(2 * n), "{}: {p:?}", clip.file);
        assert_eq!(p.u64("width"), Some(u64::from(clip.width)));
        assert_eq!(p.u64("height"), Some(u64::from(clip.height)));
        for (name, child) in subs {
            let j = final_line(&format!("{} {name}", clip.file), child);
            assert_eq!(j.u64("mismatched"), Some(0), "{} {name}: {j:?}", clip.file);
            assert_eq!(j.u64("matched"), j.u64("received"), "{} {name}: {j:?}", clip.file);
            if name == "push" {
                assert!(
                    j.u64("received").unwrap_or(0) >= n,
                    "{} {name} got too few: {j:?}",
                    clip.file
                );
                assert!(
                    j.u64("pushed").unwrap_or(0) > 0,
                    "{} {name} never got a pushed frame: {j:?}",
                    clip.file
                );
            } else {
                assert_eq!(j.u64("received"), Some(2 * n), "{} {name}: {j:?}", clip.file);
                assert_eq!(j.u64("loops"), Some(2), "{} {name}: {j:?}", clip.file);
            }
        }
        eprintln!("{} ran in {:?}", clip.file, t.elapsed());
    }
    std::thread::sleep(Duration::from_millis(500));
    let free_after = common::gpu_free_bytes(&d);
    let diff = free_before.abs_diff(free_after);
    eprintln!("device free memory before {free_before} after {free_after}");
    assert!(diff <= 4 << 20, "device free memory moved by {diff} bytes");
}
