"""The Python examples run against the Rust producer."""

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
