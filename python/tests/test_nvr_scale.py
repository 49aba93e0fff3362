"""benches/nvr_scale.py's orchestration without a GPU: --smoke runs the host
pipeline with the bench's stand-in decoder and the real Python readers on
the CPU; fakes of nvidia-smi and nvidia-cuda-mps-control on PATH stand in
for the driver's tools and log how they were called. What is proven: every
point is measured and parsed, the MPS daemon is started once and quit once
per setting (also when the bench is interrupted), and no process the bench
started outlives it. No test here asserts a rate or a duration."""

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import REPO

BENCH = REPO / "benches" / "nvr_scale.py"


def _bench():
    """benches/nvr_scale.py as a module (importing it starts nothing)."""
    spec = importlib.util.spec_from_file_location("nvr_scale", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

FAKE_SMI = """#!/bin/bash
# nvidia-smi stand-in: the sampled query prints a row every 0.1 s, every
# other one with utilization.gpu [N/A], after FAKE_SMI_SLOW_START seconds.
case " $* " in
  *" -lms "*) sleep "${FAKE_SMI_SLOW_START:-0}"
              while true; do echo "37, 12, 2048"; sleep 0.1; echo "[N/A], 14, 2050"; sleep 0.1; done ;;
  *) echo "Fake GPU, 580.00, 143771 MiB" ;;
esac
"""

# The MPS control stand-in: -d starts a "server" (a copy of sleep named
# nvidia-cuda-mps-server, in the daemon's environment) and makes the control
# pipe (FAKE_MPS_SLOW_START seconds after it is called); quit stops the
# server (unless FAKE_MPS_STUBBORN is set). Every call is logged with the
# pipe directory.
FAKE_MPS = """#!/bin/bash
log="$FAKE_MPS_LOG"
if [ "$1" = "-d" ]; then
  echo "start $CUDA_MPS_PIPE_DIRECTORY" >> "$log"
  for _ in $(seq 1 $((${FAKE_MPS_SLOW_START:-0} * 10))); do sleep 0.1; done
  "$(dirname "$0")/nvidia-cuda-mps-server" 600 > /dev/null 2>&1 &
  echo $! > "$CUDA_MPS_PIPE_DIRECTORY/server.pid"
  touch "$CUDA_MPS_PIPE_DIRECTORY/control"
  exit 0
fi
read -r cmd
echo "$cmd $CUDA_MPS_PIPE_DIRECTORY" >> "$log"
case "$cmd" in
  get_server_list) cat "$CUDA_MPS_PIPE_DIRECTORY/server.pid" ;;
  quit) [ -n "$FAKE_MPS_STUBBORN" ] || kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/server.pid")"
        rm -f "$CUDA_MPS_PIPE_DIRECTORY/control" ;;
esac
"""


@pytest.fixture
def fake_gpu(tmp_path):
    """PATH with the fake tools first; the MPS calls' log."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name, text in (("nvidia-smi", FAKE_SMI), ("nvidia-cuda-mps-control", FAKE_MPS)):
        (tools / name).write_text(text)
        (tools / name).chmod(0o755)
    shutil.copy(shutil.which("sleep"), tools / "nvidia-cuda-mps-server")
    mps_log = tmp_path / "mps.log"
    env = dict(os.environ, PATH=f"{tools}:{os.environ['PATH']}", FAKE_MPS_LOG=str(mps_log))
    yield env, mps_log
    for pid in _pids_of("nvidia-cuda-mps"):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def work():
    # Socket paths are limited to 107 bytes: a short directory.
    d = tempfile.mkdtemp(prefix="vrs")
    yield d
    leftovers = _pids_with(d)
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(d, ignore_errors=True)


def _pids_with(text):
    """Live (not zombie) processes whose command line contains `text`."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            found.append(int(d))
    return found


def _pids_of(comm_prefix):
    """Live (not zombie) processes whose name starts with `comm_prefix`."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        comm, state = s[s.index("(") + 1:s.rindex(")")], s.rsplit(")", 1)[1].split()[0]
        if comm.startswith(comm_prefix) and state != "Z":
            found.append(int(d))
    return found


def _mps_calls(mps_log):
    if not mps_log.exists():
        return []
    return [l.split() for l in mps_log.read_text().splitlines() if l.strip()]


def _assert_each_daemon_started_and_quit_once(calls, settings):
    starts = [c[1] for c in calls if c[0] == "start"]
    quits = [c[1] for c in calls if c[0] == "quit"]
    assert len(starts) == settings and sorted(starts) == sorted(quits), calls
    for pipe in starts:
        mine = [c[0] for c in calls if c[-1] == pipe]
        assert mine[0] == "start" and mine[-1] == "quit" and mine.count("quit") == 1, mine
        assert pipe.startswith("/tmp/") and not os.path.exists(pipe), "private under /tmp, removed after"


def test_smoke_sweep_measures_every_point_and_leaves_nothing_running(fake_gpu, work, tmp_path):
    env, mps_log = fake_gpu
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(BENCH), "--smoke", "--counts", "2,3", "--seconds", "2",
                        "--warmup", "0.5", "--mps", "off,on", "--keep-going", "--out", f"{out}/",
                        "--work-dir", work], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "nvr_scale_host_mps-off-on_smoke.json").read_text())
    assert res["complete"] and res["smoke"] and res["gpu"].startswith("Fake GPU"), res
    assert len(res["open_files_limit"]) == 2, res
    rule = res["sustained_rule"]
    assert (rule["min_ratio"], rule["slack_per_camera"], rule["dropped_max"]) == (0.98, 1, 0), rule
    points = res["points"]
    assert [(p["mps"], p["cameras"]) for p in points] == [("off", 2), ("off", 3), ("on", 2), ("on", 3)]
    for p in points:
        where = f"{p['mps']} {p['cameras']}: {p['verdict']}"
        assert not p["verdict"].startswith(("failed", "not run")), where
        for k, what in (("decoded", "decode at"), ("detected", "detection at"), ("motion_checked", "motion at")):
            assert p[k] > 0 and p[f"{k}_schedule"] > 0 and p[f"{k}_ratio"] > 0, (k, where)
            # The verdict follows the stated rule: 98 % of the schedule less one per camera.
            least = 0.98 * p[f"{k}_schedule"] - p["cameras"]   # the schedule is rounded to 0.1
            assert p[f"{k}_needed"] == 0 if least <= 0 else abs(p[f"{k}_needed"] - least) < 1.1, (k, where)
            assert (p[k] < p[f"{k}_needed"]) == (what in p["verdict"]), (k, where)
        assert p["dropped"] == p["decoder_dropped"] + p["motion_dropped"], where
        assert 0 <= p["latency_p50_ms"] <= p["latency_p99_ms"] <= p["latency_max_ms"], where
        assert {"decoder", "detector", "motion"} <= set(p["cpu_pct"]), where
        assert p["cpu_pct_per_camera"] >= 0 and p["exit"] == {"detector": 0, "motion": 0, "decoder": 0}, where
        # The fake nvidia-smi's figures, parsed field by field: a row with
        # utilization.gpu [N/A] still gives its decoder and memory figures.
        assert p["gpu_samples"] > 0 and p["gpu_mem_before_mib"] in (2048, 2050), where
        assert (p["sm_util_mean"], p["nvdec_util_max"], p["gpu_mem_peak_mib"]) == (37, 14, 2050), where
        assert set(p["pids"]) == {"decoder", "detector", "motion"}, where
        # The readers' tensor cache, from their final lines (numpy: no tensors asked).
        for role in ("detector", "motion"):
            assert p["tensors"][role]["tensors_cache"] == {"none": p["cameras"]}, (role, where)
            assert p["tensors"][role]["tensors_made"] == 0, (role, where)
        if p["mps"] == "on":
            assert len(p["mps_server_pids"]) == 1 and "NOT under MPS" not in p["verdict"], where
            assert any(k.startswith("mps-server") for k in p["cpu_pct"]), where
    # The probe ran under the daemon before its points: the readers' Python and a decoder that decoded.
    probe = res["mps"]["on"]["probe"]
    assert "python" in probe["cuda"] and probe["decoder_frames"] > 0, probe
    assert probe["exit"] == {"cuda": 0, "decoder": 0}, probe
    _assert_each_daemon_started_and_quit_once(_mps_calls(mps_log), 1)
    assert not _pids_with(work), "no process of the bench is left"
    assert not _pids_of("nvidia-cuda-mps"), "the MPS server stand-in is gone"
    assert "verdict" in r.stdout and "tensors" in r.stdout and "results:" in r.stdout, r.stdout


def test_a_motion_reader_split_over_worker_processes_is_measured_whole(fake_gpu, work, tmp_path):
    # --motion-procs 2: nvr_motion.py --procs 2; its ticks and final line
    # cover every camera, and the point stops every worker. The reader
    # says it took --motion-sync-every.
    env, _ = fake_gpu
    out = tmp_path / "res.json"
    r = subprocess.run([sys.executable, str(BENCH), "--smoke", "--counts", "3", "--seconds", "2",
                        "--warmup", "0.5", "--mps", "off", "--motion-procs", "2", "--motion-sync-every", "3", "--out", str(out),
                        "--work-dir", work], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["args"]["motion_procs"] == 2, res["args"]
    (p,) = res["points"]
    assert not p["verdict"].startswith(("failed", "not run")), p["verdict"]
    assert p["motion_checked"] > 0 and p["exit"]["motion"] == 0, p
    assert p["motion_sync_every"] == 3, p
    assert p["tensors"]["motion"]["tensors_cache"] == {"none": 3}, p["tensors"]
    assert p["cpu_pct"]["motion"] > 0, p["cpu_pct"]
    assert not _pids_with(work), "no process of the bench is left"


def test_an_interrupted_sweep_stops_its_processes_and_quits_mps(fake_gpu, work, tmp_path):
    env, mps_log = fake_gpu
    out = tmp_path / "res.json"
    p = subprocess.Popen([sys.executable, str(BENCH), "--smoke", "--counts", "2", "--seconds", "300",
                          "--warmup", "0.5", "--mps", "on", "--out", str(out), "--work-dir", work],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        deadline = time.monotonic() + 300
        for line in p.stderr:
            seen.append(line)
            if "measuring" in line:
                break
            assert time.monotonic() < deadline, "".join(seen)
        else:
            pytest.fail("the bench ended before measuring:\n" + "".join(seen))
        running = _pids_with(work)
        assert len(running) >= 3, "decoder, detector and motion are running"
        p.send_signal(signal.SIGTERM)
        rest_out, rest_err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + signal.SIGTERM, "".join(seen) + rest_err
    assert "interrupted by SIGTERM" in rest_err, rest_err
    res = json.loads(out.read_text())
    assert res["interrupted"] == "SIGTERM" and not res["complete"], res
    _assert_each_daemon_started_and_quit_once(_mps_calls(mps_log), 1)
    assert not _pids_with(work), "no process of the bench is left"
    assert not _pids_of("nvidia-cuda-mps"), "the MPS server stand-in is gone"


def test_a_signal_while_mps_starts_interrupts_the_sweep_and_quits_mps(fake_gpu, work, tmp_path):
    assert issubclass(_bench().Interrupted, BaseException) and not issubclass(_bench().Interrupted, Exception)
    env, mps_log = fake_gpu
    env = dict(env, FAKE_MPS_SLOW_START="20")
    out = tmp_path / "res.json"
    p = subprocess.Popen([sys.executable, str(BENCH), "--smoke", "--counts", "2", "--seconds", "1",
                          "--warmup", "0", "--mps", "on", "--out", str(out), "--work-dir", work],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(c[0] == "start" for c in _mps_calls(mps_log)):
            assert p.poll() is None and time.monotonic() < deadline, "the bench never started MPS"
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + signal.SIGTERM, err
    res = json.loads(out.read_text())
    assert res["interrupted"] == "SIGTERM" and not res["complete"], res
    assert not any("did not start" in pt["verdict"] for pt in res["points"]), res["points"]
    _assert_each_daemon_started_and_quit_once(_mps_calls(mps_log), 1)
    assert not _pids_with(work), "no process of the bench is left"
    assert not _pids_of("nvidia-cuda-mps"), "no MPS stand-in is left"


def test_when_the_mps_probe_fails_the_mps_points_say_why_and_mps_is_quit(fake_gpu, work, tmp_path):
    # A Python that cannot start under MPS (as a CUDA init that fails there would).
    broken = tmp_path / "python"
    broken.write_text(f"""#!/bin/bash
if [ -n "$CUDA_MPS_PIPE_DIRECTORY" ]; then echo "fake: cuInit failed under MPS" >&2; exit 1; fi
exec {sys.executable} "$@"
""")
    broken.chmod(0o755)
    env, mps_log = fake_gpu
    out = tmp_path / "res.json"
    r = subprocess.run([sys.executable, str(BENCH), "--smoke", "--counts", "2", "--seconds", "1", "--warmup", "0",
                        "--mps", "off,on", "--python", str(broken), "--out", str(out), "--work-dir", work],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    off, on = res["points"]
    assert off["mps"] == "off" and not off["verdict"].startswith(("failed", "not run")), off
    assert on["mps"] == "on" and on["verdict"].startswith("not run: MPS probe failed: "), on
    assert "fake: cuInit failed under MPS" in on["verdict"], on
    assert res["mps"]["on"]["probe"]["exit"] == {"cuda": 1}, res["mps"]
    _assert_each_daemon_started_and_quit_once(_mps_calls(mps_log), 1)
    assert not _pids_with(work), "no process of the bench is left"
    assert not _pids_of("nvidia-cuda-mps"), "the MPS server stand-in is gone"


def test_without_the_mps_program_the_mps_points_say_not_run(work, tmp_path):
    if shutil.which("nvidia-cuda-mps-control"):
        pytest.skip("the real MPS control program is here")
    out = tmp_path / "res.json"
    r = subprocess.run([sys.executable, str(BENCH), "--smoke", "--counts", "2", "--seconds", "1", "--warmup", "0",
                        "--mps", "on", "--out", str(out), "--work-dir", work],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (pt,) = json.loads(out.read_text())["points"]
    assert pt["verdict"].startswith("not run: the MPS control daemon did not start"), pt
    assert "nvidia-cuda-mps-control is not on PATH" in pt["verdict"], pt


def test_dry_run_prints_each_points_commands_and_starts_nothing(work):
    r = subprocess.run([sys.executable, str(BENCH), "--dry-run", "--counts", "16,32", "--mps", "off,on",
                        "--work-dir", work], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    heads = [l for l in r.stdout.splitlines() if l.startswith("== ")]
    assert len(heads) == 8, r.stdout          # 2 pipelines x 2 MPS settings x 2 counts
    assert 'memory = "host"' in r.stdout and 'memory = "cuda"' in r.stdout
    assert "nvr_decoder --config" in r.stdout and "--random-weights --device cuda" in r.stdout
    assert os.listdir(work) == []


def test_an_mps_server_that_outlives_quit_is_terminated_by_the_bench(fake_gpu, work, tmp_path):
    env, mps_log = fake_gpu
    env = dict(env, FAKE_MPS_STUBBORN="1")
    out = tmp_path / "res.json"
    r = subprocess.run([sys.executable, str(BENCH), "--smoke", "--counts", "2", "--seconds", "1", "--warmup", "0",
                        "--mps", "on", "--out", str(out), "--work-dir", work],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    problems = res["mps"]["on"]["quit_problems"]
    assert any("still running after quit: SIGTERM" in p for p in problems), problems
    _assert_each_daemon_started_and_quit_once(_mps_calls(mps_log), 1)
    assert not _pids_of("nvidia-cuda-mps"), "the bench terminated the MPS server stand-in"


def test_results_file_names_use_only_characters_the_gpu_machine_returns(tmp_path):
    bench = _bench()
    names = set()
    for pipelines in ("vram,host", "vram", "host"):
        for mps in ("off", "on", "off,on"):
            a = bench.parse_args(["--pipelines", pipelines, "--mps", mps, "--out", f"{tmp_path}/"])
            names.add(os.path.basename(bench.out_path(a)))
    a = bench.parse_args(["--smoke", "--mps", "off,on", "--out", f"{tmp_path}/"])
    names.add(os.path.basename(bench.out_path(a)))
    assert len(names) == 10, names                   # one file per sweep, none overwritten by another
    for name in names:
        assert re.fullmatch(r"[A-Za-z0-9._-]+", name), name


def test_the_time_a_point_is_given_grows_with_its_cameras():
    bench = _bench()
    a = bench.parse_args(["--seconds", "8", "--warmup", "4"])
    fixed = bench.estimate_s(a, 32, [])             # nothing run yet: the fixed part and 30 s
    assert fixed == bench.estimate_s(a, 192, [])
    # 32 cameras took the fixed part plus 40 s to start and stop: twice the
    # cameras are given about twice that (a fifth more to spare).
    done = [(32, fixed - 30.0 + 40.0)]
    var32, var64 = (bench.estimate_s(a, n, done) - (fixed - 30.0) for n in (32, 64))
    assert var32 == pytest.approx(1.2 * 40.0) and var64 == pytest.approx(2 * var32)
    # The costliest point per camera decides.
    done.append((64, fixed - 30.0 + 40.0))
    assert bench.estimate_s(a, 64, done) - (fixed - 30.0) == pytest.approx(var64)


def test_a_point_whose_start_the_budget_cuts_short_is_not_run_not_failed(work, tmp_path):
    # The detector's Python takes 8 s to start; with --budget-s 40 the bench
    # gives each process 5 s (the budget has no more left for a start).
    slow = tmp_path / "python"
    slow.write_text(f"""#!/bin/bash
case "$*" in *nvr_detector.py*) sleep 8 ;; esac
exec {sys.executable} "$@"
""")
    slow.chmod(0o755)
    out = tmp_path / "res.json"
    r = subprocess.run([sys.executable, str(BENCH), "--smoke", "--counts", "2,3", "--seconds", "2",
                        "--warmup", "0.5", "--budget-s", "40", "--python", str(slow), "--out", str(out),
                        "--work-dir", work], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    first, second = json.loads(out.read_text())["points"]
    assert first["verdict"] == "not run: --budget-s 40 ran out while the detector was still starting", first
    assert second["verdict"].startswith("not run: it would end past --budget-s 40"), second
    assert not _pids_with(work), "no process of the bench is left"


def _device_tree(tmp_path, frame_has_tensors):
    """A copy of benches/nvr_scale_device.sh beside a stand-in .device/ (a
    vramring wheel with or without Frame.tensors, an nvr_decoder) and a
    stand-in benches/nvr_scale.py that prints its arguments and open-files
    limit; stand-ins of torch, torchvision and nvidia-smi."""
    root = tmp_path / "tree"
    (root / "benches").mkdir(parents=True)
    shutil.copy(REPO / "benches" / "nvr_scale_device.sh", root / "benches")
    (root / "benches" / "nvr_scale.py").write_text(
        "import json, os, resource, sys\n"
        "work = sys.argv[len(sys.argv) - 1 - sys.argv[::-1].index('--work-dir') + 1]\n"
        "os.makedirs(work, exist_ok=True)\n"
        "open(os.path.join(work, 'decoder.err'), 'w').write('a log line')\n"
        "print(json.dumps({'argv': sys.argv[1:], 'nofile': resource.getrlimit(resource.RLIMIT_NOFILE)}))\n")
    (root / ".device" / "examples").mkdir(parents=True)
    (root / ".device" / "examples" / "nvr_decoder").write_text("#!/bin/sh\n")
    (root / ".device" / "examples" / "nvr_decoder").chmod(0o755)
    (root / ".device" / "wheels").mkdir()
    import zipfile
    with zipfile.ZipFile(root / ".device" / "wheels" / "vramring-0.1.0-cp311-abi3-linux_x86_64.whl", "w") as z:
        z.writestr("vramring/__init__.py", "__version__ = '0.1.0'\nclass Frame:\n"
                   + ("    tensors = ()\n" if frame_has_tensors else "    pass\n"))
    fakes = tmp_path / "fakes"
    (fakes / "torch").mkdir(parents=True)
    (fakes / "torch" / "__init__.py").write_text(
        "__version__ = '0'\nclass cuda:\n    @staticmethod\n    def is_available():\n        return True\n")
    (fakes / "torchvision").mkdir()
    (fakes / "torchvision" / "__init__.py").write_text("__version__ = '0'\n")
    (fakes / "nvidia-smi").write_text("#!/bin/sh\necho 'Fake GPU, 580.00, 0 MiB, 143771 MiB'\n")
    (fakes / "nvidia-smi").chmod(0o755)
    env = dict(os.environ, NVR_PYTHON=sys.executable, PYTHONPATH=str(fakes), OUT=str(tmp_path / "out"),
               PATH=f"{fakes}:{os.environ['PATH']}")
    return root, env


def test_the_device_script_refuses_a_wheel_without_frame_tensors(tmp_path):
    root, env = _device_tree(tmp_path, frame_has_tensors=False)
    r = subprocess.run(["bash", str(root / "benches" / "nvr_scale_device.sh"), "--mps", "off"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "lacks Frame.tensors" in r.stderr and "benches/nvr_stage.sh` without --no-wheel" in r.stderr, r.stderr
    assert "argv" not in r.stdout, "the bench did not run"


def test_the_device_script_sweeps_32_to_192_cameras_in_budget_with_every_fd_it_may_have(tmp_path):
    root, env = _device_tree(tmp_path, frame_has_tensors=True)
    r = subprocess.run(["bash", str(root / "benches" / "nvr_scale_device.sh"), "--mps", "on", "--counts", "8"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "open files: soft limit" in r.stdout, r.stdout
    (ran,) = [json.loads(l) for l in r.stdout.splitlines() if l.startswith('{"argv"')]
    argv = ran["argv"]

    def value(flag):                                  # argparse: the last one given wins
        return argv[len(argv) - 1 - argv[::-1].index(flag) + 1]

    assert argv[argv.index("--counts") + 1] == "32,64,128,192" and value("--counts") == "8", argv
    assert (value("--budget-s"), value("--stop-grace"), value("--mps")) == ("420", "10", "on"), argv
    assert "--keep-going" in argv and value("--work-dir") == "/tmp/nvr-scale-work", argv
    import tarfile
    with tarfile.open(tmp_path / "out" / "nvr_scale_logs.tgz") as logs:
        assert "nvr-scale-work/decoder.err" in logs.getnames(), "the processes' logs come back as one archive"
    assert not os.path.exists("/tmp/nvr-scale-work"), "and leave nothing behind"
    soft, hard = ran["nofile"]
    assert soft == hard or "could not raise the open-files limit" in r.stderr, (ran, r.stderr)


def test_the_table_shows_a_tensor_cache_that_fell_back_to_imports_per_frame():
    bench = _bench()
    on = {"tensors_cache": {"on": 4}, "tensors_made": 32, "tensors_reused": 900, "tensors_busy": 0}
    half = {"tensors_cache": {"on": 3, "off: no torch stream": 1}, "tensors_made": 300, "tensors_reused": 700,
            "tensors_busy": 0}
    base = {"pipeline": "vram", "mps": "off", "cameras": 4, "verdict": "sustained"}
    points = [dict(base, tensors={"detector": on, "motion": on}),
              dict(base, cameras=8, tensors={"detector": on, "motion": half}),
              dict(base, cameras=16, tensors={"detector": on, "motion": None}),
              dict(base, cameras=32, verdict="failed: the decoder was not ready")]
    assert [bench.tensors_cell(p)[0] for p in points] == ["on", "off 1", "off 16", "-"]
    text = bench.table({"points": points})
    rows = [l for l in text.splitlines() if l.startswith("vram")]
    assert [r.split()[-2] for r in rows[:1]] == ["on"], text
    assert "the motion's tensors_cache is 'off: no torch stream' on 1 camera(s)" in text, text
    assert "the motion's tensors_cache is 'unknown (no final line)' on 16 camera(s)" in text, text


def test_an_nvidia_smi_row_keeps_every_field_it_has():
    parse = _bench().parse_smi_row
    assert parse("37, 12, 2048\n") == (37.0, 12.0, 2048.0)
    assert parse("[N/A], 12, 2048") == (None, 12.0, 2048.0)
    assert parse("37, [Not Supported], [N/A]") == (37.0, None, None)
    assert parse("[N/A], [N/A], [N/A]") is None and parse("Fake GPU, 580.00") is None and parse("") is None


def test_a_slow_nvidia_smi_start_gives_no_baseline_and_no_error(fake_gpu, work, tmp_path):
    env, _ = fake_gpu
    bench = _bench()
    slow = bench.GpuSampler(0, work, dict(env, FAKE_SMI_SLOW_START="2"))
    try:
        assert slow.memory_now(0.3) is None            # nothing yet
        assert slow.memory_now(30.0) in (2048, 2050)   # then its first rows
    finally:
        slow.stop()
    none = bench.GpuSampler(0, work, dict(env, PATH="/nonexistent"))
    assert none.memory_now(5.0) is None and "not on PATH" in none.why
    none.stop()
