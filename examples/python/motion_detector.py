"""A Frigate-style motion detector on a vramring camera.

Subscribes in `latest` mode (a slow detector skips to the newest frame
instead of falling behind), takes the luma plane of each frame as a tensor
without another copy, and computes a motion score the way Frigate's
detector does: downscale, blur, difference against a running average,
threshold, and the fraction of pixels that changed. On a CUDA ring with
torch installed, all of it runs on the GPU; otherwise numpy on the host
(a host ring, or a CUDA ring read through torch and moved to the CPU).

    cargo run --release --example producer -- --socket /tmp/cam1.sock --fps 30
    python3 examples/python/motion_detector.py --socket /tmp/cam1.sock

Prints one line per motion event (start/end) and a status line every
second. Exit status 0 at the end of the stream, 2 when the camera is not
there, 1 on other errors (the message says why).
"""

import argparse
import sys
import time

import vramring

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # numpy-only installs
    torch = None
import numpy as np


class TorchMotion:
    """Motion score on the device the frame lives on."""

    def __init__(self, scale, threshold, alpha):
        self.scale, self.threshold, self.alpha = scale, threshold, alpha
        self.avg = None
        k = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0])
        self.kernel = (k[:, None] * k[None, :] / 256.0)[None, None]

    def score(self, frame):
        y = torch.from_dlpack(frame.plane(0))  # rows x width uint8, pitch stride, no copy
        small = F.avg_pool2d(y[None, None].float(), self.scale)
        blur = F.conv2d(small, self.kernel.to(small.device), padding=2)
        if self.avg is None or self.avg.shape != blur.shape:
            self.avg = blur.clone()
            return 0.0
        changed = (blur - self.avg).abs() > self.threshold
        self.avg.mul_(1 - self.alpha).add_(blur, alpha=self.alpha)
        return float(changed.float().mean())  # one sync per frame


class NumpyMotion:
    def __init__(self, scale, threshold, alpha):
        self.scale, self.threshold, self.alpha = scale, threshold, alpha
        self.avg = None

    def luma(self, frame):
        if frame.__dlpack_device__()[0] == 1:
            return np.from_dlpack(frame.plane(0))
        return torch.from_dlpack(frame.plane(0)).cpu().numpy()  # CUDA ring, CPU scoring

    def score(self, frame):
        y = self.luma(frame)
        s = self.scale
        h, w = (y.shape[0] // s) * s, (y.shape[1] // s) * s
        small = y[:h, :w].reshape(h // s, s, w // s, s).mean(axis=(1, 3))
        blur = (small + np.roll(small, 1, 0) + np.roll(small, -1, 0) + np.roll(small, 1, 1) + np.roll(small, -1, 1)) / 5
        if self.avg is None or self.avg.shape != blur.shape:
            self.avg = blur.copy()
            return 0.0
        changed = np.abs(blur - self.avg) > self.threshold
        self.avg = self.avg * (1 - self.alpha) + blur * self.alpha
        return float(changed.mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True, help="the camera's vramring socket")
    ap.add_argument("--threshold", type=float, default=25.0, help="luma change that counts as motion")
    ap.add_argument("--min-area", type=float, default=0.005, help="fraction of pixels that must change")
    ap.add_argument("--scale", type=int, default=4, help="downscale factor before scoring")
    ap.add_argument("--alpha", type=float, default=0.1, help="running-average weight of a new frame")
    ap.add_argument("--frames", type=int, default=0, help="stop after this many frames (0: until the camera goes)")
    ap.add_argument("--numpy", action="store_true", help="score on the CPU with numpy even when torch is here")
    ap.add_argument("--timeout", type=float, default=5.0)
    a = ap.parse_args()
    try:
        sub = vramring.Subscriber(a.socket, name="motion", mode="latest", timeout=a.timeout)
    except (vramring.IoError, vramring.Timeout) as e:
        print(f"motion: no camera at {a.socket}: {e}", file=sys.stderr)
        return 2
    use_torch = torch is not None and not a.numpy
    det = (TorchMotion if use_torch else NumpyMotion)(a.scale, a.threshold, a.alpha)
    print(f"motion: {sub.format} {sub.width}x{sub.height} on {sub.backend}, scoring with "
          f"{'torch' if use_torch else 'numpy'}", flush=True)
    moving, n, last_status, scores = False, 0, time.monotonic(), []
    try:
        for frame in sub:
            s = det.score(frame)
            scores.append(s)
            if s >= a.min_area and not moving:
                moving = True
                print(f"motion start: frame {frame.seq} pts {frame.pts} score {s:.4f}", flush=True)
            elif s < a.min_area / 2 and moving:
                moving = False
                print(f"motion end: frame {frame.seq} pts {frame.pts}", flush=True)
            n += 1
            if time.monotonic() - last_status >= 1.0:
                st = sub.stats()
                print(f"status: {n} frames scored, {st['dropped']} skipped, max score {max(scores):.4f}", flush=True)
                last_status, scores = time.monotonic(), []
            if a.frames and n >= a.frames:
                break
    except vramring.VramringError as e:
        print(f"motion: {e}", file=sys.stderr)
        return 1
    finally:
        sub.close()
    print(f"motion: done after {n} frames", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
