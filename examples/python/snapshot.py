"""Saves one frame of a vramring camera as an image (PPM for colour
formats, PGM for gray), converting NV12 to RGB on the host with numpy.

    python3 examples/python/snapshot.py --socket /tmp/cam1.sock --out cam1.ppm

Exit status 0 when the file was written, 2 when no camera is there or no
frame came in time, 1 for a format it cannot convert.
"""

import argparse
import sys

import numpy as np

import vramring


def host(view, frame):
    """A plane view as a host numpy array (copied off the GPU on a CUDA ring)."""
    if frame.__dlpack_device__()[0] == 1:
        return np.from_dlpack(view)
    import torch
    return torch.from_dlpack(view).cpu().numpy()


def nv12_to_rgb(y, uv):
    """BT.601 limited range, chroma upsampled by repetition."""
    y = y.astype(np.float32) - 16.0
    u = uv[..., 0].astype(np.float32).repeat(2, 0).repeat(2, 1)[: y.shape[0], : y.shape[1]] - 128.0
    v = uv[..., 1].astype(np.float32).repeat(2, 0).repeat(2, 1)[: y.shape[0], : y.shape[1]] - 128.0
    r = 1.164 * y + 1.596 * v
    g = 1.164 * y - 0.392 * u - 0.813 * v
    b = 1.164 * y + 2.017 * u
    return np.clip(np.stack([r, g, b], -1), 0, 255).astype(np.uint8)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--out", required=True, help="output file (.ppm or .pgm)")
    ap.add_argument("--timeout", type=float, default=5.0)
    a = ap.parse_args()
    try:
        with vramring.Subscriber(a.socket, name="snapshot") as sub:
            f = sub.next(a.timeout)
    except (vramring.IoError, vramring.Timeout, vramring.ProducerGone) as e:
        print(f"snapshot: no frame from {a.socket}: {e}", file=sys.stderr)
        return 2
    if f.format == "nv12":
        img, magic = nv12_to_rgb(host(f.plane(0), f), host(f.plane(1), f)), b"P6"
    elif f.format == "rgb8":
        img, magic = host(f.plane(0), f), b"P6"
    elif f.format == "rgba8":
        img, magic = host(f.plane(0), f)[..., :3], b"P6"
    elif f.format == "gray8":
        img, magic = host(f.plane(0), f), b"P5"
    else:
        print(f"snapshot: cannot convert {f.format} frames to an image", file=sys.stderr)
        return 1
    img = np.ascontiguousarray(img)
    with open(a.out, "wb") as fh:
        fh.write(b"%s\n%d %d\n255\n" % (magic, img.shape[1], img.shape[0]))
        fh.write(img.tobytes())
    print(f"snapshot: frame {f.seq} ({f.format} {f.width}x{f.height}) written to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
