//! The `vramring` command against real publisher processes: the `producer`
//! and `consumer` examples (frame rings) and `vramring play` (packet rings).
//! Every command, `--json` parsed back, the exit codes of a stale socket, a
//! silent publisher and a permission-denied socket, snapshots compared pixel
//! by pixel with the test pattern converted to RGB by an independent
//! reference, and recordings compared byte for byte with the file played.
//!
//! The examples are the binaries `cargo test` builds next to this test; run
//! the whole suite, or `cargo build --examples` first when running this
//! file alone.

use vramring_testkit::procs as common;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{example, spawn, wait_until, ChildProc, TempDir};
use serde_json::Value;
use vramring::packet::annexb;
use vramring::{Format, Geometry};
use vramring_testkit::pattern as testpattern;

const CLIP: &[u8] = include_bytes!("../../tests/data/clip.h264");

/// The `vramring` binary: the one Cargo built for this test, or, when the
/// test binary was staged for a GPU machine without that path, `vramring`
/// in the staging directory (`.device/vramring` beside `.device/tests/`).
fn cli_path() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_vramring"));
    if built.exists() {
        return built;
    }
    let exe = std::env::current_exe().expect("current_exe");
    let staged = exe
        .parent()
        .and_then(Path::parent)
        .expect("<dir>/tests/<test>")
        .join("vramring");
    assert!(
        staged.exists(),
        "no vramring binary at {} or {}",
        built.display(),
        staged.display()
    );
    staged
}

fn cli() -> Command {
    Command::new(cli_path())
}

/// Runs a command to its end (killed after `limit`), output captured.
fn run_limited(mut cmd: Command, limit: Duration) -> Output {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawning the command");
    let start = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("reaping");
            panic!(
                "{cmd:?} still running after {limit:?}; stdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().expect("collecting output")
}

fn run(args: &[&str]) -> Output {
    let mut c = cli();
    c.args(args);
    run_limited(c, Duration::from_secs(30))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited, not killed")
}

fn json(o: &Output) -> Value {
    serde_json::from_str(stdout(o).trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON value ({e}):\n{}\nstderr:\n{}",
            stdout(o),
            stderr(o)
        )
    })
}

fn assert_ok(o: &Output) {
    assert_eq!(code(o), 0, "stdout:\n{}\nstderr:\n{}", stdout(o), stderr(o));
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Waits until `vramring inspect` answers for `socket` (the publisher is up).
fn wait_ready(socket: &Path, who: &mut ChildProc) {
    let ok = wait_until(Duration::from_secs(20), || {
        assert!(who.try_wait().is_none(), "{} exited early:\n{}", who.name, who.output());
        socket.exists() && code(&run(&["inspect", &s(socket)])) == 0
    });
    assert!(ok, "{} never served {}:\n{}", who.name, socket.display(), who.output());
}

/// A host frame ring of the producer example.
fn producer(dir: &TempDir, name: &str, socket: &Path, format: &str, w: u32, h: u32) -> ChildProc {
    let mut c = Command::new(example("producer"));
    c.args(["--socket", &s(socket), "--backend", "host", "--format", format]);
    c.args(["--width", &w.to_string(), "--height", &h.to_string(), "--slots", "8"]);
    c.args(["--fps", "60", "--frames", "0", "--report-ms", "0"]);
    let mut p = spawn(dir, name, c);
    wait_ready(socket, &mut p);
    p
}

/// A frame ring of the producer example on `backend`.
fn producer_on(dir: &TempDir, name: &str, socket: &Path, backend: &str, w: u32, h: u32) -> ChildProc {
    let mut c = Command::new(example("producer"));
    c.args(["--socket", &s(socket), "--backend", backend, "--format", "nv12"]);
    c.args(["--width", &w.to_string(), "--height", &h.to_string(), "--slots", "8"]);
    c.args(["--fps", "30", "--frames", "0", "--report-ms", "0"]);
    let mut p = spawn(dir, name, c);
    wait_ready(socket, &mut p);
    p
}

/// `vramring play` of the test clip.
fn play(dir: &TempDir, name: &str, socket: &Path, extra: &[&str]) -> ChildProc {
    let mut c = cli();
    c.args([
        "play",
        &s(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/clip.h264")),
    ]);
    c.arg(socket);
    c.args(extra);
    spawn(dir, name, c)
}

/// Waits until `play` says it publishes: it listens from then on (the
/// socket file alone appears at the bind, before the listen).
fn wait_playing(pl: &mut ChildProc) {
    let ok = wait_until(Duration::from_secs(20), || {
        assert!(pl.try_wait().is_none(), "play exited:\n{}", pl.output());
        let out = pl.output();
        out.contains("publishing ") || out.contains("\"event\":\"ready\"")
    });
    assert!(ok, "play never said it publishes:\n{}", pl.output());
}

/// A socket file nobody listens on: what a crashed publisher leaves.
fn stale_socket(path: &Path) {
    let fd: OwnedFd = rustix::net::socket(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        None,
    )
    .unwrap();
    rustix::net::bind(&fd, &rustix::net::SocketAddrUnix::new(path).unwrap()).unwrap();
}

#[test]
fn help_documents_every_command_and_the_exit_codes() {
    let o = run(&["--help"]);
    assert_ok(&o);
    let h = stdout(&o);
    for word in [
        "ls",
        "inspect",
        "top",
        "snapshot",
        "record",
        "play",
        "Exit status",
        "stale",
        "permission",
        "timeout",
        "VRAMRING_DIR",
        "RUST_LOG",
    ] {
        assert!(h.contains(word), "--help lacks {word:?}:\n{h}");
    }
    assert_eq!(code(&run(&["no-such-command"])), 2, "a usage error exits with 2");
}

#[test]
fn ls_lists_frame_and_packet_rings_and_marks_a_stale_socket() {
    let dir = TempDir::new("cli-ls");
    let frames = dir.join("cam0.sock");
    let packets = dir.join("cam0.packets.sock");
    let _p = producer(&dir, "producer", &frames, "nv12", 320, 180);
    let mut pl = play(&dir, "play", &packets, &["--loops", "0"]);
    wait_ready(&packets, &mut pl);
    stale_socket(&dir.join("old.sock"));
    std::fs::write(dir.join("notes.txt"), b"not a socket").unwrap();

    let o = run(&["ls", &s(&dir.join("")), "--json"]);
    assert_ok(&o);
    let v = json(&o);
    let rows = v.as_array().expect("an array");
    assert_eq!(rows.len(), 3, "three sockets, the text file left out: {v}");
    let by = |name: &str| {
        rows.iter()
            .find(|r| r["path"].as_str().is_some_and(|p| p.ends_with(name)))
            .unwrap_or_else(|| panic!("{name} missing from {v}"))
    };
    let f = by("/cam0.sock");
    assert_eq!(f["status"], "ok");
    assert_eq!(f["kind"], "frames");
    assert_eq!(f["state"], "live");
    assert_eq!(f["format"], "nv12");
    assert_eq!((f["width"].as_u64(), f["height"].as_u64()), (Some(320), Some(180)));
    assert_eq!(f["slots"], 8);
    assert_eq!(f["backend"], "host");
    assert!(f["gpu_uuid"].is_null());
    assert_eq!(f["subscribers"], 0, "ls does not count itself");
    // From the commit times of the 8 frames in the ring: a 60 fps producer
    // that never bursts more than two frames reads at most about 70 Hz,
    // and under 1 Hz only if it stopped for seconds.
    let rate = f["rate_hz"].as_f64().expect("a rate");
    assert!((1.0..200.0).contains(&rate), "a 60 fps producer measured at {rate}");
    let p = by("/cam0.packets.sock");
    assert_eq!(p["kind"], "packets");
    assert_eq!(p["codec"], "H264");
    assert_eq!(p["state"], "live");
    assert_eq!(by("/old.sock")["status"], "stale");

    // The text table, from the default directory named by VRAMRING_DIR.
    let mut c = cli();
    c.arg("ls").env("VRAMRING_DIR", s(&dir.join("")));
    let o = run_limited(c, Duration::from_secs(30));
    assert_ok(&o);
    let t = stdout(&o);
    let line = |name: &str| {
        t.lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("{name} missing:\n{t}"))
            .to_string()
    };
    assert!(t.starts_with("SOCKET"), "{t}");
    assert!(
        line("cam0.sock").contains("frames") && line("cam0.sock").contains("320x180"),
        "{t}"
    );
    assert!(line("cam0.packets.sock").contains("H264"), "{t}");
    assert!(line("old.sock").contains("stale"), "{t}");

    assert_eq!(code(&run(&["ls", &s(&dir.join("no-such-dir"))])), 3);

    // RUST_LOG diagnostics go to stderr; stdout stays one JSON value.
    let mut c = cli();
    c.args(["ls", &s(&dir.join("")), "--json"]).env("RUST_LOG", "info");
    let o = run_limited(c, Duration::from_secs(30));
    assert_ok(&o);
    assert_eq!(json(&o).as_array().map(Vec::len), Some(3));
    assert!(stderr(&o).contains("stale socket"), "{}", stderr(&o));
}

#[test]
fn inspect_shows_geometry_slots_and_a_real_subscriber_in_the_table() {
    let dir = TempDir::new("cli-inspect");
    let socket = dir.join("cam.sock");
    let _p = producer(&dir, "producer", &socket, "nv12", 320, 180);
    let mut c = Command::new(example("consumer"));
    c.args([
        "--socket",
        &s(&socket),
        "--mode",
        "sequential",
        "--name",
        "detector",
        "--report-ms",
        "0",
    ]);
    let mut consumer = spawn(&dir, "consumer", c);
    let mut last = Value::Null;
    let seen = wait_until(Duration::from_secs(20), || {
        assert!(consumer.try_wait().is_none(), "consumer exited:\n{}", consumer.output());
        let o = run(&["inspect", &s(&socket), "--json"]);
        assert_ok(&o);
        last = json(&o);
        last["subscriber_table"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "detector" && r["delivered"].as_u64() > Some(5))
    });
    assert!(seen, "the consumer never showed up delivering: {last}");
    let v = &last;
    let g = Geometry::new(Format::Nv12, 320, 180).unwrap();
    assert_eq!(v["kind"], "frames");
    assert_eq!(v["layout_version"], vramring::seam::layout::LAYOUT_VERSION);
    assert_eq!(v["protocol_version"], vramring::seam::socket::PROTOCOL_VERSION);
    assert_eq!(v["policy"], "overwrite");
    assert_eq!(v["frame_bytes"], g.frame_bytes);
    // A host ring has no gate line (ADR 0011: CUDA pools only).
    assert!(v["gate_offset"].is_null(), "{v}");
    let planes = v["planes"].as_array().unwrap();
    assert_eq!(planes.len(), 2);
    for (k, p) in planes.iter().enumerate() {
        assert_eq!(p["pitch"], g.planes[k].pitch);
        assert_eq!(p["offset"], g.planes[k].offset);
        assert_eq!(p["rows"], g.planes[k].rows);
    }
    let slots = v["slot_table"].as_array().unwrap();
    assert_eq!(slots.len(), 8);
    let newest = slots.iter().filter_map(|s| s["seq"].as_u64()).max().unwrap();
    assert!(newest >= v["global_seq"].as_u64().unwrap().saturating_sub(1));
    let table = v["subscriber_table"].as_array().unwrap();
    let det = table.iter().find(|r| r["name"] == "detector").unwrap();
    assert_eq!(det["mode"], "sequential");
    assert_eq!(det["state"], "active");
    assert_eq!(det["lossless"], false);
    assert!(det["lag"].is_null(), "only lossless readers publish a cursor");
    let me = table.iter().find(|r| r["self"] == true).expect("its own entry, marked");
    assert_eq!(me["name"], "vramring-cli");
    assert_eq!(v["subscribers"], 1, "the consumer, not the inspector itself");

    let o = run(&["inspect", &s(&socket)]);
    assert_ok(&o);
    let t = stdout(&o);
    for word in [
        "nv12 320x180",
        "plane 1",
        "pitch 512",
        "policy     overwrite",
        "detector",
        "sequential",
    ] {
        assert!(t.contains(word), "text lacks {word:?}:\n{t}");
    }
}

#[test]
fn inspect_of_a_packet_ring_shows_codec_parameters_and_keyframe() {
    let dir = TempDir::new("cli-inspect-packets");
    let socket = dir.join("cam.packets.sock");
    let mut pl = play(&dir, "play", &socket, &["--loops", "0", "--fps", "200"]);
    wait_ready(&socket, &mut pl);
    let mut v = Value::Null;
    assert!(wait_until(Duration::from_secs(10), || {
        v = json(&run(&["inspect", &s(&socket), "--json"]));
        v["write_seq"].as_u64() > Some(40)
    }));
    assert_eq!(v["kind"], "packets");
    assert_eq!(v["codec"], "H264");
    let units = annexb::access_units(CLIP);
    let params = annexb::parameter_sets(units[0].bytes);
    let hex: String = params.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(v["params_hex"], hex.as_str(), "the SPS/PPS of the clip");
    let key = v["keyframe_seq"].as_u64().unwrap();
    let key_index = ((key - 1) % units.len() as u64) as usize;
    assert!(
        key > 0 && units[key_index].key,
        "keyframe seq {key} is not an IDR of the clip"
    );
    let recs = v["recent_records"].as_array().unwrap();
    assert!(!recs.is_empty());
    for r in recs {
        let seq = r["seq"].as_u64().unwrap();
        let au = &units[((seq - 1) % units.len() as u64) as usize];
        assert_eq!(r["len"].as_u64(), Some(au.bytes.len() as u64), "record {seq}");
        assert_eq!(r["key"], au.key, "record {seq}");
    }
    let t = stdout(&run(&["inspect", &s(&socket)]));
    assert!(t.contains("codec      H264") && t.contains("keyframe_seq"), "{t}");
}

#[test]
fn a_stale_or_missing_socket_exits_3_at_once() {
    let dir = TempDir::new("cli-stale");
    let stale = dir.join("stale.sock");
    stale_socket(&stale);
    let start = Instant::now();
    for cmd in [
        vec!["inspect", "SOCK"],
        vec!["snapshot", "SOCK", "-o", "x.png"],
        vec!["record", "SOCK", "-o", "x.h264"],
    ] {
        let args: Vec<String> = cmd
            .iter()
            .map(|a| match *a {
                "SOCK" => s(&stale),
                "x.png" | "x.h264" => s(&dir.join(a)),
                other => other.to_string(),
            })
            .collect();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = run(&refs);
        assert_eq!(code(&o), 3, "{cmd:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("stale socket"), "{cmd:?}: {}", stderr(&o));
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "stale sockets are never waited on"
    );
    let o = run(&["inspect", &s(&dir.join("absent.sock"))]);
    assert_eq!(code(&o), 3);
    assert!(stderr(&o).contains("no socket at"), "{}", stderr(&o));
}

#[test]
fn a_publisher_that_never_answers_is_a_timeout_exit_5_not_a_hang() {
    let dir = TempDir::new("cli-silent");
    let path = dir.join("silent.sock");
    // Listening, so connects succeed into the backlog, but never accepting.
    let fd: OwnedFd = rustix::net::socket(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        None,
    )
    .unwrap();
    rustix::net::bind(&fd, &rustix::net::SocketAddrUnix::new(&path).unwrap()).unwrap();
    rustix::net::listen(&fd, 16).unwrap();
    let start = Instant::now();
    let o = run(&["inspect", &s(&path), "--timeout-ms", "300"]);
    assert_eq!(code(&o), 5, "{}", stderr(&o));
    assert!(start.elapsed() < Duration::from_secs(5));
    let v = json(&run(&["ls", &s(&dir.join("")), "--json", "--timeout-ms", "300"]));
    assert_eq!(v[0]["status"], "timeout", "{v}");
}

#[test]
fn a_subscriber_refused_by_the_allow_list_exits_4() {
    let dir = TempDir::new("cli-allow");
    let socket = dir.join("cam.packets.sock");
    let mut pl = play(&dir, "play", &socket, &["--loops", "0", "--allow-uid", "54321"]);
    wait_playing(&mut pl);
    let o = run(&["inspect", &s(&socket)]);
    assert_eq!(code(&o), 4, "{}", stderr(&o));
    assert!(stderr(&o).contains("allow-list"), "{}", stderr(&o));
    let o = run(&["record", &s(&socket), "-o", &s(&dir.join("x.h264"))]);
    assert_eq!(code(&o), 4, "{}", stderr(&o));
    let v = json(&run(&["ls", &s(&dir.join("")), "--json"]));
    assert_eq!(v[0]["status"], "denied", "{v}");
}

#[test]
fn a_socket_whose_file_mode_excludes_the_user_exits_4() {
    let dir = TempDir::new("cli-mode");
    let socket = dir.join("cam.packets.sock");
    let root = rustix::process::getuid().is_root();
    // Root passes file modes; as root the command runs as nobody instead.
    let mode = if root { "600" } else { "000" };
    let mut pl = play(&dir, "play", &socket, &["--loops", "0", "--socket-mode", mode]);
    wait_playing(&mut pl);
    let mut c = if root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups"]);
        c.arg(cli_path());
        c
    } else {
        cli()
    };
    c.args(["inspect", &s(&socket)]);
    let o = run_limited(c, Duration::from_secs(30));
    assert_eq!(code(&o), 4, "{}", stderr(&o));
    assert!(stderr(&o).contains("permission denied"), "{}", stderr(&o));
}

#[test]
fn top_prints_rates_per_ring_and_per_subscriber_when_not_a_terminal() {
    let dir = TempDir::new("cli-top");
    let socket = dir.join("cam.sock");
    let _p = producer(&dir, "producer", &socket, "nv12", 320, 180);
    let mut c = Command::new(example("consumer"));
    c.args(["--socket", &s(&socket), "--name", "detector", "--report-ms", "0"]);
    let _consumer = spawn(&dir, "consumer", c);
    let o = run(&[
        "top",
        &s(&dir.join("")),
        "--json",
        "--count",
        "4",
        "--interval-ms",
        "300",
    ]);
    assert_ok(&o);
    let samples: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect();
    assert_eq!(samples.len(), 4, "one object per refresh");
    let last = &samples[3]["rings"][0];
    assert_eq!(last["kind"], "frames");
    // Over the 300 ms or more between the last two samples: none only if
    // the producer and the detector stopped for that long, and a 60 fps
    // producer that never bursts more than two frames stays far below 200.
    let rate = last["rate_hz"].as_f64().expect("a rate");
    assert!(rate > 0.0 && rate < 200.0, "ring rate {rate}");
    let det = last["subscriber_table"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "detector")
        .unwrap_or_else(|| panic!("no detector in {last}"));
    let sub_rate = det["rate_hz"].as_f64().expect("a subscriber rate");
    assert!(sub_rate > 0.0 && sub_rate < 200.0, "detector reads at {sub_rate}/s");
    assert!(
        last["subscriber_table"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["self"] == false),
        "top hides its own entry"
    );

    let o = run(&["top", &s(&dir.join("")), "--count", "2", "--interval-ms", "200"]);
    assert_ok(&o);
    let t = stdout(&o);
    assert!(!t.contains('\x1b'), "no escape codes when not a terminal");
    assert!(
        t.lines().filter(|l| l.contains("frames nv12 320x180")).count() == 2,
        "{t}"
    );
    assert!(t.lines().any(|l| l.contains("sub ") && l.contains("detector")), "{t}");
}

#[test]
fn top_on_a_terminal_redraws_in_place_and_quits_on_q_or_ctrl_c() {
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};
    let dir = TempDir::new("cli-top-tty");
    let socket = dir.join("cam.sock");
    let _p = producer(&dir, "producer", &socket, "nv12", 64, 64);
    // `script` (util-linux / bsdutils) runs top on a pseudo-terminal and
    // forwards our stdin to it: the key comes once three refreshes have
    // been drawn.
    const REDRAW: &str = "\x1b[H\x1b[2J";
    for key in ["q", "\x03"] {
        let cmdline = format!("{} top {} --interval-ms 200", cli_path().display(), s(&dir.join("")));
        let mut c = Command::new("script");
        c.args(["-qec", &cmdline, "/dev/null"]);
        c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().expect("script (util-linux) runs top on a pty");
        // What the terminal has shown so far, read as it comes.
        let shown = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let (shown, mut stdout) = (Arc::clone(&shown), child.stdout.take().expect("piped stdout"));
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = stdout.read(&mut buf) {
                    shown.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            })
        };
        let redraws = || String::from_utf8_lossy(&shown.lock().unwrap()).matches(REDRAW).count();
        let start = Instant::now();
        while redraws() < 3 {
            if start.elapsed() > Duration::from_secs(30) || child.try_wait().unwrap().is_some() {
                let _ = child.kill();
                panic!(
                    "top drew {} refreshes:\n{}",
                    redraws(),
                    String::from_utf8_lossy(&shown.lock().unwrap())
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.stdin.as_mut().unwrap().write_all(key.as_bytes()).unwrap();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("top did not quit on {key:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        reader.join().unwrap();
        let t = String::from_utf8_lossy(&shown.lock().unwrap()).into_owned();
        let redraws = t.matches(REDRAW).count();
        assert!(redraws >= 3, "{redraws} redraws in place:\n{t}");
        assert!(t.contains("frames nv12 64x64"), "{t}");
        assert!(t.starts_with("\x1b[?1049h"), "the alternate screen is entered");
        assert!(
            t.trim_end().ends_with("\x1b[?25h\x1b[?1049l"),
            "and left, cursor shown: {t:?}"
        );
    }
}

/// The reference YUV → RGB conversion, written independently of the CLI's
/// (published matrix coefficients, not derived from Kr/Kb).
fn reference_rgb(y: f64, u: f64, v: f64, matrix: &str) -> [f64; 3] {
    // Limited range, 8-bit scale: y, u, v already minus 16 / 128.
    let (ry, rv, gu, gv, bu) = match matrix {
        "bt601" => (1.164_383_56, 1.596_026_79, -0.391_762_29, -0.812_967_65, 2.017_232_14),
        "bt709" => (1.164_383_56, 1.792_741_07, -0.213_248_61, -0.532_909_33, 2.112_401_79),
        "bt2020" => (1.164_383_56, 1.678_674_11, -0.187_326_10, -0.650_424_32, 2.141_772_32),
        other => panic!("no reference for {other}"),
    };
    [ry * y + rv * v, ry * y + gu * u + gv * v, ry * y + bu * u]
}

/// Decodes `png_path` and checks every pixel against the pattern of `seq`
/// in a `format` `w`×`h` frame, converted with `matrix`.
fn assert_png_is_pattern(png_path: &Path, format: Format, w: u32, h: u32, seq: u64, matrix: &str) {
    let g = Geometry::new(format, w, h).unwrap();
    let mut frame = vec![0u8; g.frame_bytes as usize];
    testpattern::fill(&mut frame, seq);
    let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(png_path).unwrap()));
    let mut r = dec.read_info().unwrap();
    let text_seq = r
        .info()
        .uncompressed_latin1_text
        .iter()
        .find(|t| t.keyword == "vramring:seq")
        .map(|t| t.text.clone());
    assert_eq!(text_seq, Some(seq.to_string()), "the PNG names its frame");
    let mut img = vec![0u8; r.output_buffer_size().unwrap()];
    let info = r.next_frame(&mut img).unwrap();
    assert_eq!((info.width, info.height), (w, h));
    assert_eq!(info.color_type, png::ColorType::Rgb);
    let (y_pl, c_pl) = (g.planes[0], g.planes[1]);
    let ten = format == Format::P010;
    let sample = |plane: vramring::Plane, row: u64, i: u64| -> f64 {
        let base = (plane.offset + row * plane.pitch) as usize;
        if ten {
            let k = base + 2 * i as usize;
            // 10-bit to the 8-bit scale of the reference coefficients.
            f64::from(u16::from_le_bytes([frame[k], frame[k + 1]]) >> 6) / 4.0
        } else {
            f64::from(frame[base + i as usize])
        }
    };
    let mut worst = 0.0f64;
    for row in 0..u64::from(h) {
        for x in 0..u64::from(w) {
            let y = sample(y_pl, row, x) - 16.0;
            let cx = x & !1;
            let u = sample(c_pl, row / 2, cx) - 128.0;
            let v = sample(c_pl, row / 2, cx + 1) - 128.0;
            let want = reference_rgb(y, u, v, matrix);
            let at = ((row * u64::from(w) + x) * 3) as usize;
            for c in 0..3 {
                let expect = want[c].round().clamp(0.0, 255.0);
                let d = (f64::from(img[at + c]) - expect).abs();
                worst = worst.max(d);
                assert!(
                    d <= 1.0,
                    "pixel ({x},{row}) channel {c}: PNG {} vs reference {expect} ({matrix})",
                    img[at + c]
                );
            }
        }
    }
    assert!(worst <= 1.0);
}

#[test]
fn snapshot_writes_the_test_pattern_as_rgb_with_the_documented_matrix() {
    let dir = TempDir::new("cli-snapshot");
    // SD NV12 (auto: BT.601), HD NV12 (auto: BT.709), P010 with an explicit BT.2020.
    for (name, format, w, h, extra, matrix) in [
        ("sd", Format::Nv12, 320u32, 180u32, None, "bt601"),
        ("hd", Format::Nv12, 1280, 720, None, "bt709"),
        ("p010", Format::P010, 256, 144, Some("bt2020"), "bt2020"),
    ] {
        let socket = dir.join(&format!("{name}.sock"));
        let p = producer(&dir, name, &socket, format.name(), w, h);
        let out = dir.join(&format!("{name}.png"));
        let mut args = vec!["snapshot".to_string(), s(&socket), "-o".into(), s(&out)];
        args.extend(["--count", "2", "--every", "50", "--json"].map(String::from));
        if let Some(m) = extra {
            args.extend(["--matrix".into(), m.into()]);
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = run(&refs);
        assert_ok(&o);
        let lines: Vec<Value> = stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
            .collect();
        assert_eq!(lines.len(), 2, "{}", stdout(&o));
        let mut seqs = Vec::new();
        for (n, l) in lines.iter().enumerate() {
            assert_eq!(l["matrix"], matrix);
            assert_eq!(l["range"], "limited");
            assert_eq!(l["format"], format.name());
            let path = PathBuf::from(l["path"].as_str().unwrap());
            assert_eq!(path, dir.join(&format!("{name}-000{}.png", n + 1)));
            let seq = l["seq"].as_u64().unwrap();
            assert_png_is_pattern(&path, format, w, h, seq, matrix);
            seqs.push(seq);
        }
        assert!(seqs[1] > seqs[0], "two different frames: {seqs:?}");
        p.interrupt();
    }
}

#[test]
fn snapshot_of_a_packet_ring_says_it_is_not_a_frame_ring() {
    let dir = TempDir::new("cli-snapshot-kind");
    let socket = dir.join("cam.packets.sock");
    let mut pl = play(&dir, "play", &socket, &["--loops", "0"]);
    wait_ready(&socket, &mut pl);
    let o = run(&["snapshot", &s(&socket), "-o", &s(&dir.join("x.png"))]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("packet ring"), "{}", stderr(&o));
}

#[test]
fn record_of_a_played_file_is_byte_identical_lossless_or_not() {
    for lossless in [true, false] {
        let dir = TempDir::new(if lossless { "cli-rec-lossless" } else { "cli-rec-plain" });
        let socket = dir.join("cam.packets.sock");
        // As fast as the ring allows, once, after the recorder connected.
        let mut pl = play(
            &dir,
            "play",
            &socket,
            &[
                "--fps",
                "0",
                "--wait-subscribers",
                "1",
                "--start-delay-ms",
                "1000",
                "--linger-ms",
                "2000",
                "--json",
            ],
        );
        wait_playing(&mut pl);
        let out = dir.join("rec.h264");
        let mut args = vec!["record", "--json", "-o"];
        let out_s = s(&out);
        let sock_s = s(&socket);
        args.extend([out_s.as_str(), sock_s.as_str()]);
        if lossless {
            args.push("--lossless");
        }
        let o = run(&args);
        assert_ok(&o);
        pl.wait_success(Instant::now() + Duration::from_secs(20));
        let v = json(&o);
        assert_eq!(v["end"], "producer_gone");
        assert_eq!(v["first_seq"], 1);
        assert_eq!(v["overruns"], 0);
        assert_eq!(v["packets"].as_u64(), Some(annexb::access_units(CLIP).len() as u64));
        let got = std::fs::read(&out).unwrap();
        assert!(
            got == CLIP,
            "lossless={lossless}: {} bytes recorded, {} played",
            got.len(),
            CLIP.len()
        );
    }
}

#[test]
fn record_joining_a_running_stream_starts_on_a_keyframe_and_stops_on_time() {
    let dir = TempDir::new("cli-rec-join");
    let socket = dir.join("cam.packets.sock");
    let mut pl = play(&dir, "play", &socket, &["--loops", "0", "--fps", "100"]);
    wait_ready(&socket, &mut pl);
    std::thread::sleep(Duration::from_millis(400));
    let out = dir.join("rec.h264");
    let start = Instant::now();
    let o = run(&["record", &s(&socket), "-o", &s(&out), "--seconds", "1", "--json"]);
    assert_ok(&o);
    // Loose: a recording that ignored `--seconds` would run until `run`
    // kills it at 30 s.
    let took = start.elapsed();
    assert!(took < Duration::from_secs(20), "--seconds 1 took {took:?}");
    let v = json(&o);
    assert_eq!(v["end"], "seconds");
    let units = annexb::access_units(CLIP);
    let first = v["first_seq"].as_u64().unwrap();
    // How many come in the second depends on the machine; what they are
    // does not.
    let n = v["packets"].as_u64().unwrap();
    assert!(n >= 1, "nothing recorded in a second at 100/s");
    let start_index = ((first - 1) % units.len() as u64) as usize;
    assert!(
        units[start_index].key,
        "recording starts at seq {first}, not a keyframe"
    );
    let want: Vec<u8> = (0..n as usize)
        .flat_map(|k| units[(start_index + k) % units.len()].bytes.iter().copied())
        .collect();
    assert!(
        std::fs::read(&out).unwrap() == want,
        "the recording is the stream, in order"
    );
}

#[test]
fn record_of_a_frame_ring_is_refused_with_a_reason() {
    let dir = TempDir::new("cli-rec-kind");
    let socket = dir.join("cam.sock");
    let _p = producer(&dir, "producer", &socket, "nv12", 64, 64);
    let o = run(&["record", &s(&socket), "-o", &s(&dir.join("x.h264"))]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("frame ring"), "{}", stderr(&o));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn snapshot_of_a_cuda_ring_is_the_test_pattern_written_on_the_gpu() {
    let dir = TempDir::new("cli-cuda");
    let socket = dir.join("cam.sock");
    let (w, h) = (1920, 1080);
    let p = producer_on(&dir, "producer", &socket, "cuda", w, h);
    let v = json(&run(&["ls", &s(&dir.join("")), "--json"]));
    assert_eq!(v[0]["backend"], "cuda", "{v}");
    assert!(v[0]["gpu_uuid"].as_str().is_some_and(|u| u.starts_with("GPU-")), "{v}");
    let out = dir.join("cuda.png");
    let o = run(&[
        "snapshot",
        &s(&socket),
        "-o",
        &s(&out),
        "--count",
        "2",
        "--every",
        "100",
        "--json",
    ]);
    assert_ok(&o);
    for l in stdout(&o).lines() {
        let l: Value = serde_json::from_str(l).unwrap();
        assert_eq!(l["backend"], "cuda");
        assert_eq!(l["matrix"], "bt709", "1080 rows: HD");
        let path = PathBuf::from(l["path"].as_str().unwrap());
        assert_png_is_pattern(&path, Format::Nv12, w, h, l["seq"].as_u64().unwrap(), "bt709");
        println!("checked {} (seq {})", path.display(), l["seq"]);
    }
    // $OUT (the device machine's output folder) keeps the first PNG.
    if let Some(keep) = std::env::var_os("OUT") {
        std::fs::copy(dir.join("cuda-0001.png"), PathBuf::from(keep).join("cuda.png")).unwrap();
    }
    p.interrupt();
}

#[test]
fn snapshot_of_a_ring_that_publishes_nothing_times_out_with_exit_5() {
    let dir = TempDir::new("cli-snapshot-idle");
    let socket = dir.join("idle.sock");
    // Holds its first frame until 50 subscribers are connected: never.
    let mut c = Command::new(example("producer"));
    c.args([
        "--socket",
        &s(&socket),
        "--backend",
        "host",
        "--width",
        "64",
        "--height",
        "64",
    ]);
    c.args(["--wait-subscribers", "50", "--report-ms", "0"]);
    let mut p = spawn(&dir, "producer", c);
    wait_ready(&socket, &mut p);
    let start = Instant::now();
    let o = run(&[
        "snapshot",
        &s(&socket),
        "-o",
        &s(&dir.join("x.png")),
        "--timeout-ms",
        "300",
    ]);
    assert_eq!(code(&o), 5, "{}", stderr(&o));
    assert!(stderr(&o).contains("no frame"), "{}", stderr(&o));
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(!dir.join("x.png").exists());
}
