"""GPU proof for the Python package (run on a CUDA machine, with torch).

Reads frames from a CUDA publisher (the Rust `producer` example with
`--backend cuda`), makes each one a CUDA tensor with `torch.from_dlpack`,
and checks it on the GPU against the self-checking test pattern
(src/testpattern.rs): seq words, every body word, the checksum. Prints one
JSON line with the counts. Exit status 1 if any frame was torn or wrong.

Each frame and tensor is dropped right after its check is *queued* (no
synchronisation), so push frames are zero-copy (the pushed buffer itself)
and the check kernels may still be reading a buffer when the next `next()`
lets the publisher have it back: the frame stays whole only because the
subscriber waits for the consumer stream's work first.

With --tensors the subscriber caches its tensors (`Subscriber(tensors="torch")`):
each frame's `frame.tensors` (Y and UV, made once per buffer and handed out
again) are checked against the pattern's bytes instead, and the buffer's
reuse depends on the cache's check and its event on torch's stream.

    python3 check_gpu.py --socket /tmp/cam.sock --mode pull --frames 10000 [--tensors]
"""

import argparse
import json
import sys
import time

import torch

import vramring

M = 0xFFFFFFFF


def mix32(x):
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & M
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & M
    return x ^ (x >> 16)


class GpuPattern:
    """The pattern check as int64 torch ops on the GPU (low 32 bits kept)."""

    def __init__(self, nbytes, device):
        self.n = nbytes // 4
        self.i = torch.arange(self.n, dtype=torch.int64, device=device)
        self.body = self.i >= 4

    def bad_words(self, frame_u8, seq):
        """A 0-d GPU tensor: words that differ from the pattern of `seq`
        (body, seq words, word count, checksum)."""
        w = frame_u8[: self.n * 4].view(torch.int32).to(torch.int64) & M
        lo = (seq * 0x9E3779B1) & M
        exp = mix32(lo ^ ((self.i + (seq >> 32)) & M))
        body_bad = ((w != exp) & self.body).sum()
        checksum = (w[4:].sum() & M) != w[2]
        head_bad = (w[0] != (seq & M)).int() + (w[1] != (seq >> 32)).int() + (w[3] != self.n).int()
        return body_bad + checksum.int() + head_bad

    def expected_bytes(self, seq):
        """The frame of `seq` as uint8 on the GPU (its first n * 4 bytes)."""
        lo = (seq * 0x9E3779B1) & M
        w = mix32(lo ^ ((self.i + (seq >> 32)) & M))
        w[0], w[1], w[3] = seq & M, seq >> 32, self.n
        w[2] = w[4:].sum() & M
        return torch.stack([(w >> s) & 0xFF for s in (0, 8, 16, 24)], dim=1).to(torch.uint8).reshape(-1)


def bad_plane_bytes(pat, f, y, uv):
    """A 0-d GPU tensor: bytes of the plane tensors `y`, `uv` of frame `f`
    that differ from the pattern of its seq."""
    exp = pat.expected_bytes(f.seq)
    bad = None
    for t, p in zip((y, uv), f.planes):
        e = exp[p.offset : p.offset + p.pitch * p.rows].view(p.rows, p.pitch)[:, : p.row_bytes].reshape(t.shape)
        n = (t != e).sum()
        bad = n if bad is None else bad + n
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--mode", choices=["pull", "push", "lossless"], default="pull")
    ap.add_argument("--frames", type=int, default=10000)
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--tensors", action="store_true", help="Subscriber(tensors='torch'): check frame.tensors")
    a = ap.parse_args()
    kw = dict(name=f"py-{a.mode}", connect_timeout=a.timeout)
    if a.tensors:
        kw["tensors"] = "torch"
    if a.mode == "push":
        kw["push"] = True
    elif a.mode == "lossless":
        kw["lossless"] = True
    else:
        kw["mode"] = "sequential"
    sub = vramring.Subscriber(a.socket, **kw)
    assert sub.backend == "cuda", f"expected a CUDA ring, got {sub.backend}"
    dev = None
    pat = None
    torn = None
    delivered = 0
    planes_checked = 0
    zero_copy = 0
    t0 = time.monotonic()
    end = "frames"
    while delivered < a.frames:
        try:
            f = sub.next(a.timeout)
        except vramring.ProducerGone:
            end = "producer gone"
            break
        if a.tensors:
            y, uv = f.tensors
            p0, p1 = f.planes
            assert y.data_ptr() == f.data_ptr + p0.offset and uv.data_ptr() == f.data_ptr + p1.offset
            if pat is None:
                dev = y.device
                assert y.is_cuda and y.shape == (f.height, f.width) and y.stride() == (p0.pitch, 1)
                assert uv.shape == (f.height // 2, f.width // 2, 2) and uv.stride() == (p1.pitch, 2, 1)
                pat = GpuPattern(f.nbytes, dev)
                torn = torch.zeros((), dtype=torch.int64, device=dev)
            torn += (bad_plane_bytes(pat, f, y, uv) > 0).long()
            delivered += 1
            zero_copy += f.zero_copy
            del y, uv, f  # the check kernels may still be queued
            continue
        t = torch.from_dlpack(f)
        if pat is None:
            dev = t.device
            assert t.is_cuda and t.dtype == torch.uint8 and t.numel() == f.nbytes
            pat = GpuPattern(f.nbytes, dev)
            torn = torch.zeros((), dtype=torch.int64, device=dev)
        bad = pat.bad_words(t, f.seq)
        torn += (bad > 0).long()
        if delivered % 1000 == 0:
            # Plane views: NV12 Y is rows x width (pitch stride), UV rows x width/2 x 2,
            # and they alias the same memory as the whole-frame tensor.
            y, uv = torch.from_dlpack(f.plane(0)), torch.from_dlpack(f.plane(1))
            p0, p1 = f.planes
            assert y.shape == (f.height, f.width) and y.stride() == (p0.pitch, 1)
            assert uv.shape == (f.height // 2, f.width // 2, 2) and uv.stride() == (p1.pitch, 2, 1)
            assert y.data_ptr() == t.data_ptr() and uv.data_ptr() == t.data_ptr() + p1.offset
            assert torch.equal(y[:, :8].reshape(-1)[:8], t[:8])
            planes_checked += 1
            del y, uv
        delivered += 1
        zero_copy += f.zero_copy
        del t, f  # the check kernels may still be queued
    torch.cuda.synchronize()
    secs = time.monotonic() - t0
    s = sub.stats()
    out = dict(
        event="final", role="python-" + a.mode, delivered=delivered, torn=int(torn.item()) if torn is not None else 0,
        dropped=s["dropped"], overruns=s["overruns"], pushed=s["pushed"], zero_copy=zero_copy,
        allocated=s["allocated"], last_seq=s["last_seq"],
        planes_checked=planes_checked, seconds=round(secs, 3), fps=round(delivered / secs, 1) if secs else 0,
        end=end, device=str(dev), gpu=torch.cuda.get_device_name(0),
    )
    bad_cache = False
    if a.tensors:
        out.update({k: s[k] for k in ("tensors_cache", "tensors_made", "tensors_reused", "tensors_busy")})
        bad_cache = s["tensors_cache"] != "on" or s["tensors_reused"] == 0
    sub.close()
    print(json.dumps(out), flush=True)
    sys.exit(1 if out["torn"] or delivered == 0 or bad_cache else 0)


if __name__ == "__main__":
    main()
