"""A stand-in detector: subscribes to the decoded frames with push delivery
(the decoder's process copies each frame into this process's own GPU
buffers) and reports its frame rate. Replace the loop body with inference.

The Python package is `vramring` (python/ in this repository); the
`Subscriber` constructor below is its entry point, the rest follows its
README (frames export to DLPack/torch without a copy).
"""
import sys
import time

import vramring

path = sys.argv[1] if len(sys.argv) > 1 else "/run/vramring/cam0.sock"
sub = vramring.Subscriber(path, push=True)
count, t0 = 0, time.monotonic()
while True:
    frame = sub.next()
    count += 1
    if time.monotonic() - t0 >= 5.0:
        print(f"detector: {count / (time.monotonic() - t0):.1f} fps", flush=True)
        count, t0 = 0, time.monotonic()
