//! Stream-order commits on the GPU (ADR 0009): a CUDA producer whose
//! `publish_cuda` only enqueues (the GPU stores the seqs), with subscribers
//! of every mode as separate processes, every frame checked on the GPU
//! after its copy: 0 torn over more than 100 000 1080p frames checked
//! (240 000 published at 4 000 fps; overwrite policy:
//! latest and sequential pull, two push subscribers, a latest pull reader in
//! its own PID, IPC and mount namespaces, and a latest reader whose copies
//! are queued on the GPU behind the commit, ADR 0010), and a
//! lossless run in which the lossless readers (one of them queued) get
//! every frame in order; and a run with no push subscriber, whose commits
//! are batched stream memory operations instead of the kernel (ADR 0013),
//! with 0 torn over more than 60 000 checks by six pull readers; and
//! queued readers that keep up queue their copies at the publisher's loan
//! (ADR 0014), every frame checked. Needs a CUDA GPU and root.

mod common;

#[path = "../examples/common/mod.rs"]
#[allow(dead_code)]
mod examples_common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{example, TempDir};
use examples_common::JsonLine;
use vramring::memory::cuda::RealDriver;

fn producer(socket: &str, extra: &[&str]) -> Child {
    Command::new(example("producer"))
        .args(["--socket", socket, "--backend", "cuda", "--json", "--report-ms", "0"])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("producer")
}

fn consumer(socket: &str, name: &str, extra: &[&str], wrapper: &[&str]) -> (String, Child) {
    let mut cmd = if wrapper.is_empty() {
        Command::new(example("consumer"))
    } else {
        let mut c = Command::new(wrapper[0]);
        c.args(&wrapper[1..]).arg(example("consumer"));
        c
    };
    let child = cmd
        .args([
            "--socket",
            socket,
            "--name",
            name,
            "--json",
            "--report-ms",
            "0",
            "--timeout-ms",
            "60000",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {name}: {e}"));
    (name.to_owned(), child)
}

/// `unshare` and its flags: a consumer in its own PID, IPC and mount
/// namespaces (`VRAMRING_TEST_UNSHARE` overrides the flags).
fn unshare() -> Vec<String> {
    let flags =
        std::env::var("VRAMRING_TEST_UNSHARE").unwrap_or_else(|_| "--pid --ipc --mount --fork --mount-proc".into());
    std::iter::once("unshare")
        .chain(flags.split_whitespace())
        .map(str::to_owned)
        .collect()
}

/// Asserts that the consumers checked at least `n` frames on the GPU
/// between them.
fn at_least_checked(lines: &[(String, JsonLine)], n: u64) {
    let checked: u64 = lines.iter().map(|(_, j)| j.u64("delivered").unwrap_or(0)).sum();
    eprintln!("frames checked on the GPU across subscribers: {checked}");
    assert!(checked >= n, "only {checked} frames were checked");
}

/// Waits for the producer and every consumer; returns the consumers' final
/// JSON lines after asserting each exited cleanly with 0 torn frames.
fn finish(producer: Child, frames: u64, subs: Vec<(String, Child)>) -> Vec<(String, JsonLine)> {
    let out = producer.wait_with_output().expect("producer");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "producer failed: {text}");
    let p = JsonLine::final_in(&text);
    eprintln!("producer: {p:?}");
    assert_eq!(p.u64("published"), Some(frames), "producer: {p:?}");
    assert_eq!(
        p.u64("stream_commit"),
        Some(1),
        "the producer did not commit in stream order: {p:?}"
    );
    let mut lines = Vec::new();
    for (name, child) in subs {
        let out = child.wait_with_output().expect("consumer");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name} failed: {text}");
        let j = JsonLine::final_in(&text);
        eprintln!("{name}: {j:?}");
        assert_eq!(j.u64("torn"), Some(0), "{name}: {j:?}");
        // A sequential reader that checks each frame on the GPU cannot keep
        // up with 4 000 fps and is overrun (counted, never torn): it only
        // has to get some frames.
        assert!(j.u64("delivered").unwrap_or(0) > 0, "{name} got no frame: {j:?}");
        lines.push((name, j));
    }
    lines
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn stream_order_commits_deliver_frames_untorn_to_every_mode_over_100000_checks() {
    let d = RealDriver::shared().expect("a CUDA driver");
    let free_before = common::gpu_free_bytes(&d);
    let dir = TempDir::new("gpu-commit");
    let socket = dir.join("cam.sock").display().to_string();
    let frames = 240_000u64;
    let n = frames.to_string();
    let p = producer(
        &socket,
        &[
            "--frames",
            &n,
            "--fps",
            "4000",
            "--slots",
            "8",
            "--wait-subscribers",
            "6",
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    let wrap = unshare();
    let wrapper: Vec<&str> = wrap.iter().map(String::as_str).collect();
    let subs = vec![
        consumer(&socket, "latest", &["--mode", "latest"], &[]),
        consumer(&socket, "sequential", &["--mode", "sequential"], &[]),
        consumer(&socket, "push-a", &["--mode", "latest", "--push"], &[]),
        consumer(&socket, "push-b", &["--mode", "latest", "--push"], &[]),
        consumer(&socket, "namespaced", &["--mode", "latest"], &wrapper),
        consumer(
            &socket,
            "queued-latest",
            &["--mode", "latest", "--pull-start", "queued"],
            &[],
        ),
    ];
    let t = Instant::now();
    let lines = finish(p, frames, subs);
    eprintln!("ran in {:?}", t.elapsed());
    at_least_checked(&lines, 100_000);
    for (name, j) in &lines {
        if name == "sequential" {
            assert_eq!(j.u64("last_seq"), Some(frames), "{name}: {j:?}");
        }
        if name.starts_with("queued") {
            // Queued copies (ADR 0010) did the pulling, and were checked.
            assert!(j.u64("queued").unwrap_or(0) > 0, "{name}: {j:?}");
            // ... waiting on the pool's gate word in device memory (ADR 0011).
            assert_eq!(j.get("gate"), Some("pool"), "{name}: {j:?}");
            // The publisher closed in order: nothing was set aside.
            assert_eq!(j.u64("abandoned"), Some(0), "{name}: {j:?}");
        }

        if name.starts_with("push") {
            // Each pushed frame arrives without an overrun: the GPU wrote
            // it into a buffer the subscriber did not hold.
            assert_eq!(j.u64("overruns"), Some(0), "{name}: {j:?}");
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let free_after = common::gpu_free_bytes(&d);
    let diff = free_before.abs_diff(free_after);
    eprintln!("device free memory before {free_before} after {free_after}");
    assert!(diff <= 4 << 20, "device free memory moved by {diff} bytes");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_lossless_reader_gets_every_stream_committed_frame_in_order() {
    let dir = TempDir::new("gpu-commit-lossless");
    let socket = dir.join("cam.sock").display().to_string();
    let frames = 10_000u64;
    let n = frames.to_string();
    let p = producer(
        &socket,
        &[
            "--frames",
            &n,
            "--fps",
            "0",
            "--slots",
            "8",
            "--policy",
            "lossless",
            "--width",
            "640",
            "--height",
            "360",
            "--wait-subscribers",
            "4",
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    let subs = vec![
        consumer(&socket, "lossless", &["--mode", "sequential", "--lossless"], &[]),
        consumer(&socket, "push", &["--mode", "latest", "--push"], &[]),
        consumer(&socket, "latest", &["--mode", "latest"], &[]),
        consumer(
            &socket,
            "lossless-queued",
            &["--mode", "sequential", "--lossless", "--pull-start", "queued"],
            &[],
        ),
    ];
    let lines = finish(p, frames, subs);
    for name in ["lossless", "lossless-queued"] {
        let (_, j) = lines.iter().find(|(n, _)| n == name).expect("lossless line");
        assert_eq!(j.u64("delivered"), Some(frames), "{name}: {j:?}");
        assert_eq!(j.u64("dropped"), Some(0), "{name}: {j:?}");
        assert_eq!(j.u64("last_seq"), Some(frames), "{name}: {j:?}");
    }
    let (_, j) = lines.iter().find(|(n, _)| n == "lossless-queued").expect("line");
    assert_eq!(j.get("gate"), Some("pool"), "lossless-queued: {j:?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn with_no_push_subscriber_the_batched_commit_delivers_frames_untorn_over_60000_checks() {
    // No push target: every commit is the three batched stores (gate,
    // slot seq, global_seq) of one `cuStreamBatchMemOp`, no kernel (ADR
    // 0013). Six pull readers each check about 460 frames a second on the
    // H200 without MPS (their contexts share the GPU by time slices): 24 000
    // frames at 800 fps gave 67 548 checks, 0 torn.
    let dir = TempDir::new("gpu-commit-batched");
    let socket = dir.join("cam.sock").display().to_string();
    let frames = 24_000u64;
    let n = frames.to_string();
    let p = producer(
        &socket,
        &[
            "--frames",
            &n,
            "--fps",
            "800",
            "--slots",
            "8",
            "--wait-subscribers",
            "6",
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    let wrap = unshare();
    let wrapper: Vec<&str> = wrap.iter().map(String::as_str).collect();
    let subs = vec![
        consumer(&socket, "latest", &["--mode", "latest"], &[]),
        consumer(&socket, "latest-b", &["--mode", "latest"], &[]),
        consumer(&socket, "sequential", &["--mode", "sequential"], &[]),
        consumer(&socket, "namespaced", &["--mode", "latest"], &wrapper),
        consumer(
            &socket,
            "queued-latest",
            &["--mode", "latest", "--pull-start", "queued"],
            &[],
        ),
        consumer(
            &socket,
            "queued-sequential",
            &["--mode", "sequential", "--pull-start", "queued"],
            &[],
        ),
    ];
    let lines = finish(p, frames, subs);
    at_least_checked(&lines, 60_000);
    for (name, j) in &lines {
        if name.contains("sequential") {
            assert_eq!(j.u64("last_seq"), Some(frames), "{name}: {j:?}");
        }
        if name.starts_with("queued") {
            // A gate line: the commit is the batched one.
            assert_eq!(j.get("gate"), Some("pool"), "{name}: {j:?}");
        }
        if name == "queued-latest" {
            // Its copies were queued behind the batched stores. (A
            // sequential reader overrun at this rate is always behind the
            // newest frame, so its copies start after the commit instead.)
            assert!(j.u64("queued").unwrap_or(0) > 0, "{name}: {j:?}");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn queued_readers_that_keep_up_queue_their_copies_at_the_loan() {
    // At 200 fps every reader keeps up even without MPS, so a busy-polling
    // queued reader is waiting when the next slot is loaned and queues its
    // copy there (ADR 0014), before the commit is announced; each copy is
    // checked on the GPU like every other. The publisher closes in order,
    // opening the gate, so no copy is ever set aside.
    let dir = TempDir::new("gpu-commit-at-loan");
    let socket = dir.join("cam.sock").display().to_string();
    let frames = 2_000u64;
    let n = frames.to_string();
    let p = producer(
        &socket,
        &[
            "--frames",
            &n,
            "--fps",
            "200",
            "--slots",
            "8",
            "--wait-subscribers",
            "3",
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    let queued = ["--pull-start", "queued", "--wait", "spin"];
    let subs = vec![
        consumer(
            &socket,
            "latest-spin",
            &[&["--mode", "latest"][..], &queued].concat(),
            &[],
        ),
        consumer(
            &socket,
            "sequential-spin",
            &[&["--mode", "sequential"][..], &queued].concat(),
            &[],
        ),
        // The library's default wait: it queues at the loan only when its
        // spin window covers the loan, so only its frames are asserted.
        consumer(
            &socket,
            "latest-cadence",
            &["--mode", "latest", "--pull-start", "queued"],
            &[],
        ),
    ];
    let lines = finish(p, frames, subs);
    for (name, j) in &lines {
        let delivered = j.u64("delivered").unwrap_or(0);
        // Each reader starts at the newest frame when its first `next()`
        // runs, then reads to the end.
        assert_eq!(j.u64("last_seq"), Some(frames), "{name}: {j:?}");
        assert_eq!(j.u64("abandoned"), Some(0), "{name}: {j:?}");
        assert_eq!(j.get("gate"), Some("pool"), "{name}: {j:?}");
        if name.ends_with("spin") {
            // Kept up: every frame from its first one (a latest reader may
            // count frames it skipped before that one), nearly every copy
            // queued at the loan.
            let first = j.u64("first_seq").expect("first_seq");
            assert_eq!(delivered, frames - first + 1, "{name}: {j:?}");
            let at_loan = j.u64("queued_at_loan").unwrap_or(0);
            assert!(
                at_loan * 10 >= delivered * 9,
                "{name}: {at_loan} of {delivered} at the loan: {j:?}"
            );
        }
    }
}
