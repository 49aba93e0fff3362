"""Python subscriber latency at 1080p on a CUDA ring, against the Rust
subscriber in the same run, and against torch's own CUDA IPC
(`torch.multiprocessing` passing a CUDA tensor through a queue).

Latency is the same measure the Rust `consumer` example reports: the
CLOCK_MONOTONIC time when the frame is in the consumer's hands minus the
time the publisher committed it. For Python, "in hand" is after `next()`
**and** `torch.from_dlpack` of both NV12 planes (the issue's measure);
"next" is right after `next()` returned (what the Rust figure measures).

Neither subscriber checks its frames unless --verify is given (then both
do, on the GPU): a check kernel in the subscriber's own CUDA context makes
the GPU switch back to the producer's context for the next frame, which
delays that frame's commit by the switch (~140 us without MPS) and would
be charged to whichever side checks. Correctness is proven by
python/gpu/check_gpu.py and the Rust GPU tests.

Phases, each with a fresh Rust `producer` (same geometry and rate), for pull
and then push delivery:
  * the Rust subscriber alone, then the Python subscriber alone: the
    comparison the goal asks for (nothing else on the GPU);
  * both at once, as a reference: without MPS the GPU time-slices between
    the two subscribers' contexts, so in pull mode whichever copies second
    waits for the other's context switch (~140 us, docs/PERF.md), which
    says nothing about Python;
  * python-spin: the Python subscriber alone, spinning (`spin=`) instead of
    parking between frames;
  * python-capsule: the Python subscriber alone, importing each plane as
    `torch.from_dlpack(frame.plane(k).__dlpack__(stream=s))` with its stream
    looked up once, which skips torch's per-call `current_stream` lookup;
  * python-cached: the Python subscriber alone with
    `Subscriber(tensors="torch")` (numpy on a host ring): `y, uv =
    frame.tensors`, tensors made once per buffer and handed out again, no
    DLPack import on the frame's path. Its row also gives the cache's
    counters (tensors_made, tensors_reused, tensors_busy, tensors_cache);
  * python-cached-at-once: python-cached with `prepare_ahead=0`: `next()`
    makes its checks and starts waiting as soon as it is called, an
    interval before the frame, instead of parking until just before the
    frame is due (the default, ADR 0030).
`--phases` picks among rust, python, both, python-spin, python-capsule,
python-cached, python-cached-at-once; `--kinds` among pull and push. Every
row gives its subscriber's cadence-wait counters (windows, hits, misses,
early).
Then torch IPC (unless --no-ipc): a producer process fills a ring of 16 preallocated CUDA
tensors (device copy + synchronize, then timestamp) and puts them on a
`torch.multiprocessing` queue; the consumer takes each one ("get") and, as a
second figure, clones it into memory of its own and synchronizes ("get +
clone": what a vramring pull Frame gives you).

Every Python row also itemises its p50 from `Frame.timing`: wake (commit to
the end of the wait), copy, check (proving the copy whole), gil (to holding
the GIL again), ret (to Python having the Frame), y and uv (each
`torch.from_dlpack`; python-cached: y is `frame.tensors`, uv 0). With --split the Y plane's `torch.from_dlpack` is done
step by step as torch does it: y_plane (`frame.plane(0)`), y_device
(`__dlpack_device__`), y_stream (`torch.cuda.current_stream`, which torch
calls for every CUDA producer), y_export (`__dlpack__`), y_import
(`torch._C._from_dlpack`): which of the steps are vramring's and which
torch's. After the timed frames it times, on the last frame in
a tight loop, `torch.from_dlpack(plane)`, `plane.__dlpack__(stream=...)`
alone and `torch.from_dlpack(capsule)`: torch's own cost when warm.

    PYTHONPATH=/tmp/site python3 benches/python_latency.py \
        --examples .device/examples --frames 2000 --fps 200 --out "$OUT"
    # the goal's comparison: Rust, Python with cached tensors, torch IPC
    PYTHONPATH=/tmp/site python3 benches/python_latency.py --examples .device/examples \
        --frames 2000 --fps 200 --phases rust,python-capsule,python-cached --out "$OUT"

Needs a GPU, torch and the vramring wheel (on a CPU machine add
`--backend host`: numpy instead of torch, no IPC phase). Prints a table and
writes python_latency.json to --out.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CLOCK = time.CLOCK_MONOTONIC
# The cadence wait's counters, from both subscribers: how many frames each
# caught spinning in its window (hits) or was woken for from a park (early).
CADENCE = ("cadence_windows", "cadence_hits", "cadence_misses", "cadence_early")


def pct(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))
    return s[k]


def us(ns, p=50):
    return round(pct(ns, p) / 1000.0, 2) if ns else None


def summary(name, lat_ns, **extra):
    u = [x / 1000.0 for x in lat_ns]
    return dict(name=name, n=len(u), p50_us=round(pct(u, 50), 1), p99_us=round(pct(u, 99), 1),
                max_us=round(max(u), 1) if u else None, **extra)


def role_python(name, sock, push, frames, warmup, verify, spin, split, capsule, tensors, ahead):
    import vramring
    # torch (or numpy) is imported before connecting: importing torch takes
    # seconds, and frames published meanwhile would be missed.
    try:
        import torch
        from_dlpack = torch.from_dlpack
    except ImportError:
        torch = None
    try:
        import numpy as np
    except ImportError:
        np = None
    # tensors: "torch" or "numpy" for python-cached (frame.tensors, made once
    # per buffer; the stream is torch's current one, looked up by the cache).
    extra = {} if ahead is None else {"prepare_ahead": ahead}
    sub = vramring.Subscriber(sock, push=push, name=name, connect_timeout=20, spin=spin, tensors=tensors, **extra)
    cuda = sub.backend == "cuda"
    if not cuda:
        from_dlpack = np.from_dlpack
    cached = tensors is not None
    split = split and cuda and not cached
    capsule = capsule and cuda and not cached
    if capsule:
        # The consumer's stream, looked up once (a detector's loop knows its
        # stream): torch.from_dlpack of a capsule skips torch's per-call
        # `current_stream` lookup.
        cs = torch.cuda.current_stream().cuda_stream
        stream = 1 if cs == 0 else cs
    GpuPattern = None
    if verify and cuda:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "gpu"))
        from check_gpu import GpuPattern
    keys = ("hand", "next", "wake", "copy", "check", "gil", "ret", "y", "uv")
    if split:
        # `torch.from_dlpack(plane)` for the Y plane done step by step, as
        # torch.utils.dlpack.from_dlpack does it: which step is slow cold.
        keys += ("y_plane", "y_device", "y_stream", "y_export", "y_import")
    t = {k: [] for k in keys}
    torn, pat, n, zero_copy, warm = None, None, 0, 0, {}
    while n < frames:
        try:
            f = sub.next(10.0)
        except vramring.ProducerGone:
            break
        t_next = time.clock_gettime_ns(CLOCK)
        if split:
            v = f.plane(0)
            s1 = time.clock_gettime_ns(CLOCK)
            dev = v.__dlpack_device__()
            s2 = time.clock_gettime_ns(CLOCK)
            cs = torch.cuda.current_stream(f"cuda:{dev[1]}").cuda_stream
            s3 = time.clock_gettime_ns(CLOCK)
            cap = v.__dlpack__(stream=1 if cs == 0 else cs, max_version=(1, 0))
            s4 = time.clock_gettime_ns(CLOCK)
            y = torch._C._from_dlpack(cap)
            del v, cap
        elif cached:
            y, uv = f.tensors
        elif capsule:
            y = from_dlpack(f.plane(0).__dlpack__(stream=stream))
        else:
            y = from_dlpack(f.plane(0))
        t_y = time.clock_gettime_ns(CLOCK)
        if not cached:
            uv = from_dlpack(f.plane(1).__dlpack__(stream=stream)) if capsule else from_dlpack(f.plane(1))
        now = time.clock_gettime_ns(CLOCK)
        n += 1
        if n > warmup:
            woke, copied, checked, returned = f.timing
            c = f.commit_ns
            for k, v in (("hand", now - c), ("next", t_next - c), ("wake", woke - c), ("copy", copied - woke),
                         ("check", checked - copied), ("gil", returned - checked), ("ret", t_next - returned),
                         ("y", t_y - t_next), ("uv", now - t_y)):
                t[k].append(v)
            if split:
                for k, v in (("y_plane", s1 - t_next), ("y_device", s2 - s1), ("y_stream", s3 - s2),
                             ("y_export", s4 - s3), ("y_import", t_y - s4)):
                    t[k].append(v)
            zero_copy += f.zero_copy
        if GpuPattern is not None:
            whole = torch.from_dlpack(f)
            if pat is None:
                pat = GpuPattern(f.nbytes, whole.device)
                torn = torch.zeros((), dtype=torch.int64, device=whole.device)
            torn += (pat.bad_words(whole, f.seq) > 0).long()
            torch.cuda.synchronize()
            del whole
        del y, uv
        if n == max(1, warmup // 2):
            warm = warm_loop(f, cuda, from_dlpack)  # during the warm-up frames
        del f
    if cuda:
        torch.cuda.synchronize()
    s = sub.stats()
    if cached:
        warm.update({k: s[k] for k in ("tensors_cache", "tensors_made", "tensors_reused", "tensors_busy")})
    warm.update({k: s.get(k) for k in CADENCE})
    out = summary(name, t["hand"], delivered=s["delivered"], pushed=s["pushed"], zero_copy=zero_copy,
                  overruns=s["overruns"], allocated=s["allocated"],
                  torn=int(torn.item()) if torn is not None else None,
                  next_p50_us=us(t["next"]), next_p99_us=us(t["next"], 99),
                  stages_p50_us={k: us(t[k]) for k in keys[2:]}, **warm)
    sub.close()
    print(json.dumps(out), flush=True)


def warm_loop(f, cuda, from_dlpack, n=2000):
    """torch's (numpy's) own cost with everything warm, in a tight loop on
    frame `f`: `from_dlpack(plane)`; `plane.__dlpack__(stream=...)` alone
    (vramring's side of an export); `torch.from_dlpack(capsule)` (torch
    without its Python-level `__dlpack_device__` / `current_stream` steps)."""
    v = f.plane(0)
    s = None
    if cuda:
        import torch
        cs = torch.cuda.current_stream(v.__dlpack_device__()[1]).cuda_stream
        s = 1 if cs == 0 else cs
    imp, exp, cap = [], [], []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        a = from_dlpack(v)
        t1 = time.perf_counter_ns()
        c = v.__dlpack__(stream=s) if cuda else v.__dlpack__()
        t2 = time.perf_counter_ns()
        b = from_dlpack(c) if cuda else None  # numpy takes no bare capsule
        t3 = time.perf_counter_ns()
        imp.append(t1 - t0)
        exp.append(t2 - t1)
        cap.append(t3 - t2)
        del a, b, c
    return dict(warm_from_dlpack_us=us(imp), warm_export_us=us(exp),
                warm_from_capsule_us=us(cap) if cuda else None)


def _ipc_producer(q, ready, frames, fps, nbytes, slots):
    import torch
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    ring = [torch.empty(nbytes, dtype=torch.uint8, device="cuda") for _ in range(slots)]
    ready.wait()
    period = 1.0 / fps
    due = time.monotonic()
    for seq in range(1, frames + 1):
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        due = max(due + period, time.monotonic() - period)
        t = ring[seq % slots]
        t.copy_(src)
        torch.cuda.synchronize()
        q.put((seq, time.clock_gettime_ns(CLOCK), t))
    q.put(None)
    time.sleep(1.0)  # keep the storages alive until the consumer let go


def phase_ipc(frames, fps, nbytes, warmup):
    import torch
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue(maxsize=64)
    ready = ctx.Event()
    p = ctx.Process(target=_ipc_producer, args=(q, ready, frames, fps, nbytes, 16))
    p.start()
    torch.zeros(1, device="cuda")
    ready.set()
    get, clone, n = [], [], 0
    while True:
        item = q.get()
        if item is None:
            break
        seq, t0, t = item
        now = time.clock_gettime_ns(CLOCK)
        own = t.clone()
        torch.cuda.synchronize()
        now2 = time.clock_gettime_ns(CLOCK)
        n += 1
        if n > warmup:
            get.append(now - t0)
            clone.append(now2 - t0)
        del t, own
    p.join()
    return [summary("torch-ipc get", get), summary("torch-ipc get + clone", clone)]


def run_phase(a, kind, who):
    """One producer and the subscribers `who` ("rust", "python", "both", or
    "python-spin": Python alone spinning --spin seconds instead of parking,
    "python-capsule": Python alone, `torch.from_dlpack(plane.__dlpack__(stream=s))`,
    "python-cached": Python alone, `frame.tensors` of `Subscriber(tensors=...)`,
    "python-cached-at-once": the same with `prepare_ahead=0`)
    of delivery `kind` ("pull" or "push"); returns (rows, frame_bytes)."""
    d = tempfile.mkdtemp(prefix="vrb")
    sock = os.path.join(d, "cam.sock")
    ex = a.examples
    total = a.frames + a.warmup
    n_subs = 2 if who == "both" else 1
    prod = subprocess.Popen(
        [f"{ex}/producer", "--socket", sock, "--backend", a.backend, "--format", "nv12", "--width", str(a.width),
         "--height", str(a.height), "--slots", "16", "--fps", str(a.fps), "--frames", str(total),
         "--wait-subscribers", str(n_subs), "--json", "--report-ms", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready = json.loads(prod.stdout.readline())
    suffix = {"both": "with the other", "python-spin": "alone, spin",
              "python-capsule": "alone, capsule", "python-cached": "alone, cached",
              "python-cached-at-once": "alone, cached at once"}.get(who, "alone")
    subs = []
    if who in ("rust", "both"):
        name = f"rust-{kind}"
        subs.append((f"{name} {suffix}", subprocess.Popen(
            [f"{ex}/consumer", "--socket", sock, "--name", name, "--json", "--report-ms", "0",
             "--timeout-ms", "20000"] + (["--push"] if kind == "push" else [])
            + ([] if a.verify else ["--no-verify"]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    cached = who in ("python-cached", "python-cached-at-once")
    if who in ("python", "both", "python-spin", "python-capsule") or cached:
        name = f"python-{kind}"
        subs.append((f"{name} {suffix}", subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--role", name, "--socket", sock,
             "--frames", str(total), "--warmup", str(a.warmup)] + (["--verify"] if a.verify else [])
            + (["--spin", str(a.spin)] if who == "python-spin" else [])
            + (["--split"] if a.split else []) + (["--capsule"] if who == "python-capsule" else [])
            + (["--tensors", "torch" if a.backend == "cuda" else "numpy"] if cached else [])
            + (["--prepare-ahead", "0"] if who == "python-cached-at-once" else []),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    rows = []
    for row, p in subs:
        out, err = p.communicate(timeout=600)
        lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        if p.returncode != 0 or not lines:
            print(f"{row} failed ({p.returncode}): {err[-2000:]}", file=sys.stderr)
            rows.append(dict(name=row, error=err[-500:]))
            continue
        r = lines[-1]
        if row.startswith("rust"):
            r = dict(n=r["delivered"], p50_us=r["p50_us"], p99_us=r["p99_us"], max_us=r["max_us"],
                     delivered=r["delivered"], torn=r["torn"], overruns=r["overruns"],
                     **{k: r.get(k) for k in CADENCE})
        r["name"] = row
        rows.append(r)
    prod.communicate(timeout=60)
    return rows, ready["frame_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", required=False, help="dir with the Rust producer and consumer examples")
    ap.add_argument("--frames", type=int, default=2000)
    ap.add_argument("--fps", type=float, default=200)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--backend", choices=["cuda", "host"], default="cuda",
                    help="host: the CPU machine (numpy, no torch IPC phase)")
    ap.add_argument("--kinds", default="pull,push", help="which of pull,push to run")
    ap.add_argument("--no-ipc", action="store_true", help="skip the torch CUDA IPC phase")
    ap.add_argument("--phases", default="rust,python,both,python-spin,python-cached",
                    help="which of rust,python,both,python-spin,python-capsule,python-cached,"
                         "python-cached-at-once to run for each delivery kind")
    ap.add_argument("--spin", type=float, default=0.01,
                    help="python-spin phase: seconds next() spins before parking (longer than a frame period)")
    ap.add_argument("--out", default=".")
    ap.add_argument("--role", choices=["python-pull", "python-push"])
    ap.add_argument("--socket")
    ap.add_argument("--verify", action="store_true",
                    help="also check every frame on the GPU, in the Rust and the Python subscriber")
    ap.add_argument("--capsule", action="store_true", help=argparse.SUPPRESS)  # set for python-capsule roles
    ap.add_argument("--tensors", choices=["torch", "numpy"], help=argparse.SUPPRESS)  # python-cached roles
    ap.add_argument("--prepare-ahead", type=float, help=argparse.SUPPRESS)  # python-cached-at-once roles
    ap.add_argument("--split", action="store_true",
                    help="time torch.from_dlpack of the Y plane step by step (device, stream, export, import)")
    a = ap.parse_args()
    if a.role:
        return role_python(a.role, a.socket, a.role == "python-push", a.frames, a.warmup, a.verify,
                           a.spin if "--spin" in sys.argv else None, a.split, a.capsule, a.tensors,
                           a.prepare_ahead)

    results = []
    nbytes = 0
    for kind in a.kinds.split(","):
        for who in a.phases.split(","):
            rows, nbytes = run_phase(a, kind, who)
            results += rows
    if a.backend == "cuda":
        if not a.no_ipc:
            results += phase_ipc(a.frames + a.warmup, a.fps, nbytes, a.warmup)
        import torch
        gpu, tv = torch.cuda.get_device_name(0), torch.__version__
    else:
        gpu, tv = None, None
    by = {r["name"]: r for r in results}
    added = {}
    for kind in ("pull", "push"):
        for suffix, rs in (("alone", "alone"), ("with the other", "with the other"), ("alone, capsule", "alone"),
                           ("alone, cached", "alone"), ("alone, cached at once", "alone")):
            r, p = by.get(f"rust-{kind} {rs}"), by.get(f"python-{kind} {suffix}")
            if r and p and "p50_us" in r and "p50_us" in p:
                added[f"{kind} {suffix}"] = dict(in_hand=round(p["p50_us"] - r["p50_us"], 1),
                                                 next_only=round(p["next_p50_us"] - r["p50_us"], 1))
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), gpu=gpu, backend=a.backend,
                cpus=os.cpu_count(), load=os.getloadavg()[0], torch=tv, python=sys.version.split()[0],
                frames=a.frames, fps=a.fps, geometry=f"nv12 {a.width}x{a.height}", frame_bytes=nbytes,
                command=" ".join(sys.argv))
    print(json.dumps(meta))
    print(f"{'subscriber':<34}{'n':>6}{'p50 us':>9}{'p99 us':>9}{'max us':>9}{'next p50':>10}  torn  zero-copy")
    for r in results:
        print(f"{r['name']:<34}{r.get('n', 0):>6}{r.get('p50_us', float('nan')):>9}{r.get('p99_us', float('nan')):>9}"
              f"{r.get('max_us') or float('nan'):>9}{r.get('next_p50_us') or '':>10}  {r.get('torn', '-')}"
              f"  {r.get('zero_copy', '')}")
    print("cadence wait (windows / hits / misses / early):")
    for r in results:
        if r.get("cadence_windows") is not None:
            print(f"  {r['name']:<34}" + " / ".join(str(r[k]) for k in CADENCE))
    print("Python p50 stages, us (wake, copy, check, gil, ret, y, uv); warm-loop from_dlpack / export / from capsule:")
    for r in results:
        if "stages_p50_us" in r:
            print(f"  {r['name']:<34}{r['stages_p50_us']}  warm {r.get('warm_from_dlpack_us')} / "
                  f"{r.get('warm_export_us')} / {r.get('warm_from_capsule_us')}")
            if "tensors_cache" in r:
                print(f"  {'':<34}tensor cache {r['tensors_cache']}: made {r['tensors_made']}, "
                      f"reused {r['tensors_reused']}, busy {r['tensors_busy']}")
    print("Python minus Rust, p50 us (goal: <= 10 in hand):", json.dumps(added))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "python_latency.json"), "w") as fh:
        json.dump(dict(meta=meta, results=results, python_minus_rust_p50_us=added), fh, indent=1)


if __name__ == "__main__":
    main()
