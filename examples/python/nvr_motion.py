"""Motion on every frame of many vramring cameras, on the GPU.

One reader thread per camera subscribes in `sequential` mode (every frame,
in order; gaps are counted, never hidden) with push delivery (the
publisher's process copies each frame into this process's own buffers; pass
--pull to pull instead), takes the luma plane as a tensor without a copy,
downscales it, and scores motion as the fraction of pixels whose luma moved
more than --threshold since the previous frame. Scores made on the GPU are
read back --sync-every frames at a time (8 by default): one wait for the
GPU per batch, not per frame, so a camera's scores and motion events lag
its frames by up to that many frames. Where the scoring runs
follows each ring's memory (`backend`) and --device: a CUDA ring's luma is
scored where it is, on the GPU with torch ("torch"); a host ring's luma
(`nvr_decoder --host-memory`, the host-memory way) is uploaded to the GPU
and scored there ("torch-upload"), or scored on the CPU with numpy
("numpy": --device cpu, alias --numpy; and what --device auto does for a
host ring when torch has no CUDA GPU here). The ready line's "scoring" says
which. Reports per camera, as JSON lines, frames/s, the motion score (mean
and max over the interval), motion events and drops (frames the reader
never saw: the sum of each frame's `skipped`); every --report seconds one
{"event":"tick"} line with the CLOCK_MONOTONIC time t_ns and the totals
(what benches/nvr_scale.py measures over its window). The last lines, per
camera and {"event":"final"}, carry the tensor cache's state
(tensors_cache: "on" when each buffer's planes were imported once; per
camera in "camera-final", cameras per state in "final"; tensors_made,
tensors_reused, tensors_busy).

    cargo run --release --features nvdec --example nvr_decoder -- --config examples/nvr/cameras.example.toml
    python3 examples/python/nvr_motion.py --dir /tmp/vramring-nvr

--procs N splits the cameras over N worker processes, each with its own
interpreter (and GIL) and its own reader threads: one interpreter with 128
reader threads spends its CPU taking turns on the GIL. The parent prints the
combined ready, tick and final lines from counters the workers share with
it; the workers print their cameras' lines.

torch is imported only when it runs (and not at all with --device cpu), so
--help works without it. Exit status 0 at the end (--seconds, --frames, Ctrl-C, or
every camera gone), 2 when no camera is found, 1 on other errors.
"""

import argparse
import json
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time

# FrameMeta flag: the stream restarted before this frame (nvr_decoder sets it
# at a loop of a file and after a resync): no difference against the frame before.
DISCONTINUITY = 2


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sockets", nargs="*", help="camera ring sockets (or use --dir)")
    ap.add_argument("--dir", help="every frame ring in this directory (*.sock, not *.packets.sock)")
    ap.add_argument("--expect", type=int, default=0,
                    help="with --dir: wait up to --timeout seconds for this many rings to appear")
    ap.add_argument("--threshold", type=float, default=25.0, help="luma change that counts as motion")
    ap.add_argument("--min-area", type=float, default=0.005, help="fraction of pixels that makes a motion event")
    ap.add_argument("--scale", type=int, default=4, help="downscale factor before scoring")
    ap.add_argument("--pull", action="store_true", help="pull frames from the ring instead of push delivery")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                    help="where to score: cuda (a host ring's luma is uploaded), cpu (numpy, host rings only), "
                         "auto (cuda when torch sees a GPU, else cpu for host rings)")
    ap.add_argument("--numpy", dest="device", action="store_const", const="cpu", help="the same as --device cpu")
    ap.add_argument("--frames", type=int, default=0, help="stop each camera after this many frames (0: no limit)")
    ap.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: until Ctrl-C)")
    ap.add_argument("--report", type=float, default=1.0, help="seconds between status lines")
    ap.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for a camera and for a frame")
    ap.add_argument("--procs", type=int, default=1,
                    help="worker processes the cameras are split over (1: all in this process)")
    ap.add_argument("--sync-every", type=int, default=8,
                    help="frames of a camera whose GPU scores are read back to the host together: one wait "
                         "for the GPU per this many frames (1: every frame)")
    a = ap.parse_args(argv)
    if a.procs < 1:
        ap.error("--procs: at least 1")
    if a.sync_every < 1:
        ap.error("--sync-every: at least 1")
    return a


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


class TorchDiff:
    """Frame difference on the GPU: downscale, |now - before| > threshold.
    `upload_to`: the GPU a host frame's luma is uploaded to (None: the frame
    is on the GPU already)."""

    def __init__(self, scale, threshold, upload_to=None):
        import torch
        import torch.nn.functional as F
        self.torch, self.F = torch, F
        self.scale, self.threshold, self.prev = scale, threshold, None
        self.upload_to = upload_to

    def score(self, frame):
        """The frame's score, still on the GPU (a 0-d tensor; 0.0 when
        there is nothing to compare with): `values` reads it back."""
        if frame.flags & DISCONTINUITY:
            self.prev = None
        y = frame.tensors[0]                                # rows x width uint8, no copy, made once per buffer
        if self.upload_to is not None:
            y = y.to(self.upload_to)                        # host -> GPU: the host-memory way's upload
        small = self.F.avg_pool2d(y[None, None].float(), self.scale)
        prev, self.prev = self.prev, small
        if prev is None or prev.shape != small.shape:
            return 0.0
        return ((small - prev).abs() > self.threshold).float().mean()

    def values(self, scores):
        """`score`'s results as floats, read back together: one wait for
        the GPU (a thread waiting on torch's stream spins a core)."""
        on_gpu = [s for s in scores if not isinstance(s, float)]
        back = iter(self.torch.stack(on_gpu).tolist() if on_gpu else ())
        return [s if isinstance(s, float) else next(back) for s in scores]


class NumpyDiff:
    """The same on the host, for host rings."""

    def __init__(self, scale, threshold):
        import numpy as np
        self.np = np
        self.scale, self.threshold, self.prev = scale, threshold, None

    def score(self, frame):
        if frame.flags & DISCONTINUITY:
            self.prev = None
        y = self.np.from_dlpack(frame.plane(0))
        s = self.scale
        h, w = (y.shape[0] // s) * s, (y.shape[1] // s) * s
        small = y[:h, :w].reshape(h // s, s, w // s, s).mean(axis=(1, 3))
        prev, self.prev = self.prev, small
        if prev is None or prev.shape != small.shape:
            return 0.0
        return float((self.np.abs(small - prev) > self.threshold).mean())

    def values(self, scores):
        return scores


class Reader(threading.Thread):
    """Reads every frame of one camera and keeps its counters."""

    def __init__(self, path, sub, a, stop, scorer, shared=None, slot=0):
        super().__init__(daemon=True)
        self.path, self.sub, self.a, self.stop = path, sub, a, stop
        # --procs: (frames, drops, ended) of this camera at shared[3 * slot:],
        # read by the parent for its ticks.
        self.shared, self.slot = shared, slot
        self.name_ = os.path.basename(path).removesuffix(".sock")
        self.scorer = scorer
        if scorer == "numpy":
            self.diff = NumpyDiff(a.scale, a.threshold)
        else:
            self.diff = TorchDiff(a.scale, a.threshold, "cuda" if scorer == "torch-upload" else None)
        self.lock = threading.Lock()
        self.frames = self.drops = self.events = 0
        self.window = []
        self.moving = False
        self.end = None
        self.stats = None   # the subscriber's last stats(), read before it closes

    def run(self):
        pending = []   # scores not read back yet (--sync-every)
        try:
            while not self.stop.is_set():
                try:
                    f = self.sub.next(timeout=self.a.timeout)
                except Exception as e:  # vramring errors; ProducerGone ends the camera
                    self.end = f"{type(e).__name__}: {e}"
                    return
                pending.append(self.diff.score(f))
                with self.lock:
                    self.frames += 1
                    self.drops += f.skipped
                    if self.shared is not None:
                        self.shared[3 * self.slot] = self.frames
                        self.shared[3 * self.slot + 1] = self.drops
                del f
                if len(pending) >= self.a.sync_every:
                    self.settle(pending)
                    pending = []
                if self.a.frames and self.frames >= self.a.frames:
                    self.end = "frames"
                    return
        finally:
            try:
                self.settle(pending)
            except Exception as e:  # a GPU error: the last scores are lost, the frames were counted
                print(f"nvr_motion: camera {self.name_}: {len(pending)} scores lost: {e}", file=sys.stderr, flush=True)
            try:
                self.stats = self.sub.stats()   # how frames actually came, the tensor cache
            except Exception as e:  # vramring errors: the camera's tensor cache reads "unknown"
                print(f"nvr_motion: camera {self.name_}: no stats: {e}", file=sys.stderr, flush=True)
            finally:
                self.sub.close()
                if self.shared is not None:
                    self.shared[3 * self.slot + 2] = 1

    def settle(self, pending):
        """Reads `pending` scores back and counts their motion events."""
        scores = self.diff.values(pending)
        with self.lock:
            for s in scores:
                self.window.append(s)
                if s >= self.a.min_area and not self.moving:
                    self.moving, self.events = True, self.events + 1
                elif s < self.a.min_area / 2:
                    self.moving = False

    def take(self):
        with self.lock:
            w, self.window = self.window, []
            return w, self.frames, self.drops, self.events


def gpu_here(device):
    """Whether torch sees a CUDA GPU (imported here, before any ring is
    joined: importing torch takes seconds, and a sequential reader joined
    before would count the frames it missed meanwhile as drops). None when
    --device cpu asks for none; a sentence (str) when --device cuda cannot
    be had."""
    if device == "cpu":
        return None
    try:
        import torch
        ok = torch.cuda.is_available()
        why = "torch sees no CUDA GPU"
    except ImportError as e:
        ok, why = False, f"torch is not installed here ({e})"
    if device == "cuda" and not ok:
        return f"{why}; --device cuda scores on the GPU (--device cpu scores host rings with numpy)"
    return ok


def scorer_for(backend, device, gpu):
    """The scorer of a ring on `backend`, or None when --device rules it out."""
    if backend == "cuda":
        return "torch" if device != "cpu" and gpu else None
    return "torch-upload" if device != "cpu" and gpu else "numpy"


def open_readers(paths, a, gpu, stop, shared=None, slots=None):
    """A reader for each camera that can be joined (others are skipped,
    said on stderr); `slots`: each camera's place in `shared` (--procs)."""
    import vramring
    readers = []
    for k, p in enumerate(paths):
        try:
            # torch scorers take the planes as tensors made once per buffer
            # (`frame.tensors`): no DLPack import per frame.
            sub = vramring.Subscriber(p, name="nvr-motion", mode="sequential", push=not a.pull,
                                      connect_timeout=a.timeout, timeout=a.timeout,
                                      tensors="torch" if gpu else None)
        except vramring.VramringError as e:
            print(f"nvr_motion: skipping {p}: {e}", file=sys.stderr, flush=True)
            continue
        scorer = scorer_for(sub.backend, a.device, gpu)
        if scorer is None:
            print(f"nvr_motion: skipping {p}: a ring in {sub.backend} memory needs the GPU "
                  f"({'--device cpu' if a.device == 'cpu' else 'torch sees none'})", file=sys.stderr, flush=True)
            sub.close()
            continue
        readers.append(Reader(p, sub, a, stop, scorer, shared, slots[k] if slots else 0))
    return readers


def report_cameras(readers, prev, dt):
    """One status line per camera for the last `dt` seconds."""
    for r in readers:
        w, frames, drops, events = r.take()
        emit({
            "event": "camera", "camera": r.name_, "fps": round((frames - prev[r.name_]) / dt, 2),
            "frames": frames, "drops": drops, "motion_mean": round(sum(w) / len(w), 4) if w else 0.0,
            "motion_max": round(max(w, default=0.0), 4), "motion_events": events,
            "alive": r.is_alive(),
        })
        prev[r.name_] = frames


def run_readers(readers, a, stop, until):
    """Starts the readers and reports until they end, `until()` says so or
    Ctrl-C; then stops them and prints each camera's last line."""
    for r in readers:
        r.start()
    start = last = time.monotonic()
    prev = {r.name_: 0 for r in readers}
    try:
        while any(r.is_alive() for r in readers) and not until(start):
            time.sleep(0.05)
            if time.monotonic() - last >= a.report:
                dt, last = time.monotonic() - last, time.monotonic()
                report_cameras(readers, prev, dt)
                if readers[0].shared is None:
                    emit(tick(readers))
    except KeyboardInterrupt:
        pass
    stop.set()
    for r in readers:
        r.join(timeout=a.timeout + 1.0)
    for r in readers:
        _, frames, drops, events = r.take()
        st = r.stats or {}
        emit({"event": "camera-final", "camera": r.name_, "frames": frames, "drops": drops,
              "motion_events": events, "delivery": st.get("delivery"), "end": r.end or "stopped",
              "tensors_cache": (st.get("tensors_cache") or "none") if r.stats else "unknown",
              **{k: st.get(k, 0) for k in TENSOR_COUNTERS}})
    return start


def main(argv=None):
    a = parse_args(argv)
    paths = find_sockets(a)
    if not paths:
        print("nvr_motion: no camera: give sockets or --dir", file=sys.stderr)
        return 2
    if a.procs > 1:
        return run_procs(a, paths)
    gpu = gpu_here(a.device)
    if isinstance(gpu, str):
        print(f"nvr_motion: {gpu}", file=sys.stderr, flush=True)
        return 1
    stop = threading.Event()
    readers = open_readers(paths, a, gpu, stop)
    if not readers:
        print("nvr_motion: no usable camera", file=sys.stderr)
        return 2
    emit({"event": "ready", "role": "nvr_motion", "cameras": [r.name_ for r in readers],
          "delivery": "pull" if a.pull else "push",
          "scoring": sorted({r.scorer for r in readers}), "sync_every": a.sync_every})
    start = run_readers(readers, a, stop, lambda t0: a.seconds and time.monotonic() - t0 >= a.seconds)
    emit(tick(readers))
    emit({"event": "final", "role": "nvr_motion", "seconds": round(time.monotonic() - start, 2),
          "frames": sum(r.frames for r in readers), "drops": sum(r.drops for r in readers),
          "ended": sum(r.end is not None for r in readers),
          "scoring": sorted({r.scorer for r in readers}),
          **tensor_cache([r.stats for r in readers])})
    return 0


def worker(a, paths, slots, shared, go, stop, q):
    """One of --procs: reads `paths` (at `slots` of `shared`) from `go`
    until `stop`, telling the parent through `q`: ("ready", cameras,
    scoring, slots), ("error", sentence), then ("final", each camera's
    stats)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # the parent stops the workers
    gpu = gpu_here(a.device)
    if isinstance(gpu, str):
        q.put(("error", gpu))
        return
    # The readers' own stop: a worker whose cameras all ended stops no other.
    mine = threading.Event()
    readers = open_readers(paths, a, gpu, mine, shared, slots)
    q.put(("ready", [r.name_ for r in readers], sorted({r.scorer for r in readers}), [r.slot for r in readers]))
    # Once every worker is ready: the parent's ready line comes first.
    while not go.wait(0.1) and not stop.is_set():
        pass
    if readers and not stop.is_set():
        run_readers(readers, a, mine, lambda t0: stop.is_set())
    else:
        for r in readers:
            r.sub.close()
    q.put(("final", [r.stats for r in readers]))


def run_procs(a, paths):
    """--procs: the cameras dealt over the workers; this process prints the
    combined ready line, the ticks (from the counters the workers share)
    and the final line."""
    ctx = multiprocessing.get_context("spawn")     # CUDA does not survive a fork
    shared = ctx.RawArray("q", 3 * len(paths))
    go, stop, q = ctx.Event(), ctx.Event(), ctx.Queue()
    groups = [list(range(k, len(paths), a.procs)) for k in range(min(a.procs, len(paths)))]
    workers = [ctx.Process(target=worker, args=(a, [paths[i] for i in g], g, shared, go, stop, q), daemon=True)
               for g in groups]
    for w in workers:
        w.start()
    cameras, scoring, slots, stats, failed = [], set(), [], [], None
    ready = finals = 0

    def receive(timeout):
        """Takes every message there is, waiting up to `timeout` for the first."""
        nonlocal ready, finals, failed
        while True:
            try:
                msg = q.get(timeout=timeout)
            except queue.Empty:
                return
            timeout = 0.01
            if msg[0] == "ready":
                ready += 1
                cameras.extend(msg[1])
                scoring.update(msg[2])
                slots.extend(msg[3])
            elif msg[0] == "final":
                finals += 1
                stats.extend(msg[1])
            else:
                failed = msg[1]

    start = time.monotonic()
    try:
        while ready < len(workers) and failed is None:
            dead = not all(w.is_alive() for w in workers)
            receive(0.5)
            if dead and ready < len(workers) and failed is None:
                failed = "a worker process ended before it was ready"
        if failed is not None or not cameras:
            stop.set()
            for w in workers:
                w.join(timeout=a.timeout + 1.0)
            print(f"nvr_motion: {failed or 'no usable camera'}", file=sys.stderr, flush=True)
            return 1 if failed else 2
        emit({"event": "ready", "role": "nvr_motion", "cameras": cameras,
              "delivery": "pull" if a.pull else "push", "scoring": sorted(scoring),
              "procs": len(workers), "sync_every": a.sync_every})
        go.set()
        start = last = time.monotonic()
        while finals < len(workers) and any(w.is_alive() for w in workers):
            receive(0.05)
            if a.seconds and time.monotonic() - start >= a.seconds:
                break
            if time.monotonic() - last >= a.report:
                last = time.monotonic()
                emit(shared_tick(shared, slots))
    except KeyboardInterrupt:
        pass
    stop.set()
    deadline = time.monotonic() + a.timeout + 5.0
    while finals < len(workers) and time.monotonic() < deadline:
        try:
            receive(0.1)
        except KeyboardInterrupt:
            pass
    for w in workers:
        w.join(timeout=1.0)
    end = shared_tick(shared, slots)
    emit(end)
    emit({"event": "final", "role": "nvr_motion", "seconds": round(time.monotonic() - start, 2),
          "frames": end["frames"], "drops": end["drops"], "ended": len(slots) - end["alive"],
          "scoring": sorted(scoring), "procs": len(workers),
          **tensor_cache(stats + [None] * (len(slots) - len(stats)))})
    return 0


def emit(line):
    """One JSON line on stdout in one write: --procs workers share the pipe."""
    os.write(sys.stdout.fileno(), (json.dumps(line) + "\n").encode())


def tick(readers):
    """Every camera's totals now, with the CLOCK_MONOTONIC time."""
    frames = drops = 0
    for r in readers:
        with r.lock:
            frames, drops = frames + r.frames, drops + r.drops
    return {"event": "tick", "role": "nvr_motion", "t_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC),
            "frames": frames, "drops": drops, "alive": sum(r.is_alive() for r in readers)}


def shared_tick(shared, slots):
    """`tick` from the workers' counters (--procs): the cameras at `slots`."""
    return {"event": "tick", "role": "nvr_motion", "t_ns": time.clock_gettime_ns(time.CLOCK_MONOTONIC),
            "frames": sum(shared[3 * k] for k in slots), "drops": sum(shared[3 * k + 1] for k in slots),
            "alive": sum(shared[3 * k + 2] == 0 for k in slots)}


if __name__ == "__main__":
    sys.exit(main())
