//! What the multi-process benchmarks share to run their children safely,
//! with or without CUDA MPS: this executable started again in a role
//! ([`self_command`], [`role_command`], [`role_args`]), a guard that kills
//! and reaps child processes and waits for them within bounds
//! ([`Children`]), a stop flag for SIGINT and SIGTERM, death of a child
//! with its parent, the `--mps off|on|both` choice and its passes
//! ([`MpsChoice::run_passes`]), and a private MPS control daemon that is
//! always quit.
//!
//! The daemon lives in fresh directories under `/tmp`
//! (`CUDA_MPS_PIPE_DIRECTORY`, `CUDA_MPS_LOG_DIRECTORY`); only processes
//! started with [`MpsDaemon::env`] in their environment become its clients.
//! Nothing here changes a GPU setting (compute mode, clocks, MIG).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The MPS control program, found on `PATH`.
const MPS_CONTROL: &str = "nvidia-cuda-mps-control";
/// The variables an MPS client must share with its control daemon.
pub const MPS_VARS: [&str; 2] = ["CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"];

// ---------------------------------------------------------------- stop flag

#[path = "../../examples/common/stop.rs"]
mod stop;
// Not every program that includes this module calls both.
#[allow(unused_imports)]
pub use stop::{install_stop_handler, stop_requested};

/// Makes the calling (child) process die with SIGKILL when its parent dies,
/// so a killed orchestrator never leaves GPU processes behind. `parent` is
/// the orchestrator's pid, passed on the command line: if it is already
/// gone (the race before `prctl`), the child exits at once.
pub fn die_with_parent(parent: u32) {
    // SAFETY: PR_SET_PDEATHSIG with a valid signal number; no pointers.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        eprintln!("prctl(PR_SET_PDEATHSIG) failed: {}", std::io::Error::last_os_error());
    }
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } as u32 != parent {
        std::process::exit(3);
    }
}

// ---------------------------------------------------------------- children

/// The environment variable that carries the orchestrator's pid to its
/// children (see [`die_with_parent`]).
pub const PARENT_VAR: &str = "VRAMRING_BENCH_PARENT";

/// The flag before a child's role: `<this executable> --role <role> …`.
pub const ROLE_FLAG: &str = "--role";

/// This executable started again with `args`, its stdin closed (a bench's
/// child process; spawn it with [`Children::spawn`] so that it dies with
/// the bench).
///
/// # Errors
/// The executable's path is unknown.
pub fn self_command<I, S>(args: I) -> std::io::Result<Command>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(args).stdin(Stdio::null());
    Ok(cmd)
}

/// [`self_command`] in `role`: `--role <role> <args…>`, which the child
/// finds with [`role_args`].
///
/// # Errors
/// As [`self_command`].
pub fn role_command<I, S>(role: &str, args: I) -> std::io::Result<Command>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = self_command([ROLE_FLAG, role])?;
    cmd.args(args);
    Ok(cmd)
}

/// `bytes` in hex, to pass on a child's command line or environment.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of [`hex`]'s text.
///
/// # Errors
/// Text that is not pairs of hex digits.
pub fn unhex(text: &str) -> Result<Vec<u8>, String> {
    if text.len() % 2 != 0 {
        return Err(format!("{text:?} is not hex bytes"));
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
                .ok_or_else(|| format!("{text:?} is not hex bytes"))
        })
        .collect()
}

/// In `main`: the role and its arguments when this process was started by
/// [`role_command`] (what follows `--role`), after [`child_init`]; `None`
/// in the orchestrator.
pub fn role_args(args: &[String]) -> Option<&[String]> {
    let i = args.iter().position(|a| a == ROLE_FLAG)?;
    child_init();
    Some(&args[i + 1..])
}

/// Child processes of one measurement, each with a name. On drop, every
/// child still running is killed (SIGKILL, by its pid) and reaped.
#[derive(Debug, Default)]
pub struct Children(Vec<(String, Child, Option<ExitStatus>)>);

impl Children {
    /// Spawns `cmd` (with the parent pid in its environment) as `name`.
    ///
    /// # Errors
    /// The spawn's error.
    pub fn spawn(&mut self, name: impl Into<String>, cmd: &mut Command) -> std::io::Result<()> {
        let child = cmd.env(PARENT_VAR, std::process::id().to_string()).spawn()?;
        self.0.push((name.into(), child, None));
        Ok(())
    }

    /// Polls every child; returns the names of those that have failed so far.
    ///
    /// # Errors
    /// `try_wait`'s error.
    pub fn poll(&mut self) -> std::io::Result<(usize, Vec<String>)> {
        let mut running = 0;
        let mut failed = Vec::new();
        for (name, child, status) in &mut self.0 {
            if status.is_none() {
                *status = child.try_wait()?;
            }
            match status {
                None => running += 1,
                Some(st) if !st.success() => failed.push(format!("{name} ({st})")),
                Some(_) => {}
            }
        }
        Ok((running, failed))
    }

    /// Waits until every child has exited, at most until `deadline`; after
    /// a child fails, waits at most `grace` more for the others. Kills what
    /// is left when time is up or a stop signal arrived.
    ///
    /// # Errors
    /// Which children failed, timed out or were stopped.
    pub fn wait_all(&mut self, deadline: Instant, grace: Duration) -> Result<(), String> {
        let mut fail_deadline: Option<Instant> = None;
        loop {
            let (running, failed) = self.poll().map_err(|e| format!("waiting for children: {e}"))?;
            if running == 0 {
                return if failed.is_empty() {
                    Ok(())
                } else {
                    Err(format!("failed: {}", failed.join(", ")))
                };
            }
            if !failed.is_empty() {
                fail_deadline.get_or_insert(Instant::now() + grace);
            }
            let now = Instant::now();
            let why = if stop_requested() {
                Some("stopped by a signal")
            } else if now > deadline {
                Some("timed out")
            } else if fail_deadline.is_some_and(|d| now > d) {
                Some("left running after another child failed")
            } else {
                None
            };
            if let Some(why) = why {
                let killed = self.kill_all();
                return Err(format!(
                    "{why}; killed {}{}",
                    killed.join(", "),
                    if failed.is_empty() {
                        String::new()
                    } else {
                        format!("; failed: {}", failed.join(", "))
                    }
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until `ready()` holds, polling every millisecond, while the
    /// children run: fails with "`who` exited early" when every child has
    /// exited or one failed, and with `late` past `deadline` or on a stop
    /// signal.
    ///
    /// # Errors
    /// Which of these ended the wait.
    pub fn wait_for(
        &mut self,
        mut ready: impl FnMut() -> bool,
        deadline: Instant,
        who: &str,
        late: &str,
    ) -> Result<(), String> {
        while !ready() {
            let (running, failed) = self.poll().map_err(|e| format!("waiting for children: {e}"))?;
            if running == 0 || !failed.is_empty() {
                return Err(format!("{who} exited early: {failed:?}"));
            }
            if Instant::now() > deadline || stop_requested() {
                return Err(late.to_string());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Kills (SIGKILL, by pid) and reaps every child still running; returns
    /// their names.
    pub fn kill_all(&mut self) -> Vec<String> {
        let mut killed = Vec::new();
        for (name, child, status) in &mut self.0 {
            if status.is_none() {
                if let Ok(Some(st)) = child.try_wait() {
                    *status = Some(st);
                    continue;
                }
                let _ = child.kill();
                *status = child.wait().ok();
                killed.push(name.clone());
            }
        }
        killed
    }

    /// Whether any child is still running (its status not yet collected).
    pub fn any_running(&mut self) -> bool {
        self.poll().map_or(true, |(running, _)| running > 0)
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        let killed = self.kill_all();
        if !killed.is_empty() {
            eprintln!("killed child processes left running: {}", killed.join(", "));
        }
    }
}

/// In a child: dies with its orchestrator ([`die_with_parent`]) when
/// [`PARENT_VAR`] names it.
pub fn child_init() {
    if let Some(parent) = std::env::var(PARENT_VAR).ok().and_then(|v| v.parse().ok()) {
        die_with_parent(parent);
    }
    // `RUST_LOG=vramring=debug` (say) logs each child's library events to
    // stderr, for a case that fails or hangs.
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .try_init();
    }
}

// ------------------------------------------------------------------ choice

/// Which of the two configurations a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MpsChoice {
    /// Without MPS (each process its own GPU context, time-sliced).
    Off,
    /// Under a private MPS daemon.
    On,
    /// Without, then with, in one invocation.
    Both,
}

impl MpsChoice {
    /// Reads `--mps [off|on|both]` from `args` (`--mps` alone means `on`);
    /// `Off` without the flag.
    ///
    /// # Errors
    /// A value that is none of the three.
    pub fn from_args(args: &[String]) -> Result<MpsChoice, String> {
        let Some(i) = args.iter().position(|a| a == "--mps" || a.starts_with("--mps=")) else {
            return Ok(MpsChoice::Off);
        };
        let value = match args[i].strip_prefix("--mps=") {
            Some(v) => Some(v.to_string()),
            None => args.get(i + 1).filter(|v| !v.starts_with("--")).cloned(),
        };
        match value.as_deref() {
            None | Some("on") => Ok(MpsChoice::On),
            Some("off") => Ok(MpsChoice::Off),
            Some("both") => Ok(MpsChoice::Both),
            Some(v) => Err(format!("--mps takes off, on or both, not {v:?}")),
        }
    }

    /// The configurations to run, in order: `false` without MPS, `true` with.
    pub fn passes(self) -> &'static [bool] {
        match self {
            MpsChoice::Off => &[false],
            MpsChoice::On => &[true],
            MpsChoice::Both => &[false, true],
        }
    }

    /// Runs `pass` once per configuration, in order, until a stop signal:
    /// without MPS with `None`, under MPS with a daemon of its own, which
    /// is then quit (its client count reported in `report`). A daemon that
    /// did not start skips its pass, the reason in `report`. Returns how
    /// many passes were skipped so.
    pub fn run_passes(self, report: &mut String, mut pass: impl FnMut(Option<&MpsDaemon>, &mut String)) -> usize {
        let mut not_started = 0;
        for &with_mps in self.passes() {
            if stop_requested() {
                break;
            }
            let Ok(mut daemon) = start_pass(with_mps, report) else {
                not_started += 1;
                continue;
            };
            pass(daemon.as_ref(), report);
            if let Some(d) = daemon.as_mut() {
                d.finish_pass(report);
            }
        }
        not_started
    }
}

/// `--mps off|on|both` for a clap command line (no help per value, so the
/// values are listed on one line).
impl clap::ValueEnum for MpsChoice {
    fn value_variants<'a>() -> &'a [Self] {
        &[MpsChoice::Off, MpsChoice::On, MpsChoice::Both]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(match self {
            MpsChoice::Off => "off",
            MpsChoice::On => "on",
            MpsChoice::Both => "both",
        }))
    }
}

/// Sets a child's environment for one configuration: the daemon's variables
/// under MPS, none of them without (so an `CUDA_MPS_PIPE_DIRECTORY` set in
/// the caller's shell cannot turn a "without MPS" pass into an MPS one).
pub fn set_child_env(cmd: &mut Command, mps: Option<&MpsDaemon>) {
    match mps {
        Some(d) => {
            for (k, v) in d.env() {
                cmd.env(k, v);
            }
        }
        None => {
            for k in MPS_VARS {
                cmd.env_remove(k);
            }
        }
    }
}

// ------------------------------------------------------------------ daemon

/// A private MPS control daemon, quit by [`MpsDaemon::quit`] or on drop
/// (panics and early returns included). A process killed with SIGKILL cannot
/// run `Drop`: the orchestrators catch SIGINT/SIGTERM and bound every wait,
/// so the daemon outlives them only if they are SIGKILLed.
#[derive(Debug)]
pub struct MpsDaemon {
    root: PathBuf,
    pipe: PathBuf,
    log: PathBuf,
    running: bool,
}

/// Starts the daemon a pass needs: `Ok(None)` for a pass without MPS,
/// `Err(())` when the daemon did not start (the "not run" line is then in
/// `report` and on stderr).
fn start_pass(with_mps: bool, report: &mut String) -> Result<Option<MpsDaemon>, ()> {
    if !with_mps {
        return Ok(None);
    }
    match MpsDaemon::start() {
        Ok(d) => Ok(Some(d)),
        Err(e) => {
            let line = format!("\n### MPS on\n\nnot run: the MPS control daemon did not start: {e}\n");
            eprint!("{line}");
            report.push_str(&line);
            Err(())
        }
    }
}

impl MpsDaemon {
    /// Starts `nvidia-cuda-mps-control -d` with its pipe and log directories
    /// in a fresh directory under `/tmp`, and waits for its control socket.
    ///
    /// # Errors
    /// The program is missing, fails, or its control socket does not appear
    /// within 20 s (the daemon is then quit before returning).
    pub fn start() -> Result<MpsDaemon, String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let root = PathBuf::from(format!("/tmp/vramring-mps-{}-{nanos}", std::process::id()));
        let (pipe, log) = (root.join("pipe"), root.join("log"));
        std::fs::create_dir(&root).map_err(|e| format!("creating {}: {e}", root.display()))?;
        // From here on, dropping `daemon` removes the directories (and quits
        // the daemon once it may be running).
        let mut daemon = MpsDaemon {
            root,
            pipe,
            log,
            running: false,
        };
        for d in [&daemon.pipe, &daemon.log] {
            std::fs::create_dir(d).map_err(|e| format!("creating {}: {e}", d.display()))?;
        }
        // The daemon forks and may keep the descriptors it inherited: give
        // it a file, not a pipe whose end-of-file would never come.
        let start_log = daemon.root.join("start.log");
        let out_file = std::fs::File::create(&start_log).map_err(|e| format!("{}: {e}", start_log.display()))?;
        let err_file = out_file
            .try_clone()
            .map_err(|e| format!("{}: {e}", start_log.display()))?;
        let mut cmd = Command::new(MPS_CONTROL);
        cmd.arg("-d").stdin(Stdio::null()).stdout(out_file).stderr(err_file);
        set_child_env(&mut cmd, Some(&daemon));
        let child = cmd.spawn().map_err(|e| {
            format!("starting {MPS_CONTROL} -d: {e} (is the NVIDIA driver's MPS control program on PATH?)")
        })?;
        // From here on the daemon may be running: `daemon` quits it on drop.
        daemon.running = true;
        let out = wait_output(child, Duration::from_secs(20)).map_err(|e| format!("{MPS_CONTROL} -d: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{MPS_CONTROL} -d exited with {}: {}; control.log: {}",
                out.status,
                std::fs::read_to_string(&start_log).unwrap_or_default().trim(),
                daemon.log_tail(10)
            ));
        }
        let control = daemon.pipe.join("control");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !control.exists() {
            if Instant::now() > deadline {
                return Err(format!(
                    "the MPS control socket {} did not appear within 20 s; control.log: {}",
                    control.display(),
                    daemon.log_tail(10)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(daemon)
    }

    /// The variables that make a process a client of this daemon.
    pub fn env(&self) -> [(&'static str, &Path); 2] {
        [(MPS_VARS[0], &self.pipe), (MPS_VARS[1], &self.log)]
    }

    /// Sends one command to the control daemon and returns its answer.
    ///
    /// # Errors
    /// The program fails or takes longer than `timeout`.
    pub fn command(&self, what: &str, timeout: Duration) -> Result<String, String> {
        let mut cmd = Command::new(MPS_CONTROL);
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        set_child_env(&mut cmd, Some(self));
        let mut child = cmd.spawn().map_err(|e| format!("{MPS_CONTROL}: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            // A closed pipe shows up below as a failed command.
            let _ = writeln!(stdin, "{what}");
        }
        let out = wait_output(child, timeout).map_err(|e| format!("{MPS_CONTROL} <<< {what}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{MPS_CONTROL} <<< {what}: exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// PIDs of the MPS servers this daemon runs now (`get_server_list`):
    /// non-empty while a client is connected, which proves that the clients
    /// really run under MPS.
    ///
    /// # Errors
    /// As [`MpsDaemon::command`].
    pub fn server_list(&self) -> Result<Vec<u32>, String> {
        let text = self.command("get_server_list", Duration::from_secs(10))?;
        Ok(text.split_whitespace().filter_map(|w| w.parse().ok()).collect())
    }

    /// How many client connections the daemon's `control.log` records
    /// ("NEW CLIENT" lines): 0 after a pass means the processes did not run
    /// under MPS.
    pub fn clients_seen(&self) -> usize {
        std::fs::read_to_string(self.log.join("control.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("NEW CLIENT"))
            .count()
    }

    /// The last `n` lines of the daemon's `control.log`, on one line.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.log.join("control.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join(" | ")
    }

    /// Ends a pass: reports (in `report` and on stderr) how many clients
    /// the daemon logged, flagging none as a pass that did not run under
    /// MPS, then quits the daemon.
    pub fn finish_pass(&mut self, report: &mut String) {
        let clients = self.clients_seen();
        let line = format!(
            "\nMPS control daemon: {clients} client connections logged{}\n",
            if clients == 0 {
                " — **the processes did NOT run under MPS**"
            } else {
                ""
            }
        );
        eprint!("{line}");
        report.push_str(&line);
        if let Err(e) = self.quit() {
            report.push_str(&format!("MPS daemon shutdown: {e}\n"));
        }
    }

    /// Quits the daemon (`echo quit | nvidia-cuda-mps-control`, same
    /// environment), waits for its processes to exit, and removes its
    /// directories. If `quit` fails or hangs, the daemon's own processes
    /// (found by their `CUDA_MPS_PIPE_DIRECTORY` and program name, by pid)
    /// get SIGTERM, then SIGKILL. Idempotent.
    ///
    /// # Errors
    /// What went wrong; the daemon's processes have been signalled anyway.
    pub fn quit(&mut self) -> Result<(), String> {
        if !self.running {
            // Never started (or already quit): only the directories are left.
            return match std::fs::remove_dir_all(&self.root) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(format!("removing {}: {e}", self.root.display()))
                }
                _ => Ok(()),
            };
        }
        let mut problems = Vec::new();
        if let Err(e) = self.command("quit", Duration::from_secs(30)) {
            problems.push(e);
        }
        // `quit` returns before the daemon has exited; wait for it.
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut left = self.own_processes();
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            left = self.own_processes();
        }
        if !left.is_empty() {
            problems.push(format!(
                "MPS processes still running after quit: {left:?}; terminating them"
            ));
            for signal in [libc::SIGTERM, libc::SIGKILL] {
                for &pid in &left {
                    // SAFETY: kill(2) with a pid we found running with our
                    // own private pipe directory and an MPS program name.
                    unsafe { libc::kill(pid as libc::pid_t, signal) };
                }
                std::thread::sleep(Duration::from_secs(2));
                left = self.own_processes();
                if left.is_empty() {
                    break;
                }
            }
            if !left.is_empty() {
                problems.push(format!("MPS processes {left:?} survived SIGKILL"));
            }
        }
        self.running = false;
        if let Err(e) = std::fs::remove_dir_all(&self.root) {
            problems.push(format!("removing {}: {e}", self.root.display()));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// PIDs of the MPS control daemon and servers whose environment holds
    /// this daemon's pipe directory (our benchmark processes hold it too, so
    /// the program name must also be an MPS one).
    fn own_processes(&self) -> Vec<u32> {
        let mut needle = format!("{}=", MPS_VARS[0]).into_bytes();
        needle.extend_from_slice(self.pipe.as_os_str().as_encoded_bytes());
        needle.push(0);
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            if !comm.starts_with("nvidia-cuda-mps") {
                continue;
            }
            let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
                continue;
            };
            if environ.windows(needle.len()).any(|w| w == needle.as_slice()) {
                found.push(pid);
            }
        }
        found
    }
}

impl Drop for MpsDaemon {
    fn drop(&mut self) {
        if let Err(e) = self.quit() {
            eprintln!("MPS daemon shutdown: {e}");
        }
    }
}

/// Waits for `child` and collects its output, killing it (by its pid) past
/// `timeout`.
fn wait_output(mut child: std::process::Child, timeout: Duration) -> Result<std::process::Output, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().map_err(|e| e.to_string()),
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {} s (killed)", timeout.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_role_command_is_this_executable_with_the_role_first() {
        let cmd = role_command("producer", ["a", "b"]).unwrap();
        assert_eq!(cmd.get_program(), std::env::current_exe().unwrap().as_os_str());
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args, ["--role", "producer", "a", "b"]);
        let argv = strings(&["--quick", "--role", "producer", "a"]);
        assert_eq!(role_args(&argv), Some(&argv[2..]));
        assert_eq!(role_args(&strings(&["--quick"])), None);
    }

    #[test]
    fn a_child_started_and_waited_for() {
        let mut children = Children::default();
        children
            .spawn("true", Command::new("true").stdin(Stdio::null()))
            .unwrap();
        children
            .wait_all(Instant::now() + Duration::from_secs(20), Duration::ZERO)
            .unwrap();
        let mut children = Children::default();
        children.spawn("false", &mut Command::new("false")).unwrap();
        let err = children
            .wait_for(|| false, Instant::now() + Duration::from_secs(20), "false", "late")
            .unwrap_err();
        assert!(err.starts_with("false exited early"), "{err}");
    }

    #[test]
    fn bytes_travel_as_hex() {
        let b = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex(&b), "0001abff");
        assert_eq!(unhex("0001abff").unwrap(), b);
        assert!(unhex("0g").is_err() && unhex("abc").is_err());
    }

    #[test]
    fn the_mps_choice_from_flags_and_clap() {
        use clap::ValueEnum as _;
        assert_eq!(MpsChoice::from_args(&strings(&["--quick"])), Ok(MpsChoice::Off));
        assert_eq!(MpsChoice::from_args(&strings(&["--mps"])), Ok(MpsChoice::On));
        assert_eq!(MpsChoice::from_args(&strings(&["--mps", "both"])), Ok(MpsChoice::Both));
        assert_eq!(MpsChoice::from_args(&strings(&["--mps=off"])), Ok(MpsChoice::Off));
        assert!(MpsChoice::from_args(&strings(&["--mps", "x"])).is_err());
        assert_eq!(MpsChoice::from_str("both", false), Ok(MpsChoice::Both));
        // Without MPS: one pass, no daemon, nothing reported.
        let mut report = String::new();
        let mut passes = 0;
        assert_eq!(
            MpsChoice::Off.run_passes(&mut report, |d, _| passes += usize::from(d.is_none())),
            0
        );
        assert_eq!((passes, report.as_str()), (1, ""));
    }
}
