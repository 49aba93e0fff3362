"""Shared fixtures: the Rust example binaries, socket paths, a producer
process, and an independent numpy implementation of the test pattern
(src/testpattern.rs) to check frames with."""

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
# How long a wait that must end may take before a test calls it a hang: a
# guard, no claim about speed (far beyond what a busy machine adds).
HANG = 60.0


def _examples_dir() -> Path:
    env = os.environ.get("VRAMRING_EXAMPLES")
    if env:
        return Path(env)
    for profile in ("debug", "release"):
        d = REPO / "target" / profile / "examples"
        if (d / "producer").exists() and (d / "consumer").exists():
            return d
    return REPO / "target" / "debug" / "examples"


@pytest.fixture(scope="session")
def examples() -> Path:
    d = _examples_dir()
    for name in ("producer", "consumer"):
        if not (d / name).exists():
            pytest.fail(
                f"{d / name} is missing: run `cargo build --example producer --example consumer` "
                "(python/ci.sh does) or set VRAMRING_EXAMPLES"
            )
    return d


@pytest.fixture
def sock():
    # Unix socket paths are limited to 107 bytes: keep them short.
    d = tempfile.mkdtemp(prefix="vrpy")
    yield os.path.join(d, "cam.sock")
    shutil.rmtree(d, ignore_errors=True)


class Producer:
    """The Rust `producer` example in its own process."""

    def __init__(self, exe, sock, **args):
        cmd = [str(exe), "--socket", sock, "--json", "--report-ms", "0"]
        for k, v in args.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"producer did not start: {self.proc.stderr.read()}")
        self.ready = json.loads(line)
        assert self.ready["event"] == "ready", line

    def final(self, timeout=30):
        out, err = self.proc.communicate(timeout=timeout)
        lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        assert self.proc.returncode == 0, err
        return lines[-1]

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def producer(examples, sock):
    made = []

    def start(**args):
        args.setdefault("backend", "host")
        args.setdefault("format", "nv12")
        args.setdefault("width", 320)
        args.setdefault("height", 240)
        if args.get("policy") == "lossless":
            # A reader left unscheduled for a second on a busy machine is
            # not an eviction any test here is about.
            args.setdefault("lossless_lease_ms", 30000)
        p = Producer(examples / "producer", sock, **args)
        made.append(p)
        return p

    yield start
    for p in made:
        p.kill()


def _mix32(x):
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> np.uint32(13))
    x = x * np.uint32(0xC2B2AE35)
    x = x ^ (x >> np.uint32(16))
    return x


def pattern_words(seq: int, n: int) -> np.ndarray:
    """Words w[0..n) of the pattern of `seq`, as src/testpattern.rs writes them."""
    i = np.arange(n, dtype=np.uint32)
    lo = np.uint32((seq * 0x9E3779B1) & 0xFFFFFFFF)
    hi = np.uint32(seq >> 32)
    w = _mix32(lo ^ (i + hi))
    w[0] = seq & 0xFFFFFFFF
    w[1] = seq >> 32
    w[2] = int(w[4:].sum(dtype=np.uint64)) & 0xFFFFFFFF
    w[3] = n
    return w


def check_pattern(frame_bytes: np.ndarray, seq: int) -> None:
    """Asserts a whole frame (uint8, frame_bytes long) is the pattern of `seq`."""
    b = np.ascontiguousarray(frame_bytes).reshape(-1).view(np.uint8)
    n = b.size // 4
    w = b[: n * 4].view("<u4")
    exp = pattern_words(seq, n)
    bad = int(np.count_nonzero(w != exp))
    assert bad == 0, f"frame {seq}: {bad} of {n} words differ from the pattern (pixels say seq {int(w[0]) | int(w[1]) << 32})"


def pattern_frame(seq: int, nbytes: int) -> np.ndarray:
    """A frame of `nbytes` bytes holding the pattern of `seq`."""
    out = np.zeros(nbytes, np.uint8)
    n = nbytes // 4
    out[: n * 4].view("<u4")[:] = pattern_words(seq, n)
    return out


def wait_push_active(sub) -> None:
    """Waits until `sub`'s push buffers are attached (a hang fails the test)."""
    t0 = time.monotonic()
    while not sub.push_active:
        assert time.monotonic() - t0 < HANG, "push never became active"
        time.sleep(0.005)
