"""An object detector over many vramring cameras, all on the GPU.

Subscribes to every camera ring (push delivery, latest frame: the decoder's
process copies each frame into this process's own GPU buffers), and at a
configurable rate per camera (default 5 fps) takes each due camera's newest
frame, converts NV12 to RGB and resizes it on the GPU with torch ops on the
DLPack tensors (no host copy of a frame), batches the cameras that are due
into one forward pass of a torchvision detection network, and reports per
camera, as JSON lines, detections per second and the latency from the
decoder's commit of the frame to the detections being on the host.

    cargo run --release --features nvdec --example nvr_decoder -- --config examples/nvr/cameras.example.toml
    python3 examples/python/nvr_detector.py --dir /tmp/vramring-nvr

Pretrained weights are used only if torchvision has them offline (its
cache); otherwise the network runs with random weights, which measures the
cost of detection, not its accuracy (the script says so). torch and
torchvision are imported only when it runs, so --help works without them.
Exit status 0 at the end (--seconds, Ctrl-C, or every camera gone), 2 when
no camera is found, 1 on other errors.
"""

import argparse
import json
import os
import sys
import time

MODELS = ("ssdlite320_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn",
          "fasterrcnn_mobilenet_v3_large_fpn")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sockets", nargs="*", help="camera ring sockets (or use --dir)")
    ap.add_argument("--dir", help="every frame ring in this directory (*.sock, not *.packets.sock)")
    ap.add_argument("--expect", type=int, default=0,
                    help="with --dir: wait up to --timeout seconds for this many rings to appear")
    ap.add_argument("--fps", type=float, default=5.0, help="detections per second per camera")
    ap.add_argument("--model", choices=MODELS, default=MODELS[0], help="torchvision detection network")
    ap.add_argument("--size", type=int, default=320, help="the network's input: frames are resized to size x size")
    ap.add_argument("--score", type=float, default=0.5, help="detections below this score are not counted")
    ap.add_argument("--half", action="store_true", help="run the network in float16")
    ap.add_argument("--random-weights", action="store_true",
                    help="do not look for pretrained weights (measures cost only)")
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


def load_model(name, device, half, random_weights):
    """The network, eval mode, on `device`; pretrained only if available offline."""
    import torchvision
    ctor = getattr(torchvision.models.detection, name)
    model, pretrained = None, False
    if not random_weights:
        try:
            model, pretrained = ctor(weights="DEFAULT"), True
        except Exception as e:  # no network and nothing cached
            print(f"nvr_detector: no pretrained weights for {name} here ({type(e).__name__}: {e})",
                  file=sys.stderr, flush=True)
    if model is None:
        print("nvr_detector: using RANDOM weights: the figures measure the cost of detection, not its accuracy",
              file=sys.stderr, flush=True)
        model = ctor(weights=None, weights_backbone=None)
    model = model.eval().to(device)
    if half:
        model = model.half()
    return model, pretrained


def nv12_to_rgb(frame, size, dtype):
    """NV12 frame (DLPack, on the GPU) -> 3 x size x size RGB in [0, 1], BT.709
    limited range, resized on the GPU. No host copy."""
    import torch
    import torch.nn.functional as F
    y = torch.from_dlpack(frame.plane(0))           # rows x width, pitch stride
    uv = torch.from_dlpack(frame.plane(1))          # rows/2 x width/2 x 2
    y = F.interpolate(y[None, None].to(dtype), size=(size, size), mode="bilinear", align_corners=False)[0, 0]
    uv = F.interpolate(uv.permute(2, 0, 1)[None].to(dtype), size=(size, size), mode="bilinear",
                       align_corners=False)[0]
    yy = (y - 16.0) * (255.0 / 219.0)
    u, v = (uv[0] - 128.0) * (255.0 / 224.0), (uv[1] - 128.0) * (255.0 / 224.0)
    r = yy + 1.5748 * v
    g = yy - 0.1873 * u - 0.4681 * v
    b = yy + 1.8556 * u
    return (torch.stack((r, g, b)) / 255.0).clamp_(0.0, 1.0)


class Camera:
    def __init__(self, path, sub):
        self.path, self.sub = path, sub
        self.name = os.path.basename(path).removesuffix(".sock")
        self.due = time.monotonic()
        self.gone = False
        self.window = {"detections": 0, "objects": 0, "latency_ms": [], "missed": 0}
        self.total = 0


def percentile(v, p):
    if not v:
        return 0.0
    s = sorted(v)
    return s[min(len(s) - 1, int(round((len(s) - 1) * p)))]


def main(argv=None):
    a = parse_args(argv)
    paths = find_sockets(a)
    if not paths:
        print("nvr_detector: no camera: give sockets or --dir", file=sys.stderr)
        return 2
    import torch
    import vramring
    if not torch.cuda.is_available():
        print("nvr_detector: torch sees no CUDA GPU; this example runs on the GPU only", file=sys.stderr)
        return 1
    device = torch.device("cuda")
    cams = []
    for p in paths:
        try:
            sub = vramring.Subscriber(p, name="nvr-detector", mode="latest", push=True,
                                      connect_timeout=a.timeout, timeout=a.timeout)
        except vramring.VramringError as e:
            print(f"nvr_detector: skipping {p}: {e}", file=sys.stderr, flush=True)
            continue
        if sub.backend != "cuda" or sub.format != "nv12":
            print(f"nvr_detector: skipping {p}: a {sub.format} ring on {sub.backend}; this reads NV12 on CUDA",
                  file=sys.stderr, flush=True)
            sub.close()
            continue
        cams.append(Camera(p, sub))
    if not cams:
        print("nvr_detector: no usable camera", file=sys.stderr)
        return 2
    dtype = torch.float16 if a.half else torch.float32
    model, pretrained = load_model(a.model, device, a.half, a.random_weights)
    print(json.dumps({"event": "ready", "role": "nvr_detector", "cameras": [c.name for c in cams],
                      "model": a.model, "pretrained": pretrained, "fps_per_camera": a.fps, "size": a.size}),
          flush=True)
    period = 1.0 / a.fps if a.fps > 0 else 0.0
    start = last_report = time.monotonic()
    batches, batch_sizes = 0, 0
    try:
        with torch.inference_mode():
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
                        continue
                    except (vramring.ProducerGone, vramring.Evicted) as e:
                        print(f"nvr_detector: camera {c.name}: {e}", file=sys.stderr, flush=True)
                        c.gone = True
                        continue
                    c.due = max(c.due + period, now)    # behind: no burst to catch up
                    batch.append(nv12_to_rgb(f, a.size, dtype))
                    taken.append((c, f.commit_ns))
                    del f                                # the tensor made from it keeps what it needs
                if batch:
                    out = model(batch)                   # one forward pass for every due camera
                    scores = [o["scores"].float().cpu() for o in out]   # the results, to the host (syncs)
                    done = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
                    batches += 1
                    batch_sizes += len(batch)
                    for (c, commit_ns), s in zip(taken, scores):
                        c.window["detections"] += 1
                        c.total += 1
                        c.window["objects"] += int((s >= a.score).sum())
                        c.window["latency_ms"].append((done - commit_ns) / 1e6)
                else:
                    nxt = min((c.due for c in live), default=now + 0.01)
                    time.sleep(min(max(nxt - time.monotonic(), 0.0005), 0.01))
                if time.monotonic() - last_report >= a.report:
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
    except KeyboardInterrupt:
        pass
    finally:
        for c in cams:
            c.sub.close()
    secs = time.monotonic() - start
    print(json.dumps({"event": "final", "role": "nvr_detector", "seconds": round(secs, 2),
                      "detections": sum(c.total for c in cams), "batches": batches,
                      "mean_batch": round(batch_sizes / batches, 2) if batches else 0.0,
                      "pretrained": pretrained}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
