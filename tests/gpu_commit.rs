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
#[path = "common/finals.rs"]
mod finals;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{example, TempDir};
use examples_common::JsonLine;
use finals::{final_line, untorn_final};
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
    let p = final_line("producer", producer);
    assert_eq!(p.u64("published"), Some(frames), "producer: {p:?}");
    assert_eq!(
        p.u64("stream_commit"),
        Some(1),
        "the producer did not commit in stream order: {p:?}"
    );
    let mut lines = Vec::new();
    for (name, child) in subs {
        let j = untorn_final(&name, child);
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

/// A stream-order publish does not wait for its commit, even while a
/// subscriber is parked on its futex (ADR 0017): it rings the parked
/// subscriber at once, and the subscriber, finding the commit in flight,
/// waits for it itself.
///
/// Each of the last five frames' commits is held on the GPU behind a
/// `cuStreamWaitValue64` on a registered host word until the test releases
/// it, 100 ms after the publish. Two `--wait park` subscribers (push, and
/// latest pull), asleep on their doorbells at each publish, must still get
/// every held frame, untorn, with nobody ringing them after the commit
/// lands, and none later than 1 s (their park slice is 10 s: only the
/// publisher's ring wakes them); and the held publishes must return in well
/// under a millisecond (median of five; about 30 µs on the H200). Before
/// ADR 0017 such a publish waited for the commit until the parked
/// subscribers' park slice (there the default 20 ms) ended: 1.3–10.4 ms
/// each on the H200, and a subscriber that never clears its flag would
/// have held it until the 5 s timeout.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_publish_returns_before_its_held_commit_lands_and_parked_subscribers_still_get_the_frame() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use vramring::memory::cuda::{ContextGuard, CuStream, Driver, GpuTestPattern};
    use vramring::{BackendChoice, Format, FrameMeta, Publisher, RingConfig};

    let d = RealDriver::shared().expect("a CUDA driver");
    let dir = TempDir::new("gpu-commit-held");
    let socket = dir.join("cam.sock").display().to_string();
    let mut p = Publisher::create(
        &socket,
        RingConfig::new(Format::Nv12, 1920, 1080).backend(BackendChoice::Cuda(0)),
    )
    .expect("a CUDA ring");
    assert!(p.stream_commit(), "the ring does not commit in stream order");
    let gpu = GpuTestPattern::for_uuid(p.info().device_uuid).expect("pattern kernels");
    let stream = gpu.stream().expect("stream");

    // The word each held commit waits for, in one registered host page.
    let mut page = memmap2::MmapMut::map_anon(4096).expect("a host page");
    let dev = d.device_get(0).expect("device 0");
    let ctx = d.primary_ctx_retain(dev).expect("primary context");
    // Runs `f` with the ring's (primary) context current.
    let in_ctx = |f: &mut dyn FnMut()| {
        // SAFETY: `ctx` is retained above and released at the end.
        let g = unsafe { ContextGuard::push(&*d, ctx) }.expect("push");
        f();
        g.restore().expect("restore");
    };
    let page_ptr = page.as_mut_ptr();
    let mut word_dev = None;
    // SAFETY: the page stays mapped until it is unregistered below, after
    // the stream has passed every wait on it.
    in_ctx(&mut || unsafe {
        d.mem_host_register(page_ptr.cast(), 4096).expect("cuMemHostRegister");
        word_dev = Some(d.mem_host_device_pointer(page_ptr.cast()).expect("device pointer"));
    });
    let word_dev = word_dev.expect("registered");
    // SAFETY: the page is 4096 bytes, page-aligned, and outlives `word`.
    let word = unsafe { &*page.as_ptr().cast::<AtomicU64>() };

    // A 10 s park slice: a parked subscriber wakes only when rung (or at
    // the close), so a publisher that did not ring would show in the
    // latencies below.
    let park = ["--wait", "park", "--park-slice-ms", "10000"];
    let subs = vec![
        consumer(&socket, "push-parked", &[&["--push"][..], &park].concat(), &[]),
        consumer(
            &socket,
            "latest-parked",
            &[&["--mode", "latest"][..], &park].concat(),
            &[],
        ),
    ];
    let t = Instant::now();
    while p.stats().subscribers < 2 {
        assert!(t.elapsed() < Duration::from_secs(20), "the subscribers did not connect");
        std::thread::sleep(Duration::from_millis(20));
    }
    let frames = 7u64;
    let held = 5u64;
    let mut held_took = Vec::new();
    for n in 1..=frames {
        // Long enough for both subscribers to spin out and park.
        std::thread::sleep(Duration::from_millis(200));
        let slot = p.loan(Duration::from_secs(1)).expect("loan");
        let seq = slot.seq();
        let len = slot.geometry().frame_bytes;
        let hold = n > frames - held;
        // SAFETY: the loaned slot is ours to write until it is published;
        // the stream and the word are of the ring's (primary) context.
        let took = unsafe {
            gpu.fill(slot.addr(), len, seq).expect("fill");
            if hold {
                in_ctx(&mut || {
                    d.stream_wait_value_geq(CuStream::from_raw(stream), word_dev, seq)
                        .expect("cuStreamWaitValue64");
                });
            }
            let t = Instant::now();
            slot.publish_cuda(FrameMeta::pts(seq as i64), stream).expect("publish");
            t.elapsed()
        };
        eprintln!(
            "frame {seq}: publish took {took:?}{}",
            if hold { " (commit held)" } else { "" }
        );
        if hold {
            held_took.push(took);
            std::thread::sleep(Duration::from_millis(100));
            let mut idle = true;
            // SAFETY: a live stream of the current context.
            in_ctx(&mut || idle = unsafe { d.stream_query(CuStream::from_raw(stream)) }.expect("cuStreamQuery"));
            assert!(!idle, "the commit of frame {seq} was not held");
            // SYNC: the GPU's stream wait reads the word; Release is enough
            // (registered host memory is coherent with the device).
            word.store(seq, Ordering::Release);
        }
    }
    held_took.sort();
    let median = held_took[held_took.len() / 2];
    assert!(
        median < Duration::from_millis(1),
        "held publishes took {held_took:?} (median {median:?}): they waited for the commit"
    );
    std::thread::sleep(Duration::from_millis(300));
    p.close().expect("close");
    drop(p);
    // SAFETY: the stream has passed every wait (the close waited for every
    // commit); the page is unregistered before it is unmapped.
    in_ctx(&mut || unsafe {
        d.stream_synchronize(CuStream::from_raw(stream)).expect("sync");
        d.mem_host_unregister(page_ptr.cast()).expect("unregister");
    });
    d.primary_ctx_release(dev).expect("release");
    for (name, child) in subs {
        let j = untorn_final(&name, child);
        assert_eq!(j.u64("dropped"), Some(0), "{name}: {j:?}");
        assert_eq!(j.u64("last_seq"), Some(frames), "{name}: {j:?}");
        let first = j.u64("first_seq").expect("first_seq");
        assert!(first <= frames - held + 1, "{name} missed a held frame: {j:?}");
        assert_eq!(j.u64("delivered"), Some(frames - first + 1), "{name}: {j:?}");
        // Held 100 ms, then found by the in-flight wait's naps (at most
        // 20 ms each); never at the end of a 10 s park slice.
        let max = j.f64("max_us").expect("max_us");
        assert!(max < 1_000_000.0, "{name} was not rung: a frame took {max} µs: {j:?}");
    }
}
