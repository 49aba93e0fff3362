"""The Python examples run against the Rust producer."""

import json
import os
import subprocess
import sys

import conftest
from conftest import REPO

EX = REPO / "examples" / "python"


def test_motion_detector_scores_frames_with_numpy(producer, sock):
    producer(frames=0, fps=100)
    r = subprocess.run([sys.executable, str(EX / "motion_detector.py"), "--socket", sock, "--frames", "40", "--numpy"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "scoring with numpy" in r.stdout and "done after 40 frames" in r.stdout
    # The test pattern changes every pixel every frame: that is motion.
    assert "motion start" in r.stdout


def test_motion_detector_without_a_camera_exits_2(tmp_path):
    r = subprocess.run([sys.executable, str(EX / "motion_detector.py"), "--socket", str(tmp_path / "no.sock")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no camera" in r.stderr


def test_snapshot_writes_an_rgb_image(producer, sock, tmp_path):
    producer(frames=0, fps=50, width=160, height=90)
    out = tmp_path / "snap.ppm"
    r = subprocess.run([sys.executable, str(EX / "snapshot.py"), "--socket", sock, "--out", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    data = out.read_bytes()
    assert data.startswith(b"P6\n160 90\n255\n") and len(data) == len(b"P6\n160 90\n255\n") + 160 * 90 * 3


def test_lossless_python_recorder_is_byte_identical_to_the_clip(examples, sock, tmp_path):
    exe = examples / "packet_producer"
    assert exe.exists(), f"{exe} is missing: cargo build --example packet_producer"
    clip = REPO / "tests" / "data" / "clip.h264"
    # A 64 KiB ring for a 279 KiB clip: the lossless recorder holds the writer back.
    prod = subprocess.Popen([str(exe), "--socket", sock, "--input", str(clip), "--fps", "0", "--ring-bytes", "65536",
                             "--records", "16", "--max-packet", "32768", "--wait-subscribers", "1", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = tmp_path / "rec.h264"
    r = subprocess.run([sys.executable, str(EX / "recorder.py"), "--socket", sock, "--output", str(out)],
                       capture_output=True, text=True, timeout=120)
    pout, perr = prod.communicate(timeout=60)
    assert prod.returncode == 0, perr
    assert r.returncode == 0, r.stderr
    final = json.loads(r.stdout.strip().splitlines()[-1])
    assert (final["packets"], final["overruns"], final["end"]) == (300, 0, "producer gone")
    assert out.read_bytes() == clip.read_bytes()


NVR_EXAMPLES = ("nvr_detector.py", "nvr_motion.py")


def test_nvr_examples_print_help_without_importing_torch():
    for name in NVR_EXAMPLES:
        r = subprocess.run([sys.executable, str(EX / name), "--help"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "usage:" in r.stdout and "--dir" in r.stdout, r.stdout
        # Importing the module (what --help does first) loads neither torch nor torchvision.
        code = (f"import runpy, sys; runpy.run_path({str(EX / name)!r}, run_name='not_main'); "
                "assert 'torch' not in sys.modules and 'torchvision' not in sys.modules")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr


def test_nvr_examples_without_a_camera_exit_2(tmp_path):
    for name in NVR_EXAMPLES:
        r = subprocess.run([sys.executable, str(EX / name), "--dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "no camera" in r.stderr, (name, r.stderr)


def test_nvr_motion_reads_every_frame_of_two_host_cameras_by_push(producer, sock, examples):
    # Two cameras in one directory, as nvr_decoder makes them: the fixture's
    # producer and a second one beside it; plus a packet socket name to skip.
    producer(frames=0, fps=100)
    d = os.path.dirname(sock)
    second = conftest.Producer(examples / "producer", os.path.join(d, "cam2.sock"), backend="host",
                               format="nv12", width=320, height=240, frames=0, fps=100)
    try:
        r = subprocess.run([sys.executable, str(EX / "nvr_motion.py"), "--dir", d, "--numpy", "--frames", "40",
                            "--report", "0.2"], capture_output=True, text=True, timeout=120)
    finally:
        second.kill()
    assert r.returncode == 0, r.stderr
    lines = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    assert lines[0]["event"] == "ready" and sorted(lines[0]["cameras"]) == ["cam", "cam2"], lines[0]
    assert lines[0]["delivery"] == "push" and lines[0]["scoring"] == ["numpy"]
    finals = {l["camera"]: l for l in lines if l["event"] == "camera-final"}
    for cam in ("cam", "cam2"):
        assert finals[cam]["frames"] == 40 and finals[cam]["end"] == "frames", finals
        assert finals[cam]["delivery"] == "push", finals
        # The test pattern changes every pixel every frame: that is motion.
        assert finals[cam]["motion_events"] >= 1, finals
