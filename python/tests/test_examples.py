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
                             "--records", "16", "--max-packet", "32768", "--wait-subscribers", "1", "--lease-ms", "30000", "--json"],
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


def _example(name):
    """An example's globals, imported without running it."""
    import runpy
    return runpy.run_path(str(EX / name), run_name="not_main")


def test_nvr_detector_with_random_weights_keeps_only_boxes_above_its_score():
    from types import SimpleNamespace
    limit = _example("nvr_detector.py")["limit_random_postprocess"]
    # ssdlite320's own post-processing: threshold 0.001, 300 candidates per class.
    ssd = SimpleNamespace(score_thresh=0.001, topk_candidates=300)
    assert limit(ssd, 0.5) == {"score_thresh": 0.5, "topk_candidates": 10}
    assert (ssd.score_thresh, ssd.topk_candidates) == (0.5, 10)
    rcnn = SimpleNamespace(roi_heads=SimpleNamespace(score_thresh=0.05))
    assert limit(rcnn, 0.5) == {"roi_heads.score_thresh": 0.5} and rcnn.roi_heads.score_thresh == 0.5
    # Never looser than the network's own.
    strict = SimpleNamespace(score_thresh=0.7, topk_candidates=5)
    assert limit(strict, 0.5) == {"score_thresh": 0.7, "topk_candidates": 5}


def test_nvr_detector_limits_post_processing_for_random_weights_only(monkeypatch, capsys):
    """load_model with a stand-in torchvision: random weights get the
    network's threshold at --score and say so; pretrained ones are left as
    they are."""
    from types import ModuleType, SimpleNamespace

    class Net(SimpleNamespace):
        def eval(self):
            return self

        def to(self, _device):
            return self

    def ssdlite(weights=None, weights_backbone=None):
        if weights == "DEFAULT" and not pretrained_here:
            raise RuntimeError("no network")
        return Net(score_thresh=0.001, topk_candidates=300, weights=weights, box_coder=None, nms_thresh=0.55,
                   detections_per_img=300, anchor_generator=None)

    tv = ModuleType("torchvision")
    tv.models = SimpleNamespace(detection=SimpleNamespace(ssdlite320_mobilenet_v3_large=ssdlite))
    monkeypatch.setitem(sys.modules, "torchvision", tv)
    monkeypatch.syspath_prepend(str(EX))   # ssd_postprocess.py, beside the script
    load = _example("nvr_detector.py")["load_model"]
    pretrained_here = False
    model, pretrained, post = load("ssdlite320_mobilenet_v3_large", "cpu", False, False, 0.4)
    assert (pretrained, post) == (False, {"score_thresh": 0.4, "topk_candidates": 10, "batched": True})
    assert (model.score_thresh, model.topk_candidates) == (0.4, 10)
    assert callable(model.postprocess_detections), "an SSD's post-processing is batched"
    err = capsys.readouterr().err
    assert "RANDOM weights" in err and "keeps only boxes scoring above --score 0.4" in err, err
    pretrained_here = True
    model, pretrained, post = load("ssdlite320_mobilenet_v3_large", "cpu", False, False, 0.4)
    assert (pretrained, post) == (True, {"batched": True})
    assert (model.score_thresh, model.topk_candidates) == (0.001, 300)
    model, pretrained, post = load("ssdlite320_mobilenet_v3_large", "cpu", False, False, 0.4, True)
    assert post == {} and not hasattr(model, "postprocess_detections"), "torchvision's own, when asked"


def test_nvr_readers_sum_the_tensor_cache_over_their_cameras():
    stats = [{"tensors_cache": "on", "tensors_made": 8, "tensors_reused": 100, "tensors_busy": 1},
             {"tensors_cache": "on", "tensors_made": 8, "tensors_reused": 90, "tensors_busy": 0},
             {"tensors_cache": "off: the consumer kept a tensor", "tensors_made": 50, "tensors_reused": 0,
              "tensors_busy": 0},
             {"tensors_cache": None, "tensors_made": 0, "tensors_reused": 0, "tensors_busy": 0},
             None]
    want = {"tensors_cache": {"on": 2, "off: the consumer kept a tensor": 1, "none": 1, "unknown": 1},
            "tensors_made": 66, "tensors_reused": 190, "tensors_busy": 1}
    for name in NVR_EXAMPLES:
        assert _example(name)["tensor_cache"](stats) == want, name


def test_nvr_examples_without_a_camera_exit_2(tmp_path):
    for name in NVR_EXAMPLES:
        r = subprocess.run([sys.executable, str(EX / name), "--dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "no camera" in r.stderr, (name, r.stderr)


def test_nvr_motion_reads_every_frame_of_two_host_cameras_by_push(producer, sock, examples):
    # Two cameras in one directory, as nvr_decoder makes them.
    lines = _run_on_two_cameras(producer, sock, examples, "nvr_motion.py", "--numpy", "--frames", "40",
                                "--report", "0.2")
    assert lines[0]["delivery"] == "push" and lines[0]["scoring"] == ["numpy"]
    finals = {l["camera"]: l for l in lines if l["event"] == "camera-final"}
    for cam in ("cam", "cam2"):
        assert finals[cam]["frames"] == 40 and finals[cam]["end"] == "frames", finals
        assert finals[cam]["delivery"] == "push", finals
        # The test pattern changes every pixel every frame: that is motion.
        assert finals[cam]["motion_events"] >= 1, finals


def _torch_here():
    import importlib.util
    return importlib.util.find_spec("torch") is not None


def _json_lines(text):
    return [json.loads(l) for l in text.splitlines() if l.startswith("{")]


def _two_host_cameras(producer, sock, examples, frames=0, fps=100):
    """The fixture's host producer and a second beside it (`frames` at
    `fps`, 0: for ever), as nvr_decoder --host-memory makes them. A second
    with a frame count waits for its first subscriber, so a slow start of
    the reader cannot find it already gone."""
    producer(frames=0, fps=100)
    d = os.path.dirname(sock)
    wait = {"wait_subscribers": 1} if frames else {}
    second = conftest.Producer(examples / "producer", os.path.join(d, "cam2.sock"), backend="host",
                               format="nv12", width=320, height=240, frames=frames, fps=fps, **wait)
    return d, second


def _run_on_two_cameras(producer, sock, examples, script, *args, frames=0, fps=100):
    """`script --dir D *args` over `_two_host_cameras` (the second's
    `frames` at `fps`): asserts that it exited 0 and that its ready line
    names both cameras; returns its JSON lines."""
    d, second = _two_host_cameras(producer, sock, examples, frames=frames, fps=fps)
    try:
        r = subprocess.run([sys.executable, str(EX / script), "--dir", d, *args],
                           capture_output=True, text=True, timeout=120)
    finally:
        second.kill()
    assert r.returncode == 0, r.stderr
    lines = _json_lines(r.stdout)
    assert lines[0]["event"] == "ready" and sorted(lines[0]["cameras"]) == ["cam", "cam2"], lines[0]
    return lines


def _ticks_are_cumulative(ticks, key):
    assert len(ticks) >= 2, ticks
    t = [x["t_ns"] for x in ticks]
    assert t == sorted(t), "t_ns only grows"
    v = [x[key] for x in ticks]
    assert v == sorted(v), f"{key} is a running total"


def test_nvr_motion_splits_its_cameras_over_worker_processes(producer, sock, examples):
    # --procs 2: a camera per worker; the parent's ticks add up the workers'
    # counters and its final line counts every frame. cam2's publisher ends
    # after 3 s: its worker ends, and the other reads on to --frames.
    lines = _run_on_two_cameras(producer, sock, examples, "nvr_motion.py", "--device", "cpu", "--procs", "2",
                                "--frames", "600", "--report", "0.2", frames=30, fps=10)
    ready = lines[0]
    assert ready["procs"] == 2 and ready["scoring"] == ["numpy"], ready
    ticks = [l for l in lines if l["event"] == "tick"]
    _ticks_are_cumulative(ticks, "frames")
    finals = {l["camera"]: l for l in lines if l["event"] == "camera-final"}
    assert finals["cam"]["frames"] == 600 and finals["cam"]["end"] == "frames", finals
    assert 0 < finals["cam2"]["frames"] <= 30 and finals["cam2"]["end"].startswith("ProducerGone"), finals
    final = lines[-1]
    assert final["event"] == "final" and final["ended"] == 2, final
    assert final["frames"] == 600 + finals["cam2"]["frames"], (final, finals)
    assert (ticks[-1]["frames"], ticks[-1]["drops"]) == (final["frames"], final["drops"]), (ticks[-1], final)
    assert final["tensors_cache"] == {"none": 2}, final


def test_nvr_detector_reads_host_cameras_with_numpy_and_reports_ticks(producer, sock, examples):
    lines = _run_on_two_cameras(producer, sock, examples, "nvr_detector.py", "--model", "none", "--device", "cpu",
                                "--fps", "20", "--seconds", "2", "--report", "0.3")
    ready = lines[0]
    assert (ready["input"], ready["device"], ready["delivery"]) == (["host"], "cpu", "push"), ready
    assert ready["postprocess"] == {}, "--model none has no post-processing to limit"
    ticks = [l for l in lines if l["event"] == "tick"]
    _ticks_are_cumulative(ticks, "detections")
    latencies = [ms for t in ticks for ms in t["latency_ms"]]
    final = lines[-1]
    assert final["event"] == "final" and final["detections"] >= 2, final
    assert len(latencies) == final["detections"], "each detection's latency is in exactly one tick"
    assert all(ms >= 0 for ms in latencies), latencies
    assert final["input"] == ["host"] and final["gone"] == 0, final
    # The tensor cache of each camera's subscriber (numpy asks for no tensors).
    assert final["tensors_cache"] == {"none": 2}, final
    assert all(final[k] == 0 for k in ("tensors_made", "tensors_reused", "tensors_busy")), final


def test_nvr_motion_on_host_cameras_reports_ticks_and_scores_where_asked(producer, sock, examples):
    d, second = _two_host_cameras(producer, sock, examples)
    try:
        r = subprocess.run([sys.executable, str(EX / "nvr_motion.py"), "--dir", d, "--device", "cpu",
                            "--frames", "30", "--report", "0.2"], capture_output=True, text=True, timeout=120)
        auto = None
        if not _torch_here():
            # --device auto on a host ring, torch absent: numpy on the CPU.
            auto = subprocess.run([sys.executable, str(EX / "nvr_motion.py"), "--dir", d, "--frames", "5"],
                                  capture_output=True, text=True, timeout=120)
    finally:
        second.kill()
    assert r.returncode == 0, r.stderr
    lines = _json_lines(r.stdout)
    assert lines[0]["scoring"] == ["numpy"], lines[0]
    _ticks_are_cumulative([l for l in lines if l["event"] == "tick"], "frames")
    final = lines[-1]
    assert final["event"] == "final" and final["frames"] == 60 and final["scoring"] == ["numpy"], final
    last_tick = [l for l in lines if l["event"] == "tick"][-1]
    assert (last_tick["frames"], last_tick["drops"]) == (final["frames"], final["drops"]), (last_tick, final)
    # The tensor cache, per camera and over both (numpy asks for no tensors).
    assert final["tensors_cache"] == {"none": 2}, final
    cams = [l for l in lines if l["event"] == "camera-final"]
    assert [c["tensors_cache"] for c in cams] == ["none", "none"], cams
    for line in (final, *cams):
        assert all(line[k] == 0 for k in ("tensors_made", "tensors_reused", "tensors_busy")), line
    if auto is not None:
        assert auto.returncode == 0, auto.stderr
        assert _json_lines(auto.stdout)[0]["scoring"] == ["numpy"], auto.stdout


def test_nvr_readers_asked_for_the_gpu_without_torch_say_why_and_exit_1(producer, sock):
    if _torch_here():
        import pytest
        pytest.skip("torch is installed here: this is about a machine without it")
    producer(frames=0, fps=50)
    d = os.path.dirname(sock)
    for name, args in (("nvr_detector.py", []), ("nvr_detector.py", ["--model", "none"]),
                       ("nvr_motion.py", ["--device", "cuda"])):
        r = subprocess.run([sys.executable, str(EX / name), "--dir", d, "--seconds", "1", *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, (name, args, r.returncode, r.stderr)
        assert "torch is not installed" in r.stderr and "Traceback" not in r.stderr, (name, r.stderr)
