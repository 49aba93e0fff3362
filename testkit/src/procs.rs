//! Helpers of the multi-process tests: re-executing the test binary itself
//! as a child process in a named role, a subscriber role that verifies every
//! frame and writes what it saw to a result file, and temporary directories.
//!
//! A test binary that spawns children defines
//!
//! ```ignore
//! #[test]
//! fn child_process_entry() {
//!     common::run_child_role();
//! }
//! ```
//!
//! which does nothing in a normal run; a child is the same binary started
//! with `--exact child_process_entry` and `VRAMRING_TEST_ROLE` set.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use vramring::monotonic_ns;
use vramring::ClientOptions;
use vramring::{Error, Mode, Subscriber, SubscriberOptions};

use crate::pattern as testpattern;

/// Environment variable that selects a child's role.
pub const ROLE: &str = "VRAMRING_TEST_ROLE";

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory named after the test and this process.
    pub fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("vramring-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("creating a temp dir");
        TempDir(p)
    }
    /// A path inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A socket path in a fresh [`TempDir`] of its own, both removed on drop:
/// the library never unlinks the `.lock` file beside a socket, so a socket
/// straight in the temp dir would leave it behind.
pub struct SocketPath {
    path: PathBuf,
    _dir: TempDir,
}

impl SocketPath {
    /// `<temp>/vramring-test-<pid>-<name>/ring.sock`.
    pub fn new(name: &str) -> SocketPath {
        let dir = TempDir::new(name);
        SocketPath {
            path: dir.join("ring.sock"),
            _dir: dir,
        }
    }
}

impl std::ops::Deref for SocketPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for SocketPath {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

/// A child process, killed (by its own pid) if the test ends first.
pub struct ChildProc {
    pub name: String,
    child: Child,
    log: PathBuf,
    status: Option<ExitStatus>,
}

impl ChildProc {
    /// The exit status, if it exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().expect("try_wait on a child");
        }
        self.status
    }
    /// Waits until `deadline`; panics with the child's output if it runs
    /// longer or exits unsuccessfully.
    pub fn wait_success(&mut self, deadline: Instant) {
        while self.try_wait().is_none() {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "child {} still running at its deadline; output:\n{}",
                    self.name,
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let status = self.status.expect("exited");
        assert!(
            status.success(),
            "child {} failed with {status}; output:\n{}",
            self.name,
            self.output()
        );
    }
    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }
    /// What the child printed (stdout and stderr).
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    /// The file the child's stdout and stderr go to.
    pub fn log_path(&self) -> &Path {
        &self.log
    }
    /// Sends SIGKILL (unless the child already exited) and reaps it; returns
    /// its exit status, which says whether the signal or an earlier exit
    /// ended it.
    pub fn kill9(&mut self) -> ExitStatus {
        if self.try_wait().is_none() {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_child(&self.child),
                rustix::process::Signal::KILL,
            );
            self.status = Some(self.child.wait().expect("waitpid on a killed child"));
        }
        self.status.expect("reaped")
    }
    /// Sends SIGINT.
    pub fn interrupt(&self) {
        if self.status.is_none() {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_child(&self.child),
                rustix::process::Signal::INT,
            );
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        if self.try_wait().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Spawns `program args`, with stdout and stderr going to `<dir>/<name>.log`.
pub fn spawn(dir: &TempDir, name: &str, mut cmd: Command) -> ChildProc {
    let log = dir.join(&format!("{name}.log"));
    let out = File::create(&log).expect("creating a child log");
    let err = out.try_clone().expect("dup of a child log");
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    let child = cmd.spawn().unwrap_or_else(|e| panic!("spawning {name} ({cmd:?}): {e}"));
    ChildProc {
        name: name.into(),
        child,
        log,
        status: None,
    }
}

/// The command that re-runs this test binary as a child in `role`,
/// optionally under a wrapper (e.g. `unshare ... --`).
pub fn self_command(wrapper: &[&str], role: &str, env: &[(&str, String)]) -> Command {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.args(["--exact", "child_process_entry", "--nocapture", "--test-threads=1"]);
    cmd.env(ROLE, role);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs the role named by `VRAMRING_TEST_ROLE`, if any.
pub fn run_child_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "subscriber" => subscriber_role(),
        other => panic!("unknown child role {other:?}"),
    }
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("child needs {k}"))
}

/// What a subscriber child is told.
#[derive(Debug, Clone)]
pub struct SubSpec {
    /// Name (and result file stem).
    pub name: String,
    /// `latest`, `sequential` or `lossless`.
    pub mode: String,
    /// Artificial work per frame.
    pub delay_us: u64,
    /// Stop after the frame with this seq (0: until the producer is gone).
    pub until_seq: u64,
}

impl SubSpec {
    /// A subscriber spec.
    pub fn new(name: &str, mode: &str, delay_us: u64, until_seq: u64) -> SubSpec {
        SubSpec {
            name: name.into(),
            mode: mode.into(),
            delay_us,
            until_seq,
        }
    }

    /// The environment of a subscriber child reading from `socket` and
    /// writing its result to `result`.
    pub fn env(&self, socket: &Path, result: &Path) -> Vec<(&'static str, String)> {
        vec![
            ("VRAMRING_SOCK", socket.display().to_string()),
            ("VRAMRING_NAME", self.name.clone()),
            ("VRAMRING_MODE", self.mode.clone()),
            ("VRAMRING_DELAY_US", self.delay_us.to_string()),
            ("VRAMRING_UNTIL_SEQ", self.until_seq.to_string()),
            ("VRAMRING_RESULT", result.display().to_string()),
        ]
    }
}

fn ns_link(kind: &str) -> String {
    std::fs::read_link(format!("/proc/self/ns/{kind}"))
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

/// The namespace identity of this process, e.g. `ipc:[4026531839]`.
pub fn own_namespace(kind: &str) -> String {
    ns_link(kind)
}

/// A subscriber process: connect, verify every frame against the test
/// pattern, note every seq and latency, write the result file.
fn subscriber_role() {
    let socket = PathBuf::from(env("VRAMRING_SOCK"));
    let name = env("VRAMRING_NAME");
    let mode = env("VRAMRING_MODE");
    let delay = Duration::from_micros(env("VRAMRING_DELAY_US").parse().expect("delay"));
    let until: u64 = env("VRAMRING_UNTIL_SEQ").parse().expect("until");
    let result = PathBuf::from(env("VRAMRING_RESULT"));
    let mut opts = SubscriberOptions::default().name(name.clone());
    opts = match mode.as_str() {
        "latest" => opts.mode(Mode::Latest),
        "sequential" => opts.mode(Mode::Sequential),
        "lossless" => opts.lossless(true),
        other => panic!("unknown mode {other}"),
    };
    let mut sub = Subscriber::connect(&socket, opts).unwrap_or_else(|e| panic!("{name}: connect: {e}"));
    // Connected, with its start cursor set: the parent may publish now.
    std::fs::write(ready_path(&result), b"").expect("writing the ready file");
    let mut seqs = Vec::new();
    let mut lat = Vec::new();
    let mut torn = Vec::new();
    let end;
    loop {
        let frame = match sub.next(Duration::from_secs(30)) {
            Ok(f) => f,
            Err(Error::ProducerGone { .. }) => {
                end = "producer-gone";
                break;
            }
            Err(e) => panic!("{name}: next after {} frames: {e}", seqs.len()),
        };
        lat.push(monotonic_ns().saturating_sub(frame.commit_ns()));
        let seq = frame.seq();
        let bytes = frame.host_bytes().expect("host backend");
        if let Err(e) = testpattern::verify(bytes, seq) {
            torn.push(format!("{seq}:{e}"));
        }
        seqs.push(seq);
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        if until > 0 && seq >= until {
            end = "until-seq";
            break;
        }
    }
    let st = sub.stats();
    let mut out = String::new();
    let _ = writeln!(out, "name {name}");
    let _ = writeln!(out, "pid {}", std::process::id());
    for kind in ["pid", "ipc", "mnt"] {
        let _ = writeln!(out, "ns_{kind} {}", ns_link(kind));
    }
    let _ = writeln!(out, "delivered {}", st.delivered);
    let _ = writeln!(out, "dropped {}", st.dropped);
    let _ = writeln!(out, "overruns {}", st.overruns);
    let _ = writeln!(out, "torn {}", torn.len());
    let _ = writeln!(out, "end {end}");
    let _ = writeln!(
        out,
        "torn_detail {}",
        torn.iter().take(5).cloned().collect::<Vec<_>>().join(" ")
    );
    let _ = writeln!(
        out,
        "seqs {}",
        seqs.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")
    );
    let _ = writeln!(
        out,
        "lat_ns {}",
        lat.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")
    );
    let tmp = result.with_extension("tmp");
    std::fs::write(&tmp, out).expect("writing the result");
    std::fs::rename(&tmp, &result).expect("publishing the result");
    let _ = sub.close();
}

/// The file a subscriber child creates once `Subscriber::connect` returned
/// (its start cursor is then fixed), next to its result file.
pub fn ready_path(result: &Path) -> PathBuf {
    result.with_extension("ready")
}

/// Waits until every child whose result file is in `results` is connected;
/// panics with a child's output if it exits first or `timeout` passes.
pub fn wait_connected(children: &mut [ChildProc], results: &[PathBuf], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !results.iter().all(|r| ready_path(r).exists()) {
        for c in children.iter_mut() {
            if let Some(status) = c.try_wait() {
                panic!(
                    "child {} exited ({status}) before it connected:\n{}",
                    c.name,
                    c.output()
                );
            }
        }
        assert!(Instant::now() < deadline, "children did not connect within {timeout:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A subscriber child's result file, parsed.
#[derive(Debug, Clone, Default)]
pub struct SubResult {
    pub fields: BTreeMap<String, String>,
    pub seqs: Vec<u64>,
    pub lat_ns: Vec<u64>,
}

impl SubResult {
    /// Reads `path`.
    pub fn read(path: &Path) -> SubResult {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let mut r = SubResult::default();
        for line in text.lines() {
            let (k, v) = line.split_once(' ').unwrap_or((line, ""));
            let nums = || {
                v.split_whitespace()
                    .map(|n| n.parse::<u64>().expect("number"))
                    .collect()
            };
            match k {
                "seqs" => r.seqs = nums(),
                "lat_ns" => r.lat_ns = nums(),
                _ => {
                    r.fields.insert(k.to_owned(), v.to_owned());
                }
            }
        }
        r
    }
    /// A field as text.
    pub fn get(&self, k: &str) -> &str {
        self.fields.get(k).map_or("", String::as_str)
    }
    /// A field as a number.
    pub fn num(&self, k: &str) -> u64 {
        self.get(k)
            .parse()
            .unwrap_or_else(|_| panic!("field {k} = {:?} is not a number", self.get(k)))
    }
    /// Checks the gap accounting of a reader whose `connect` returned before
    /// the first frame was published (see [`wait_connected`]): seqs strictly increase and every seq never delivered before
    /// the last delivered one is counted in `dropped`, exactly.
    pub fn assert_gaps_exactly_counted(&self) {
        let name = self.get("name");
        assert!(!self.seqs.is_empty(), "{name} received nothing");
        for w in self.seqs.windows(2) {
            assert!(w[1] > w[0], "{name}: seq {} after {}", w[1], w[0]);
        }
        let mut gaps = self.seqs[0] - 1;
        for w in self.seqs.windows(2) {
            gaps += w[1] - w[0] - 1;
        }
        assert_eq!(
            gaps,
            self.num("dropped"),
            "{name}: gaps between delivered seqs vs stats().dropped"
        );
        assert_eq!(self.seqs.len() as u64, self.num("delivered"), "{name}: delivered count");
    }
    /// (p50, p99, max) of the latencies, in microseconds.
    pub fn latency_us(&self) -> (f64, f64, f64) {
        let mut v = self.lat_ns.clone();
        v.sort_unstable();
        let pick = |p: f64| {
            if v.is_empty() {
                return 0.0;
            }
            let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
            v[rank.clamp(1, v.len()) - 1] as f64 / 1000.0
        };
        (pick(50.0), pick(99.0), pick(100.0))
    }
}

/// Waits until `cond` holds or `timeout` passes; returns whether it held.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    cond()
}

/// An example binary built next to this test (`target/<profile>/examples/`,
/// or `.device/examples/` when staged for a GPU machine).
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "example binary {} is missing: run `cargo test` (which builds the examples) or `cargo build --examples` first",
        path.display()
    );
    path
}

/// Free device memory on GPU 0 (`cuMemGetInfo`), read in this process's
/// primary context, which is retained and released around the call.
pub fn gpu_free_bytes(d: &std::sync::Arc<vramring::seam::cuda::RealDriver>) -> u64 {
    use vramring::seam::cuda::{ContextGuard, Driver};
    let dev = d.device_get(0).expect("device 0");
    let ctx = d.primary_ctx_retain(dev).expect("primary context");
    // SAFETY: `ctx` is retained above and released below.
    let g = unsafe { ContextGuard::push(&**d, ctx) }.expect("push");
    let (free, _) = d.mem_get_info().expect("cuMemGetInfo");
    g.restore().expect("restore");
    d.primary_ctx_release(dev).expect("release");
    free
}
