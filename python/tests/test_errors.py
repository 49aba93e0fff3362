"""Bad paths, bad arguments, exceptions mirroring vramring::Error."""

import os
import threading
import time

import numpy as np
import pytest

import vramring


def test_every_exception_is_a_vramring_error():
    for name in ["Timeout", "ProducerGone", "Evicted", "Refused", "LayoutMismatch", "VersionMismatch",
                 "AddressInUse", "ConfigError", "IoError", "TooLarge", "Closed", "FramesHeld", "PacketOverrun"]:
        assert issubclass(getattr(vramring, name), vramring.VramringError)


def test_a_path_nobody_listens_on_is_an_io_error(tmp_path):
    with pytest.raises(vramring.IoError, match="No such file"):
        vramring.Subscriber(str(tmp_path / "nothing.sock"))
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(vramring.IoError):
        vramring.Subscriber(str(plain), connect_timeout=0.5)
    with pytest.raises(vramring.IoError):
        vramring.PacketSubscriber(str(tmp_path / "nothing.sock"))


def test_timeout_message_is_the_rust_message(sock):
    with vramring.Publisher(sock, "gray8", 16, 16, backend="host"):
        with vramring.Subscriber(sock) as sub:
            with pytest.raises(vramring.Timeout) as e:
                sub.next(0.05)
    assert str(e.value) == "timed out after 50ms waiting for the next frame"


@pytest.mark.parametrize("kwargs", [{}, {"push": True}, {"tensors": "numpy"}])
def test_a_timeout_longer_than_the_clock_holds_waits_for_the_frame(sock, kwargs):
    # 1e19 s is past what the monotonic clock can add: no deadline, not a
    # panic (which left the subscriber unusable).
    with vramring.Publisher(sock, "gray8", 64, 8, backend="host") as pub:
        with vramring.Subscriber(sock, **kwargs) as sub:
            published = 0

            def publish():
                nonlocal published
                published += 1
                pub.publish(np.full(pub.nbytes, published % 256, dtype=np.uint8))

            if kwargs.get("push"):
                # A push reader gets only frames published once the
                # publisher has mapped its buffers (at a publish after its
                # attach): one published before is never its, and a wait
                # for it would wait for the next.
                deadline = time.monotonic() + 30
                while not sub.push_active:
                    assert time.monotonic() < deadline, "push never became active"
                    publish()
                    time.sleep(0.005)
            for _ in range(3):
                publish()
                got = []
                # Joined with a bound: a lost frame fails the test, not CI.
                reader = threading.Thread(target=lambda: got.append(sub.next(1e19)), daemon=True)
                reader.start()
                reader.join(60)
                assert got, "no frame within 60 s"
                assert got[0].seq == published


def test_a_second_publisher_on_a_live_socket_is_address_in_use(sock):
    with vramring.Publisher(sock, "gray8", 16, 16, backend="host"):
        with pytest.raises(vramring.AddressInUse, match="already listening"):
            vramring.Publisher(sock, "gray8", 16, 16, backend="host")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mode="newest"), "mode must be"),
        (dict(mode="latest", lossless=True), "lossless"),
        (dict(timeout=-1.0), "timeout"),
        (dict(max_held=0), "max_held"),
        (dict(spin=float("nan")), "spin must be"),
        (dict(spin=1e30), "spin of .* seconds is too long"),
        (dict(prepare_ahead=-0.001), "prepare_ahead must be"),
    ],
)
def test_bad_subscriber_arguments_are_value_errors(sock, kwargs, match):
    with vramring.Publisher(sock, "gray8", 16, 16, backend="host"):
        with pytest.raises(ValueError, match=match):
            vramring.Subscriber(sock, **kwargs)


def test_bad_publisher_arguments(sock):
    with pytest.raises(ValueError):
        vramring.Publisher(sock, "yuv444", 16, 16, backend="host")
    with pytest.raises(ValueError, match="unknown backend"):
        vramring.Publisher(sock, "nv12", 16, 16, backend="gpu")
    with pytest.raises(ValueError, match="policy"):
        vramring.Publisher(sock, "nv12", 16, 16, backend="host", policy="drop")
    with pytest.raises(vramring.ConfigError):
        vramring.Publisher(sock, "nv12", 16, 16, slots=3, backend="host")
    with vramring.Publisher(sock, "nv12", 16, 16, backend="host") as pub:
        with pytest.raises(ValueError, match="bytes as the slot image"):
            pub.publish(np.zeros(100, np.uint8))
        with pytest.raises(ValueError, match="contiguous"):
            pub.publish(np.zeros((pub.nbytes, 2), np.uint8)[:, 0])
        with pytest.raises(vramring.TooLarge):
            pub.publish(np.zeros(pub.nbytes, np.uint8), meta=b"x" * 65)
        with pytest.raises(TypeError):
            pub.publish("not a tensor")
        assert pub.stats()["published"] == 0
    with pytest.raises(vramring.Closed):
        pub.publish(np.zeros(16, np.uint8))


def test_cuda_on_a_machine_without_a_gpu_is_a_typed_error(sock):
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has a GPU; the GPU path is checked by python/gpu/check_gpu.py")
    with pytest.raises((vramring.CudaUnavailable, vramring.DriverError)):
        vramring.Publisher(sock, "nv12", 64, 64, backend="cuda")
