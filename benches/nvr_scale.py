"""NVR scale: how many 25 fps 1080p cameras one GPU carries through the
whole NVR pipeline, with frames in GPU memory (vramring's CUDA rings) and
the host-memory way (host shared-memory rings, each frame copied
device-to-host by the decoder and uploaded again by each reader), with and
without CUDA MPS.

Each point runs the real programs, in the layout docs/PIPELINE.md describes:
one `nvr_decoder` process (all N cameras, `tests/data/clip1080.h264` looped
at --fps, one ring each; `[decoder] memory = "cuda"` for the vram pipeline,
`"host"` for the host one), one `nvr_detector.py` (the newest frame of every
camera at --detect-fps, batched torchvision detection with random weights)
and one `nvr_motion.py` (every frame of every camera, GPU frame difference;
--motion-procs N splits its cameras over N worker processes, whose CPU
and memory count with it; --motion-sync-every N sets how many frames'
scores it reads back from the GPU at once),
both readers by push delivery (--delivery pull to pull). The readers are
told nothing about the pipeline: each looks at its rings' backend and, on a
host ring, uploads what it reads to the GPU itself; the bench checks from
their ready lines that they did (input "cuda" / "host-upload", scoring
"torch" / "torch-upload").

After every process is ready and --warmup seconds have passed, the bench
measures for --seconds. Each process prints, every 0.5 s, a JSON "tick"
line with its running totals and its CLOCK_MONOTONIC time; the rates are
the difference between the first and the last tick inside the window.
Per point it reports:

* frames decoded, detected and motion-checked against the schedule
  (cameras x rate x window);
* frames dropped: the decoder's (lossless loans that timed out) and the
  motion reader's (frames of its sequential rings it never saw);
* the latency from the decoded picture reaching the decoder's sink (its
  time is in the frame's metadata) to the detections of it being on the
  host, p50 and p99, over the window's detections: the same span for both
  pipelines (it includes the host pipeline's device-to-host copy and
  upload and the vram pipeline's device-to-device copy);
* CPU % per camera: the utime + stime (/proc/<pid>/stat) of every process
  of the pipeline (and the MPS server under MPS) over the window, over the
  window, per camera (100 = one core);
* the readers' tensor cache, from their final lines (tensors_cache,
  tensors_made, tensors_reused, tensors_busy): "on" in the table when
  every camera's planes were imported once per buffer, else "off N" and a
  note under the table with the state (a run that fell back to imports
  per frame shows);
* GPU memory used (peak in the window, and before the point started), SM
  and NVDEC utilisation (mean and peak), sampled by `nvidia-smi
  --query-gpu=utilization.gpu,utilization.decoder,memory.used -lms 500`;
* a verdict: "sustained" (nothing dropped and each of decode, detection
  and motion at >= 98 % of its schedule, less one frame per camera for
  where the window cuts each camera's period), else what gave; the
  results' "sustained_rule" states the test, and each point's
  <count>_needed the least count that passed it.

A sweep over --counts stops at the first point that is not sustained
(--keep-going runs them all), and points that would not end within
--budget-s of the start are not run (said so in the results; a point's
time is estimated from the points before it, scaled to its cameras, and a
point whose start the budget cuts short is also recorded as not run, not
as a failure), so one invocation fits one 10-minute command. Every process
the bench starts is stopped on every way out (SIGINT first, then SIGKILL
to its process group; each child also gets SIGKILL if the bench dies:
PR_SET_PDEATHSIG), and the MPS control daemon of --mps on (private
CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY under /tmp) is always
quit with `echo quit | nvidia-cuda-mps-control`, in a finally that
SIGTERM, SIGHUP and SIGINT also reach. Before the MPS sweep a probe runs
under the daemon (torch's CUDA init within 30 s, then a one-camera decoder
for 3 s); if it fails, the MPS points are recorded as "not run: MPS probe
failed: <why>" and the daemon is quit. Under MPS each process has at most
--mps-startup-timeout to be ready. The results go, one JSON file, to --out
(updated after each point), and a table to stdout.

On the H200 (staged with benches/nvr_stage.sh; torch in /opt/torch/.venv;
one command per MPS setting, each under 10 minutes):

    bash benches/nvr_scale_device.sh --mps off --out "$OUT"
    bash benches/nvr_scale_device.sh --mps on --out "$OUT"

or by hand:

    python3 -m pip install --no-index --no-deps --target /tmp/site .device/wheels/vramring-*.whl
    PYTHONPATH=/tmp/site /opt/torch/.venv/bin/python benches/nvr_scale.py \\
        --examples .device/examples --pipelines vram,host --mps off --out "$OUT"

On a machine without a GPU, --smoke runs the same orchestration, parsing and
cleanup with a stand-in decoder (this file's `_fake-decoder`: host rings of
--smoke-size frames, the same JSON lines as nvr_decoder), the detector with
--model none --device cpu and motion with --device cpu (numpy only, no
torch); nvidia-smi and MPS are used only if present (python/tests/
test_nvr_scale.py runs it with fakes of both). --dry-run prints the plan.
"""

import argparse
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
READERS = os.path.join(REPO, "examples", "python")
MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_VARS = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
# "Sustained": nothing dropped, and each of decode, detection and motion
# done >= SUSTAINED x schedule - SLACK_PER_CAMERA x cameras (measure()).
SUSTAINED = 0.98
SLACK_PER_CAMERA = 1
SUSTAINED_RULE = {
    "min_ratio": SUSTAINED, "slack_per_camera": SLACK_PER_CAMERA, "dropped_max": 0,
    "test": "for each of decoded, detected and motion_checked: count + slack_per_camera x cameras "
            ">= min_ratio x schedule (each point's <count>_needed is the least count that passes); "
            "and dropped <= dropped_max",
}
TENSOR_KEYS = ("tensors_cache", "tensors_made", "tensors_reused", "tensors_busy")
TICK_S = 0.5


def now_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def log(msg):
    print(f"nvr_scale: {msg}", file=sys.stderr, flush=True)


class Interrupted(BaseException):
    """SIGTERM, SIGHUP or SIGINT reached the bench. A BaseException, as
    KeyboardInterrupt is: no `except Exception` on the way (a failed MPS
    start, a failed point) takes it for an error of its own; main's
    finally stops every process and quits MPS."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _on_signal(signum, _frame):
    raise Interrupted(signum)


# ------------------------------------------------------------------ processes

def _load_prctl():
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up here, not in the child: between fork and exec the child runs
# only this call (no import, no dlopen, which could wait on a lock another
# thread of the bench held at the fork).
_PRCTL = _load_prctl()
PR_SET_PDEATHSIG = 1


def _pdeathsig():
    """In the child before exec: SIGKILL when the bench (the thread that
    started it: always the main thread here) dies."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGKILL))


class Proc:
    """A child in its own process group, its stdout's JSON lines collected
    by a thread (each with the time it arrived), its stderr in a file."""

    ALL = []

    def __init__(self, name, cmd, env, logdir):
        self.name, self.cmd = name, cmd
        self.lines, self.cond = [], threading.Condition()
        self.err_path = os.path.join(logdir, f"{name}.stderr")
        self.out_path = os.path.join(logdir, f"{name}.stdout")
        err = open(self.err_path, "w")
        try:
            self.p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                      env=env, text=True, bufsize=1, start_new_session=True,
                                      preexec_fn=_pdeathsig)
        finally:
            err.close()
        Proc.ALL.append(self)
        self.pid = self.p.pid
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        with open(self.out_path, "w") as raw:
            for line in self.p.stdout:
                raw.write(line)
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                j["_recv_ns"] = now_ns()
                with self.cond:
                    self.lines.append(j)
                    self.cond.notify_all()

    def events(self, event):
        with self.cond:
            return [j for j in self.lines if j.get("event") == event]

    def wait_event(self, event, timeout):
        """The first `event` line, or None when the process ended or `timeout` passed."""
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                for j in self.lines:
                    if j.get("event") == event:
                        return j
                if self.p.poll() is not None and not self.thread.is_alive():
                    return None
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(min(left, 0.2))

    def alive(self):
        return self.p.poll() is None

    def stderr_tail(self, n=3):
        try:
            with open(self.err_path, errors="replace") as f:
                lines = [l.strip() for l in f if l.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-n:])

    def stop(self, grace):
        """SIGINT (the programs print their final lines), then SIGKILL to
        the whole process group; reaped either way. Returns the exit code."""
        if self.p.poll() is None:
            try:
                os.kill(self.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)   # its group: whatever it started too
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log(f"{self.name} (pid {self.pid}) did not die after SIGKILL")
        self.thread.join(timeout=5)
        if self in Proc.ALL:
            Proc.ALL.remove(self)
        return self.p.returncode

    @classmethod
    def stop_all(cls, grace=5.0):
        for p in list(cls.ALL):
            p.stop(grace)


def proc_stat(pid):
    """The fields of /proc/<pid>/stat after the command, or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    return s[s.rfind(")") + 2:].split()


def family(pid):
    """`pid` and its descendants alive now (nvr_motion.py --procs: its workers)."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := proc_stat(name)) is not None:
            parent[int(name)] = int(st[1])
    out, todo = [pid], [pid]
    while todo:
        p = todo.pop()
        kids = [k for k, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def cpu_ticks(pid):
    """utime + stime of `pid` and its descendants (all their threads), in
    clock ticks; None if `pid` is gone."""
    total = None
    for p in family(pid):
        st = proc_stat(p)
        if st is not None:
            total = (total or 0) + int(st[11]) + int(st[12])
    return total if proc_stat(pid) is not None else None


def rss_mib(pid):
    """Resident memory of `pid` and its descendants, MiB; None if gone."""
    total = None
    for p in family(pid):
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total = (total or 0) + int(line.split()[1]) / 1024
        except OSError:
            pass
    return None if total is None else round(total, 1)


# ------------------------------------------------------------------ GPU

def parse_smi_row(line):
    """An nvidia-smi CSV row (utilization.gpu, utilization.decoder,
    memory.used) as (sm, dec, mem), each a float or None where the row has
    none ("[N/A]", "[Not Supported]"); None for a line that is no such row."""
    parts = [x.strip() for x in line.split(",")]
    if len(parts) != 3:
        return None
    vals = []
    for x in parts:
        try:
            vals.append(float(x))
        except ValueError:
            vals.append(None)
    return None if all(v is None for v in vals) else tuple(vals)


class SmiProc(Proc):
    """A Proc whose stdout lines are nvidia-smi CSV rows, kept as (arrival
    ns, sm, dec, mem) (parse_smi_row: a field without a number is None)."""

    def _read(self):
        with open(self.out_path, "w") as raw:
            for line in self.p.stdout:
                raw.write(line)
                vals = parse_smi_row(line)
                if vals is None:
                    continue
                with self.cond:
                    self.lines.append((now_ns(), *vals))
                    self.cond.notify_all()

    def samples(self):
        with self.cond:
            return list(self.lines)


class GpuSampler:
    """`nvidia-smi --query-gpu=... -lms 500` in the background, if it is here."""

    def __init__(self, device, logdir, env):
        self.proc, self.why = None, None
        exe = shutil.which("nvidia-smi", path=env.get("PATH"))
        if exe is None:
            self.why = "nvidia-smi is not on PATH"
            return
        self.proc = SmiProc("nvidia-smi", [exe, "-i", str(device),
                                           "--query-gpu=utilization.gpu,utilization.decoder,memory.used",
                                           "--format=csv,noheader,nounits", "-lms", "500"], env, logdir)

    def memory_now(self, timeout):
        """memory.used (MiB) of the newest sample that has it, waiting up to
        `timeout` for one; None when none came (no nvidia-smi, a slow start)."""
        end = time.monotonic() + timeout
        while self.proc is not None and time.monotonic() < end:
            got = [x[3] for x in self.proc.samples() if x[3] is not None]
            if got:
                return got[-1]
            time.sleep(0.05)
        return None

    def window(self, t0, t1):
        """(sm, dec, mem) of the samples that arrived in [t0, t1]."""
        if self.proc is None:
            return []
        return [x[1:] for x in self.proc.samples() if t0 <= x[0] <= t1]

    def stop(self):
        if self.proc is not None:
            self.proc.stop(2)


def gpu_identity(env, device):
    exe = shutil.which("nvidia-smi", path=env.get("PATH"))
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "-i", str(device), "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20, env=env)
        return r.stdout.strip() or r.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi failed: {e}"


# ------------------------------------------------------------------ MPS

class Mps:
    """A private MPS control daemon: started with its own pipe and log
    directories under /tmp, quit (and its processes reaped) by quit(),
    which the bench calls in a finally."""

    def __init__(self, env):
        self.base_env = env
        self.root = tempfile.mkdtemp(prefix="nvr-mps-", dir="/tmp")
        self.pipe, self.logdir = os.path.join(self.root, "pipe"), os.path.join(self.root, "log")
        os.mkdir(self.pipe)
        os.mkdir(self.logdir)
        self.running = False
        self.exe = shutil.which(MPS_CONTROL, path=env.get("PATH"))

    def env(self, base):
        e = dict(base)
        e[MPS_VARS[0]], e[MPS_VARS[1]] = self.pipe, self.logdir
        return e

    def start(self):
        if self.exe is None:
            raise RuntimeError(f"{MPS_CONTROL} is not on PATH (the NVIDIA driver's MPS control program)")
        # The daemon forks and keeps what it inherited: a file, not a pipe.
        with open(os.path.join(self.root, "start.log"), "w") as out:
            self.running = True   # from here on quit() has work to do
            r = subprocess.run([self.exe, "-d"], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                               env=self.env(self.base_env), timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"{MPS_CONTROL} -d exited with {r.returncode}: {self._start_log()}")
        control = os.path.join(self.pipe, "control")
        end = time.monotonic() + 20
        while not os.path.exists(control):
            if time.monotonic() > end:
                raise RuntimeError(f"the MPS control pipe {control} did not appear within 20 s; "
                                   f"control.log: {self.log_tail()}")
            time.sleep(0.05)
        log(f"MPS control daemon started (CUDA_MPS_PIPE_DIRECTORY={self.pipe})")

    def _start_log(self):
        try:
            with open(os.path.join(self.root, "start.log")) as f:
                return f.read().strip()
        except OSError:
            return ""

    def command(self, what, timeout=30):
        r = subprocess.run([self.exe, ], input=what + "\n", capture_output=True, text=True, timeout=timeout,
                           env=self.env(self.base_env))
        if r.returncode != 0:
            raise RuntimeError(f"{MPS_CONTROL} <<< {what}: exit {r.returncode}: {r.stderr.strip()}")
        return r.stdout.strip()

    def server_pids(self):
        try:
            return [int(w) for w in self.command("get_server_list", 10).split() if w.isdigit()]
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            log(f"MPS get_server_list: {e}")
            return []

    def clients_logged(self):
        try:
            with open(os.path.join(self.logdir, "control.log"), errors="replace") as f:
                return sum("NEW CLIENT" in l for l in f)
        except OSError:
            return 0

    def log_tail(self, n=5):
        try:
            with open(os.path.join(self.logdir, "control.log"), errors="replace") as f:
                return " | ".join(l.strip() for l in f.readlines()[-n:])
        except OSError:
            return ""

    def own_processes(self):
        """PIDs of MPS programs whose environment names our pipe directory."""
        mine, want = [], f"{MPS_VARS[0]}={self.pipe}".encode()
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/comm") as f:
                    if not f.read().startswith("nvidia-cuda-mps"):
                        continue
                with open(f"/proc/{d}/environ", "rb") as f:
                    if want in f.read().split(b"\0"):
                        mine.append(int(d))
            except OSError:
                continue
        return mine

    def quit(self):
        """`echo quit | nvidia-cuda-mps-control`, then waits for the
        daemon's processes to go (SIGTERM, SIGKILL if they do not), then
        removes the directories. Idempotent; never raises."""
        problems = []
        if self.running:
            try:
                self.command("quit", 30)
                log("MPS control daemon: quit sent")
            except Exception as e:
                problems.append(str(e))
            end = time.monotonic() + 15
            left = self.own_processes()
            while left and time.monotonic() < end:
                time.sleep(0.1)
                left = self.own_processes()
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if not left:
                    break
                problems.append(f"MPS processes {left} still running after quit: {sig.name}")
                for pid in left:
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
                time.sleep(2)
                left = self.own_processes()
            self.running = False
        shutil.rmtree(self.root, ignore_errors=True)
        for p in problems:
            log(p)
        return problems


# What the MPS probe runs in the readers' Python: torch's CUDA init and one
# kernel (--smoke: that Python starting, no CUDA).
PROBE_CUDA = ("import json, torch; x = torch.ones(1, device='cuda') + 1; torch.cuda.synchronize(); "
              "print(json.dumps({'event': 'probe', 'gpu': torch.cuda.get_device_name(), 'sum': float(x)}), "
              "flush=True)")
PROBE_SMOKE = ("import json, sys; "
               "print(json.dumps({'event': 'probe', 'python': sys.version.split()[0]}), flush=True)")
PROBE_WAIT_S = 30.0
PROBE_DECODE_S = 3.0


def mps_probe(a, env, work):
    """Whether CUDA works under the MPS daemon at all, before its sweep:
    torch's CUDA init in the readers' Python, then a one-camera decoder
    (as the sweep's first pipeline runs it) that must be ready and decode
    for PROBE_DECODE_S, each within PROBE_WAIT_S. Returns (why it failed or
    None, what it saw)."""
    d = os.path.join(work, "mps-probe")
    rings = os.path.join(d, "r")
    os.makedirs(rings)
    seen, procs = {}, {}
    try:
        what = "the readers' Python starting (--smoke: no CUDA)" if a.smoke else "torch's CUDA init"
        log(f"MPS probe: {what}")
        procs["cuda"] = p = Proc("probe-cuda", [a.python, "-c", PROBE_SMOKE if a.smoke else PROBE_CUDA], env, d)
        got = p.wait_event("probe", PROBE_WAIT_S)
        if got is None:
            return f"{what} gave no answer within {PROBE_WAIT_S:.0f} s (exit {p.p.poll()}): {p.stderr_tail()}", seen
        seen["cuda"] = {k: v for k, v in got.items() if k not in ("event", "_recv_ns")}
        pipeline = a.pipelines[0]
        cfg = os.path.join(d, "cameras.toml")
        with open(cfg, "w") as f:
            f.write(camera_config(a, pipeline, 1, rings))
        log(f"MPS probe: a one-camera decoder ({pipeline} pipeline) for {PROBE_DECODE_S:.0f} s")
        procs["decoder"] = p = Proc("probe-decoder", commands(a, pipeline, 1, cfg, rings)[0], env, d)
        if p.wait_event("ready", PROBE_WAIT_S) is None:
            return (f"a one-camera decoder was not ready within {PROBE_WAIT_S:.0f} s (exit {p.p.poll()}): "
                    f"{p.stderr_tail()}"), seen
        dead = sleep_alive({"one-camera decoder": p}, PROBE_DECODE_S)
        ticks = p.events("tick")
        seen["decoder_frames"] = frames = ticks[-1].get("frames", 0) if ticks else 0
        if dead:
            return dead, seen
        if frames < 1:
            return f"a one-camera decoder decoded no frame in {PROBE_DECODE_S:.0f} s: {p.stderr_tail()}", seen
        log(f"MPS probe: CUDA and the decoder work ({frames} frames)")
        return None, seen
    finally:
        for role, p in procs.items():
            seen.setdefault("exit", {})[role] = p.stop(a.stop_grace)


# ------------------------------------------------------------------ one point

def camera_config(a, pipeline, n, rings):
    memory = "cuda" if pipeline == "vram" else "host"
    pull = "anyone" if a.delivery == "pull" else "nobody"
    lines = ["# written by benches/nvr_scale.py", "[decoder]", f"socket_dir = {json.dumps(rings)}",
             f"device = {a.device}", f'memory = "{memory}"', f"report_ms = {int(TICK_S * 1000)}", ""]
    for k in range(n):
        lines += ["[[camera]]", f'name = "cam{k:03d}"',
                  f"input = {{ file = {json.dumps(os.path.abspath(a.clip))}, loop = true, fps = {a.fps} }}",
                  f'ring = {{ slots = {a.slots}, pull = "{pull}" }}', ""]
    return "\n".join(lines)


def commands(a, pipeline, n, cfg, rings):
    py = a.python
    if a.smoke:
        w, h = a.smoke_size
        dec = [py, os.path.abspath(__file__), "_fake-decoder", "--config", cfg, "--width", str(w), "--height", str(h)]
        det_work = ["--model", "none", "--device", "cpu"]
        mot_work = ["--device", "cpu"]
    else:
        dec = [os.path.join(a.examples, "nvr_decoder"), "--config", cfg, "--json"]
        det_work = ["--model", a.model, "--size", str(a.size), "--random-weights", "--device", "cuda"]
        det_work += ["--half"] if a.half else []
        mot_work = ["--device", "cuda"]
    pull = ["--pull"] if a.delivery == "pull" else []
    # --timeout: for each ring to connect and each frame to come (the rings
    # exist when the readers start).
    common = ["--dir", rings, "--expect", str(n), "--timeout", "30", "--report", str(TICK_S)]
    det = [py, os.path.join(READERS, "nvr_detector.py"), *common, "--fps", str(a.detect_fps), *det_work, *pull]
    procs = ["--procs", str(a.motion_procs)] if a.motion_procs > 1 else []
    procs += ["--sync-every", str(a.motion_sync_every)] if a.motion_sync_every else []
    mot = [py, os.path.join(READERS, "nvr_motion.py"), *common, *mot_work, *pull, *procs]
    return dec, det, mot


def expected_inputs(a, pipeline):
    """What the readers' ready lines must say: (detector input, motion scoring)."""
    if a.smoke:
        return ["host"], ["numpy"]
    return (["cuda"], ["torch"]) if pipeline == "vram" else (["host-upload"], ["torch-upload"])


def window(ticks, t0, t1, key):
    """(delta of `key`, seconds, first, last) between the first and the last tick in [t0, t1]."""
    inside = [t for t in ticks if t0 <= t.get("t_ns", -1) <= t1]
    if len(inside) < 2:
        return None
    a, b = inside[0], inside[-1]
    return b[key] - a[key], (b["t_ns"] - a["t_ns"]) / 1e9, a, b


def pct(xs, p):
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))]


def run_point(a, pipeline, mps, n, env, work, mps_daemon):
    """Runs one point; returns its result (a dict with a verdict)."""
    name = f"{pipeline}-mps{mps}-{n}"
    d = os.path.join(work, name)
    rings = os.path.join(d, "r")
    os.makedirs(rings)
    cfg = os.path.join(d, "cameras.toml")
    with open(cfg, "w") as f:
        f.write(camera_config(a, pipeline, n, rings))
    dec_cmd, det_cmd, mot_cmd = commands(a, pipeline, n, cfg, rings)
    pt = {"pipeline": pipeline, "mps": mps, "cameras": n, "fps": a.fps, "detect_fps": a.detect_fps,
          "seconds": a.seconds, "warmup": a.warmup, "delivery": a.delivery, "pids": {}}
    if a.keep_work or a.work_dir:
        pt["logs"] = d
    gave = []
    started = time.monotonic()
    smi = GpuSampler(a.device, d, env)
    procs = {}
    try:
        pt["gpu_mem_before_mib"] = smi.memory_now(5.0)
        if pt["gpu_mem_before_mib"] is None:
            pt["gpu_mem_before_note"] = smi.why or "nvidia-smi gave no memory.used within 5 s of its start"
        log(f"{name}: starting the decoder ({n} cameras)")
        procs["decoder"] = Proc("decoder", dec_cmd, env, d)
        wait, cut = startup_wait(a, mps)
        ready = procs["decoder"].wait_event("ready", wait)
        if ready is None:
            return not_ready(a, pt, procs, "decoder", wait, cut)
        want_mem = "cuda" if pipeline == "vram" else "host"
        if ready.get("memory") != want_mem:
            return fail(pt, procs, f"misconfigured: the decoder says memory {ready.get('memory')!r}, "
                               f"not {want_mem!r}")
        wait, cut = startup_wait(a, mps)
        end = time.monotonic() + wait
        while (made := len([x for x in os.listdir(rings) if x.endswith(".sock")])) < n:
            alive = procs["decoder"].alive()
            if alive and cut and time.monotonic() > end:
                return out_of_budget(a, pt, f"the decoder had made {made} of {n} rings")
            if not alive or time.monotonic() > end:
                return fail(pt, procs, f"the decoder made {made} of {n} rings in {wait:.0f} s: "
                                   f"{procs['decoder'].stderr_tail()}")
            time.sleep(0.1)
        log(f"{name}: {n} rings up; starting the detector and the motion reader")
        procs["detector"] = Proc("detector", det_cmd, env, d)
        procs["motion"] = Proc("motion", mot_cmd, env, d)
        want_det, want_mot = expected_inputs(a, pipeline)
        for role, key, want in (("detector", "input", want_det), ("motion", "scoring", want_mot)):
            wait, cut = startup_wait(a, mps)
            r = procs[role].wait_event("ready", wait)
            if r is None:
                return not_ready(a, pt, procs, role, wait, cut)
            if r.get(key) != want:
                return fail(pt, procs, f"misconfigured: the {role} says {key} {r.get(key)}, not {want}")
            if role == "detector":
                pt["detector_postprocess"] = r.get("postprocess")
            else:
                pt["motion_sync_every"] = r.get("sync_every")
            joined = len(r.get("cameras", []))
            if joined != n:
                return fail(pt, procs, f"the {role} joined {joined} of {n} cameras: {procs[role].stderr_tail()}")
        pt["pids"] = {k: p.pid for k, p in procs.items()}
        pt["startup_s"] = round(time.monotonic() - started, 1)
        dead = sleep_alive(procs, a.warmup)
        if dead:
            return fail(pt, procs, dead)
        log(f"{name}: measuring {a.seconds} s")
        mps_pids = mps_daemon.server_pids() if mps_daemon else []
        watched = dict(pt["pids"])
        for k, pid in enumerate(mps_pids):
            watched[f"mps-server{k}"] = pid
        t0 = now_ns()
        c0 = {k: cpu_ticks(pid) for k, pid in watched.items()}
        dead = sleep_alive(procs, a.seconds)
        t1 = now_ns()
        c1 = {k: cpu_ticks(pid) for k, pid in watched.items()}
        pt["rss_mib"] = {k: rss_mib(p.pid) for k, p in procs.items()}
        if mps_daemon:
            pt["mps_server_pids"] = mps_pids
            if not mps_pids:
                gave.append("NOT under MPS (the daemon listed no server during the window)")
        if dead:
            gave.append(dead)
        time.sleep(TICK_S + 0.2)   # the ticks just before t1 are read
        for role in ("detector", "motion", "decoder"):
            rc = procs[role].stop(a.stop_grace)
            pt.setdefault("exit", {})[role] = rc
            if rc != 0:
                # Not a verdict on the rates, but the lead should see it.
                why = f"the {role} ended with code {rc} when stopped: {procs[role].stderr_tail()}"
                pt.setdefault("stop_problems", []).append(why)
                log(f"{name}: {why}")
        measure(pt, procs, smi, t0, t1, c0, c1, n, a, gave)
    finally:
        for p in procs.values():
            p.stop(a.stop_grace)
        smi.stop()
        pt["stderr_tail"] = {role: p.stderr_tail(5) for role, p in procs.items()}
        pt["duration_s"] = round(time.monotonic() - started, 1)
    # Sustained: nothing dropped, and decode, detection and motion each at
    # least 98 % of its schedule with one frame per camera of slack
    # (SUSTAINED_RULE; measure() adds to `gave` what fell short).
    pt["verdict"] = "sustained" if not gave else "; ".join(gave)
    return pt


def startup_wait(a, mps):
    """How long a process may take to be ready, and whether the budget cut
    that short: --startup-timeout (under MPS at most --mps-startup-timeout),
    less when the run's hard end (--budget-s, less the rest of the point)
    comes first."""
    limit = a.startup_timeout if mps == "off" else min(a.startup_timeout, a.mps_startup_timeout)
    left = a.hard_end - time.monotonic() - a.warmup - a.seconds - a.stop_grace - 30.0
    return max(5.0, min(limit, left)), left < limit


def not_ready(a, pt, procs, role, wait, cut):
    """The verdict on a process that was not ready within `wait`: not run
    when it is still starting and the budget cut the wait short, else a
    failure."""
    p = procs[role]
    if cut and p.alive():
        return out_of_budget(a, pt, f"the {role} was still starting")
    rc = p.p.poll()
    state = "still running" if rc is None else f"exit {rc}"
    return fail(pt, procs, f"the {role} was not ready within {wait:.0f} s ({state}): {p.stderr_tail()}")


def out_of_budget(a, pt, what):
    why = f"not run: --budget-s {a.budget_s:.0f} ran out while {what}"
    log(f"{pt['pipeline']}-mps{pt['mps']}-{pt['cameras']}: {why}")
    pt["verdict"] = why
    return pt


def fail(pt, procs, why):
    log(f"{pt['pipeline']}-mps{pt['mps']}-{pt['cameras']}: {why}")
    pt["pids"] = pt["pids"] or {k: p.pid for k, p in procs.items()}
    pt["verdict"] = f"failed: {why}"
    return pt


def sleep_alive(procs, seconds):
    """Sleeps, checking every child is alive; a sentence when one ended."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for role, p in procs.items():
            if not p.alive():
                return f"the {role} exited (code {p.p.returncode}): {p.stderr_tail()}"
        time.sleep(0.1)
    return None


def measure(pt, procs, smi, t0, t1, c0, c1, n, a, gave):
    """Fills the point's figures from the ticks, /proc and nvidia-smi, and
    adds to `gave` what fell short."""
    window_s = (t1 - t0) / 1e9
    pt["window_s"] = round(window_s, 2)
    parts = {}
    for role, key, rate in (("decoder", "frames", a.fps), ("detector", "detections", a.detect_fps),
                            ("motion", "frames", a.fps)):
        w = window(procs[role].events("tick"), t0, t1, key)
        if w is None:
            gave.append(f"no {role} figures in the window (fewer than two ticks)")
            parts[role] = None
            continue
        delta, secs, first, last = w
        sched = n * rate * secs
        parts[role] = (delta, secs, first, last)
        label = {"decoder": "decoded", "detector": "detected", "motion": "motion_checked"}[role]
        pt[label] = delta
        pt[f"{label}_schedule"] = round(sched, 1)
        pt[f"{label}_ratio"] = round(delta / sched, 4) if sched else None
        # SLACK_PER_CAMERA (one frame, or detection, per camera) besides the
        # 2 % (SUSTAINED): the window's two ends cut each camera's periodic
        # work at any phase, so a camera that keeps up shows rate x window
        # +- 1 (the detector's cameras run in step, one batch every
        # 1/--detect-fps, so without the slack an 8 s window could read
        # 97.5 % for a detector that keeps up).
        needed = max(0, math.ceil(SUSTAINED * sched - SLACK_PER_CAMERA * n - 1e-9))
        pt[f"{label}_needed"] = needed
        if delta < needed:
            what = {"decoder": "decode", "detector": "detection", "motion": "motion"}[role]
            gave.append(f"{what} at {100 * delta / sched:.1f} % of schedule")
    dropped = 0
    if parts["decoder"]:
        _, _, first, last = parts["decoder"]
        pt["decoder_dropped"] = last["dropped"] - first["dropped"]
        pt["decode_errors"] = last.get("decode_errors", 0) - first.get("decode_errors", 0)
        dropped += pt["decoder_dropped"]
    if parts["motion"]:
        _, _, first, last = parts["motion"]
        pt["motion_dropped"] = last["drops"] - first["drops"]
        dropped += pt["motion_dropped"]
    pt["dropped"] = dropped
    if dropped:
        gave.append(f"{dropped} frames dropped (decoder {pt.get('decoder_dropped')}, "
                    f"motion {pt.get('motion_dropped')})")
    # The readers' final lines (after SIGINT): whether each camera's planes
    # were imported once per buffer (tensors_cache "on") or per frame.
    pt["tensors"] = {}
    for role in ("detector", "motion"):
        fin = procs[role].events("final")
        pt["tensors"][role] = {k: fin[-1].get(k) for k in TENSOR_KEYS} if fin else None
    if parts["detector"]:
        _, _, first, last = parts["detector"]
        ticks = procs["detector"].events("tick")
        lat = [ms for t in ticks if first["t_ns"] < t["t_ns"] <= last["t_ns"] for ms in t["latency_ms"]]
        pt["latency_p50_ms"], pt["latency_p99_ms"] = pct(lat, 50), pct(lat, 99)
        pt["latency_max_ms"] = max(lat) if lat else None
    clk = os.sysconf("SC_CLK_TCK")
    cpu = {}
    for k in c0:
        if c0[k] is not None and c1[k] is not None:
            cpu[k] = round(100.0 * (c1[k] - c0[k]) / clk / window_s, 1)
    pt["cpu_pct"] = cpu
    pt["cpu_pct_total"] = round(sum(cpu.values()), 1)
    pt["cpu_pct_per_camera"] = round(sum(cpu.values()) / n, 2)
    samples = smi.window(t0, t1)
    if samples:
        pt["gpu_samples"] = len(samples)
        sm, dec, mem = ([x for x in field if x is not None] for field in zip(*samples))
        for key, vals in (("sm_util", sm), ("nvdec_util", dec)):
            pt[f"{key}_mean"] = round(sum(vals) / len(vals), 1) if vals else None
            pt[f"{key}_max"] = max(vals) if vals else None
        pt["gpu_mem_peak_mib"] = max(mem) if mem else None
        missing = [name for name, vals in (("utilization.gpu", sm), ("utilization.decoder", dec),
                                           ("memory.used", mem)) if not vals]
        if missing:
            pt["gpu_note"] = f"nvidia-smi gave no number for {', '.join(missing)} in the window ([N/A])"
    else:
        pt["gpu_samples"] = 0
        pt["gpu_note"] = smi.why or "no nvidia-smi sample in the window"


# ------------------------------------------------------------------ the sweep

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipelines", default="vram,host", help="comma-separated: vram, host")
    ap.add_argument("--mps", default="off", help="comma-separated: off, on")
    ap.add_argument("--counts", default="16,32,64,128,192,256,320", help="camera counts, comma-separated")
    ap.add_argument("--fps", type=float, default=25.0, help="decode rate per camera")
    ap.add_argument("--detect-fps", type=float, default=5.0, help="detections per second per camera")
    ap.add_argument("--seconds", type=float, default=8.0, help="the measured window per point")
    ap.add_argument("--warmup", type=float, default=4.0, help="seconds after every process is ready, unmeasured")
    ap.add_argument("--clip", default=os.path.join(REPO, "tests", "data", "clip1080.h264"))
    ap.add_argument("--examples", default=None,
                    help="where nvr_decoder is (default: .device/examples, else target/release/examples)")
    ap.add_argument("--python", default=sys.executable, help="the Python (with torch and vramring) of the readers")
    ap.add_argument("--model", default="ssdlite320_mobilenet_v3_large", help="the detector's network")
    ap.add_argument("--size", type=int, default=320, help="the detector's input size")
    ap.add_argument("--half", action="store_true", help="the detector in float16")
    ap.add_argument("--delivery", choices=("push", "pull"), default="push", help="how the readers get frames")
    ap.add_argument("--slots", type=int, default=8, help="slots per camera ring")
    ap.add_argument("--motion-procs", type=int, default=1,
                    help="worker processes the motion reader splits the cameras over (its --procs)")
    ap.add_argument("--motion-sync-every", type=int, default=0,
                    help="frames per camera whose GPU scores the motion reader reads back together (its "
                         "--sync-every; 0: its default)")
    ap.add_argument("--device", type=int, default=0, help="CUDA device of the decoder (and nvidia-smi -i)")
    ap.add_argument("--out", default=None, help="the JSON result: a file, or a directory to write it in")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="points that would end later than this after the start are not run, and a point's "
                         "waits are cut short so that the run ends soon after it (one 10-minute command)")
    ap.add_argument("--startup-timeout", type=float, default=180.0, help="seconds for each process to be ready")
    ap.add_argument("--mps-startup-timeout", type=float, default=60.0,
                    help="under MPS, at most this many seconds for each process to be ready")
    ap.add_argument("--stop-grace", type=float, default=10.0, help="seconds after SIGINT before SIGKILL")
    ap.add_argument("--keep-going", action="store_true", help="run every count even after one gave")
    ap.add_argument("--work-dir", default=None, help="configs, sockets and logs (default: a new dir in /tmp)")
    ap.add_argument("--keep-work", action="store_true", help="leave the work dir (logs) in place")
    ap.add_argument("--smoke", action="store_true",
                    help="no GPU needed: a stand-in decoder on host rings, the readers on the CPU")
    ap.add_argument("--smoke-size", default="320x240", help="--smoke frames: WxH")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    a = ap.parse_args(argv)
    a.pipelines = [x for x in a.pipelines.split(",") if x]
    a.mps = [x for x in a.mps.split(",") if x]
    a.counts = [int(x) for x in a.counts.split(",") if x]
    bad = [p for p in a.pipelines if p not in ("vram", "host")] + [m for m in a.mps if m not in ("off", "on")]
    if bad or not a.pipelines or not a.mps or not a.counts or min(a.counts) < 1:
        ap.error(f"--pipelines takes vram,host, --mps off,on, --counts positive integers (not {bad or 'empty'})")
    if a.motion_procs < 1:
        ap.error("--motion-procs: at least 1")
    if a.motion_sync_every < 0:
        ap.error("--motion-sync-every: 0 (the reader's default) or more")
    if a.smoke and a.pipelines != ["host"]:
        if "vram" in a.pipelines:
            log("--smoke: the vram pipeline needs a GPU; running the host pipeline only")
        a.pipelines = ["host"]
    w, _, h = a.smoke_size.partition("x")
    a.smoke_size = (int(w), int(h))
    if a.examples is None:
        staged = os.path.join(REPO, ".device", "examples")
        a.examples = staged if os.path.isdir(staged) else os.path.join(REPO, "target", "release", "examples")
    return a


def estimate_s(a, n, done):
    """How long a point of `n` cameras will take, from the points `done`
    ((cameras, seconds) each): the fixed part (--warmup, --seconds, the
    last ticks) plus starting and stopping the processes, which grows with
    the cameras: the most seconds per camera any point took for it, times
    `n`, a fifth more to spare. At least 30 s besides the fixed part."""
    fixed = a.warmup + a.seconds + TICK_S + 0.2
    per_camera = max((max(0.0, secs - fixed) / k for k, secs in done), default=0.0)
    return fixed + max(30.0, 1.2 * per_camera * n)


def out_path(a):
    if not a.out:
        return None
    if os.path.isdir(a.out) or a.out.endswith("/"):
        os.makedirs(a.out, exist_ok=True)
        # Letters, digits, '.', '_' and '-' only: the GPU machine returns
        # no file whose name has any other character.
        name = f"nvr_scale_{'-'.join(a.pipelines)}_mps-{'-'.join(a.mps)}{'_smoke' if a.smoke else ''}.json"
        return os.path.join(a.out, name)
    return a.out


def write(path, results):
    if path is None:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, path)


def tensors_cell(pt):
    """The readers' tensor cache in a word: "on" (every camera's planes
    imported once per buffer), "none" (no tensors, --smoke), "off N" (N
    camera subscriptions imported them per frame, or were not reported),
    "-" (no final line); and a note per state other than on/none."""
    t = pt.get("tensors")
    if not t:
        return "-", []
    states, notes = {}, []
    for role, got in t.items():
        for state, cams in ((got or {}).get("tensors_cache") or {"unknown (no final line)": pt["cameras"]}).items():
            states[state] = states.get(state, 0) + cams
            if state not in ("on", "none"):
                notes.append(f"{pt['pipeline']} mps={pt['mps']} {pt['cameras']} cameras: the {role}'s "
                             f"tensors_cache is {state!r} on {cams} camera(s)")
    off = sum(n for state, n in states.items() if state not in ("on", "none"))
    return (f"off {off}" if off else "on" if "on" in states else "none"), notes


def table(results):
    head = (f"{'pipeline':<8} {'mps':<3} {'cams':>4} {'decoded':>8} {'detected':>8} {'motion':>8} {'drop':>5} "
            f"{'lat p50/p99 ms':>15} {'CPU%/cam':>8} {'GPU MiB':>8} {'SM%':>5} {'NVDEC%':>6} {'tensors':>7}  verdict")
    rows = [head, "-" * len(head)]
    notes = []

    def r(pt, k):
        v = pt.get(k)
        return f"{100 * v:.1f}%" if isinstance(v, (int, float)) else "-"

    def val(pt, k):
        v = pt.get(k)
        return "-" if v is None else str(v)

    for pt in results["points"]:
        cache, why = tensors_cell(pt)
        notes += why
        lat = (f"{pt['latency_p50_ms']:.0f}/{pt['latency_p99_ms']:.0f}"
               if pt.get("latency_p50_ms") is not None else "-")
        rows.append(f"{pt['pipeline']:<8} {pt['mps']:<3} {pt['cameras']:>4} {r(pt, 'decoded_ratio'):>8} "
                    f"{r(pt, 'detected_ratio'):>8} {r(pt, 'motion_checked_ratio'):>8} "
                    f"{val(pt, 'dropped'):>5} {lat:>15} {val(pt, 'cpu_pct_per_camera'):>8} "
                    f"{val(pt, 'gpu_mem_peak_mib'):>8} {val(pt, 'sm_util_mean'):>5} "
                    f"{val(pt, 'nvdec_util_mean'):>6} {cache:>7}  {pt['verdict']}")
    if notes:
        rows += ["", "tensors: 'on' = each camera's planes imported once per buffer; otherwise per frame:", *notes]
    return "\n".join(rows)


def plan(a):
    for mps in a.mps:
        for pipeline in a.pipelines:
            for n in a.counts:
                rings = f"<work>/{pipeline}-mps{mps}-{n}/r"
                cfg = f"<work>/{pipeline}-mps{mps}-{n}/cameras.toml"
                dec, det, mot = commands(a, pipeline, n, cfg, rings)
                print(f"== {pipeline} mps={mps} {n} cameras")
                print("   " + "\n   ".join(camera_config(a, pipeline, min(n, 1), rings).splitlines()[:8]))
                print(f"   ... {n} cameras like it")
                for c in (dec, det, mot):
                    print("   $ " + " ".join(c))


def main(argv=None):
    a = parse_args(argv)
    if a.dry_run:
        plan(a)
        return 0
    if not a.smoke and not os.path.exists(os.path.join(a.examples, "nvr_decoder")):
        print(f"nvr_scale: {a.examples}/nvr_decoder is missing: stage it (benches/nvr_stage.sh) or build it "
              "(cargo build --release --features nvdec --example nvr_decoder), or pass --examples", file=sys.stderr)
        return 2
    if not os.path.exists(a.clip):
        print(f"nvr_scale: the clip {a.clip} is missing", file=sys.stderr)
        return 2
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, _on_signal)
    path = out_path(a)
    work = a.work_dir or tempfile.mkdtemp(prefix="nvrscale-", dir="/tmp")
    os.makedirs(work, exist_ok=True)
    base_env = {k: v for k, v in os.environ.items() if k not in MPS_VARS}
    results = {"bench": "nvr_scale", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "host": " ".join(os.uname()), "cpus": os.cpu_count(), "gpu": gpu_identity(base_env, a.device),
               "smoke": a.smoke, "args": {k: v for k, v in vars(a).items()}, "points": [], "mps": {},
               "open_files_limit": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
               "sustained_rule": SUSTAINED_RULE, "complete": False}
    if os.path.exists("/tmp/nvidia-mps/control"):
        results["warning"] = ("a system MPS daemon's control pipe /tmp/nvidia-mps/control exists: "
                              "processes of the mps=off runs may run under it")
        log(results["warning"])
    start = time.monotonic()
    a.hard_end = start + a.budget_s
    rc = 0
    daemon = None
    try:
        for mps in a.mps:
            env, daemon, probe = base_env, None, None
            if mps == "on":
                daemon = Mps(base_env)
                try:
                    daemon.start()
                except Exception as e:
                    why = f"not run: the MPS control daemon did not start: {e}"
                else:
                    env = daemon.env(base_env)
                    failed, probe = mps_probe(a, env, work)
                    why = f"not run: MPS probe failed: {failed}" if failed else None
                if why:
                    log(why)
                    for pipeline in a.pipelines:
                        for n in a.counts:
                            results["points"].append({"pipeline": pipeline, "mps": mps, "cameras": n,
                                                      "verdict": why})
                    results["mps"][mps] = {"probe": probe, "control_log_tail": daemon.log_tail()}
                    problems = daemon.quit()
                    if problems:
                        results["mps"][mps]["quit_problems"] = problems
                    daemon = None
                    write(path, results)
                    continue
            try:
                # Count by count, each pipeline in turn: a budget that runs
                # out cuts both sweeps at the same count.
                gave_at = {p: None for p in a.pipelines}
                done = []   # (cameras, seconds) of the points run
                for n in a.counts:
                    for pipeline in a.pipelines:
                        est = estimate_s(a, n, done)
                        skip = None
                        if gave_at[pipeline] is not None:
                            skip = (f"not run: the {pipeline} pipeline gave at {gave_at[pipeline]} cameras "
                                    "(--keep-going runs it)")
                        elif time.monotonic() - start + est > a.budget_s:
                            skip = f"not run: it would end past --budget-s {a.budget_s:.0f} s"
                        if skip:
                            results["points"].append({"pipeline": pipeline, "mps": mps, "cameras": n,
                                                      "verdict": skip})
                            continue
                        pt = run_point(a, pipeline, mps, n, env, work, daemon)
                        pt["estimate_s"] = round(est, 1)
                        results["points"].append(pt)
                        write(path, results)
                        log(f"{pipeline} mps={mps} {n} cameras: {pt['verdict']}")
                        if pt["verdict"].startswith("not run"):
                            continue   # the budget ran out: no figure, and no verdict on the pipeline
                        done.append((n, pt["duration_s"]))
                        if pt["verdict"] != "sustained" and not a.keep_going:
                            gave_at[pipeline] = n
            finally:
                if daemon is not None:
                    results["mps"][mps] = {"probe": probe, "clients_logged": daemon.clients_logged(),
                                           "control_log_tail": daemon.log_tail()}
                    problems = daemon.quit()
                    if problems:
                        results["mps"][mps]["quit_problems"] = problems
                    daemon = None
        results["complete"] = True
    except Interrupted as e:
        log(f"interrupted by {e}: stopping every process")
        results["interrupted"] = str(e)
        rc = 128 + e.signum
    finally:
        # Ignore further signals while cleaning up: a second Ctrl-C must
        # not leave a process or the MPS daemon behind.
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        Proc.stop_all(grace=3.0)
        if daemon is not None:
            daemon.quit()
        results["elapsed_s"] = round(time.monotonic() - start, 1)
        write(path, results)
        if not a.keep_work and not a.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    if path:
        print(f"results: {path}")
    return rc


# ------------------------------------------------------------------ stand-in decoder (--smoke)

def fake_decoder(argv):
    """A stand-in for nvr_decoder on a machine without NVDEC: the config's
    cameras as host rings of WxH NV12 frames, paced at each camera's fps,
    with nvr_decoder's JSON lines (ready, tick, camera-final, final) and its
    user metadata (index in the segment, segment). Host memory only."""
    import struct
    import tomllib

    import numpy as np
    import vramring
    ap = argparse.ArgumentParser(prog="nvr_scale.py _fake-decoder")
    ap.add_argument("--config", required=True)
    ap.add_argument("--width", type=int, default=320)
    ap.add_argument("--height", type=int, default=240)
    a = ap.parse_args(argv)
    with open(a.config, "rb") as f:
        cfg = tomllib.load(f)
    dec = cfg.get("decoder", {})
    if dec.get("memory") != "host":
        print("fake-decoder: it makes host rings only ([decoder] memory = \"host\")", file=sys.stderr)
        return 3
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    cams = cfg["camera"]
    counts = [0] * len(cams)
    pubs = []
    for c in cams:
        path = os.path.join(dec["socket_dir"], c.get("output", c["name"] + ".sock"))
        pubs.append(vramring.Publisher(path, "nv12", a.width, a.height, slots=c.get("ring", {}).get("slots", 8),
                                       backend="host"))
    size = pubs[0].packed_nbytes
    frames = [np.full(size, v, np.uint8) for v in (40, 200)]

    def camera(k):
        fps = cams[k]["input"].get("fps", 30) or 30
        period, due, index = 1.0 / fps, time.monotonic(), 0
        while not stop.is_set():
            nowm = time.monotonic()
            if due > nowm:
                time.sleep(min(due - nowm, 0.1))
                continue
            if nowm - due > 8 * period:
                due = nowm   # far behind: pace from now, as nvr_decoder's file input does
            due += period
            meta = struct.pack("<IIQ", index, 0, now_ns())   # as nvr_decoder: index, segment, decoded_ns
            pubs[k].publish(frames[index % 2], pts=index, meta=meta)
            index += 1
            counts[k] = index

    print(json.dumps({"event": "ready", "role": "nvr_decoder", "cameras": len(cams),
                      "socket_dir": dec["socket_dir"], "device": 0, "memory": "host", "fake": True}), flush=True)
    threads = [threading.Thread(target=camera, args=(k,), daemon=True) for k in range(len(cams))]
    for t in threads:
        t.start()
    report = dec.get("report_ms", 1000) / 1000.0
    start = last = time.monotonic()
    while not stop.is_set():
        time.sleep(0.02)
        if report and time.monotonic() - last >= report:
            last = time.monotonic()
            print(json.dumps({"event": "tick", "role": "nvr_decoder", "t_ns": now_ns(), "frames": sum(counts),
                              "dropped": 0, "resyncs": 0, "decode_errors": 0, "running": len(cams)}), flush=True)
    for t in threads:
        t.join(timeout=5)
    for c, p, n in zip(cams, pubs, counts):
        p.close()
        print(json.dumps({"event": "camera-final", "camera": c["name"], "frames": n, "dropped": 0}), flush=True)
    print(json.dumps({"event": "final", "role": "nvr_decoder", "cameras": len(cams), "memory": "host",
                      "frames": sum(counts), "dropped": 0, "seconds": round(time.monotonic() - start, 2)}),
          flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_fake-decoder":
        sys.exit(fake_decoder(sys.argv[2:]))
    sys.exit(main())
