"""GPU proof of the Python publisher: a CUDA ring fed with torch CUDA
tensors (the test pattern computed on the GPU), half by `publish()` (a copy
on the GPU) and half through `loan()` (written in place), read by the Rust
`consumer` example, which checks every frame on the GPU.

    python3 publish_gpu.py --socket /tmp/p.sock --frames 2000
"""

import argparse
import json
import time

import torch

import vramring
from check_gpu import M, mix32


def pattern(seq, n, i):
    lo = (seq * 0x9E3779B1) & M
    w = mix32(lo ^ ((i + (seq >> 32)) & M))
    w[0], w[1], w[3] = seq & M, seq >> 32, n
    w[2] = w[4:].sum() & M
    return w.to(torch.int32)  # low 32 bits, two's complement


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--frames", type=int, default=2000)
    ap.add_argument("--fps", type=float, default=500)
    a = ap.parse_args()
    pub = vramring.Publisher(a.socket, "nv12", 1920, 1080, slots=16, backend="cuda")
    assert pub.backend == "cuda"
    n = pub.nbytes // 4
    i = torch.arange(n, dtype=torch.int64, device="cuda")
    deadline = time.monotonic() + 20
    while pub.stats()["subscribers"] < 1:
        assert time.monotonic() < deadline, "no consumer connected"
        time.sleep(0.01)
    period, due = 1.0 / a.fps, time.monotonic()
    loaned = 0
    for seq in range(1, a.frames + 1):
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        due += period
        frame = pattern(seq, n, i).view(torch.uint8)
        if seq % 2:
            assert pub.publish(frame, pts=seq) == seq
        else:
            with pub.loan() as slot:
                dst = torch.from_dlpack(slot)  # the slot itself, 1-D uint8 on the GPU
                dst.copy_(frame)
                del dst
                assert slot.publish(pts=seq, stream=torch.cuda.current_stream()) == seq
            loaned += 1
    st = pub.stats()
    pub.close()
    print(json.dumps(dict(event="final", role="python-publisher", published=st["published"], loaned=loaned)))


if __name__ == "__main__":
    main()
