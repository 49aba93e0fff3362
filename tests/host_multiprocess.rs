//! The host backend end to end across real processes: this test binary is
//! the publisher, and re-executes itself as each subscriber (see
//! `common::run_child_role`).

use vramring_testkit::procs as common;

use std::time::{Duration, Instant};
use vramring::ServeOptions;

use common::{ChildProc, SubResult, SubSpec, TempDir};
use std::path::PathBuf;
use vramring::BackendChoice;
use vramring::{Format, FrameMeta, Policy, Publisher, RingConfig};
use vramring_testkit::pattern as testpattern;

#[test]
fn child_process_entry() {
    common::run_child_role();
}

fn publish_one(p: &mut Publisher, timeout: Duration) -> u64 {
    let mut slot = p.loan(timeout).expect("loan");
    let seq = slot.seq();
    testpattern::fill(slot.bytes_mut().expect("host slot"), seq);
    slot.publish(FrameMeta::pts(seq as i64)).expect("publish")
}

/// 1 producer × 4 subscriber processes (a fast latest reader, a slow latest
/// reader, a slow sequential reader and a lossless reader) × 5000 frames on
/// the lossless policy: no delivered frame is torn (every one is checked
/// against the pattern of its seq), every gap a reader saw is counted in its
/// `dropped` exactly, and the lossless reader gets every frame in order.
#[test]
fn four_subscriber_processes_see_no_torn_frame_exact_gaps_and_a_complete_lossless_stream() {
    const FRAMES: u64 = 5000;
    let dir = TempDir::new("fanout");
    let socket = dir.join("ring.sock");
    let cfg = RingConfig::new(Format::Nv12, 64, 32)
        .slots(4)
        .policy(Policy::Lossless)
        .backend(BackendChoice::Host)
        .lossless_lease(Duration::from_secs(120));
    let mut p = Publisher::create(&socket, cfg).expect("publisher");
    let frame_bytes = p.geometry().frame_bytes;
    let specs = [
        SubSpec::new("latest-fast", "latest", 0, FRAMES),
        SubSpec::new("latest-slow", "latest", 1000, FRAMES),
        SubSpec::new("sequential-slow", "sequential", 300, FRAMES),
        SubSpec::new("lossless", "lossless", 0, FRAMES),
    ];
    let results: Vec<PathBuf> = specs.iter().map(|s| dir.join(&format!("{}.result", s.name))).collect();
    let mut children: Vec<ChildProc> = specs
        .iter()
        .zip(&results)
        .map(|(s, result)| {
            common::spawn(
                &dir,
                &s.name,
                common::self_command(&[], "subscriber", &s.env(&socket, result)),
            )
        })
        .collect();
    common::wait_connected(&mut children, &results, Duration::from_secs(30));
    assert_eq!(p.stats().subscribers, specs.len() as u32);

    let start = Instant::now();
    for _ in 0..FRAMES {
        publish_one(&mut p, Duration::from_secs(60));
    }
    let publish_s = start.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(120);
    for c in &mut children {
        c.wait_success(deadline);
    }
    let stats = p.stats();
    p.close().expect("close");

    eprintln!(
        "host multi-process run: {FRAMES} frames of NV12 64x32 ({frame_bytes} bytes), 4 slots, lossless policy: \
         published in {publish_s:.2} s = {:.0} fps (paced by the lossless reader); {} loans waited for it",
        FRAMES as f64 / publish_s,
        stats.lossless_waits
    );
    for (s, result) in specs.iter().zip(&results) {
        let r = SubResult::read(result);
        let (p50, p99, max) = r.latency_us();
        eprintln!(
            "  {:<16} delivered {:>5}  dropped {:>5}  overruns {:>3}  torn {}  latency p50 {:>8.1} us  p99 {:>8.1} us  max {:>8.1} us",
            s.name,
            r.num("delivered"),
            r.num("dropped"),
            r.num("overruns"),
            r.num("torn"),
            p50,
            p99,
            max
        );
        assert_eq!(r.num("torn"), 0, "{}: torn frames {}", s.name, r.get("torn_detail"));
        assert_eq!(r.seqs.last(), Some(&FRAMES), "{}: read up to the last frame", s.name);
        r.assert_gaps_exactly_counted();
        if s.mode == "lossless" {
            assert_eq!(
                r.seqs,
                (1..=FRAMES).collect::<Vec<_>>(),
                "the lossless reader gets every frame in order"
            );
            assert_eq!(r.num("dropped"), 0);
        }
    }
    assert_eq!(stats.evictions, 0, "no lossless reader was evicted");
}

/// A subscriber started by `unshare --pid --ipc --mount --fork` (PID 1 of
/// its own PID namespace, its own IPC and mount namespaces, sharing only the
/// socket's directory) connects, imports the ring and receives correct
/// frames: every one, in order (it reads losslessly, so how fast it runs
/// does not matter). Without `unshare` or the right to use it, this fails:
/// it never passes by skipping.
#[test]
fn a_subscriber_in_its_own_pid_ipc_and_mount_namespaces_receives_correct_frames() {
    const UNTIL: u64 = 300;
    let dir = TempDir::new("unshare");
    let socket = dir.join("ring.sock");
    let cfg = RingConfig::new(Format::Nv12, 128, 64)
        .slots(8)
        .policy(Policy::Lossless)
        .backend(BackendChoice::Host)
        .lossless_lease(Duration::from_secs(120));
    let mut p = Publisher::create(&socket, cfg).expect("publisher");
    let spec = SubSpec::new("namespaced", "lossless", 0, UNTIL);
    let result = dir.join("namespaced.result");
    let unshare = ["unshare", "--pid", "--ipc", "--mount", "--fork", "--"];
    let found = std::process::Command::new("unshare").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "`unshare` (util-linux) is needed to start a subscriber in its own namespaces; install util-linux (.ci/run does)"
    );
    let mut child = common::spawn(
        &dir,
        "namespaced",
        common::self_command(&unshare, "subscriber", &spec.env(&socket, &result)),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !common::ready_path(&result).exists() {
        if let Some(status) = child.try_wait() {
            panic!(
                "the subscriber under `unshare --pid --ipc --mount --fork` exited ({status}) before connecting; \
                 unshare needs root or CAP_SYS_ADMIN. Output:\n{}",
                child.output()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the namespaced subscriber did not connect in 30 s:\n{}",
            child.output()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Publish at about 2 kHz, or as fast as the subscriber reads, until it
    // has read its last frame.
    while child.try_wait().is_none() {
        assert!(
            Instant::now() < deadline + Duration::from_secs(30),
            "namespaced subscriber still running"
        );
        publish_one(&mut p, Duration::from_secs(60));
        std::thread::sleep(Duration::from_micros(500));
    }
    child.wait_success(Instant::now());
    p.close().expect("close");
    let r = SubResult::read(&result);
    eprintln!(
        "namespaced subscriber: pid {} ({}, {}, {}), delivered {}, dropped {}, torn {}",
        r.get("pid"),
        r.get("ns_pid"),
        r.get("ns_ipc"),
        r.get("ns_mnt"),
        r.num("delivered"),
        r.num("dropped"),
        r.num("torn")
    );
    assert_eq!(r.num("pid"), 1, "the subscriber is PID 1 of its own PID namespace");
    for kind in ["pid", "ipc", "mnt"] {
        let theirs = r.get(&format!("ns_{kind}"));
        assert!(!theirs.is_empty(), "no {kind} namespace reported");
        assert_ne!(
            theirs,
            common::own_namespace(kind),
            "the subscriber shares our {kind} namespace"
        );
    }
    assert_eq!(r.num("torn"), 0, "torn frames: {}", r.get("torn_detail"));
    assert_eq!(
        r.seqs,
        (1..=UNTIL).collect::<Vec<_>>(),
        "the namespaced subscriber gets every frame in order"
    );
    assert_eq!(r.num("dropped"), 0);
}
