//! Every example runs and does what its documentation says: the producer
//! and consumer pass verified frames between processes and report in JSON,
//! the CUDA backend choice fails clearly where no GPU is usable, and the
//! demo runs a producer and three consumers to a clean table.
//!
//! The examples are the binaries `cargo test` builds next to this test
//! (`target/<profile>/examples/`). Run the whole suite (`cargo test`), or
//! `cargo build --examples` first when running this file alone.

use vramring_testkit::procs as common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{example, TempDir};
use vramring_testkit::json::JsonLine;

#[test]
fn producer_and_consumer_examples_pass_verified_frames_and_report_zero_torn() {
    let dir = TempDir::new("examples-pc");
    let socket = dir.join("cam.sock");
    let s = socket.display().to_string();
    let mut producer = Command::new(example("producer"));
    producer.args([
        "--socket",
        &s,
        "--backend",
        "host",
        "--width",
        "320",
        "--height",
        "180",
        "--slots",
        "8",
    ]);
    producer.args([
        "--fps",
        "400",
        "--frames",
        "0",
        "--wait-subscribers",
        "2",
        "--report-ms",
        "200",
        "--json",
    ]);
    let mut producer = common::spawn(&dir, "producer", producer);
    let consumer = |name: &str, mode: &str, delay_us: &str, prepare_ahead_us: &str| {
        let mut c = Command::new(example("consumer"));
        c.args(["--socket", &s, "--name", name, "--mode", mode, "--delay-us", delay_us]);
        c.args(["--prepare-ahead-us", prepare_ahead_us]);
        c.args([
            "--frames",
            "150",
            "--timeout-ms",
            "20000",
            "--report-ms",
            "200",
            "--json",
        ]);
        common::spawn(&dir, name, c)
    };
    let mut consumers = [
        // Parking before each read until just before the frame is due
        // loses none of the frames a sequential reader reads.
        consumer("in-order", "sequential", "0", "500"),
        consumer("slow-latest", "latest", "3000", "0"),
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    for c in &mut consumers {
        c.wait_success(deadline);
        let j = JsonLine::final_in(&c.output());
        eprintln!("{}: {:?}", c.name, j.0);
        assert_eq!(j.u64("delivered"), Some(150), "{}", c.name);
        assert_eq!(j.u64("torn"), Some(0), "{}", c.name);
        assert!(j.f64("p99_us").is_some_and(|v| v > 0.0), "{}: latency reported", c.name);
        let (first, last) = (j.u64("first_seq").unwrap_or(0), j.u64("last_seq").unwrap_or(0));
        assert!(first >= 1 && last > first, "{}: seqs {first}..{last}", c.name);
        // Every seq in first..=last not delivered is counted dropped; so may
        // be some before `first`, published while the consumer connected.
        let missed = last - first + 1 - 150;
        let dropped = j.u64("dropped").unwrap_or(u64::MAX);
        assert!(
            (missed..=missed + first - 1).contains(&dropped),
            "{}: {missed} seqs missed in {first}..={last}, {dropped} counted dropped",
            c.name
        );
    }
    // Ctrl-C ends the producer cleanly, with its summary.
    producer.interrupt();
    producer.wait_success(Instant::now() + Duration::from_secs(20));
    let j = JsonLine::final_in(&producer.output());
    eprintln!("producer: {:?}", j.0);
    assert!(j.u64("published").is_some_and(|n| n >= 150));
    assert_eq!(j.u64("connects"), Some(2));
}

/// On a GPU machine the choice works (one frame published); without one it
/// fails with a message naming CUDA. Either way something is asserted.
#[test]
fn the_cuda_backend_choice_works_on_a_gpu_and_says_why_not_without_one() {
    let gpu = vramring::seam::cuda::cuda_usable();
    let dir = TempDir::new("examples-cuda");
    let socket = dir.join("cam.sock");
    let out = Command::new(example("producer"))
        .args([
            "--socket",
            &socket.display().to_string(),
            "--backend",
            "cuda",
            "--frames",
            "1",
            "--width",
            "64",
            "--height",
            "64",
        ])
        .output()
        .expect("running the producer example");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if gpu {
        assert!(
            out.status.success(),
            "producer --backend cuda failed on a GPU machine:\n{text}"
        );
        return;
    }
    // Without a GPU the pool cannot be created: a non-zero exit naming CUDA.
    assert!(!out.status.success(), "producer --backend cuda succeeded:\n{text}");
    assert!(text.contains("CUDA"), "the error names CUDA:\n{text}");
}

#[test]
fn the_demo_runs_a_producer_and_three_consumers_to_a_clean_table() {
    let dir = TempDir::new("examples-demo");
    let mut cmd = Command::new(example("demo"));
    cmd.args([
        "--seconds",
        "2",
        "--backend",
        "host",
        "--width",
        "320",
        "--height",
        "180",
        "--fps",
        "100",
    ]);
    let mut demo = common::spawn(&dir, "demo", cmd);
    demo.wait_success(Instant::now() + Duration::from_secs(60));
    let out = demo.output();
    eprintln!("{out}");
    for row in ["producer", "detector", "recorder", "slow-analytics"] {
        assert!(
            out.lines().any(|l| l.starts_with(row) && l.contains("exit status: 0")),
            "no clean row for {row}:\n{out}"
        );
    }
    assert!(out.contains("every delivered frame verified: torn = 0"), "{out}");
}

#[test]
fn the_consumer_example_fails_with_a_sentence_when_frames_stop_coming() {
    use std::io::{BufRead, BufReader, Read};
    use std::sync::atomic::{AtomicBool, Ordering};
    use vramring::{BackendChoice, Format, FrameMeta, Publisher, RingConfig};
    let dir = TempDir::new("examples-stall");
    let socket = dir.join("cam.sock");
    let mut p = Publisher::create(
        &socket,
        RingConfig::new(Format::Gray8, 64, 16).backend(BackendChoice::Host),
    )
    .expect("publisher");
    let mut child = Command::new(example("consumer"))
        .args(["--socket", &socket.display().to_string(), "--name", "stalled"])
        .args(["--timeout-ms", "300", "--report-ms", "20", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("consumer");
    // Publish until the consumer reports a frame, then hold the ring
    // without publishing: its next read times out.
    let delivered = AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            let start = Instant::now();
            while !delivered.load(Ordering::Relaxed) {
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "the consumer never reported a frame"
                );
                let mut slot = p.loan(Duration::from_secs(1)).expect("loan");
                let seq = slot.seq();
                vramring_testkit::pattern::fill(slot.bytes_mut().expect("host slot"), seq);
                slot.publish(FrameMeta::pts(seq as i64)).expect("publish");
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let mut lines = Vec::new();
        for line in BufReader::new(child.stdout.take().expect("stdout")).lines() {
            let line = line.expect("consumer stdout");
            if JsonLine::parse(&line)
                .and_then(|j| j.u64("delivered"))
                .is_some_and(|n| n > 0)
            {
                delivered.store(true, Ordering::Relaxed);
            }
            lines.push(line);
        }
        delivered.store(true, Ordering::Relaxed);
        lines.join("\n")
    });
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("stderr");
    let status = child.wait().expect("consumer exit");
    assert_eq!(status.code(), Some(1), "a stall is a failure; stderr: {err}");
    assert!(err.contains("no frame came for 300 ms"), "{err}");
    assert_eq!(JsonLine::final_in(&out).get("end"), Some("timeout"), "{out}");
}

#[test]
fn the_producer_example_refuses_what_its_access_flags_say() {
    use vramring::{ClientOptions, Delivery, Refusal, Subscriber, SubscriberOptions};
    let dir = TempDir::new("examples-access");
    let connect = |socket: &std::path::Path, opts: SubscriberOptions| {
        let start = Instant::now();
        loop {
            match Subscriber::connect(socket, opts.clone().connect_timeout(Duration::from_secs(5))) {
                Err(vramring::Error::Io { .. }) if start.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                other => return other,
            }
        }
    };
    let producer = |name: &str, flags: &[&str]| {
        let socket = dir.join(&format!("{name}.sock"));
        let mut c = Command::new(example("producer"));
        c.args(["--socket", &socket.display().to_string(), "--backend", "host"]);
        c.args(["--width", "64", "--height", "16", "--fps", "100"]);
        c.args(flags);
        (common::spawn(&dir, name, c), socket)
    };

    let (_nobody, socket) = producer("pull-nobody", &["--pull", "nobody"]);
    match connect(&socket, SubscriberOptions::default().delivery(Delivery::Pull)) {
        Err(e) => assert_eq!(e.refusal(), Some(Refusal::PullDenied), "{e}"),
        Ok(_) => panic!("a pull subscriber was served by a push-only producer"),
    }
    let pushed = connect(&socket, SubscriberOptions::default().push(true));
    assert!(pushed.is_ok(), "a push subscriber was refused: {:?}", pushed.err());
    let auto = connect(&socket, SubscriberOptions::default()).expect("a default subscriber is served by push");
    assert_eq!(auto.delivery(), Delivery::Push);

    let (_stranger, socket) = producer("allow-list", &["--allow-uid", "4000000000"]);
    match connect(&socket, SubscriberOptions::default()) {
        Err(e) => assert_eq!(e.refusal(), Some(Refusal::Permission), "{e}"),
        Ok(_) => panic!("a peer off the allow-list was served"),
    }

    let (_read_only, socket) = producer("no-write", &[]);
    match connect(&socket, SubscriberOptions::default().write(true)) {
        Err(e) => assert_eq!(e.refusal(), Some(Refusal::WriteDenied), "{e}"),
        Ok(_) => panic!("write access was granted without --allow-write"),
    }
    let (_writable, socket) = producer("write", &["--allow-write"]);
    let w = connect(&socket, SubscriberOptions::default().write(true));
    assert!(w.is_ok(), "--allow-write did not grant write access: {:?}", w.err());

    // Lossless kept to named uids: refused to the others (who may still
    // connect without it), granted to a uid on the list.
    let uid = rustix::process::getuid().as_raw();
    let lossless = |name: &str, access: &str| producer(name, &["--policy", "lossless", "--lossless-access", access]);
    let (_nobody, socket) = lossless("lossless-nobody", "nobody");
    match connect(&socket, SubscriberOptions::default().lossless(true)) {
        Err(e) => {
            assert_eq!(e.refusal(), Some(Refusal::Policy), "{e}");
            assert!(
                e.to_string().contains(&format!("uid {uid}")),
                "the reason names the uid: {e}"
            );
        }
        Ok(_) => panic!("a lossless reader was served by a producer that grants lossless to nobody"),
    }
    let lossy = connect(&socket, SubscriberOptions::default());
    assert!(
        lossy.is_ok(),
        "a reader without lossless was refused: {:?}",
        lossy.err()
    );
    let (_stranger, socket) = lossless("lossless-stranger", "uids=4000000000");
    match connect(&socket, SubscriberOptions::default().lossless(true)) {
        Err(e) => assert_eq!(e.refusal(), Some(Refusal::Policy), "{e}"),
        Ok(_) => panic!("a lossless reader off the uid list was served"),
    }
    let (_named, socket) = lossless("lossless-named", &format!("uids=4000000000,{uid}"));
    let granted = connect(&socket, SubscriberOptions::default().lossless(true));
    assert!(
        granted.is_ok(),
        "a lossless reader on the uid list was refused: {:?}",
        granted.err()
    );
}
