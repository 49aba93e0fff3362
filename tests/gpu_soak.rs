//! Soak and kill run on the GPU: a CUDA producer at 1080p and 8 reconnecting
//! subscribers (push, pull latest, sequential) for `VRAMRING_SOAK_SECS`
//! (default 60 s; the recorded soak runs 600 s), while a subscriber is SIGKILLed and replaced every ~2 s
//! and the producer is SIGKILLed (or stopped in order) and restarted every
//! 15–35 s. Every frame is written and checked on the GPU; afterwards device
//! free memory and this process's descriptors are back where they started.
//! Needs a CUDA GPU.

use vramring_testkit::procs as common;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{example, ChildProc, TempDir};
use vramring::seam::cuda::RealDriver;
use vramring_testkit::json::JsonLine;

/// xorshift64*: the run's random decisions, replayable from the printed seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// The subscribers: name and extra consumer flags.
const SUBS: [(&str, &[&str]); 8] = [
    ("push-0", &["--mode", "latest", "--push"]),
    ("push-1", &["--mode", "latest", "--push"]),
    ("push-2", &["--mode", "latest", "--push"]),
    ("pull-0", &["--mode", "latest"]),
    ("pull-1", &["--mode", "latest"]),
    ("pull-2", &["--mode", "latest"]),
    ("seq-0", &["--mode", "sequential"]),
    ("seq-1", &["--mode", "sequential"]),
];

#[test]
#[ignore = "needs a CUDA GPU"]
fn eight_subscribers_survive_kills_and_producer_restarts_untorn_with_flat_vram() {
    let secs: u64 = std::env::var("VRAMRING_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let seed = std::env::var("VRAMRING_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| vramring::monotonic_ns() | 1);
    eprintln!("soak: {secs} s, seed {seed}");
    let mut rng = Rng(seed);
    // VRAMRING_SOAK_BACKEND=host runs the same churn on host memory (to try
    // the harness without a GPU); the device-memory checks need CUDA.
    let backend = std::env::var("VRAMRING_SOAK_BACKEND").unwrap_or_else(|_| "cuda".into());
    let d = (backend == "cuda").then(|| RealDriver::shared().expect("a CUDA driver"));
    let free = |d: &Option<Arc<RealDriver>>| d.as_ref().map_or(0, common::gpu_free_bytes);
    let (free_before, fds_before) = (free(&d), fd_count());
    let dir = TempDir::new("gpu-soak");
    let socket = dir.join("cam.sock").display().to_string();
    let mut generation = 0u32;
    let spawn_producer = |generation: &mut u32| {
        *generation += 1;
        let mut cmd = Command::new(example("producer"));
        cmd.args([
            "--socket",
            &socket,
            "--backend",
            &backend,
            "--width",
            "1920",
            "--height",
            "1080",
        ])
        .args([
            "--slots",
            "16",
            "--fps",
            "120",
            "--frames",
            "0",
            "--json",
            "--report-ms",
            "0",
        ]);
        common::spawn(&dir, &format!("producer-{generation}"), cmd)
    };
    let spawn_sub = |name: &str, extra: &[&str], n: u32| {
        let mut cmd = Command::new(example("consumer"));
        cmd.args([
            "--socket",
            &socket,
            "--name",
            name,
            "--reconnect",
            "--json",
            "--report-ms",
            "1000",
        ])
        .args(["--timeout-ms", "10000"])
        .args(extra);
        common::spawn(&dir, &format!("{name}-{n}"), cmd)
    };
    let mut producer = spawn_producer(&mut generation);
    std::thread::sleep(Duration::from_millis(500));
    let mut subs: Vec<(usize, u32, ChildProc)> = SUBS
        .iter()
        .enumerate()
        .map(|(i, (name, extra))| (i, 0, spawn_sub(name, extra, 0)))
        .collect();
    let mut dead: Vec<ChildProc> = Vec::new();
    let (mut sub_kills, mut producer_kills, mut producer_stops) = (0u64, 0u64, 0u64);
    let mut free_samples = Vec::new();
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut next_producer_event = start + Duration::from_secs(15 + rng.below(20));
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1500 + rng.below(1000)));
        // A random subscriber dies and is replaced.
        let k = rng.below(subs.len() as u64) as usize;
        let (i, n, mut victim) = subs.remove(k);
        victim.kill9();
        sub_kills += 1;
        dead.push(victim);
        let (name, extra) = SUBS[i];
        subs.push((i, n + 1, spawn_sub(name, extra, n + 1)));
        if Instant::now() >= next_producer_event {
            if rng.below(10) < 7 {
                producer.kill9();
                producer_kills += 1;
            } else {
                producer.interrupt();
                let deadline = Instant::now() + Duration::from_secs(10);
                while producer.try_wait().is_none() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                assert!(producer.try_wait().is_some(), "an interrupted producer did not stop");
                producer_stops += 1;
            }
            dead.push(producer);
            producer = spawn_producer(&mut generation);
            next_producer_event = Instant::now() + Duration::from_secs(15 + rng.below(20));
        }
        if free_samples.len() < 1000 && rng.below(5) == 0 {
            free_samples.push(free(&d));
        }
    }
    // Let the last producer run a while, so every subscriber can show it
    // reconnected, then stop everyone in order.
    std::thread::sleep(Duration::from_secs(5));
    for (_, _, s) in &subs {
        s.interrupt();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for (_, _, s) in &mut subs {
        s.wait_success(deadline);
    }
    producer.interrupt();
    producer.wait_success(Instant::now() + Duration::from_secs(10));
    // Every log (killed processes' too): no torn frame, ever.
    let (mut delivered, mut torn) = (0u64, 0u64);
    for p in dead
        .iter()
        .chain(subs.iter().map(|(_, _, s)| s))
        .chain(std::iter::once(&producer))
    {
        let out = p.output();
        assert!(!out.contains("TORN"), "{} saw a torn frame:\n{out}", p.name);
        let last = out
            .lines()
            .rev()
            .filter_map(JsonLine::parse)
            .find(|j| j.get("role") == Some("consumer"));
        if let Some(j) = last {
            delivered += j.u64("delivered").unwrap_or(0);
            torn += j.u64("torn").unwrap_or(0);
        }
    }
    for (_, _, s) in &subs {
        let out = s.output();
        let j = out
            .lines()
            .rev()
            .filter_map(JsonLine::parse)
            .find(|j| j.get("event") == Some("final"))
            .unwrap_or_else(|| panic!("{} wrote no final report:\n{out}", s.name));
        assert!(
            j.u64("delivered").unwrap_or(0) > 0,
            "{} received nothing: {j:?}",
            s.name
        );
    }
    drop(subs);
    drop(dead);
    drop(producer);
    std::thread::sleep(Duration::from_millis(500));
    let (free_after, fds_after) = (free(&d), fd_count());
    let (lo, hi) = (free_samples.iter().min().copied(), free_samples.iter().max().copied());
    eprintln!(
        "soak: {:?}, {} producers ({producer_kills} SIGKILLed, {producer_stops} stopped), {sub_kills} subscribers SIGKILLed, \
         {delivered} frames verified in the subscribers' last reports, torn {torn}; device free before {free_before} after {free_after}, \
         during min {lo:?} max {hi:?} ({} samples); fds {fds_before} -> {fds_after}",
        start.elapsed(),
        generation,
        free_samples.len()
    );
    assert_eq!(torn, 0);
    assert!(
        free_before.abs_diff(free_after) <= 4 << 20,
        "device memory moved by {} bytes",
        free_before.abs_diff(free_after)
    );
    assert!(
        fds_after <= fds_before + 2,
        "descriptors leaked: {fds_before} -> {fds_after}"
    );
    if secs >= 600 {
        assert!(
            sub_kills + producer_kills >= 200,
            "only {} kills",
            sub_kills + producer_kills
        );
    }
}
