"""vramring: GPU video frames from one publisher process to many subscriber
processes (a CUDA VMM pool or a host memfd, handed over a Unix socket), as
DLPack tensors.

    import torch, vramring
    with vramring.Subscriber("/run/cam1.sock") as sub:
        for frame in sub:
            y = torch.from_dlpack(frame.plane(0))   # CUDA tensor on a CUDA ring

Every ``Frame`` owns its memory (a buffer of the subscriber's pool, on the
ring's GPU or on the host, or the push buffer the publisher filled): tensors
made from it keep it alive, and no later ``next()`` writes into it. Cost: a
pull frame is one copy, the one the Rust subscriber makes too (device to
device on a CUDA ring); a push frame is no copy, or one when a push frame
handed out before is still alive.
"""

import os
from typing import Any, Iterator, Literal, Optional, Union

__version__: str

Mode = Literal["latest", "sequential"]
Format = Literal["nv12", "p010", "gray8", "rgb8", "rgba8", "raw"]

class Plane:
    """Layout of one plane inside a frame."""
    offset: int
    pitch: int
    row_bytes: int
    rows: int

class View:
    """A DLPack view of one plane (or a whole frame / loaned slot)."""
    shape: list[int]
    strides: list[int]
    data_ptr: int
    def __dlpack__(self, stream: Any = None, *, max_version: Optional[tuple[int, int]] = None,
                   dl_device: Optional[tuple[int, int]] = None, copy: Optional[bool] = None) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

class Frame:
    """A frame in memory of its own, with its metadata. DLPack: the whole
    frame as 1-D uint8 of ``nbytes``; ``plane(k)`` per plane."""
    seq: int
    pts: int
    flags: int
    commit_ns: int
    """CLOCK_MONOTONIC ns when the publisher committed the frame."""
    skipped: int
    pushed: bool
    zero_copy: bool
    """True: the frame is the push buffer the publisher filled, lent as it
    is (no copy in this process); False: a buffer of the subscriber's pool."""
    timing: tuple[int, int, int, int]
    """CLOCK_MONOTONIC ns of ``next()``'s steps: (woke, copied, checked,
    returned): the wait ended; the copy was complete (``woke`` when
    zero-copy); the copy was proven whole; the GIL was held again."""
    meta: bytes
    format: str
    width: int
    height: int
    planes: list[Plane]
    nbytes: int
    data_ptr: int
    tensors: tuple[Any, ...]
    """One tensor per plane (``Subscriber(tensors=)``; ValueError without),
    shaped as ``plane(k)``: made once per buffer and handed out again as
    fresh aliases. The buffer is not written again while this frame, these
    tensors, any view of them or an export of the frame is alive."""
    def plane(self, k: int) -> View:
        """NV12: plane(0) is Y, ``rows x width`` uint8 with the pitch as row
        stride; plane(1) is UV, ``rows x width/2 x 2``. P010 is uint16;
        RGB8/RGBA8 are ``rows x width x 3|4``."""
    def __dlpack__(self, stream: Any = None, *, max_version: Optional[tuple[int, int]] = None,
                   dl_device: Optional[tuple[int, int]] = None, copy: Optional[bool] = None) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

class BorrowedFrame:
    """A frame lent in place (no copy) by ``Subscriber.borrow``."""
    seq: int
    pts: int
    flags: int
    commit_ns: int
    meta: bytes
    nbytes: int
    planes: list[Plane]
    data_ptr: int
    intact: Optional[bool]
    """None while lent; after release, whether the frame stayed whole."""
    def tobytes(self) -> bytes: ...
    def release(self) -> bool: ...
    def __enter__(self) -> "BorrowedFrame": ...
    def __exit__(self, *args: Any) -> bool: ...

class Subscriber:
    """Connects to the publisher at ``path``. The GIL is released while
    waiting and copying."""
    backend: str
    format: str
    width: int
    height: int
    planes: list[Plane]
    epoch: int
    push_active: bool
    delivery: Literal["pull", "push"]
    path: str
    def __init__(self, path: Union[str, "os.PathLike[str]"], *, name: Optional[str] = None,
                 mode: Optional[Mode] = None, lossless: bool = False, push: bool = False,
                 reconnect: bool = False, timeout: float = 5.0, connect_timeout: float = 5.0,
                 max_held: int = 16, spin: Optional[float] = None,
                 prepare_ahead: float = 0.0005,
                 tensors: Optional[Literal["torch", "numpy"]] = None,
                 stream: Optional[Any] = None) -> None:
        """``push``: the publisher copies frames into this subscriber's own
        buffers, in any mode; without it the subscriber pulls where the
        publisher hands out its pool and is pushed to where it does not
        (``delivery`` says which). ``spin``: seconds ``next()`` spins
        before parking the thread (default 50 us); longer costs CPU and
        saves the wake-up. ``prepare_ahead``: once the publisher's
        cadence is known, ``next()`` first parks until this many seconds
        before it would start spinning for the next frame, then prepares
        for it (default 500 us; 0: at once), so that the frame's way to
        Python runs warm.
        ``tensors``: ``frame.tensors`` holds the planes
        as torch tensors (or numpy arrays, host rings), imported once per
        buffer and handed out again; a buffer is written again only once
        nothing of its last frame is alive (tensors, views of them,
        exports). ``stream``: the CUDA stream they are used on (an int
        ``CUstream`` or a ``torch.cuda.Stream``; default torch's current
        stream; -1: none, you order your own work)."""
    def next(self, timeout: float = 5.0) -> Frame:
        """Raises Timeout, ProducerGone, Evicted, FramesHeld."""
    def __iter__(self) -> Iterator[Frame]: ...
    def __next__(self) -> Frame: ...
    def borrow(self, timeout: float = 5.0) -> BorrowedFrame:
        """A push subscriber lends its newest pushed buffer, without holding
        it (``intact`` says whether the publisher left it alone)."""
    def stats(self) -> dict[str, Any]:
        """delivered, dropped, overruns, last_seq, reconnects, pushed,
        delivery ("pull" or "push"), held,
        zero_copy (push frames handed out without a copy), allocated (frame
        buffers the pool ever allocated; reused, not made per frame);
        tensors ("torch", "numpy" or None), tensors_cache ("on", or "off:
        why" when tensors are imported per frame instead), tensors_made
        (plane imports: once per buffer), tensors_reused (frames handed
        tensors made for an earlier frame), tensors_busy (checks that found
        a buffer still referenced, which was skipped); cadence_windows,
        cadence_hits, cadence_misses, cadence_early (the cadence wait's
        spin windows, frames caught in one, windows without their frame,
        frames that came before their window's spin began)."""
    def close(self) -> None:
        """A zero-copy push frame still alive keeps the connection (and its
        buffer held) until it and its tensors are gone."""
    def __enter__(self) -> "Subscriber": ...
    def __exit__(self, *args: Any) -> bool: ...

class Loan:
    """A slot lent by ``Publisher.loan()`` for zero-copy writing."""
    seq: int
    data_ptr: int
    planes: list[Plane]
    def plane(self, k: int) -> View: ...
    def __dlpack__(self, stream: Any = None, *, max_version: Optional[tuple[int, int]] = None,
                   dl_device: Optional[tuple[int, int]] = None, copy: Optional[bool] = None) -> Any: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def publish(self, *, pts: Optional[int] = None, meta: bytes = b"", flags: int = 0,
                stream: Any = None) -> int: ...
    def cancel(self) -> None: ...
    def __enter__(self) -> "Loan": ...
    def __exit__(self, *args: Any) -> bool: ...

class Publisher:
    """Creates a ring and serves it on the Unix socket ``path``."""
    backend: str
    nbytes: int
    packed_nbytes: int
    planes: list[Plane]
    next_seq: int
    path: str
    def __init__(self, path: Union[str, "os.PathLike[str]"], format: Format, width: int, height: int, *,
                 slots: int = 8, backend: str = "auto",
                 policy: Literal["overwrite", "lossless"] = "overwrite",
                 max_subscribers: Optional[int] = None, lossless_lease: float = 1.0,
                 attach_rate: Optional[tuple[int, int]] = (8, 16),
                 commit_graph: Literal["auto", "always", "never"] = "auto") -> None:
        """``attach_rate``: ``(per_second, burst)``, how many push
        subscribers' buffers the publisher takes (one past the rate waits for
        its first frame), or ``None`` to take every one at once (trusted
        subscribers only). ``commit_graph`` (CUDA rings): when push commits
        replay the commit graph instead of launching the commit kernel."""
    def publish(self, frame: Any, *, pts: Optional[int] = None, meta: bytes = b"", flags: int = 0,
                timeout: float = 1.0) -> int:
        """Copies a DLPack producer (torch CUDA/CPU tensor, numpy array) of
        ``nbytes`` (slot image) or ``packed_nbytes`` (planes packed) bytes
        into the next slot and commits it; returns its seq."""
    def loan(self, timeout: float = 1.0) -> Loan: ...
    def stats(self) -> dict[str, int]:
        """published, subscribers, connects, disconnects, evictions,
        lossless_waits, refused, attaches (push subscribers' buffers taken),
        attaches_deferred (Attaches that waited for the publisher's attach
        rate, taken in the end or not)."""
    def close(self) -> None: ...
    def __enter__(self) -> "Publisher": ...
    def __exit__(self, *args: Any) -> bool: ...

class Packet:
    seq: int
    pts: int
    dts: int
    flags: int
    codec: int
    commit_ns: int
    skipped: int
    data: bytes
    is_key: bool
    def __len__(self) -> int: ...
    def __bytes__(self) -> bytes: ...

class PacketSubscriber:
    def __init__(self, path: Union[str, "os.PathLike[str]"], *, name: Optional[str] = None,
                 lossless: bool = False, timeout: float = 5.0, connect_timeout: float = 5.0) -> None: ...
    def next(self, timeout: float = 5.0) -> Packet: ...
    def __iter__(self) -> Iterator[Packet]: ...
    def __next__(self) -> Packet: ...
    def codec_params(self) -> bytes: ...
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...
    def __enter__(self) -> "PacketSubscriber": ...
    def __exit__(self, *args: Any) -> bool: ...

class PacketPublisher:
    def __init__(self, path: Union[str, "os.PathLike[str]"], *, data_bytes: int = 8 << 20,
                 records: int = 1024, max_packet: int = 2 << 20, codec: int = 0,
                 allow_lossless: bool = False, write_timeout: float = 1.0) -> None: ...
    def write(self, data: Any, *, pts: int = 0, dts: Optional[int] = None, key: bool = False,
              flags: int = 0, codec: int = 0) -> int: ...
    def set_codec_params(self, params: bytes) -> int: ...
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...
    def __enter__(self) -> "PacketPublisher": ...
    def __exit__(self, *args: Any) -> bool: ...

class VramringError(Exception): ...
class VersionMismatch(VramringError): ...
class LayoutMismatch(VramringError): ...
class BadMessage(VramringError): ...
class Refused(VramringError): ...
class ProducerGone(VramringError): ...
class Evicted(VramringError): ...
class Timeout(VramringError): ...
class Overrun(VramringError): ...
class LosslessBlocked(VramringError): ...
class AddressInUse(VramringError): ...
class ConfigError(VramringError): ...
class WrongBackend(VramringError): ...
class CudaUnavailable(VramringError): ...
class DriverError(VramringError): ...
class OutOfDeviceMemory(VramringError): ...
class DeviceNotVisible(VramringError): ...
class PermissionDenied(VramringError): ...
class TooManySubscribers(VramringError): ...
class IoError(VramringError): ...
class TooLarge(VramringError): ...
class Closed(VramringError): ...
class PacketOverrun(VramringError): ...
class FramesHeld(VramringError): ...

