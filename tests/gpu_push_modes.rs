//! Push delivery for every read mode on the GPU, across processes: a CUDA
//! lossless producer at 1 000 fps with a lossless push reader (every frame
//! after its start, none dropped), a sequential push reader and a pull
//! reader, every frame checked on the GPU; and a CUDA ring's default pull
//! access: a subscriber of another uid is refused the pool and served by
//! push without asking. Device memory returns to where it started. Needs a
//! CUDA GPU (and root with `setpriv` for the other uid).

use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use vramring_testkit::finals::{final_line, untorn_final};
use vramring_testkit::procs::{example, gpu_free_bytes, TempDir};

use vramring::seam::cuda::RealDriver;

/// A CUDA 1080p producer of `frames` frames at 1 000 fps on `socket`,
/// waiting for `subs` subscribers, with `extra` arguments.
fn producer(socket: &str, frames: u64, subs: u32, extra: &[&str]) -> Child {
    Command::new(example("producer"))
        .args([
            "--socket",
            socket,
            "--backend",
            "cuda",
            "--width",
            "1920",
            "--height",
            "1080",
        ])
        .args(["--slots", "16", "--fps", "1000", "--json", "--report-ms", "0"])
        .args(["--frames", &frames.to_string(), "--wait-subscribers", &subs.to_string()])
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("producer")
}

/// A consumer on `socket`, run as `as_user` (a `setpriv` prefix) when
/// given, checking every frame on the GPU.
fn consumer(socket: &str, name: &str, extra: &[&str], as_user: &[&str]) -> Child {
    let mut cmd = match as_user.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(example("consumer"));
            c
        }
        None => Command::new(example("consumer")),
    };
    cmd.args([
        "--socket",
        socket,
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
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn lossless_and_sequential_push_readers_get_every_frame_whole_on_the_gpu() {
    let d = RealDriver::shared().expect("a CUDA driver");
    let free_before = gpu_free_bytes(&d);
    let dir = TempDir::new("gpu-push-modes");
    let socket = dir.join("cam.sock").display().to_string();
    let frames = 5000;
    let p = producer(&socket, frames, 3, &["--policy", "lossless"]);
    let lossless = consumer(
        &socket,
        "lossless-push",
        &["--lossless", "--push", "--push-buffers", "4"],
        &[],
    );
    let sequential = consumer(&socket, "sequential-push", &["--mode", "sequential", "--push"], &[]);
    let pull = consumer(&socket, "lossless-pull", &["--lossless", "--delivery", "pull"], &[]);
    let pj = final_line("producer", p);
    assert_eq!(pj.u64("published"), Some(frames), "{pj:?}");
    assert_eq!(pj.u64("evictions"), Some(0), "{pj:?}");
    let l = untorn_final("lossless-push", lossless);
    assert_eq!(l.get("delivery"), Some("push"), "{l:?}");
    assert_eq!(
        l.u64("dropped"),
        Some(0),
        "a lossless push reader misses nothing: {l:?}"
    );
    assert_eq!(l.u64("last_seq"), Some(frames), "{l:?}");
    assert_eq!(l.u64("pushed"), l.u64("delivered"), "{l:?}");
    assert_eq!(
        l.u64("delivered").unwrap() + l.u64("first_seq").unwrap() - 1,
        frames,
        "every frame from its first on: {l:?}"
    );
    let s = untorn_final("sequential-push", sequential);
    assert_eq!(s.get("delivery"), Some("push"), "{s:?}");
    assert!(s.u64("delivered").unwrap() > 100, "{s:?}");
    let q = untorn_final("lossless-pull", pull);
    assert_eq!(q.get("delivery"), Some("pull"), "{q:?}");
    assert_eq!(q.u64("dropped"), Some(0), "{q:?}");
    std::thread::sleep(Duration::from_millis(500));
    let free_after = gpu_free_bytes(&d);
    let diff = free_before.abs_diff(free_after);
    eprintln!("device free memory before {free_before} after {free_after}");
    assert!(diff <= 4 << 20, "device free memory moved by {diff} bytes");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_cuda_ring_hands_its_pool_to_no_other_uid_by_default_and_serves_it_by_push() {
    let setpriv = [
        "/usr/bin/setpriv",
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
    ];
    assert!(
        std::path::Path::new(setpriv[0]).exists(),
        "needs setpriv (util-linux) to run a subscriber as another uid"
    );
    let dir = TempDir::new("gpu-default-pull");
    std::fs::set_permissions(dir.join(""), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let socket = dir.join("cam.sock").display().to_string();
    let p = producer(&socket, 2000, 2, &["--socket-mode", "666"]);
    // The other uid asks for pull only: refused, nothing handed out.
    let refused = consumer(&socket, "other-pull", &["--delivery", "pull"], &setpriv);
    let out = refused.wait_with_output().expect("other-pull");
    assert!(!out.status.success(), "another uid was handed a CUDA pool");
    // The other uid with the default options: served by push, in its mode.
    let other = consumer(&socket, "other-auto", &["--mode", "sequential"], &setpriv);
    let own = consumer(&socket, "own-auto", &["--mode", "sequential"], &[]);
    let pj = final_line("producer", p);
    assert_eq!(pj.u64("published"), Some(2000), "{pj:?}");
    let o = untorn_final("other-auto", other);
    assert_eq!(o.get("delivery"), Some("push"), "{o:?}");
    assert!(o.u64("delivered").unwrap() > 100, "{o:?}");
    let m = untorn_final("own-auto", own);
    assert_eq!(m.get("delivery"), Some("pull"), "the publisher's own uid pulls: {m:?}");
}
