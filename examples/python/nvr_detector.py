"""An object detector over many vramring cameras, on the GPU.

Subscribes to every camera ring (push delivery, latest frame: the decoder's
process copies each frame into this process's own buffers; --pull to pull
instead), and at a configurable rate per camera (default 5 fps) takes each
due camera's newest frame, converts NV12 to RGB and resizes it on the GPU
with torch ops on the DLPack tensors, batches the cameras that are due into
one forward pass of a torchvision detection network, and reports per
camera, as JSON lines, detections per second and the latency from the
decoded picture reaching nvr_decoder's sink (the CLOCK_MONOTONIC time in
bytes 8..16 of the frame's metadata; the frame's commit time for a ring
without it) to the detections being on the host.

The frame's memory decides the path (each ring's `backend`): a CUDA ring's
frame is already on the GPU (no host copy of a frame); a host ring's frame
(`nvr_decoder --host-memory`, the host-memory way) is uploaded to the GPU
here, both planes, before the same conversion ("input" in the ready line:
"cuda" or "host-upload"). With --device cpu the work stays on the CPU
(host rings only); --model none runs no network (each frame is converted
and reduced to one number: the cost of delivery and conversion), and with
--device cpu it needs numpy only, not torch.

    cargo run --release --features nvdec --example nvr_decoder -- --config examples/nvr/cameras.example.toml
    python3 examples/python/nvr_detector.py --dir /tmp/vramring-nvr

Besides the per-camera lines, every --report seconds one
{"event":"tick"} line with the CLOCK_MONOTONIC time t_ns, the totals so far
and the latencies of the detections since the last tick (what
benches/nvr_scale.py measures over its window), and at the end
{"event":"final"}, with the tensor cache's state over the cameras
(tensors_cache: cameras per state, "on" when each buffer's planes were
imported once; tensors_made, tensors_reused, tensors_busy summed).

Pretrained weights are used only if torchvision has them offline (its
cache); otherwise the network runs with random weights, which measures the
cost of detection, not its accuracy (the script says so). With random
weights the network's own post-processing keeps only boxes scoring above
--score (and ssdlite/ssd only a few candidates per class), as a trained
model's few confident boxes would: every random class score is about 1/91,
above ssdlite's own threshold of 0.001, so it would otherwise keep some
27 000 boxes per image and run NMS on them class by class, a CPU cost no
trained model has. An SSD's post-processing runs batched
(ssd_postprocess.py: the same detections, without torchvision's host
round trip per class and image) unless --torchvision-postprocess. torch
and torchvision are imported only when it runs, so --help works without
them.
Exit status 0 at the end (--seconds, Ctrl-C, or every camera gone), 2 when
no camera is found, 1 on other errors.
"""

import argparse
import contextlib
import json
import os
import sys
import time

MODELS = ("ssdlite320_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn",
          "fasterrcnn_mobilenet_v3_large_fpn", "none")
# With random weights: the candidates per class ssdlite/ssd keeps before NMS.
RANDOM_TOPK = 10


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sockets", nargs="*", help="camera ring sockets (or use --dir)")
    ap.add_argument("--dir", help="every frame ring in this directory (*.sock, not *.packets.sock)")
    ap.add_argument("--expect", type=int, default=0,
                    help="with --dir: wait up to --timeout seconds for this many rings to appear")
    ap.add_argument("--fps", type=float, default=5.0, help="detections per second per camera")
    ap.add_argument("--model", choices=MODELS, default=MODELS[0],
                    help="torchvision detection network (none: convert and reduce each frame, no network)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="where the work runs: cuda (a host ring's frames are uploaded) or cpu (host rings only)")
    ap.add_argument("--pull", action="store_true", help="pull frames from the ring instead of push delivery")
    ap.add_argument("--size", type=int, default=320, help="the network's input: frames are resized to size x size")
    ap.add_argument("--score", type=float, default=0.5,
                    help="detections below this score are not counted (with random weights the network's "
                         "post-processing drops them)")
    ap.add_argument("--half", action="store_true", help="run the network in float16")
    ap.add_argument("--random-weights", action="store_true",
                    help="do not look for pretrained weights (measures cost only)")
    ap.add_argument("--torchvision-postprocess", action="store_true",
                    help="keep torchvision's own SSD post-processing (a host round trip per class and image) "
                         "instead of ssd_postprocess.py's batched form")
    ap.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: until Ctrl-C)")
    ap.add_argument("--report", type=float, default=1.0, help="seconds between status lines")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for a camera to connect")
    return ap.parse_args(argv)


def find_sockets(a):
    """The sockets given, and the frame rings in --dir (waiting for --expect of them)."""
    deadline = time.monotonic() + a.timeout
    while True:
        found = []
        if a.dir and os.path.isdir(a.dir):
            found = [os.path.join(a.dir, n) for n in sorted(os.listdir(a.dir))
                     if n.endswith(".sock") and not n.endswith(".packets.sock")]
        if len(found) >= a.expect or time.monotonic() >= deadline:
            return list(a.sockets) + found
        time.sleep(0.1)


def limit_random_postprocess(model, score, topk=RANDOM_TOPK):
    """Makes a randomly initialised network's post-processing keep only
    boxes scoring above `score` (never loosening a threshold it has), and
    ssdlite/ssd keep at most `topk` candidates per class: the few boxes a
    trained model would keep, not every one of its random ~1/91 scores.
    Returns what it set, {attribute: value}."""
    done = {}
    if hasattr(model, "score_thresh"):                  # ssdlite, ssd
        model.score_thresh = max(model.score_thresh, score)
        done["score_thresh"] = model.score_thresh
        if hasattr(model, "topk_candidates"):
            model.topk_candidates = min(model.topk_candidates, topk)
            done["topk_candidates"] = model.topk_candidates
    roi = getattr(model, "roi_heads", None)
    if roi is not None and hasattr(roi, "score_thresh"):  # faster-rcnn
        roi.score_thresh = max(roi.score_thresh, score)
        done["roi_heads.score_thresh"] = roi.score_thresh
    return done


def load_model(name, device, half, random_weights, score, torchvision_postprocess=False):
    """The network, eval mode, on `device`, and what was set on its
    post-processing ({} when pretrained); pretrained only if available
    offline, else random weights post-processed as limit_random_postprocess
    says; an SSD's post-processing batched (ssd_postprocess.py) unless
    `torchvision_postprocess`."""
    import torchvision
    ctor = getattr(torchvision.models.detection, name)
    model, pretrained = None, False
    if not random_weights:
        try:
            model, pretrained = ctor(weights="DEFAULT"), True
        except Exception as e:  # no network and nothing cached
            print(f"nvr_detector: no pretrained weights for {name} here ({type(e).__name__}: {e})",
                  file=sys.stderr, flush=True)
    postprocess = {}
    if model is None:
        model = ctor(weights=None, weights_backbone=None)
        postprocess = limit_random_postprocess(model, score)
        print("nvr_detector: using RANDOM weights: the figures measure the cost of detection, not its accuracy; "
              f"its post-processing keeps only boxes scoring above --score {score} ({postprocess}), as a trained "
              "model's few confident boxes would (every random score, about 1/91, passes the network's own "
              "threshold)", file=sys.stderr, flush=True)
    if not torchvision_postprocess:
        import ssd_postprocess
        if ssd_postprocess.batched(model):
            postprocess["batched"] = True
    model = model.eval().to(device)
    if half:
        model = model.half()
    return model, pretrained, postprocess


def planes(frame, upload_to):
    """The NV12 frame's Y (rows x width, pitch stride) and UV (rows/2 x
    width/2 x 2) planes as torch tensors where the frame is (no copy: made
    once per buffer, `Subscriber(tensors="torch")`), then, for a host frame
    going to the GPU, uploaded there."""
    y, uv = frame.tensors
    if upload_to is not None:
        y, uv = y.to(upload_to), uv.to(upload_to)   # host -> GPU: the host-memory way's upload
    return y, uv


def nv12_to_rgb(y, uv, size, dtype):
    """NV12 planes (torch, on the device) -> 3 x size x size RGB in [0, 1],
    BT.709 limited range, resized where the planes are."""
    import torch
    import torch.nn.functional as F
    y = F.interpolate(y[None, None].to(dtype), size=(size, size), mode="bilinear", align_corners=False)[0, 0]
    uv = F.interpolate(uv.permute(2, 0, 1)[None].to(dtype), size=(size, size), mode="bilinear",
                       align_corners=False)[0]
    yy = (y - 16.0) * (255.0 / 219.0)
    u, v = (uv[0] - 128.0) * (255.0 / 224.0), (uv[1] - 128.0) * (255.0 / 224.0)
    r = yy + 1.5748 * v
    g = yy - 0.1873 * u - 0.4681 * v
    b = yy + 1.8556 * u
    return (torch.stack((r, g, b)) / 255.0).clamp_(0.0, 1.0)


class TorchWork:
    """Detection with torch: the network (or, with --model none, the
    conversion and a mean) on `device`; a host frame for the GPU is
    uploaded first."""

    def __init__(self, a, device):
        import torch
        self.torch, self.a, self.device = torch, a, device
        self.dtype = torch.float16 if a.half else torch.float32
        self.model, self.pretrained, self.postprocess = (None, False, {}) if a.model == "none" else \
            load_model(a.model, device, a.half, a.random_weights, a.score, a.torchvision_postprocess)

    def input_of(self, backend):
        """How a frame of a ring on `backend` reaches the work, or None when it cannot."""
        gpu = self.device.type == "cuda"
        if backend == "cuda":
            return "cuda" if gpu else None
        return "host-upload" if gpu else "host"

    def prepare(self, frame, how):
        y, uv = planes(frame, self.device if how == "host-upload" else None)
        return nv12_to_rgb(y, uv, self.a.size, self.dtype)

    def run(self, batch):
        """One forward pass; the per-image scores on the host (this syncs)."""
        if self.model is None:
            return [m.reshape(1) for m in self.torch.stack(batch).mean(dim=(1, 2, 3)).float().cpu()]
        scores = [o["scores"] for o in self.model(batch)]
        # One copy to the host for the batch (one wait), not one per image.
        return list(self.torch.cat(scores).float().cpu().split([len(x) for x in scores]))


class NumpyWork:
    """--model none --device cpu on host rings: the luma's mean with numpy,
    no torch (measures delivery alone)."""

    def __init__(self, a):
        import numpy as np
        self.np, self.model, self.pretrained, self.postprocess = np, None, False, {}

    def input_of(self, backend):
        return "host" if backend == "host" else None

    def prepare(self, frame, how):
        y = self.np.from_dlpack(frame.plane(0))
        return self.np.array([y[::4, ::4].mean()], dtype=self.np.float32)

    def run(self, batch):
        return batch


class Camera:
    def __init__(self, path, sub, how):
        self.path, self.sub, self.how = path, sub, how
        self.name = os.path.basename(path).removesuffix(".sock")
        self.due = time.monotonic()
        self.gone = False
        self.window = {"detections": 0, "objects": 0, "latency_ms": [], "missed": 0}
        self.total = 0
        self.missed = 0
        self.stats = None   # the subscriber's last stats(), read before it closes


def decoded_ns(frame):
    """When nvr_decoder's sink got the decoded picture (CLOCK_MONOTONIC,
    metadata bytes 8..16), else when the frame was committed."""
    meta = frame.meta
    if len(meta) >= 16:
        t = int.from_bytes(meta[8:16], "little")
        if 0 < frame.commit_ns - t < 10_000_000_000:   # not some other program's metadata
            return t
    return frame.commit_ns


TENSOR_COUNTERS = ("tensors_made", "tensors_reused", "tensors_busy")


def tensor_cache(stats):
    """The tensor cache over the cameras' last `stats()` (None: not read):
    tensors_cache counts the cameras in each state ("on"; "off: why" when
    the planes were imported per frame instead; "none" without tensors=;
    "unknown" when not read), the counters are summed. nvr_detector.py and
    nvr_motion.py each have this, so that each example stands alone."""
    states = {}
    for s in stats:
        state = "unknown" if s is None else (s.get("tensors_cache") or "none")
        states[state] = states.get(state, 0) + 1
    return {"tensors_cache": states, **{k: sum((s or {}).get(k, 0) for s in stats) for k in TENSOR_COUNTERS}}


def percentile(v, p):
    if not v:
        return 0.0
    s = sorted(v)
    return s[min(len(s) - 1, int(round((len(s) - 1) * p)))]


class Unavailable(Exception):
    """What --model/--device need is not here (a sentence)."""


def make_work(a):
    """The detection work of --model/--device; Unavailable says why not."""
    if a.model == "none" and a.device == "cpu":
        return NumpyWork(a)
    try:
        import torch
    except ImportError as e:
        raise Unavailable(f"torch is not installed here ({e}); --model {a.model} on --device {a.device} "
                          "needs it (only --model none --device cpu runs with numpy alone)") from e
    if a.device == "cuda" and not torch.cuda.is_available():
        raise Unavailable("torch sees no CUDA GPU; this example runs on the GPU (--device cpu reads "
                          "host rings without one)")
    return TorchWork(a, torch.device(a.device))


def main(argv=None):
    a = parse_args(argv)
    paths = find_sockets(a)
    if not paths:
        print("nvr_detector: no camera: give sockets or --dir", file=sys.stderr)
        return 2
    import vramring
    try:
        # torch and the network before subscribing: they take seconds.
        work = make_work(a)
    except Unavailable as e:
        print(f"nvr_detector: {e}", file=sys.stderr, flush=True)
        return 1
    cams = []
    for p in paths:
        try:
            sub = vramring.Subscriber(p, name="nvr-detector", mode="latest", push=not a.pull,
                                      connect_timeout=a.timeout, timeout=a.timeout,
                                      tensors="torch" if isinstance(work, TorchWork) else None)
        except vramring.VramringError as e:
            print(f"nvr_detector: skipping {p}: {e}", file=sys.stderr, flush=True)
            continue
        how = work.input_of(sub.backend)
        if how is None or sub.format != "nv12":
            where = "in GPU or host memory" if a.device == "cuda" else "in host memory only"
            print(f"nvr_detector: skipping {p}: a {sub.format} ring in {sub.backend} memory; --device {a.device} "
                  f"reads NV12 rings {where}", file=sys.stderr, flush=True)
            sub.close()
            continue
        cams.append(Camera(p, sub, how))
    if not cams:
        print("nvr_detector: no usable camera", file=sys.stderr)
        return 2
    pretrained = work.pretrained
    print(json.dumps({"event": "ready", "role": "nvr_detector", "cameras": [c.name for c in cams],
                      "model": a.model, "pretrained": pretrained, "postprocess": work.postprocess,
                      "fps_per_camera": a.fps, "size": a.size,
                      "device": a.device, "input": sorted({c.how for c in cams}),
                      "delivery": "pull" if a.pull else "push"}),
          flush=True)
    period = 1.0 / a.fps if a.fps > 0 else 0.0
    start = last_report = time.monotonic()
    batches, batch_sizes = 0, 0
    tick_latency, all_latency = [], []
    inference = getattr(work, "torch", None)
    try:
        with (inference.inference_mode() if inference else contextlib.nullcontext()):
            while True:
                now = time.monotonic()
                if a.seconds and now - start >= a.seconds:
                    break
                live = [c for c in cams if not c.gone]
                if not live:
                    break
                due = [c for c in live if c.due <= now]
                batch, taken = [], []
                for c in due:
                    try:
                        f = c.sub.next(timeout=0.001)     # the newest frame, if one came since the last
                    except vramring.Timeout:
                        c.window["missed"] += 1         # nothing new yet: try again at the next tick
                        c.missed += 1
                        continue
                    except (vramring.ProducerGone, vramring.Evicted) as e:
                        print(f"nvr_detector: camera {c.name}: {e}", file=sys.stderr, flush=True)
                        c.gone = True
                        continue
                    c.due = max(c.due + period, now)    # behind: no burst to catch up
                    batch.append(work.prepare(f, c.how))
                    taken.append((c, decoded_ns(f)))
                    del f                                # the tensor made from it keeps what it needs
                if batch:
                    scores = work.run(batch)             # one forward pass for every due camera; on the host
                    done = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                    batches += 1
                    batch_sizes += len(batch)
                    for (c, since_ns), sc in zip(taken, scores):
                        ms = (done - since_ns) / 1e6
                        c.window["detections"] += 1
                        c.total += 1
                        c.window["objects"] += int((sc >= a.score).sum())
                        c.window["latency_ms"].append(ms)
                        tick_latency.append(round(ms, 3))
                else:
                    nxt = min((c.due for c in live), default=now + 0.01)
                    time.sleep(min(max(nxt - time.monotonic(), 0.0005), 0.01))
                if a.report > 0 and time.monotonic() - last_report >= a.report:
                    dt = time.monotonic() - last_report
                    last_report = time.monotonic()
                    for c in cams:
                        w = c.window
                        print(json.dumps({
                            "event": "camera", "camera": c.name, "detections_per_s": round(w["detections"] / dt, 2),
                            "objects": w["objects"],
                            "latency_p50_ms": round(percentile(w["latency_ms"], 0.5), 2),
                            "latency_max_ms": round(max(w["latency_ms"], default=0.0), 2),
                            "no_new_frame": w["missed"], "gone": c.gone, "pretrained": pretrained,
                        }), flush=True)
                        c.window = {"detections": 0, "objects": 0, "latency_ms": [], "missed": 0}
                    print(json.dumps(tick(cams, tick_latency)), flush=True)
                    all_latency += tick_latency
                    tick_latency = []
    except KeyboardInterrupt:
        pass
    finally:
        for c in cams:
            try:
                c.stats = c.sub.stats()
            except vramring.VramringError as e:
                print(f"nvr_detector: camera {c.name}: no stats: {e}", file=sys.stderr, flush=True)
            c.sub.close()
    all_latency += tick_latency
    print(json.dumps(tick(cams, tick_latency)), flush=True)
    secs = time.monotonic() - start
    print(json.dumps({"event": "final", "role": "nvr_detector", "seconds": round(secs, 2),
                      "detections": sum(c.total for c in cams), "batches": batches,
                      "mean_batch": round(batch_sizes / batches, 2) if batches else 0.0,
                      "no_new_frame": sum(c.missed for c in cams),
                      "latency_p50_ms": round(percentile(all_latency, 0.5), 2),
                      "latency_p99_ms": round(percentile(all_latency, 0.99), 2),
                      "gone": sum(c.gone for c in cams), "input": sorted({c.how for c in cams}),
                      "pretrained": pretrained, **tensor_cache([c.stats for c in cams])}), flush=True)
    return 0


def tick(cams, latency):
    """The totals now, and the latencies (ms) of the detections since the last tick."""
    return {"event": "tick", "role": "nvr_detector", "t_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC),
            "detections": sum(c.total for c in cams), "no_new_frame": sum(c.missed for c in cams),
            "gone": sum(c.gone for c in cams), "latency_ms": latency}


if __name__ == "__main__":
    sys.exit(main())
