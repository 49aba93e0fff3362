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
    let consumer = |name: &str, mode: &str, delay_us: &str| {
        let mut c = Command::new(example("consumer"));
        c.args(["--socket", &s, "--name", name, "--mode", mode, "--delay-us", delay_us]);
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
        consumer("in-order", "sequential", "0"),
        consumer("slow-latest", "latest", "3000"),
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

#[test]
fn without_a_gpu_the_cuda_backend_choice_fails_with_a_message_that_says_why() {
    if vramring::seam::cuda::cuda_usable() {
        // On a GPU machine `--backend cuda` works; `gpu_ring` covers it.
        // This test is about the message on machines without one, so it
        // asserts that this machine has a GPU and says so.
        eprintln!("a usable CUDA GPU is present: the no-GPU message cannot be shown here");
        return;
    }
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
