"""Python subscribers of every mode against the Rust producer example."""

import gc
import time

import numpy as np
import pytest

import vramring
from conftest import HANG, check_pattern, wait_push_active


def drain(sub, timeout=5.0):
    """Reads until the publisher is gone; returns the frames' (seq, skipped)."""
    got = []
    while True:
        try:
            f = sub.next(timeout)
        except vramring.ProducerGone:
            return got
        check_pattern(np.from_dlpack(f), f.seq)
        got.append((f.seq, f.skipped))


def test_sequential_reads_every_frame_in_order_and_each_matches_the_pattern(producer, sock):
    p = producer(frames=300, fps=300, wait_subscribers=1)
    with vramring.Subscriber(sock, mode="sequential", name="py-seq") as sub:
        assert (sub.backend, sub.format, sub.width, sub.height) == ("host", "nv12", 320, 240)
        got = drain(sub)
        stats = sub.stats()
    seqs = [s for s, _ in got]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    # Every frame is delivered or counted as dropped, none both.
    assert stats["delivered"] == len(got)
    assert seqs[0] == 1 and stats["delivered"] + stats["dropped"] == seqs[-1]
    assert seqs[-1] == 300
    assert p.final()["published"] == 300


def test_latest_skips_to_the_newest_frame_when_the_reader_is_slow(producer, sock):
    producer(frames=200, fps=400, wait_subscribers=1)
    with vramring.Subscriber(sock) as sub:
        got = []
        while True:
            try:
                f = sub.next(5.0)
            except vramring.ProducerGone:
                break
            check_pattern(np.from_dlpack(f), f.seq)
            got.append((f.seq, f.skipped))
            time.sleep(0.01)
    assert len(got) < 200
    assert sum(k for _, k in got) > 0, "a slow latest reader skips frames"
    assert all(b[0] - a[0] == b[1] + 1 for a, b in zip(got, got[1:])), "skipped counts the gap"


def test_lossless_reader_gets_every_frame_even_when_slow(producer, sock):
    producer(frames=60, fps=0, policy="lossless", slots=4, wait_subscribers=1)
    with vramring.Subscriber(sock, lossless=True) as sub:
        seqs = []
        while True:
            try:
                f = sub.next(5.0)
            except vramring.ProducerGone:
                break
            check_pattern(np.from_dlpack(f), f.seq)
            seqs.append(f.seq)
            time.sleep(0.002)
    assert seqs == list(range(1, 61))


def test_push_subscriber_receives_pushed_frames_that_match_the_pattern(producer, sock):
    producer(frames=200, fps=200, wait_subscribers=1)
    with vramring.Subscriber(sock, push=True) as sub:
        got = drain(sub)
        stats = sub.stats()
    assert len(got) > 50
    assert stats["pushed"] > 0, "after the publisher mapped the buffers frames arrive by push"


def test_lossless_push_reader_gets_every_frame_from_its_first_on(producer, sock):
    producer(frames=60, fps=0, policy="lossless", slots=4, wait_subscribers=1)
    with vramring.Subscriber(sock, lossless=True, push=True) as sub:
        assert sub.delivery == "push"
        got = drain(sub)
        stats = sub.stats()
    seqs = [s for s, _ in got]
    assert seqs == list(range(seqs[0], 61)), "no frame missing once the push stream started"
    assert stats["dropped"] == 0 and stats["pushed"] == len(seqs)


def test_a_default_subscriber_refused_the_pool_is_pushed_to_in_its_own_mode(producer, sock):
    producer(frames=200, fps=200, pull="nobody", wait_subscribers=1)
    with vramring.Subscriber(sock, mode="sequential") as sub:
        assert sub.delivery == "push"
        got = drain(sub)
        stats = sub.stats()
    seqs = [s for s, _ in got]
    assert seqs == sorted(seqs) and seqs[-1] == 200
    assert stats["delivery"] == "push" and stats["pushed"] == len(seqs)
    # Every frame after the first delivered one is delivered or counted
    # dropped (a pushed frame lost before it may be counted too).
    assert seqs[-1] - seqs[0] + 1 <= stats["delivered"] + stats["dropped"] <= seqs[-1]


def test_iteration_ends_when_the_producer_is_gone(producer, sock):
    producer(frames=50, fps=500, wait_subscribers=1)
    sub = vramring.Subscriber(sock, mode="sequential", timeout=5.0)
    n = 0
    for f in sub:
        check_pattern(np.from_dlpack(f), f.seq)
        n += 1
    assert n > 0 and sub.stats()["last_seq"] == 50
    sub.close()
    sub.close()  # idempotent
    with pytest.raises(vramring.Closed):
        sub.next(0.1)


def test_planes_are_strided_views_of_the_frame(producer, sock):
    producer(frames=0, fps=100, wait_subscribers=1)
    with vramring.Subscriber(sock) as sub:
        f = sub.next(5.0)
        whole = np.from_dlpack(f)
        y, uv = np.from_dlpack(f.plane(0)), np.from_dlpack(f.plane(1))
        py, puv = f.planes
        assert y.shape == (240, 320) and y.strides == (py.pitch, 1)
        assert uv.shape == (120, 160, 2) and uv.strides == (puv.pitch, 2, 1)
        assert np.array_equal(y, whole[: py.pitch * 240].reshape(240, py.pitch)[:, :320])
        rows = whole[puv.offset : puv.offset + puv.pitch * 120].reshape(120, puv.pitch)[:, :320]
        assert np.array_equal(uv.reshape(120, 320), rows)
        assert f.__dlpack_device__() == (1, 0)
        with pytest.raises(IndexError):
            f.plane(2)


def test_tensors_held_across_many_next_calls_never_change(producer, sock):
    """Lifetime: arrays made from frames keep their memory, and later next()
    calls (which reuse pool buffers) never write memory a live array views."""
    producer(frames=0, fps=1000, slots=4, wait_subscribers=1)
    with vramring.Subscriber(sock, max_held=12) as sub:
        held = []
        for _ in range(8):
            f = sub.next(5.0)
            whole, y = np.from_dlpack(f), np.from_dlpack(f.plane(0))
            held.append((f.seq, whole, y, whole.copy(), y.copy()))
            del f  # only the arrays keep the buffers now
        gc.collect()
        for _ in range(300):  # the ring wraps many times; pool buffers are reused
            f = sub.next(5.0)
            check_pattern(np.from_dlpack(f), f.seq)
            del f
        assert sub.stats()["held"] == 8
        for seq, whole, y, whole0, y0 in held:
            assert np.array_equal(whole, whole0) and np.array_equal(y, y0)
            check_pattern(whole, seq)
    # The arrays outlive the subscriber too.
    for seq, whole, y, whole0, y0 in held:
        check_pattern(whole, seq)
        assert np.array_equal(y, y0)


def test_more_frames_held_than_max_held_raise_frames_held(producer, sock):
    producer(frames=0, fps=500, wait_subscribers=1)
    with vramring.Subscriber(sock, max_held=3) as sub:
        frames = [sub.next(5.0) for _ in range(3)]
        with pytest.raises(vramring.FramesHeld, match="max_held"):
            sub.next(5.0)
        t = np.from_dlpack(frames.pop())  # the array still holds that buffer
        with pytest.raises(vramring.FramesHeld):
            sub.next(5.0)
        del t
        frames.append(sub.next(5.0))  # a buffer came back
        assert sub.stats()["held"] == 3


def test_a_killed_producer_is_reported_as_producer_gone(producer, sock):
    p = producer(frames=0, fps=200, wait_subscribers=1)
    with vramring.Subscriber(sock, mode="sequential") as sub:
        sub.next(5.0)
        p.kill()
        # Seen as gone, not waited out: a wait that missed the death would
        # raise Timeout instead.
        with pytest.raises(vramring.ProducerGone, match="the publisher is gone"):
            while True:
                sub.next(HANG)
        # And on every later call.
        with pytest.raises(vramring.ProducerGone):
            sub.next(0.1)


def test_frame_buffers_are_reused_not_allocated_per_frame(producer, sock):
    producer(frames=0, fps=1000, wait_subscribers=1)
    with vramring.Subscriber(sock) as sub:
        for _ in range(200):
            f = sub.next(5.0)
            y = np.from_dlpack(f.plane(0))
            check_pattern(np.from_dlpack(f), f.seq)
            del y, f
        s = sub.stats()
    assert s["delivered"] == 200
    assert s["allocated"] == 1, f"one buffer serves every frame dropped before the next, got {s['allocated']}"


def test_timing_says_when_each_step_of_next_ended(producer, sock):
    producer(frames=0, fps=500, wait_subscribers=1)
    with vramring.Subscriber(sock) as sub:
        for _ in range(20):
            f = sub.next(5.0)
            now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            woke, copied, checked, returned = f.timing
            assert f.commit_ns <= woke <= copied <= checked <= returned <= now, (f.commit_ns, f.timing, now)
            assert not f.zero_copy



def test_push_frames_are_the_pushed_buffers_themselves_when_the_last_one_is_gone(producer, sock):
    producer(frames=0, fps=500, wait_subscribers=1)
    with vramring.Subscriber(sock, push=True) as sub:
        wait_push_active(sub)
        n = 0
        for _ in range(100):
            f = sub.next(5.0)
            check_pattern(np.from_dlpack(f), f.seq)
            assert f.pushed and f.zero_copy, "nothing else alive: the pushed buffer itself"
            woke, copied, checked, _ = f.timing
            assert woke == copied == checked, "no copy, no check"
            n += 1
            del f
        s = sub.stats()
    assert s["zero_copy"] == n
    assert s["allocated"] == 0, "a zero-copy push subscriber allocates no frame buffer"


def test_a_live_push_frame_is_never_written_while_later_frames_arrive(producer, sock):
    """Lifetime: a zero-copy push frame keeps its buffer held; frames read
    while it lives are copies, and it never changes."""
    producer(frames=0, fps=1000, slots=4, wait_subscribers=1)
    with vramring.Subscriber(sock, push=True, max_held=4) as sub:
        wait_push_active(sub)
        f = sub.next(5.0)
        assert f.zero_copy
        seq, y, whole = f.seq, np.from_dlpack(f.plane(0)), np.from_dlpack(f)
        y0 = y.copy()
        del f  # only the arrays hold the lent buffer now
        gc.collect()
        later = []
        for _ in range(300):  # the publisher keeps pushing into the other buffers
            g = sub.next(5.0)
            check_pattern(np.from_dlpack(g), g.seq)
            assert g.seq > seq and g.pushed and not g.zero_copy
            later.append(g.seq)
            del g
        assert later == sorted(later)
        assert np.array_equal(y, y0)
        check_pattern(whole, seq)
        assert sub.stats()["held"] == 1
        del y, whole
        gc.collect()
        g = sub.next(5.0)
        assert g.zero_copy, "the lent frame is gone: zero-copy again"
        check_pattern(np.from_dlpack(g), g.seq)


def test_closing_or_dropping_a_push_subscriber_keeps_a_live_zero_copy_frame_whole(producer, sock):
    producer(frames=0, fps=1000, slots=4, wait_subscribers=2)
    kept = []
    subs = [vramring.Subscriber(sock, push=True, name=f"py-push-{i}") for i in range(2)]
    for sub in subs:
        wait_push_active(sub)
        f = sub.next(5.0)
        assert f.zero_copy
        kept.append((f.seq, np.from_dlpack(f)))
        del f
    subs[0].close()
    with pytest.raises(vramring.Closed):
        subs[0].next(0.1)
    del subs  # the second one is dropped without close()
    gc.collect()
    time.sleep(0.3)  # the publisher keeps publishing meanwhile
    for seq, whole in kept:
        check_pattern(whole, seq)
    del kept, whole
    gc.collect()  # the parked subscribers close now


def test_a_push_subscriber_borrows_its_newest_pushed_buffer_in_place(producer, sock):
    producer(frames=0, fps=200, wait_subscribers=1)
    with vramring.Subscriber(sock, push=True) as sub:
        wait_push_active(sub)
        intact = 0
        for _ in range(20):
            with sub.borrow(5.0) as b:
                data, seq = b.tobytes(), b.seq
            if b.intact:
                check_pattern(np.frombuffer(data, np.uint8), seq)
                intact += 1
        assert intact >= 15
        assert sub.stats()["pushed"] >= intact


@pytest.mark.parametrize("ahead", [0.0005, 0.0])
def test_next_loses_no_frame_whether_or_not_it_prepares_ahead(producer, sock, ahead):
    # 25 fps: the cadence locks within a few frames, and from then on each
    # next() parks until `ahead` before it would spin for the frame (0: not
    # at all; the park itself is proven in tests/cadence_wait.rs). The
    # cadence counters are reported and consistent.
    producer(frames=0, fps=25, wait_subscribers=1)
    with vramring.Subscriber(sock, mode="sequential", prepare_ahead=ahead) as sub:
        seqs = [sub.next(HANG).seq for _ in range(30)]
        st = sub.stats()
    assert seqs == list(range(seqs[0], seqs[0] + 30))
    assert st["dropped"] == 0, st
    assert st["cadence_hits"] + st["cadence_misses"] <= st["cadence_windows"], st
    assert st["cadence_hits"] + st["cadence_early"] <= st["cadence_windows"], st


def voluntary_switches():
    """This thread's voluntary context switches: each park on a futex is
    one; being descheduled on a busy machine is an involuntary one."""
    with open("/proc/thread-self/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches in /proc/thread-self/status")


def test_spin_makes_next_busy_wait_and_every_frame_still_arrives(producer, sock):
    producer(frames=0, fps=100, wait_subscribers=1)
    parks = {}
    for spin in (5.0, None):
        with vramring.Subscriber(sock, mode="sequential", spin=spin) as sub:
            sub.next(HANG)
            v0 = voluntary_switches()
            seqs = [sub.next(HANG).seq for _ in range(30)]  # ~0.3 s of waiting
            parks[spin] = voluntary_switches() - v0
        assert seqs == list(range(seqs[0], seqs[0] + 30))
    # Spinning 5 s covers any gap between frames: the thread never parks.
    # Without it, it parks for nearly every frame (a frame found already
    # there, the thread having been held off the CPU, needs none).
    assert parks[5.0] <= 2 and parks[None] >= 1, parks
