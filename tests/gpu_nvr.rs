//! The multi-camera decoder (`examples/nvr_decoder.rs`) on the GPU: one
//! process decodes four cameras looping `tests/data/clip.h264` and a fifth
//! fed by a packet ring, each into its own CUDA ring.
//!
//! * Every frame a Rust `Subscriber` receives from a file camera (two
//!   lossless pull readers on lossless rings, two push readers on
//!   push-only rings) equals, bit for bit, FFmpeg's software decode of the
//!   clip at the frame's index (`tests/data/clip.nv12.framemd5`, the
//!   reference `tests/gpu_nvdec.rs` uses), across at least two loops;
//!   every frame's decode time (user metadata bytes 8..16) is set and
//!   precedes its commit.
//! * The packet camera's publisher (`packet_producer`) is killed: the four
//!   file cameras keep delivering verified frames; the decoder reports the
//!   input gone; the publisher is started again and the packet camera
//!   resumes on the same ring (its subscriber never reconnects), its frames
//!   equal to some frame of the clip, with a resync logged and counted.
//! * SIGINT ends the decoder with exit 0 and a final line per camera: no
//!   decode error, no resync on the file cameras, one input restart on the
//!   packet camera.
//!
//! And the host-memory mode (`[decoder] memory = "host"`): two file cameras
//! decoded into host shared-memory rings (each picture copied
//! device-to-host into its slot), read by a lossless pull reader and a push
//! reader, every frame equal to the same reference at its index, across at
//! least two loops, exactly as the CUDA rings' frames are.
//!
//! Run on a GPU machine: `cargo build --features nvdec --examples && cargo
//! test --features nvdec --test gpu_nvr -- --include-ignored` (it starts the
//! `nvr_decoder` and `packet_producer` examples), or staged:
//! `VRAMRING_TEST_DATA=tests/data bash .device/run.sh tests gpu_nvr` (the
//! tests' names start with `gpu_nvr`).

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use md5::{Digest, Md5};
use vramring::seam::cuda::{find_device_by_uuid, ContextGuard, Driver, RealDriver};
use vramring::{BackendKind, ClientOptions, Error, Mode, Subscriber, SubscriberOptions};
use vramring_testkit::data::{framemd5, path as data};
use vramring_testkit::json::JsonLine;
use vramring_testkit::procs::{example, TempDir};

const FILE_CAMERAS: usize = 4;
const DEADLINE: Duration = Duration::from_secs(120);

/// What one subscriber thread saw.
#[derive(Default)]
struct Seen {
    received: AtomicU64,
    matched: AtomicU64,
    mismatched: AtomicU64,
    pushed: AtomicU64,
    /// Frames whose decode time (user bytes 8..16) is 0 or after their commit.
    bad_times: AtomicU64,
    /// Highest segment (loop) number seen plus one.
    segments: AtomicU64,
    first_bad: Mutex<String>,
    end: Mutex<String>,
}

fn get(c: &AtomicU64) -> u64 {
    // Relaxed: counters written by one thread, read for progress only.
    c.load(Ordering::Relaxed)
}

/// Reads `socket` until its publisher is gone, hashing the displayed rows
/// of every frame. `by_index`: match the reference at the frame's index
/// (file cameras); otherwise any frame of the clip (the packet camera).
/// The ring must be on `backend`: a CUDA ring's frames are copied to the
/// host in the ring's GPU context, a host ring's straight from its memory.
fn read_ring(
    socket: &Path,
    opts: SubscriberOptions,
    refs: &[String],
    by_index: bool,
    backend: BackendKind,
    seen: &Seen,
) {
    let deadline = Instant::now() + DEADLINE;
    let mut sub = loop {
        match Subscriber::connect(socket, opts.clone()) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("connecting to {}: {e}", socket.display()),
        }
    };
    let any: HashSet<&str> = refs.iter().map(String::as_str).collect();
    assert_eq!(sub.backend(), backend, "{}: the ring's memory", socket.display());
    let gpu = (backend == BackendKind::Cuda).then(|| {
        let d = RealDriver::shared().expect("driver");
        let dev = find_device_by_uuid(&*d, &sub.info().device_uuid()).expect("the ring's GPU");
        let ctx = d.primary_ctx_retain(dev).expect("primary context");
        (d, dev, ctx)
    });
    let g = *sub.geometry();
    let (y, uv) = (g.planes()[0], g.planes()[1]);
    let mut host = vec![0u8; g.frame_bytes as usize];
    let end = loop {
        let f = match sub.next(Duration::from_secs(30)) {
            Ok(f) => f,
            Err(Error::ProducerGone { .. }) => break "producer gone".to_owned(),
            Err(e) => break format!("error: {e}"),
        };
        let user = f.user();
        let idx = u32::from_le_bytes(user[..4].try_into().expect("8 user bytes")) as usize;
        let segment = u32::from_le_bytes(user[4..8].try_into().expect("8 user bytes"));
        // When the decoded picture reached the decoder's sink: before the
        // frame's commit, whatever the ring's memory.
        let decoded_ns = u64::from_le_bytes(user[8..16].try_into().expect("16 user bytes"));
        if decoded_ns == 0 || decoded_ns > f.commit_ns() {
            seen.bad_times.fetch_add(1, Ordering::Relaxed);
        }
        seen.pushed.fetch_add(u64::from(f.pushed()), Ordering::Relaxed);
        if let Some((d, _, ctx)) = &gpu {
            // SAFETY: `ctx` is retained above, released at the end.
            let guard = unsafe { ContextGuard::push(&**d, *ctx) }.expect("push context");
            // SAFETY: the frame's device buffer is this subscriber's copy
            // (`frame_bytes` long) in its primary context, valid until the
            // next `next`.
            unsafe { d.memcpy_dtoh(&mut host, f.device().expect("a CUDA frame").as_raw()) }
                .expect("device to host copy");
            guard.restore().expect("restore context");
        } else {
            f.copy_to_host(&mut host).expect("the host frame");
        }
        let w = g.width as usize;
        let mut h = Md5::new();
        for r in 0..g.height as usize {
            h.update(&host[y.offset as usize + r * y.pitch as usize..][..w]);
        }
        for r in 0..g.height as usize / 2 {
            h.update(&host[uv.offset as usize + r * uv.pitch as usize..][..w]);
        }
        let hash = format!("{:x}", h.finalize());
        let ok = if by_index {
            refs.get(idx) == Some(&hash)
        } else {
            any.contains(hash.as_str())
        };
        if ok {
            seen.matched.fetch_add(1, Ordering::Relaxed);
        } else {
            seen.mismatched.fetch_add(1, Ordering::Relaxed);
            let mut fb = seen.first_bad.lock().unwrap();
            if fb.is_empty() {
                *fb = format!("frame {idx} segment {segment}: {hash} vs {:?}", refs.get(idx));
            }
        }
        seen.segments.fetch_max(u64::from(segment) + 1, Ordering::Relaxed);
        seen.received.fetch_add(1, Ordering::Relaxed);
    };
    drop(sub);
    if let Some((d, dev, _)) = gpu {
        d.primary_ctx_release(dev).expect("release");
    }
    *seen.end.lock().unwrap() = end;
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process killed and reaped when dropped (a failing phase must not
/// leave a looping publisher behind).
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn packet_producer(socket: &Path) -> KillOnDrop {
    let child = Command::new(example("packet_producer"))
        .arg("--socket")
        .arg(socket)
        .arg("--input")
        .arg(data("clip.h264"))
        .args(["--fps", "60", "--loops", "0"])
        .stdout(Stdio::null())
        .spawn()
        .expect("packet_producer");
    KillOnDrop(child)
}

/// Lines the decoder printed, collected by a thread.
type Lines = Arc<Mutex<Vec<String>>>;

/// Starts `nvr_decoder --config config --json`; a thread collects its
/// stdout lines until it exits.
fn start_decoder(config: &Path) -> (Child, Lines, std::thread::JoinHandle<()>) {
    let mut decoder = Command::new(example("nvr_decoder"))
        .arg("--config")
        .arg(config)
        .arg("--json")
        .stdout(Stdio::piped())
        .spawn()
        .expect("nvr_decoder");
    let lines: Lines = Arc::default();
    let reader = {
        let out = decoder.stdout.take().expect("piped");
        let lines = Arc::clone(&lines);
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(l);
            }
        })
    };
    (decoder, lines, reader)
}

/// Prints what camera `name`'s reader saw, and checks that every frame it
/// received matched the clip, carried a decode time before its commit, and
/// that its ring ended as the decoder closed it.
fn check_camera(name: &str, st: &Seen) {
    eprintln!(
        "{name}: received {} matched {} mismatched {} pushed {} segments {} end {:?} first bad {:?}",
        get(&st.received),
        get(&st.matched),
        get(&st.mismatched),
        get(&st.pushed),
        get(&st.segments),
        st.end.lock().unwrap(),
        st.first_bad.lock().unwrap()
    );
    assert_eq!(get(&st.mismatched), 0, "{name}: {}", st.first_bad.lock().unwrap());
    assert_eq!(get(&st.bad_times), 0, "{name}: decode times before the commit");
    assert_eq!(get(&st.matched), get(&st.received), "{name}");
    assert_eq!(*st.end.lock().unwrap(), "producer gone", "{name}");
}

/// Ends the decoder: SIGINT when the test's phases passed (it exits 0
/// and closes its rings), SIGKILL when one failed.
fn stop_decoder(decoder: &Child, phases_passed: bool) {
    let signal = if phases_passed { libc::SIGINT } else { libc::SIGKILL };
    // SAFETY: kill(2) on our own child's pid, which has not been reaped.
    let rc = unsafe { libc::kill(decoder.id() as libc::pid_t, signal) };
    assert_eq!(rc, 0, "signal to the decoder");
}

/// Waits for the signalled decoder: re-raises a failed phase with the
/// decoder's output, else checks it exited 0 and returns its lines.
fn finish_decoder(
    mut decoder: Child,
    phases: std::thread::Result<()>,
    lines: &Lines,
    reader: std::thread::JoinHandle<()>,
) -> Vec<String> {
    if let Err(panic) = phases {
        let _ = decoder.wait();
        eprintln!("decoder output:\n{}", lines.lock().unwrap().join("\n"));
        std::panic::resume_unwind(panic);
    }
    let status = decoder.wait().expect("decoder");
    reader.join().expect("stdout reader");
    let lines = lines.lock().unwrap().clone();
    assert!(
        status.success(),
        "nvr_decoder exit {status:?}; output:\n{}",
        lines.join("\n")
    );
    lines
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_nvr_four_file_cameras_stay_bit_exact_while_a_dead_packet_input_is_resynced() {
    let refs = framemd5(&data("clip.nv12.framemd5"));
    let n = refs.len() as u64;
    let dir = TempDir::new("gpu-nvr");
    let rings = dir.join("rings");
    std::fs::create_dir_all(&rings).expect("rings dir");
    let clip = data("clip.h264").display().to_string();
    let mut toml = format!(
        "[decoder]\nsocket_dir = {:?}\nreport_ms = 500\nstall_ms = 500\nretry_ms = 100\n",
        rings.display().to_string()
    );
    for k in 0..FILE_CAMERAS {
        // Two lossless rings read by lossless pull readers, two push-only
        // rings read by push readers.
        let ring = if k < 2 {
            "{ slots = 8, policy = \"lossless\", loan_timeout_ms = 5000 }"
        } else {
            "{ slots = 8, pull = \"nobody\" }"
        };
        toml += &format!(
            "[[camera]]\nname = \"cam{k}\"\ninput = {{ file = {clip:?}, loop = true, fps = 100 }}\nring = {ring}\n"
        );
    }
    toml += "[[camera]]\nname = \"live\"\ninput = { packets = \"live.packets.sock\" }\nring = { slots = 8 }\n";
    let config = dir.join("cameras.toml");
    std::fs::write(&config, &toml).expect("config");
    eprintln!("{toml}");

    let live_packets = rings.join("live.packets.sock");
    let source = packet_producer(&live_packets);
    let (decoder, lines, reader) = start_decoder(&config);
    let events = |camera: &str, kind: &str| -> usize {
        lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| JsonLine::parse(l))
            .filter(|j| {
                j.get("event") == Some("camera-event") && j.get("camera") == Some(camera) && j.get("kind") == Some(kind)
            })
            .count()
    };

    let seen: Vec<Seen> = (0..=FILE_CAMERAS).map(|_| Seen::default()).collect();
    let phases = std::thread::scope(|s| {
        for (k, st) in seen.iter().enumerate() {
            let refs = &refs;
            let rings = &rings;
            s.spawn(move || {
                let (name, opts, by_index) = if k == FILE_CAMERAS {
                    (
                        "live".to_owned(),
                        SubscriberOptions::default().push(true).name("gpu_nvr-live"),
                        false,
                    )
                } else if k < 2 {
                    let o = SubscriberOptions::default()
                        .mode(Mode::Sequential)
                        .lossless(true)
                        .name("gpu_nvr-lossless");
                    (format!("cam{k}"), o, true)
                } else {
                    (
                        format!("cam{k}"),
                        SubscriberOptions::default().push(true).name("gpu_nvr-push"),
                        true,
                    )
                };
                read_ring(
                    &rings.join(format!("{name}.sock")),
                    opts,
                    refs,
                    by_index,
                    BackendKind::Cuda,
                    st,
                );
            });
        }
        let phases = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let file = &seen[..FILE_CAMERAS];
            let live = &seen[FILE_CAMERAS];
            // Phase 1: two loops of every file camera, and the live camera going.
            wait_for("two loops on the lossless file cameras", || {
                file[..2].iter().all(|s| get(&s.received) >= 2 * n)
            });
            wait_for("frames on the push file cameras", || {
                file[2..].iter().all(|s| get(&s.received) >= n / 2)
            });
            wait_for("frames on the live camera", || get(&live.received) >= 30);
            // Phase 2: the live camera's publisher dies.
            drop(source);
            wait_for("the decoder to report the live input gone", || {
                events("live", "input-gone") >= 1
            });
            let at_kill: Vec<u64> = file.iter().map(|s| get(&s.received)).collect();
            let live_at_kill = get(&live.received);
            wait_for("the file cameras to go on without the live one", || {
                file.iter().zip(&at_kill).all(|(s, k)| get(&s.received) >= k + n / 2)
            });
            // Phase 3: it comes back; its ring never went away.
            let source2 = packet_producer(&live_packets);
            wait_for("the live camera to resync", || events("live", "resync") >= 1);
            wait_for("live frames after the restart", || {
                get(&live.received) >= live_at_kill + 30
            });
            drop(source2);
        }));
        // The decoder ends (SIGINT; SIGKILL when a phase failed), its rings close
        // and every reader thread sees ProducerGone.
        stop_decoder(&decoder, phases.is_ok());
        phases
    });
    let lines = finish_decoder(decoder, phases, &lines, reader);
    for (k, st) in seen.iter().enumerate() {
        let name = if k == FILE_CAMERAS {
            "live".to_owned()
        } else {
            format!("cam{k}")
        };
        check_camera(&name, st);
        if (2..FILE_CAMERAS).contains(&k) || k == FILE_CAMERAS {
            assert!(get(&st.pushed) > 0, "{name}: a push reader got pushed frames");
        }
        if k < 2 {
            assert!(get(&st.segments) >= 2, "{name}: at least two loops");
        }
    }
    let finals: Vec<JsonLine> = lines
        .iter()
        .filter_map(|l| JsonLine::parse(l))
        .filter(|j| j.get("event") == Some("camera-final"))
        .collect();
    assert_eq!(finals.len(), FILE_CAMERAS + 1, "a final line per camera");
    for j in &finals {
        let cam = j.get("camera").expect("camera");
        assert_eq!(j.u64("decode_errors"), Some(0), "{cam}: {j:?}");
        assert_eq!(j.u64("panics"), Some(0), "{cam}: {j:?}");
        if cam == "live" {
            assert_eq!(j.u64("input_restarts"), Some(1), "{cam}: {j:?}");
            assert!(j.u64("resyncs").unwrap_or(0) >= 1, "{cam}: {j:?}");
        } else {
            assert_eq!(j.u64("resyncs"), Some(0), "{cam}: {j:?}");
            assert_eq!(j.u64("input_restarts"), Some(0), "{cam}: {j:?}");
            assert!(j.u64("loops").unwrap_or(0) >= 2, "{cam}: {j:?}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_nvr_host_memory_rings_carry_the_same_bit_exact_frames() {
    let refs = framemd5(&data("clip.nv12.framemd5"));
    let n = refs.len() as u64;
    let dir = TempDir::new("gpu-nvr-host");
    let rings = dir.join("rings");
    std::fs::create_dir_all(&rings).expect("rings dir");
    let clip = data("clip.h264").display().to_string();
    // cam0: a lossless ring read by a lossless pull reader (every frame);
    // cam1: a push-only ring read by a push reader.
    let toml = format!(
        "[decoder]\nsocket_dir = {:?}\nmemory = \"host\"\nreport_ms = 500\n\
         [[camera]]\nname = \"cam0\"\ninput = {{ file = {clip:?}, loop = true, fps = 100 }}\n\
         ring = {{ slots = 8, policy = \"lossless\", loan_timeout_ms = 5000 }}\n\
         [[camera]]\nname = \"cam1\"\ninput = {{ file = {clip:?}, loop = true, fps = 100 }}\n\
         ring = {{ slots = 8, pull = \"nobody\" }}\n",
        rings.display().to_string()
    );
    let config = dir.join("cameras.toml");
    std::fs::write(&config, &toml).expect("config");
    eprintln!("{toml}");
    let (decoder, lines, reader) = start_decoder(&config);
    let seen = [Seen::default(), Seen::default()];
    let phases = std::thread::scope(|s| {
        for (k, st) in seen.iter().enumerate() {
            let (refs, rings) = (&refs, &rings);
            s.spawn(move || {
                let opts = if k == 0 {
                    SubscriberOptions::default()
                        .mode(Mode::Sequential)
                        .lossless(true)
                        .name("gpu_nvr-host-lossless")
                } else {
                    SubscriberOptions::default().push(true).name("gpu_nvr-host-push")
                };
                let socket = rings.join(format!("cam{k}.sock"));
                read_ring(&socket, opts, refs, true, BackendKind::Host, st);
            });
        }
        let phases = std::panic::catch_unwind(AssertUnwindSafe(|| {
            wait_for("two loops on the lossless host camera", || {
                get(&seen[0].received) >= 2 * n
            });
            wait_for("two loops on the push host camera", || get(&seen[1].segments) >= 2);
        }));
        stop_decoder(&decoder, phases.is_ok());
        phases
    });
    let lines = finish_decoder(decoder, phases, &lines, reader);
    let parsed: Vec<JsonLine> = lines.iter().filter_map(|l| JsonLine::parse(l)).collect();
    for event in ["ready", "final"] {
        let j = parsed
            .iter()
            .find(|j| j.get("event") == Some(event))
            .unwrap_or_else(|| panic!("a {event} line"));
        assert_eq!(j.get("memory"), Some("host"), "{event}: {j:?}");
    }
    for (k, st) in seen.iter().enumerate() {
        check_camera(&format!("cam{k}"), st);
        assert!(get(&st.segments) >= 2, "cam{k}: at least two loops");
    }
    assert!(get(&seen[1].pushed) > 0, "the push reader got pushed frames");
    let finals: Vec<&JsonLine> = parsed
        .iter()
        .filter(|j| j.get("event") == Some("camera-final"))
        .collect();
    assert_eq!(finals.len(), 2, "a final line per camera");
    for j in finals {
        assert_eq!(j.u64("decode_errors"), Some(0), "{j:?}");
        assert_eq!(j.u64("resyncs"), Some(0), "{j:?}");
        assert_eq!(j.u64("panics"), Some(0), "{j:?}");
    }
}
