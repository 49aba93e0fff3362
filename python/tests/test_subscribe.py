"""Python subscribers of every mode against the Rust producer example."""

import gc
import time

import numpy as np
import pytest

import vramring
from conftest import check_pattern


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
        t0 = time.monotonic()
        with pytest.raises(vramring.ProducerGone, match="the publisher is gone"):
            while True:
                sub.next(5.0)
        assert time.monotonic() - t0 < 5.0
        # And on every later call.
        with pytest.raises(vramring.ProducerGone):
            sub.next(0.1)
