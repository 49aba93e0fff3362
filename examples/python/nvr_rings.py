"""Finding the camera rings the NVR examples read (nvr_detector.py,
nvr_motion.py): the sockets named on the command line, and the frame rings
in the multi-camera decoder's socket directory."""

import os
import time


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
