"""Python publisher: to Python subscribers, and to the Rust consumer example."""

import json
import subprocess
import threading
import time

import numpy as np
import pytest

import vramring
from conftest import HANG, check_pattern, pattern_frame


def test_python_publisher_to_rust_consumer_has_no_torn_frames(examples, sock):
    n = 200
    # Lossless, so the consumer (a debug build, slow to verify) gets every frame.
    with vramring.Publisher(sock, "nv12", 640, 360, slots=8, backend="host", policy="lossless",
                           lossless_lease=30.0) as pub:
        cons = subprocess.Popen(
            [str(examples / "consumer"), "--socket", sock, "--lossless", "--json", "--report-ms", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + HANG
        while pub.stats()["subscribers"] < 1:
            assert time.monotonic() < deadline, "the Rust consumer did not connect"
            time.sleep(0.01)
        for seq in range(1, n + 1):
            assert pub.publish(pattern_frame(seq, pub.nbytes), pts=seq * 1000, timeout=5.0) == seq
    out, err = cons.communicate(timeout=30)
    assert cons.returncode == 0, err
    final = json.loads(out.strip().splitlines()[-1])
    assert final["event"] == "final"
    assert final["torn"] == 0
    assert (final["delivered"], final["dropped"], final["first_seq"], final["last_seq"]) == (n, 0, 1, n)


def test_publish_accepts_the_slot_image_and_the_packed_layout(sock):
    with vramring.Publisher(sock, "nv12", 64, 48, slots=4, backend="host") as pub:
        with vramring.Subscriber(sock, mode="sequential") as sub:
            img = pattern_frame(1, pub.nbytes)
            pub.publish(img, meta=b"camera-7")
            f = sub.next(1.0)
            check_pattern(np.from_dlpack(f), 1)
            assert (f.seq, f.pts, f.meta) == (1, 1, b"camera-7")
            # Packed: Y rows then UV rows, no pitch padding, any dtype/shape.
            y = np.arange(64 * 48, dtype=np.uint32).astype(np.uint8).reshape(48, 64)
            uv = np.full((24, 32, 2), 9, np.uint8)
            packed = np.concatenate([y.reshape(-1), uv.reshape(-1)]).reshape(-1, 16)
            assert packed.nbytes == pub.packed_nbytes
            pub.publish(packed, pts=77)
            f = sub.next(1.0)
            assert f.pts == 77
            assert np.array_equal(np.from_dlpack(f.plane(0)), y)
            assert np.array_equal(np.from_dlpack(f.plane(1)), uv)


def test_loan_writes_in_place_and_publishes(sock):
    with vramring.Publisher(sock, "rgb8", 32, 16, slots=4, backend="host") as pub:
        with vramring.Subscriber(sock, mode="sequential") as sub:
            with pub.loan() as loan:
                assert loan.seq == 1
                px = np.from_dlpack(loan.plane(0))
                assert px.shape == (16, 32, 3)
                px[:] = [1, 2, 3]
                assert loan.publish(pts=5) == 1
            f = sub.next(1.0)
            assert f.pts == 5 and np.all(np.from_dlpack(f.plane(0)) == [1, 2, 3])
            # A cancelled loan leaves the seq unused.
            with pub.loan() as loan:
                assert loan.seq == 2
            assert pub.publish(np.zeros(pub.nbytes, np.uint8)) == 2
            # A view of a loaned slot blocks close() while it lives.
            with pub.loan() as loan:
                px = np.from_dlpack(loan.plane(0))
                loan.publish()
            with pytest.raises(ValueError, match="still alive"):
                pub.close()
            del px
            pub.close()


def test_borrow_reports_whether_the_frame_stayed_intact(sock):
    with vramring.Publisher(sock, "gray8", 64, 64, slots=4, backend="host") as pub:
        with vramring.Subscriber(sock, mode="sequential") as sub:
            pub.publish(pattern_frame(1, pub.nbytes))
            with sub.borrow(1.0) as b:
                assert b.seq == 1 and b.intact is None
                check_pattern(np.frombuffer(b.tobytes(), np.uint8), 1)
                with pytest.raises(ValueError, match="borrow"):
                    sub.next(0.1)  # the subscriber is lent out
            assert b.intact is True
            pub.publish(pattern_frame(2, pub.nbytes))
            with sub.borrow(1.0) as b:
                for seq in range(3, 8):  # wraps the 4-slot ring over frame 2
                    pub.publish(pattern_frame(seq, pub.nbytes))
            assert b.intact is False
            assert sub.stats()["overruns"] == 1


def test_reconnect_follows_the_next_publisher_instance(sock):
    sub = None
    with vramring.Publisher(sock, "gray8", 64, 8, backend="host") as a:
        sub = vramring.Subscriber(sock, mode="sequential", reconnect=True)
        a.publish(pattern_frame(1, a.nbytes))
        assert sub.next(1.0).seq == 1
        first = sub.epoch
    with pytest.raises(vramring.ProducerGone):
        sub.next(1.0)
    with vramring.Publisher(sock, "gray8", 128, 8, backend="host") as b:
        def later():
            time.sleep(0.2)
            b.publish(pattern_frame(1, b.nbytes))
        t = threading.Thread(target=later)
        t.start()
        f = sub.next(3.0)
        # `publish` may still be finishing on the other thread once the
        # frame is readable: leaving the block closes `b`, which needs it
        # (a Publisher is used from one thread at a time).
        t.join()
        assert f.width == 128 and f.seq == 1 and sub.epoch != first
        check_pattern(np.from_dlpack(f), 1)
        assert sub.stats()["reconnects"] == 1
    sub.close()


def test_stats_count_a_push_subscribers_attach(sock):
    with vramring.Publisher(sock, "gray8", 64, 16, slots=4, backend="host") as pub:
        stats = pub.stats()
        assert (stats["attaches"], stats["attaches_deferred"], stats["refused"]) == (0, 0, 0)
        with vramring.Subscriber(sock, push=True) as sub:
            # The buffers are taken at a publish after the Attach came.
            deadline = time.monotonic() + HANG
            while True:
                pub.publish(np.zeros(pub.nbytes, np.uint8))
                try:
                    sub.next(0.05)
                    break
                except vramring.Timeout:
                    assert time.monotonic() < deadline, "no frame was ever pushed"
        stats = pub.stats()
        assert (stats["attaches"], stats["attaches_deferred"]) == (1, 0)


def test_push_subscribers_past_the_attach_rate_wait_their_turn(sock):
    # One push subscriber's buffers at once, then one a second.
    with vramring.Publisher(sock, "gray8", 64, 16, slots=4, backend="host", attach_rate=(1, 1)) as pub:
        # Before the first Attach: the second token comes at least a second
        # after it.
        start = time.monotonic()
        subs = [vramring.Subscriber(sock, push=True, name=f"py-rate-{i}") for i in range(2)]
        connected = time.monotonic() - start
        first = [None, None]
        while None in first:
            assert time.monotonic() - start < HANG, f"push never started: {first}"
            pub.publish(np.zeros(pub.nbytes, np.uint8))
            for i, sub in enumerate(subs):
                if first[i] is None:
                    try:
                        sub.next(0.002)
                        first[i] = time.monotonic() - start
                    except vramring.Timeout:
                        pass
        # In order of arrival, the second a token interval later.
        assert first[0] < first[1] and first[1] >= 1.0, f"not served one token apart, in order: {first}"
        stats = pub.stats()
        # The second Attach waits unless this thread stalled a token's
        # interval between the two connects.
        assert stats["attaches"] == 2, stats
        if connected < 1.0:
            assert stats["attaches_deferred"] == 1, (connected, stats)
        for sub in subs:
            sub.close()


def test_attach_rate_none_takes_every_push_subscriber_at_once_and_zero_is_refused(sock):
    with pytest.raises(vramring.ConfigError, match="attach rate"):
        vramring.Publisher(sock, "gray8", 16, 16, backend="host", attach_rate=(0, 4))
    with vramring.Publisher(sock, "gray8", 16, 16, backend="host", attach_rate=None) as pub:
        subs = [vramring.Subscriber(sock, push=True) for _ in range(3)]
        deadline = time.monotonic() + HANG
        while pub.stats()["attaches"] < 3:
            assert time.monotonic() < deadline, pub.stats()
            pub.publish(np.zeros(pub.nbytes, np.uint8))
            time.sleep(0.002)
        assert pub.stats()["attaches_deferred"] == 0
        for sub in subs:
            sub.close()
