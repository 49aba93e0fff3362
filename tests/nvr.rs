//! The multi-camera decoder's parts that need no GPU
//! (`examples/nvr/`, included here by path): its config file, and the
//! supervision of cameras driven through fakes of the decode step, with the
//! real file and packet-ring inputs. No test here asserts a duration or a
//! rate: each waits, with a generous deadline, for a count to be reached.

#[path = "../examples/nvr/mod.rs"]
#[allow(dead_code)]
mod nvr;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvr::config::{self, CodecName, ConfigError, FrameMemory, Input, PolicyName, PullSetting};
use nvr::sources::{FileSource, PacketSource};
use nvr::supervisor::{
    self, CameraStats, Cameras, Decode, DecodeError, Env, InputError, Log, Read, Source, State, Timing, Unit,
};
use vramring::packet::{PacketMeta, PacketPublisher, PacketPublisherConfig, PacketRingConfig, PACKET_KEY};
use vramring_testkit::procs::TempDir;

const CLIP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/clip.h264");

fn parse(text: &str) -> Result<config::Config, ConfigError> {
    config::parse(text, Path::new("/etc/nvr/cameras.toml"), Path::new("/run/vramring"))
}

fn invalid(text: &str) -> String {
    match parse(text) {
        Err(e) => {
            assert_eq!(ConfigError::EXIT_CODE, 2);
            let s = e.to_string();
            assert!(
                s.starts_with("/etc/nvr/cameras.toml"),
                "the sentence names the file: {s}"
            );
            s
        }
        Ok(c) => panic!("accepted a bad config: {c:?}"),
    }
}

// ---------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------

#[test]
fn the_shipped_example_config_parses_with_every_kind_of_input() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/nvr/cameras.example.toml");
    let cfg = config::load(&path, Path::new("/run/vramring")).expect("the example config");
    assert_eq!(cfg.socket_dir, PathBuf::from("/tmp/vramring-nvr"));
    let names: Vec<&str> = cfg.cameras.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["front", "garage", "yard"]);
    for cam in &cfg.cameras {
        assert_eq!(
            cam.output.parent(),
            Some(cfg.socket_dir.as_path()),
            "{}: discoverable by top",
            cam.name
        );
        if let Input::File { path, .. } = &cam.input {
            assert!(path.exists(), "{}: the clip {} is there", cam.name, path.display());
        }
    }
    let garage = &cfg.cameras[1];
    assert_eq!(garage.ring.policy, PolicyName::Lossless);
    assert_eq!(garage.ring.pull, PullSetting::Uids(vec![1000]));
    assert_eq!(garage.ring.socket_mode, 0o660);
    assert_eq!(garage.ring.loan_timeout, Duration::from_millis(500));
    assert_eq!(
        cfg.cameras[2].input,
        Input::Packets {
            socket: PathBuf::from("/tmp/vramring-nvr/yard.packets.sock")
        }
    );
}

#[test]
fn a_minimal_camera_gets_the_defaults_and_paths_resolve_where_documented() {
    let cfg = parse(
        r#"
        [[camera]]
        name = "cam0"
        input = { file = "clips/a.h264", loop = true }
        [[camera]]
        name = "cam1"
        codec = "hevc"
        input = { packets = "/elsewhere/cam1.packets.sock" }
        output = "sub/cam1.sock"
        "#,
    )
    .expect("a good config");
    assert_eq!(cfg.socket_dir, PathBuf::from("/run/vramring"));
    let (a, b) = (&cfg.cameras[0], &cfg.cameras[1]);
    assert_eq!(
        a.input,
        Input::File {
            path: PathBuf::from("/etc/nvr/clips/a.h264"),
            looped: true,
            fps: 30.0
        }
    );
    assert_eq!(a.output, PathBuf::from("/run/vramring/cam0.sock"));
    assert_eq!(
        (a.codec, a.ring.slots, a.ring.policy),
        (CodecName::H264, 8, PolicyName::Overwrite)
    );
    assert_eq!(a.ring.pull, PullSetting::Auto);
    assert_eq!(b.codec, CodecName::Hevc);
    assert_eq!(b.output, PathBuf::from("/run/vramring/sub/cam1.sock"));
    assert_eq!(
        b.input,
        Input::Packets {
            socket: PathBuf::from("/elsewhere/cam1.packets.sock")
        }
    );
}

#[test]
fn bad_config_files_are_refused_with_a_sentence_naming_the_camera_and_key() {
    let cases: &[(&str, &[&str])] = &[
        ("[[camera]]\nname = \"a\"\ninput = { file = \"x.h264\" }\nring = { slotz = 4 }\n", &["slotz", "line 4"]),
        ("[[camera]]\nname = \"a\"\ninput = { file = \"x.h264\" }\nring = { slots = \"many\" }\n", &["slots"]),
        ("this is not toml", &["not a valid camera config"]),
        ("[decoder]\ndevice = 0\n", &["no camera"]),
        ("[[camera]]\nname = \"a\"\ninput = {}\n", &["camera \"a\"", "input", "file =", "packets ="]),
        (
            "[[camera]]\nname = \"a\"\ninput = { file = \"x\", packets = \"y\" }\n",
            &["camera \"a\"", "not both"],
        ),
        (
            "[[camera]]\nname = \"a\"\ninput = { packets = \"y\", loop = true }\n",
            &["camera \"a\"", "loop and fps are for a file"],
        ),
        (
            "[[camera]]\nname = \"a\"\ninput = { file = \"x\", fps = -3 }\n",
            &["camera \"a\"", "input.fps", "out of range"],
        ),
        (
            "[[camera]]\nname = \"a\"\ninput = { file = \"x\" }\nring = { slots = 1 }\n",
            &["camera \"a\"", "ring.slots = 1", "2 to 256"],
        ),
        (
            "[[camera]]\nname = \"a\"\ninput = { file = \"x\" }\nring = { policy = \"sometimes\" }\n",
            &["policy"],
        ),
        (
            "[[camera]]\nname = \"a\"\ninput = { file = \"x\" }\nring = { pull = \"everybody\" }\n",
            &["camera \"a\"", "ring.pull", "nobody"],
        ),
        (
            "[[camera]]\nname = \"a\"\ninput = { file = \"x\" }\nring = { socket_mode = 4095 }\n",
            &["ring.socket_mode", "octal"],
        ),
        (
            "[[camera]]\nname = \"a\"\ninput = { file = \"x\" }\n[[camera]]\nname = \"a\"\ninput = { file = \"y\" }\n",
            &["two cameras are named \"a\""],
        ),
        (
            "[[camera]]\nname = \"a\"\ninput = { file = \"x\" }\n[[camera]]\nname = \"b\"\noutput = \"a.sock\"\ninput = { file = \"y\" }\n",
            &["camera \"b\"", "another camera's output"],
        ),
        (
            "[[camera]]\nname = \"a\"\ninput = { file = \"x\" }\n[[camera]]\nname = \"b\"\ninput = { packets = \"a.sock\" }\n",
            &["camera \"b\"", "packet input", "a camera's output"],
        ),
        ("[[camera]]\nname = \"../a\"\ninput = { file = \"x\" }\n", &["camera name \"../a\""]),
        ("[[camera]]\nname = \"a\"\ninput = { file = \"x\" }\ncodec = \"vp9\"\n", &["codec"]),
        ("[decoder]\nretry_ms = 0\n[[camera]]\nname = \"a\"\ninput = { file = \"x\" }\n", &["retry_ms"]),
        (
            "[decoder]\nmemory = \"gpu\"\n[[camera]]\nname = \"a\"\ninput = { file = \"x\" }\n",
            &["memory", "cuda", "host", "line 2"],
        ),
    ];
    for (text, needles) in cases {
        let s = invalid(text);
        for n in *needles {
            assert!(s.contains(n), "the sentence for {text:?} says {n:?}: {s}");
        }
        assert!(!s.contains('\n'), "one line: {s:?}");
    }
}

#[test]
fn frame_rings_are_in_gpu_memory_unless_the_decoder_section_says_host() {
    let camera = "[[camera]]\nname = \"a\"\ninput = { file = \"x.h264\", loop = true, fps = 25 }\n";
    assert_eq!(parse(camera).expect("default").memory, FrameMemory::Cuda);
    for (value, want) in [("cuda", FrameMemory::Cuda), ("host", FrameMemory::Host)] {
        let cfg = parse(&format!("[decoder]\nmemory = \"{value}\"\n{camera}")).expect("memory key");
        assert_eq!(cfg.memory, want, "memory = {value:?}");
        assert_eq!(cfg.memory.name(), value);
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/nvr/cameras.example.toml");
    let shipped = config::load(&path, Path::new("/run/vramring")).expect("the example config");
    assert_eq!(
        shipped.memory,
        FrameMemory::Cuda,
        "the shipped example stays in GPU memory"
    );
}

#[test]
fn a_missing_config_file_is_a_read_error_naming_it() {
    let e = config::load(Path::new("/nonexistent/cameras.toml"), Path::new("/run/vramring")).expect_err("no file");
    assert!(matches!(e, ConfigError::Read { .. }), "{e:?}");
    assert!(e.to_string().contains("/nonexistent/cameras.toml"), "{e}");
}

// ---------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------

#[test]
fn a_looped_file_starts_each_pass_at_a_keyframe_and_says_where_it_ends() {
    let mut src = FileSource::open(Path::new(CLIP), CodecName::H264, true, 0.0).expect("the clip");
    let mut buf = Vec::new();
    let (mut units, mut ends, mut first_of_pass) = (0u64, 0u64, Vec::new());
    let mut at_start = true;
    while ends < 2 {
        match src.read(&mut buf).expect("read") {
            Read::Unit(u) => {
                if at_start {
                    first_of_pass.push(u.key);
                    at_start = false;
                }
                assert_eq!(u.len, buf.len());
                units += 1;
            }
            Read::EndOfStream => {
                ends += 1;
                at_start = true;
            }
            other => panic!("a looped file without pacing gave {other:?}"),
        }
    }
    assert_eq!(units, 600, "two passes of the 300-unit clip");
    assert_eq!(first_of_pass, [true, true]);
}

#[test]
fn a_file_that_does_not_loop_finishes() {
    let mut src = FileSource::open(Path::new(CLIP), CodecName::H264, false, 0.0).expect("the clip");
    let mut buf = Vec::new();
    let mut n = 0;
    loop {
        match src.read(&mut buf).expect("read") {
            Read::Unit(_) => n += 1,
            Read::Finished => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(n, 300);
}

#[test]
fn an_input_file_without_a_keyframe_is_refused() {
    let dir = TempDir::new("nvr-nokey");
    let p = dir.join("garbage.h264");
    std::fs::write(&p, [0u8, 0, 1, 0x41, 0x9a, 0, 0, 1, 0x41, 0x9a]).expect("write");
    let e = FileSource::open(&p, CodecName::H264, true, 0.0).err().expect("refused");
    assert!(e.to_string().contains("no h264 keyframe"), "{e}");
    let e = FileSource::open(&dir.join("missing.h264"), CodecName::H264, true, 0.0)
        .err()
        .expect("refused");
    assert!(matches!(e, InputError::Gone(_)), "{e:?}");
}

#[test]
fn hevc_access_units_split_at_first_slices_and_find_irap_keyframes() {
    // VPS, SPS, PPS, IDR_W_RADL (first slice), TRAIL_R (first slice), TRAIL_R (second slice), TRAIL_R (first slice)
    let nal = |t: u8, first: bool| {
        let mut v = vec![0, 0, 0, 1, t << 1, 1];
        v.push(if first { 0x80 } else { 0x00 });
        v.push(0xff);
        v
    };
    let stream: Vec<u8> = [
        nal(32, false),
        nal(33, false),
        nal(34, false),
        nal(19, true),
        nal(1, true),
        nal(1, false),
        nal(1, true),
    ]
    .concat();
    let aus = nvr::sources::hevc_access_units(&stream);
    let shape: Vec<(usize, bool)> = aus.iter().map(|(b, k)| (b.len() / 8, *k)).collect();
    assert_eq!(shape, [(4, true), (2, false), (1, false)]);
    assert_eq!(
        aus.iter().flat_map(|(b, _)| b.iter().copied()).collect::<Vec<u8>>(),
        stream
    );
}

// ---------------------------------------------------------------------------
// Supervision, with a fake decode step
// ---------------------------------------------------------------------------

/// What a fake camera's input does, shared with the test.
#[derive(Default)]
struct Script {
    /// Units its source hands out before it fails (None: never).
    gone_after: Option<u64>,
    /// Times `open` refuses before it opens again.
    refuse_opens: u64,
    /// Garbage: units whose bytes are `b"garbage"`.
    garbage_every: Option<u64>,
    /// Panics in `decode` at this unit count.
    panic_at: Option<u64>,
    /// Opens so far.
    opens: u64,
}

struct FakeSource {
    n: u64,
    script: Arc<Mutex<Script>>,
}

impl Source for FakeSource {
    fn read(&mut self, buf: &mut Vec<u8>) -> Result<Read, InputError> {
        std::thread::sleep(Duration::from_micros(200));
        let s = self.script.lock().unwrap();
        if s.gone_after.is_some_and(|g| self.n >= g) {
            return Err(InputError::Gone("the fake camera hung up".into()));
        }
        self.n += 1;
        buf.clear();
        let garbage = s.garbage_every.is_some_and(|g| self.n % g == 0);
        buf.extend_from_slice(if garbage { b"garbage" } else { b"picture" });
        Ok(Read::Unit(Unit {
            len: buf.len(),
            pts: self.n as i64,
            // A keyframe every 10 units, as a camera's GOP.
            key: self.n % 10 == 1,
            discontinuity: false,
        }))
    }
}

/// Decodes "picture" into one frame; anything else is an error.
struct FakeDecoder {
    script: Arc<Mutex<Script>>,
    decoded: u64,
}

impl Decode for FakeDecoder {
    fn decode(&mut self, au: &[u8], _unit: &Unit) -> Result<u64, DecodeError> {
        self.decoded += 1;
        if self.script.lock().unwrap().panic_at == Some(self.decoded) {
            panic!("the fake decoder hit a bug");
        }
        if au == b"picture" {
            Ok(1)
        } else {
            Err(DecodeError("the bitstream is corrupt".into()))
        }
    }
    fn end_of_stream(&mut self) -> Result<u64, DecodeError> {
        Ok(0)
    }
    fn reset(&mut self) -> Result<(), DecodeError> {
        Ok(())
    }
}

struct FakeCameras;

struct FakeCam {
    script: Arc<Mutex<Script>>,
}

impl Cameras for FakeCameras {
    type Camera = FakeCam;
    type Src = FakeSource;
    type Dec = FakeDecoder;
    fn open(&self, cam: &FakeCam) -> Result<FakeSource, InputError> {
        let mut s = cam.script.lock().unwrap();
        s.opens += 1;
        if s.refuse_opens > 0 {
            s.refuse_opens -= 1;
            return Err(InputError::Gone("connection refused".into()));
        }
        Ok(FakeSource {
            n: 0,
            script: Arc::clone(&cam.script),
        })
    }
    fn decoder(&self, cam: &FakeCam) -> Result<FakeDecoder, DecodeError> {
        Ok(FakeDecoder {
            script: Arc::clone(&cam.script),
            decoded: 0,
        })
    }
}

#[derive(Default)]
struct Lines(Mutex<Vec<(String, String, String)>>);

impl Log for Lines {
    fn line(&self, name: &str, event: &str, text: &str) {
        self.0.lock().unwrap().push((name.into(), event.into(), text.into()));
    }
}

impl Lines {
    fn of(&self, name: &str, event: &str) -> Vec<String> {
        let v = self.0.lock().unwrap();
        v.iter()
            .filter(|l| l.0 == name && l.1 == event)
            .map(|l| l.2.clone())
            .collect()
    }
}

const DEADLINE: Duration = Duration::from_secs(60);

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn timing() -> Timing {
    Timing {
        stall: Duration::from_millis(200),
        retry: Duration::from_millis(5),
    }
}

/// Runs one supervised camera per script on its own thread until `body`
/// returns, then stops them.
fn run_cameras(scripts: &[Arc<Mutex<Script>>], body: impl FnOnce(&[Arc<CameraStats>], &Lines)) {
    let stats: Vec<Arc<CameraStats>> = scripts.iter().map(|_| Arc::default()).collect();
    let lines = Lines::default();
    let stop = AtomicBool::new(false);
    let cams: Vec<FakeCam> = scripts.iter().map(|s| FakeCam { script: Arc::clone(s) }).collect();
    std::thread::scope(|s| {
        for (k, (cam, st)) in cams.iter().zip(&stats).enumerate() {
            let (lines, stop) = (&lines, &stop);
            s.spawn(move || {
                let first = FakeCameras.decoder(cam).expect("fake");
                let name = format!("cam{k}");
                let env = Env {
                    cams: &FakeCameras,
                    cam,
                    name: &name,
                    stats: st,
                    timing: timing(),
                    log: lines,
                    stop,
                };
                supervisor::supervise(&env, first);
            });
        }
        body(&stats, &lines);
        stop.store(true, Ordering::Relaxed);
    });
    for st in &stats {
        assert_eq!(st.state(), State::Stopped);
    }
}

fn frames(st: &CameraStats) -> u64 {
    CameraStats::get(&st.frames)
}

#[test]
fn a_camera_whose_input_dies_is_reopened_and_resynced_while_the_others_keep_going() {
    let scripts: Vec<_> = (0..4).map(|_| Arc::new(Mutex::new(Script::default()))).collect();
    scripts[1].lock().unwrap().gone_after = Some(25);
    scripts[1].lock().unwrap().refuse_opens = 0;
    run_cameras(&scripts, |stats, lines| {
        wait_for("camera 1 to lose its input", || {
            CameraStats::get(&stats[1].input_restarts) >= 1
        });
        // It stays down a while: every open is refused; the others go on.
        scripts[1].lock().unwrap().refuse_opens = u64::MAX;
        wait_for("camera 1 to be refused", || scripts[1].lock().unwrap().opens >= 5);
        assert_eq!(stats[1].state(), State::WaitingInput);
        let before: Vec<u64> = stats.iter().map(|s| frames(s)).collect();
        for k in [0, 2, 3] {
            wait_for("the other cameras to keep decoding", || {
                frames(&stats[k]) > before[k] + 50
            });
        }
        // Its camera comes back, for good this time.
        {
            let mut s = scripts[1].lock().unwrap();
            s.refuse_opens = 0;
            s.gone_after = None;
        }
        let f1 = frames(&stats[1]);
        wait_for("camera 1 to decode again", || frames(&stats[1]) > f1 + 20);
        assert!(CameraStats::get(&stats[1].resyncs) >= 1);
        let resync = lines.of("cam1", "resync");
        assert!(
            resync
                .iter()
                .any(|l| l.contains("resynchronised at a keyframe") && l.contains("input restart")),
            "{resync:?}"
        );
        assert!(!lines.of("cam1", "input-gone").is_empty());
        assert_eq!(
            lines.of("cam1", "input-waiting").len(),
            1,
            "a refused reopen is logged once per outage"
        );
        for k in [0, 2, 3] {
            assert_eq!(CameraStats::get(&stats[k].input_restarts), 0);
            assert_eq!(CameraStats::get(&stats[k].resyncs), 0);
            assert!(lines.of(&format!("cam{k}"), "input-gone").is_empty());
        }
    });
}

#[test]
fn garbage_makes_a_new_decoder_and_decoding_resumes_at_the_next_keyframe_only() {
    let scripts: Vec<_> = (0..2).map(|_| Arc::new(Mutex::new(Script::default()))).collect();
    scripts[0].lock().unwrap().garbage_every = Some(25);
    run_cameras(&scripts, |stats, lines| {
        wait_for("three decode errors", || CameraStats::get(&stats[0].decode_errors) >= 3);
        wait_for("three resyncs", || CameraStats::get(&stats[0].resyncs) >= 3);
        let s = &stats[0];
        assert!(CameraStats::get(&s.decoder_resets) >= 3);
        // Garbage at unit 25 of a 10-unit GOP: units 26..=30 wait for the
        // keyframe at 31. Every error skips those five.
        assert!(
            CameraStats::get(&s.skipped) >= 5 * 3 - 5,
            "{}",
            CameraStats::get(&s.skipped)
        );
        let errors = lines.of("cam0", "decode-error");
        assert!(
            errors[0].contains("the bitstream is corrupt") && errors[0].contains("new decoder"),
            "{errors:?}"
        );
        let resync = lines.of("cam0", "resync");
        assert!(resync[0].contains("5 access units skipped"), "{resync:?}");
        assert_eq!(CameraStats::get(&stats[1].decode_errors), 0);
        let f = frames(&stats[1]);
        wait_for("the clean camera to go on", || frames(&stats[1]) > f + 20);
    });
}

#[test]
fn a_panicking_camera_is_started_again_and_the_others_never_notice() {
    let scripts: Vec<_> = (0..3).map(|_| Arc::new(Mutex::new(Script::default()))).collect();
    scripts[2].lock().unwrap().panic_at = Some(15);
    run_cameras(&scripts, |stats, lines| {
        wait_for("the panic", || CameraStats::get(&stats[2].panics) >= 1);
        let f = frames(&stats[2]);
        wait_for("camera 2 to decode again", || frames(&stats[2]) > f + 20);
        assert!(lines.of("cam2", "panic")[0].contains("the fake decoder hit a bug"));
        for k in [0, 1] {
            assert_eq!(CameraStats::get(&stats[k].panics), 0);
        }
    });
}

// ---------------------------------------------------------------------------
// Supervision of a real packet-ring input
// ---------------------------------------------------------------------------

/// Counts units; every unit decodes to one frame.
struct CountingDecoder;

impl Decode for CountingDecoder {
    fn decode(&mut self, _au: &[u8], _unit: &Unit) -> Result<u64, DecodeError> {
        Ok(1)
    }
    fn end_of_stream(&mut self) -> Result<u64, DecodeError> {
        Ok(0)
    }
    fn reset(&mut self) -> Result<(), DecodeError> {
        Ok(())
    }
}

struct PacketCameras;

impl Cameras for PacketCameras {
    type Camera = PathBuf;
    type Src = PacketSource;
    type Dec = CountingDecoder;
    fn open(&self, socket: &PathBuf) -> Result<PacketSource, InputError> {
        PacketSource::open(socket, "nvr-test")
    }
    fn decoder(&self, _: &PathBuf) -> Result<CountingDecoder, DecodeError> {
        Ok(CountingDecoder)
    }
}

fn packet_publisher(path: &Path) -> PacketPublisher {
    let cfg = PacketPublisherConfig::new(PacketRingConfig::new(1 << 20, 256, 64 << 10));
    let mut p = PacketPublisher::create(path, cfg).expect("packet publisher");
    p.set_codec_params(b"\0\0\0\x01\x67params").expect("params");
    p
}

#[test]
fn a_packet_input_whose_publisher_restarts_stalls_then_resumes_at_a_keyframe() {
    let dir = TempDir::new("nvr-packets");
    let socket = dir.join("cam.packets.sock");
    let stats = CameraStats::default();
    let lines = Lines::default();
    let stop = AtomicBool::new(false);
    let write = |p: &mut PacketPublisher, units: std::ops::Range<u64>| {
        for k in units {
            let flags = if k % 10 == 0 { PACKET_KEY } else { 0 };
            p.write(
                b"\0\0\0\x01\x65unit",
                PacketMeta {
                    pts: k as i64,
                    dts: k as i64,
                    flags,
                    codec: 0,
                },
            )
            .expect("write");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            let env = Env {
                cams: &PacketCameras,
                cam: &socket,
                name: "cam",
                stats: &stats,
                timing: timing(),
                log: &lines,
                stop: &stop,
            };
            supervisor::supervise(&env, CountingDecoder);
        });
        // No publisher yet: the camera waits for its input.
        wait_for("the camera to wait for its input", || {
            stats.state() == State::WaitingInput
        });
        let mut p = packet_publisher(&socket);
        wait_for("the camera to connect", || p.stats().subscribers == 1);
        write(&mut p, 0..50);
        wait_for("frames", || frames(&stats) >= 40);
        // Silence: a stall. (A pause of this thread while writing may have
        // been counted as one already, so it is at least one.)
        wait_for("a stall", || stats.state() == State::Stalled);
        let stalls = CameraStats::get(&stats.stalls);
        assert!(stalls >= 1);
        // Reported once: the silence goes on for three stall thresholds more.
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(CameraStats::get(&stats.stalls), stalls, "one stall reported again");
        // The camera's publisher dies and comes back (a new ring).
        drop(p);
        wait_for("the input to be gone", || !lines.of("cam", "input-gone").is_empty());
        let mut p = packet_publisher(&socket);
        wait_for("the camera to reconnect", || p.stats().subscribers == 1);
        let f = frames(&stats);
        // Starts mid-GOP: units before the keyframe are skipped.
        write(&mut p, 5..40);
        wait_for("frames after the restart", || frames(&stats) >= f + 30);
        assert_eq!(CameraStats::get(&stats.input_restarts), 1);
        assert!(CameraStats::get(&stats.resyncs) >= 1);
        let resync = lines.of("cam", "resync");
        assert!(resync.iter().any(|l| l.contains("input restart")), "{resync:?}");
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(stats.state(), State::Stopped);
}
