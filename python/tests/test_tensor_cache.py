"""Subscriber(tensors=...): plane tensors made once per buffer and handed
out again, and the rule that a buffer is not written while anything of its
last frame (tensor, view, export, the frame) is alive. numpy on the host
ring here; the torch tests run where torch is installed."""

import gc
import importlib.util
import threading
import time

import numpy as np
import pytest

import vramring
from conftest import check_pattern, pattern_frame, wait_push_active



def _open(sock, delivery, **kw):
    sub = vramring.Subscriber(sock, tensors="numpy", push=delivery == "push", **kw)
    if delivery == "push":
        wait_push_active(sub)
    return sub


def _addr(a):
    return a.__array_interface__["data"][0]


def _check_planes(f, y, uv):
    """`y`, `uv` are the frame's planes, and the frame is its pattern."""
    whole = np.from_dlpack(f)
    check_pattern(whole, f.seq)
    py_, puv = f.planes
    assert y.shape == tuple(f.plane(0).shape) and uv.shape == tuple(f.plane(1).shape)
    assert _addr(y) == f.data_ptr + py_.offset and _addr(uv) == f.data_ptr + puv.offset
    assert np.array_equal(y, np.from_dlpack(f.plane(0))) and np.array_equal(uv, np.from_dlpack(f.plane(1)))


@pytest.mark.parametrize("delivery", ["pull", "push"])
def test_each_buffer_imports_its_tensors_once_and_hands_them_out_again(producer, sock, delivery):
    producer(frames=0, fps=500, wait_subscribers=1)
    with _open(sock, delivery) as sub:
        addrs = set()
        for _ in range(100):
            f = sub.next(5.0)
            y, uv = f.tensors
            _check_planes(f, y, uv)
            assert f.zero_copy == (delivery == "push")
            addrs.add(_addr(y))
            del f, y, uv  # nothing of the frame is kept
        s = sub.stats()
    assert s["tensors"] == "numpy" and s["tensors_cache"] == "on"
    buffers = len(addrs)
    if delivery == "pull":
        assert buffers == 1 and s["allocated"] == 1, "one pool buffer serves every frame dropped before the next"
    else:
        assert s["allocated"] == 0 and s["zero_copy"] == 100, "every frame is a push buffer itself"
    # One import per plane per buffer; every later frame in a buffer reuses them.
    assert s["tensors_made"] == 2 * buffers
    assert s["tensors_reused"] == 100 - buffers
    assert s["tensors_busy"] == 0 and s["held"] == 0


def _keep(kind, f, y, uv):
    """What the user keeps of frame `f`, and how to read it back later."""
    if kind == "tensor":
        return y, lambda k: k
    if kind == "view":  # shares the memory, not the object
        return y[:, :100], lambda k: k
    if kind == "view of a view":
        return uv[10:][:, :50, 1], lambda k: k
    if kind == "memoryview":
        return memoryview(y[5]), np.asarray
    if kind == "base":  # the array the cache keeps, reached through an alias
        return y.base, lambda k: k
    if kind == "frame":
        return f, lambda k: np.from_dlpack(k.plane(0))
    if kind == "export":  # a DLPack export of the frame, not one of its tensors
        return np.from_dlpack(f.plane(0)), lambda k: k
    raise AssertionError(kind)


KINDS = ["tensor", "view", "view of a view", "memoryview", "base", "frame", "export"]


@pytest.mark.parametrize("delivery", ["pull", "push"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_buffer_is_not_rewritten_while_anything_of_its_frame_is_alive(producer, sock, delivery, kind):
    producer(frames=0, fps=1000, slots=4, wait_subscribers=1)
    with _open(sock, delivery, max_held=4) as sub:
        f = sub.next(5.0)
        seq, (y, uv) = f.seq, f.tensors
        base_addr = _addr(y)
        kept, read = _keep(kind, f, y, uv)
        before = np.array(read(kept), copy=True)
        whole0 = np.from_dlpack(f).copy()
        check_pattern(whole0, seq)
        del f, y, uv
        gc.collect()
        later = []
        for _ in range(200):  # the publisher wraps its 4 slots many times
            g = sub.next(5.0)
            gy, guv = g.tensors
            _check_planes(g, gy, guv)
            assert g.seq > seq
            later.append(_addr(gy))
            if delivery == "push":
                assert not g.zero_copy, "the push buffer lent last is still held: frames are copies"
            del g, gy, guv
        assert base_addr not in later, "a buffer whose frame is alive was written again"
        assert np.array_equal(read(kept), before), "the kept memory changed"
        s = sub.stats()
        assert s["tensors_busy"] > 0 and s["held"] == 1, s
        if kind == "frame":
            check_pattern(np.from_dlpack(kept), seq)
        # Let go: the buffer is free again and handed out again.
        del kept
        gc.collect()
        again = []
        for _ in range(20):
            g = sub.next(5.0)
            gy, guv = g.tensors
            _check_planes(g, gy, guv)
            again.append((_addr(gy), g.zero_copy))
            del g, gy, guv
        assert sub.stats()["held"] == 0
    if delivery == "pull":
        assert again[0][0] == base_addr, "the first buffer is free and taken again"
    else:
        assert all(z for _, z in again), "nothing held: zero-copy push again"


def test_frames_held_counts_buffers_whose_tensors_or_views_are_alive(producer, sock):
    producer(frames=0, fps=500, wait_subscribers=1)
    with vramring.Subscriber(sock, tensors="numpy", max_held=3) as sub:
        views = []
        for _ in range(3):
            f = sub.next(5.0)
            views.append(f.tensors[0][:, :8])
            del f
        with pytest.raises(vramring.FramesHeld, match="max_held"):
            sub.next(5.0)
        assert sub.stats()["held"] == 3
        views.pop()
        f = sub.next(5.0)  # that buffer came back
        assert sub.stats()["allocated"] == 3


def test_tensors_held_past_close_keep_their_buffers_whole(producer, sock):
    producer(frames=0, fps=1000, slots=4, wait_subscribers=2)
    subs = [_open(sock, d, name=f"py-{d}") for d in ("pull", "push")]
    kept = []
    for sub in subs:
        f = sub.next(5.0)
        v = f.tensors[0][:, :64]
        kept.append((f.seq, np.from_dlpack(f).copy(), v, v.copy()))
        del f, v
    for sub in subs:
        sub.close()
    del subs, sub
    gc.collect()
    time.sleep(0.3)  # the publisher keeps publishing meanwhile
    for seq, whole0, view, y0 in kept:
        check_pattern(whole0, seq)
        assert np.array_equal(view, y0)
    del kept, view
    gc.collect()  # the parked push subscriber closes now


def test_tensors_argument_errors_and_frames_without_tensors(producer, sock):
    producer(frames=0, fps=200, wait_subscribers=1)
    with pytest.raises(ValueError, match="tensors must be"):
        vramring.Subscriber(sock, tensors="jax")
    with pytest.raises(ValueError, match="tensors="):
        vramring.Subscriber(sock, stream=1)
    with vramring.Subscriber(sock) as sub:
        f = sub.next(5.0)
        with pytest.raises(ValueError, match="tensors="):
            f.tensors
        s = sub.stats()
    assert s["tensors"] is None and s["tensors_cache"] is None and s["tensors_made"] == 0


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_tensors_torch_without_torch_is_an_import_error(producer, sock):
    producer(frames=0, fps=200, wait_subscribers=1)
    with pytest.raises(ImportError):
        vramring.Subscriber(sock, tensors="torch")


# torch (CPU tensors on the host ring): where torch is installed.


def test_torch_tensors_are_reused_and_a_view_or_autograd_keeps_the_buffer(producer, sock):
    torch = pytest.importorskip("torch")
    producer(frames=0, fps=1000, slots=4, wait_subscribers=1)
    with vramring.Subscriber(sock, tensors="torch", max_held=6) as sub:
        ptrs = set()
        for _ in range(50):
            f = sub.next(5.0)
            y, uv = f.tensors
            assert isinstance(y, torch.Tensor) and y.shape == tuple(f.plane(0).shape)
            check_pattern(np.from_dlpack(f), f.seq)
            assert torch.equal(y, torch.from_dlpack(f.plane(0)))
            ptrs.add(y.data_ptr())
            del f, y, uv
        s = sub.stats()
        if s["tensors_cache"] != "on":
            pytest.skip(f"this torch's counts cannot be proven: {s['tensors_cache']}")
        assert len(ptrs) == 1 and s["tensors_made"] == 2 and s["tensors_reused"] == 49

        # A slice (shares the storage, not the object) keeps the buffer.
        f = sub.next(5.0)
        v = f.tensors[0][:, :100]
        v0 = v.clone()
        del f
        # autograd saves the uint8 plane itself for the backward of `w`.
        f = sub.next(5.0)
        y = f.tensors[0]
        y_addr, y0 = y.data_ptr(), y.clone()
        w = torch.ones(y.shape, dtype=torch.float32, requires_grad=True)
        out = (y * w).sum()
        del f, y
        gc.collect()
        for _ in range(200):
            g = sub.next(5.0)
            gy = g.tensors[0]
            assert gy.data_ptr() not in (v.data_ptr(), y_addr)
            check_pattern(np.from_dlpack(g), g.seq)
            del g, gy
        assert torch.equal(v, v0)
        out.backward()
        assert torch.equal(w.grad, y0.float()), "the saved plane was not rewritten"
        assert sub.stats()["tensors_busy"] > 0


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_a_torch_storage_kept_alone_keeps_its_buffer(producer, sock):
    # torch keeps one Python object per storage, whose references show in
    # neither the storage's use count nor the base's: the cache counts them
    # too (`untyped_storage()`, and the typed `storage()` over it).
    torch = pytest.importorskip("torch")
    producer(frames=0, fps=1000, slots=4, wait_subscribers=1)
    with vramring.Subscriber(sock, tensors="torch", max_held=6) as sub:
        for kind in ("untyped_storage", "storage"):
            f = sub.next(5.0)
            y = f.tensors[0]
            if sub.stats()["tensors_cache"] != "on":
                pytest.skip(f"this torch's counts cannot be proven: {sub.stats()['tensors_cache']}")
            kept = getattr(y, kind)()
            before, where = y.clone(), (y.storage_offset(), y.shape, y.stride())
            addr = y.data_ptr()
            del f, y
            gc.collect()
            for _ in range(100):
                g = sub.next(5.0)
                assert g.tensors[0].data_ptr() != addr, f"a buffer whose {kind}() is kept was handed out again"
                check_pattern(np.from_dlpack(g), g.seq)
                del g
            storage = kept if kind == "untyped_storage" else kept.untyped()
            now = torch.empty(0, dtype=torch.uint8).set_(storage, *where)
            assert torch.equal(now, before), f"the buffer under {kind}() was rewritten"
            del kept, now


def test_a_reconnect_to_a_ring_of_the_same_size_but_another_shape_gets_tensors_of_its_shape(sock):
    # gray8 1536x1024 and 1024x1536: 512-byte pitches make both frames
    # 1 572 864 bytes, so only the shape tells them apart.
    sub = None
    with vramring.Publisher(sock, "gray8", 1536, 1024, backend="host") as a:
        sub = vramring.Subscriber(sock, mode="sequential", reconnect=True, tensors="numpy")
        first_nbytes = a.nbytes
        a.publish(pattern_frame(1, a.nbytes))
        f = sub.next(5.0)
        assert f.tensors[0].shape == (1024, 1536)
        del f
    with pytest.raises(vramring.ProducerGone):
        sub.next(1.0)
    with vramring.Publisher(sock, "gray8", 1024, 1536, backend="host") as b:
        assert b.nbytes == first_nbytes
        t = threading.Thread(target=lambda: (time.sleep(0.2), b.publish(pattern_frame(1, b.nbytes))))
        t.start()
        f = sub.next(5.0)
        t.join()
        (y,) = f.tensors
        assert (f.width, f.height) == (1024, 1536)
        assert y.shape == tuple(f.plane(0).shape) == (1536, 1024)
        assert np.array_equal(y, np.from_dlpack(f.plane(0)))
        del f, y
    sub.close()


def test_a_reference_cycle_through_a_frame_is_collected_and_its_buffer_reused(producer, sock):
    # frame -> its tensors -> a tensor -> the frame: the garbage collector
    # sees through the frame, so the cycle goes and the buffer comes back
    # (before, every such frame stayed held until max_held was reached).
    torch = pytest.importorskip("torch")
    producer(frames=0, fps=1000, slots=4, wait_subscribers=1)
    with vramring.Subscriber(sock, tensors="torch", max_held=2) as sub:
        for _ in range(20):
            f = sub.next(5.0)
            y = f.tensors[0]
            assert isinstance(y, torch.Tensor)
            y.frame = f
            del f, y
            gc.collect()
        assert sub.stats()["tensors_busy"] == 0
