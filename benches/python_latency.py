"""Python subscriber latency at 1080p on a CUDA ring, against the Rust
subscriber in the same run, and against torch's own CUDA IPC
(`torch.multiprocessing` passing a CUDA tensor through a queue).

Latency is the same measure the Rust `consumer` example reports: the
CLOCK_MONOTONIC time when the frame is in the consumer's hands (for Python:
after `next()` and `torch.from_dlpack` of both NV12 planes) minus the time the
publisher committed it. Every Python frame is also checked against the test
pattern on the GPU after the timestamp is taken when `--verify` is given.

Phase A, a CUDA producer (the Rust `producer` example) with a Rust pull and
a Python pull subscriber at once; phase B the same with push subscribers.
The Rust consumer checks each frame with its GPU kernel after its
timestamp; the Python one does not (`--verify` makes it, on the GPU, after
the timestamp: python/gpu/check_gpu.py proves the frames separately).
Phase C, torch IPC: a producer process fills a ring of 16 preallocated CUDA
tensors (device copy + synchronize, then timestamp) and puts them on a
`torch.multiprocessing` queue; the consumer takes each one ("get") and, as a
second figure, clones it into memory of its own and synchronizes ("get +
clone": what a vramring Frame gives you).

    PYTHONPATH=/tmp/site python3 benches/python_latency.py \
        --examples .device/examples --frames 3000 --fps 200 --out "$OUT"

Needs a GPU, torch and the vramring wheel. Prints a table and writes
python_latency.json to --out.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CLOCK = time.CLOCK_MONOTONIC


def pct(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))
    return s[k]


def summary(name, lat_ns, **extra):
    us = [x / 1000.0 for x in lat_ns]
    return dict(name=name, n=len(us), p50_us=round(pct(us, 50), 1), p99_us=round(pct(us, 99), 1),
                max_us=round(max(us), 1) if us else None, **extra)


def role_python(sock, push, frames, warmup, verify):
    import vramring
    sub = vramring.Subscriber(sock, push=push, name="py-push" if push else "py-pull", connect_timeout=20)
    if sub.backend == "host":
        return role_python_host(sub, push, frames, warmup)
    import torch
    GpuPattern = None
    if verify:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "gpu"))
        from check_gpu import GpuPattern
    lat, conv, torn, pat, n = [], [], None, None, 0
    while True:
        try:
            f = sub.next(10.0)
        except vramring.ProducerGone:
            break
        t_next = time.clock_gettime_ns(CLOCK)
        y = torch.from_dlpack(f.plane(0))
        uv = torch.from_dlpack(f.plane(1))
        now = time.clock_gettime_ns(CLOCK)
        n += 1
        if n > warmup:
            lat.append(now - f.commit_ns)
            conv.append(now - t_next)
        if GpuPattern is not None:
            whole = torch.from_dlpack(f)
            if pat is None:
                pat = GpuPattern(f.nbytes, whole.device)
                torn = torch.zeros((), dtype=torch.int64, device=whole.device)
            torn += (pat.bad_words(whole, f.seq) > 0).long()
            torch.cuda.synchronize()
        del y, uv, f
        if n >= frames:
            break
    torch.cuda.synchronize()
    s = sub.stats()
    out = summary("python-push" if push else "python-pull", lat, delivered=s["delivered"], pushed=s["pushed"],
                  torn=int(torn.item()) if torn is not None else None, overruns=s["overruns"],
                  from_dlpack_p50_us=round(pct(conv, 50) / 1000.0, 1))
    sub.close()
    print(json.dumps(out), flush=True)


def role_python_host(sub, push, frames, warmup):
    """A host ring (the CPU machine): numpy.from_dlpack instead of torch."""
    import numpy as np

    import vramring
    lat, conv, n, kept = [], [], 0, None
    while n < frames:
        try:
            f = sub.next(10.0)
        except vramring.ProducerGone:
            break
        t_next = time.clock_gettime_ns(CLOCK)
        y = np.from_dlpack(f.plane(0))
        uv = np.from_dlpack(f.plane(1))
        now = time.clock_gettime_ns(CLOCK)
        n += 1
        if n > warmup:
            lat.append(now - f.commit_ns)
            conv.append(now - t_next)
        if kept is None:
            kept = f
        del y, uv, f
    # vramring's side of an export alone, in a tight loop on the last frame:
    # plane() + __dlpack__ (capsule made), and numpy.from_dlpack of a view.
    f, kept = kept, None
    export_ns, import_ns = [], []
    if f is not None:
        v = f.plane(0)
        for _ in range(5000):
            t0 = time.perf_counter_ns()
            f.plane(0).__dlpack__()
            t1 = time.perf_counter_ns()
            np.from_dlpack(v)
            export_ns.append(t1 - t0)
            import_ns.append(time.perf_counter_ns() - t1)
        del v, f
    s = sub.stats()
    out = summary("python-push" if push else "python-pull", lat, delivered=s["delivered"], pushed=s["pushed"],
                  overruns=s["overruns"], from_dlpack_p50_us=round(pct(conv, 50) / 1000.0, 2),
                  export_loop_p50_us=round(pct(export_ns, 50) / 1000.0, 2) if export_ns else None,
                  numpy_import_loop_p50_us=round(pct(import_ns, 50) / 1000.0, 2) if import_ns else None)
    sub.close()
    print(json.dumps(out), flush=True)


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", required=False, help="dir with the Rust producer and consumer examples")
    ap.add_argument("--frames", type=int, default=3000)
    ap.add_argument("--fps", type=float, default=200)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--backend", choices=["cuda", "host"], default="cuda",
                    help="host: the CPU machine (numpy, no torch IPC phase)")
    ap.add_argument("--out", default=".")
    ap.add_argument("--role", choices=["py-pull", "py-push"])
    ap.add_argument("--socket")
    ap.add_argument("--verify", action="store_true", help="also check every Python frame on the GPU")
    a = ap.parse_args()
    if a.role:
        return role_python(a.socket, a.role == "py-push", a.frames, a.warmup, a.verify)

    results = []
    nbytes = 0
    # One phase per delivery kind: the producer, the Rust subscriber and the
    # Python subscriber at once (fewer GPU processes time-slicing the GPU).
    for rust_name, rust_extra, py_role in (("rust-pull", [], "py-pull"), ("rust-push", ["--push"], "py-push")):
        d = tempfile.mkdtemp(prefix="vrb")
        sock = os.path.join(d, "cam.sock")
        ex = a.examples
        prod = subprocess.Popen(
            [f"{ex}/producer", "--socket", sock, "--backend", a.backend, "--format", "nv12", "--width", str(a.width),
             "--height", str(a.height), "--slots", "16", "--fps", str(a.fps), "--frames", str(a.frames + a.warmup),
             "--wait-subscribers", "2", "--json", "--report-ms", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = json.loads(prod.stdout.readline())
        nbytes = ready["frame_bytes"]
        subs = [(rust_name, subprocess.Popen(
            [f"{ex}/consumer", "--socket", sock, "--name", rust_name, "--json", "--report-ms", "0",
             "--timeout-ms", "20000"] + rust_extra,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))]
        subs.append((py_role, subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--role", py_role, "--socket", sock,
             "--frames", str(a.frames + a.warmup), "--warmup", str(a.warmup)] + (["--verify"] if a.verify else []),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
        for name, p in subs:
            out, err = p.communicate(timeout=600)
            lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
            if p.returncode != 0 or not lines:
                print(f"{name} failed ({p.returncode}): {err[-2000:]}", file=sys.stderr)
                results.append(dict(name=name, error=err[-500:]))
                continue
            r = lines[-1]
            if name.startswith("rust"):
                r = dict(name=name, n=r["delivered"], p50_us=r["p50_us"], p99_us=r["p99_us"], max_us=r["max_us"],
                         delivered=r["delivered"], torn=r["torn"], overruns=r["overruns"])
            results.append(r)
        prod.communicate(timeout=60)
    if a.backend == "cuda":
        results += phase_ipc(a.frames + a.warmup, a.fps, nbytes, a.warmup)
        import torch
        gpu, tv = torch.cuda.get_device_name(0), torch.__version__
    else:
        gpu, tv = None, None
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), gpu=gpu, backend=a.backend,
                cpus=os.cpu_count(), torch=tv, python=sys.version.split()[0], frames=a.frames, fps=a.fps,
                geometry=f"nv12 {a.width}x{a.height}", frame_bytes=nbytes, command=" ".join(sys.argv))
    print(json.dumps(meta))
    print(f"{'subscriber':<24}{'n':>7}{'p50 us':>10}{'p99 us':>10}{'max us':>10}  torn  from_dlpack p50 us")
    for r in results:
        print(f"{r['name']:<24}{r.get('n', 0):>7}{r.get('p50_us', float('nan')):>10}{r.get('p99_us', float('nan')):>10}"
              f"{r.get('max_us') or float('nan'):>10}  {r.get('torn', '-')}  {r.get('from_dlpack_p50_us', '')}")
    with open(os.path.join(a.out, "python_latency.json"), "w") as fh:
        json.dump(dict(meta=meta, results=results), fh, indent=1)


if __name__ == "__main__":
    main()
