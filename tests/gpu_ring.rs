//! The ring end to end on the GPU, across processes: a CUDA producer, four
//! subscribers (one in its own PID, IPC and mount namespaces, one by push
//! delivery), every frame written and checked on the GPU; a rogue subscriber
//! that writes into its read-only mapping fails alone; device memory returns
//! to where it started. Needs a CUDA GPU and root (for `unshare`).

use vramring::ClientOptions;
use vramring_testkit::procs as common;

use vramring_testkit::finals;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{example, TempDir};
use finals::{final_line, untorn_final};
use vramring::seam::cuda::{ContextGuard, Driver, RealDriver};
use vramring::{Subscriber, SubscriberOptions};

const ROGUE: &str = "VRAMRING_GPU_ROGUE";

/// The rogue subscriber: connects, borrows a frame, and tries to write into
/// the read-only mapping. Exits 0 when the write was refused.
fn rogue(socket: &str) {
    let mut sub = Subscriber::connect(socket, SubscriberOptions::default().name("rogue")).expect("rogue connect");
    let b = sub.borrow(Duration::from_secs(20)).expect("rogue borrow");
    let d = RealDriver::shared().expect("driver");
    let dev = d.device_get(0).expect("device");
    let ctx = d.primary_ctx_retain(dev).expect("ctx");
    // SAFETY: retained above.
    let g = unsafe { ContextGuard::push(&*d, ctx) }.expect("push");
    // SAFETY: deliberately writing into a mapping we were granted read
    // access to only; the driver must refuse (or the context must fault).
    let wrote = unsafe { d.memset_d8(b.device().expect("a CUDA borrow").as_raw(), 0xff, 4096) };
    let _ = g.restore();
    println!("rogue write: {wrote:?}");
    std::process::exit(if wrote.is_err() { 0 } else { 1 });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn four_gpu_subscribers_one_in_its_own_namespaces_get_10000_frames_untorn() {
    if let Ok(socket) = std::env::var(ROGUE) {
        rogue(&socket);
    }
    let d = RealDriver::shared().expect("a CUDA driver");
    let free_before = common::gpu_free_bytes(&d);
    let dir = TempDir::new("gpu-ring");
    let socket = dir.join("cam.sock").display().to_string();
    let frames = "10000";
    let producer = Command::new(example("producer"))
        .args([
            "--socket",
            &socket,
            "--backend",
            "cuda",
            "--width",
            "1920",
            "--height",
            "1080",
            "--slots",
            "16",
        ])
        .args([
            "--frames",
            frames,
            "--fps",
            "1000",
            "--wait-subscribers",
            "5",
            "--json",
            "--report-ms",
            "0",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("producer");
    let consumer = |name: &str, extra: &[&str], wrapper: &[&str]| {
        let mut cmd = if wrapper.is_empty() {
            Command::new(example("consumer"))
        } else {
            let mut c = Command::new(wrapper[0]);
            c.args(&wrapper[1..]).arg(example("consumer"));
            c
        };
        cmd.args([
            "--socket",
            &socket,
            "--name",
            name,
            "--json",
            "--report-ms",
            "0",
            "--timeout-ms",
            "30000",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {name}: {e}"))
    };
    std::thread::sleep(Duration::from_millis(500));
    // The namespaces the fourth subscriber runs in, as a container has them:
    // its own PID, IPC and mount namespaces and its own /proc (without
    // --mount-proc, cuInit fails with CUDA_ERROR_OPERATING_SYSTEM in a new
    // PID namespace: the driver reads /proc for a pid that /proc does not
    // show). Override with VRAMRING_TEST_UNSHARE.
    let flags =
        std::env::var("VRAMRING_TEST_UNSHARE").unwrap_or_else(|_| "--pid --ipc --mount --fork --mount-proc".into());
    let mut wrapper = vec!["unshare"];
    wrapper.extend(flags.split_whitespace());
    eprintln!("namespaced subscriber runs under: {}", wrapper.join(" "));
    let subs = vec![
        ("latest", consumer("latest", &["--mode", "latest"], &[])),
        ("sequential", consumer("sequential", &["--mode", "sequential"], &[])),
        ("push", consumer("push", &["--mode", "latest", "--push"], &[])),
        ("namespaced", consumer("namespaced", &["--mode", "latest"], &wrapper)),
    ];
    let rogue = Command::new(std::env::current_exe().expect("exe"))
        .args([
            "--exact",
            "four_gpu_subscribers_one_in_its_own_namespaces_get_10000_frames_untorn",
            "--include-ignored",
        ])
        .env(ROGUE, &socket)
        .stdout(Stdio::piped())
        .spawn()
        .expect("rogue");
    let t = Instant::now();
    let rogue_out = rogue.wait_with_output().expect("rogue");
    assert!(
        rogue_out.status.success(),
        "the rogue subscriber's write into its read-only mapping was not refused: {}",
        String::from_utf8_lossy(&rogue_out.stdout)
    );
    let p = final_line("producer", producer);
    assert_eq!(p.u64("published"), Some(10_000), "producer: {p:?}");
    for (name, child) in subs {
        let j = untorn_final(name, child);
        assert!(
            j.u64("delivered").unwrap_or(0) > 100,
            "{name} got too few frames: {j:?}"
        );
        if name == "sequential" {
            assert_eq!(j.u64("last_seq"), Some(10_000), "{name}: {j:?}");
        }
    }
    eprintln!("ran in {:?}", t.elapsed());
    // Every process is gone: their pools, imports and push buffers with them.
    std::thread::sleep(Duration::from_millis(500));
    let free_after = common::gpu_free_bytes(&d);
    let diff = free_before.abs_diff(free_after);
    eprintln!("device free memory before {free_before} after {free_after}");
    assert!(diff <= 4 << 20, "device free memory moved by {diff} bytes");
}
