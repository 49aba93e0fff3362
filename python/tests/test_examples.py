"""The Python examples run against the Rust producer."""

import json
import subprocess
import sys

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
