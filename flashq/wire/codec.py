"""Encode messages to ZeroMQ frames and back, with numpy arrays as raw out-of-band frames.

Frame 0 is the msgpack `Envelope`; each array at least `INLINE_LIMIT` bytes long is replaced by
`[dtype, shape, frame_index]` and its bytes go as their own frame, sent without a copy and
viewed without a copy on arrival (`np.frombuffer` over the received frame). Smaller arrays ride
inline as bytes, where an extra frame would cost more than the copy.

Decoding is also validation: schema version, message type, field types, array dtype/shape
against the frame length, then the message's own `validate()`. Anything wrong raises
`RejectedFrame` with a reason; callers count and log it and go on.

Several messages for one peer may travel as one ZeroMQ message, a bundle (`pack`/`unpack`):
`[BUNDLE_MARK, each message's frame sizes, all their frames joined in one]`. Each
ZeroMQ message costs a send, a wake-up of ZeroMQ's I/O thread and a receive on both sides;
a rollout worker answers about a hundred requests per engine step, so one message per answer
cost the roles more CPU than the messages' contents. Inside a bundle each message is decoded
and rejected on its own, so a bad one costs only itself.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from flashq.wire.protocol import SCHEMA_VERSION, Envelope, Message

INLINE_LIMIT = 1024
# frame 0 of a bundle; 0xc1 is the one byte msgpack never uses, so no envelope starts with it
BUNDLE_MARK = b"\xc1flashq-bundle-1"
MAX_BUNDLE = 4096  # messages in one bundle
BUNDLE_BYTES = 8 << 20  # and bytes: past this a message's own overhead is negligible anyway
# wire name (numpy's byte-order-explicit dtype string) -> dtype; anything else is refused
ALLOWED_DTYPES = {d.str: d for d in map(np.dtype, ("<i4", "<i8", "<f4", "<f8", "|u1", "|b1"))}
MAX_ARRAY_DIMS = 4


class RejectedFrame(Exception):
    """A frame that is not a valid flashq message; `reason` says what was wrong."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Encoder:
    """Not thread-safe: keep one per socket."""

    def __init__(self) -> None:
        self._frames: list[Any] = []
        self._enc = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)

    def encode(self, msg: Message) -> list[Any]:
        self._frames = [b""]
        try:
            self._frames[0] = self._enc.encode(Envelope(SCHEMA_VERSION, msg))
            return self._frames
        finally:
            self._frames = []

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            dtype = obj.dtype.str
            if dtype not in ALLOWED_DTYPES:
                raise TypeError(f"array dtype {obj.dtype} cannot be sent")
            arr = obj if obj.flags.c_contiguous else np.ascontiguousarray(obj)
            if arr.nbytes < INLINE_LIMIT:
                return [dtype, arr.shape, arr.tobytes()]
            self._frames.append(memoryview(arr).cast("B"))
            return [dtype, arr.shape, len(self._frames) - 1]
        raise TypeError(f"cannot encode {type(obj).__name__}")


class Decoder:
    """Not thread-safe: keep one per socket."""

    def __init__(self, max_message_bytes: int = 1 << 30) -> None:
        self._frames: list[Any] = []
        self._used: set[int] = set()
        self.max_message_bytes = max_message_bytes
        self._dec = msgspec.msgpack.Decoder(Envelope, dec_hook=self._dec_hook)

    def decode(self, frames: list[Any]) -> Message:
        if not frames:
            raise RejectedFrame("empty message")
        buffers = [_view(f) for f in frames]
        total = sum(b.nbytes for b in buffers)
        if total > self.max_message_bytes:
            raise RejectedFrame(f"message of {total} bytes exceeds the {self.max_message_bytes}-byte limit")
        self._frames, self._used = buffers, set()
        try:
            env = self._dec.decode(buffers[0])
        except msgspec.ValidationError as e:
            raise RejectedFrame(f"invalid message: {e}") from None
        except msgspec.DecodeError as e:
            raise RejectedFrame(f"malformed msgpack: {e}") from None
        except (UnicodeDecodeError, ValueError, TypeError, OverflowError) as e:  # msgspec lets some through
            raise RejectedFrame(f"malformed message: {type(e).__name__}: {e}") from None
        except RecursionError:  # msgspec recurses once per level of nesting; ~1,000 levels fit in 10 KB
            raise RejectedFrame("nested too deep to decode") from None
        except MemoryError:
            raise RejectedFrame(f"no memory to decode a message of {total} bytes") from None
        finally:
            self._frames = []
        if env.schema != SCHEMA_VERSION:
            raise RejectedFrame(f"schema version {env.schema}, this build speaks {SCHEMA_VERSION}")
        if len(self._used) != len(buffers) - 1:
            raise RejectedFrame(f"{len(buffers) - 1} data frames sent, {len(self._used)} referenced")
        try:
            env.body.validate()
        except ValueError as e:
            raise RejectedFrame(f"{type(env.body).__name__}: {e}") from None
        return env.body

    def _dec_hook(self, typ: type, obj: Any) -> Any:
        if typ is not np.ndarray:
            raise NotImplementedError(f"cannot decode {typ}")
        if not (isinstance(obj, list) and len(obj) == 3):
            raise ValueError("array must be [dtype, shape, data]")
        name, shape, data = obj
        dtype = ALLOWED_DTYPES.get(name) if isinstance(name, str) else None
        if dtype is None:
            raise ValueError(f"array dtype {name!r} not allowed")
        if not (isinstance(shape, list) and len(shape) <= MAX_ARRAY_DIMS and all(type(s) is int and s >= 0 for s in shape)):
            raise ValueError(f"bad array shape {shape!r}")
        if isinstance(data, int) and not isinstance(data, bool):
            if not 1 <= data < len(self._frames) or data in self._used:
                raise ValueError(f"array frame index {data} is missing or reused")
            self._used.add(data)
            buf = self._frames[data]
        elif isinstance(data, (bytes, memoryview)):
            buf = data
        else:
            raise ValueError("array data must be bytes or a frame index")
        count = 1
        for s in shape:
            count *= s
        size = memoryview(buf).nbytes
        if count * dtype.itemsize != size:
            raise ValueError(f"array of shape {shape} {dtype} needs {count * dtype.itemsize} bytes, frame has {size}")
        arr = np.frombuffer(buf, dtype=dtype)
        return arr if len(shape) == 1 else arr.reshape(shape)


def frames_nbytes(frames: list[Any]) -> int:
    return sum(_view(f).nbytes for f in frames)


def pack(messages: list[list[Any]]) -> list[Any]:
    """One ZeroMQ message for several encoded messages (each a list of frames); a single
    message goes as itself. A bundle is three frames whatever it holds, `[BUNDLE_MARK, the
    byte length of each message's frames, every frame joined]`: libzmq and pyzmq charge per
    frame as well as per message, and the copy into one buffer costs less than either."""
    if len(messages) == 1:
        return messages[0]
    if not 1 < len(messages) <= MAX_BUNDLE:
        raise ValueError(f"a bundle holds 2 to {MAX_BUNDLE} messages, not {len(messages)}")
    sizes = [[_view(f).nbytes for f in m] for m in messages]
    return [BUNDLE_MARK, msgspec.msgpack.encode(sizes), b"".join(f for m in messages for f in m)]


_sizes = msgspec.msgpack.Decoder(list[list[int]])


def _view(frame: Any) -> memoryview:
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def unpack(frames: list[Any]) -> list[list[Any]]:
    """The messages in one received ZeroMQ message, each still to be decoded (its frames are
    views into the bundle, not copies); raises `RejectedFrame` when a bundle's own layout is
    wrong (then none of it can be trusted)."""
    first = _view(frames[0]) if frames else memoryview(b"")
    if first.nbytes != len(BUNDLE_MARK) or bytes(first) != BUNDLE_MARK:
        return [frames]
    if len(frames) != 3:
        raise RejectedFrame(f"bundle of {len(frames)} frames; a bundle is its mark, its frame sizes and its joined frames")
    try:
        sizes = _sizes.decode(_view(frames[1]))
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise RejectedFrame(f"bundle frame sizes unreadable: {e}") from None
    joined = _view(frames[2]).cast("B")
    if (not 1 < len(sizes) <= MAX_BUNDLE or any(not m for m in sizes) or any(n < 0 for m in sizes for n in m)
            or sum(map(sum, sizes)) != joined.nbytes):
        raise RejectedFrame(f"bundle frame sizes do not split its {joined.nbytes} bytes into 2 to {MAX_BUNDLE} messages")
    out, start = [], 0
    for message in sizes:
        parts = []
        for n in message:
            parts.append(joined[start:start + n])
            start += n
        out.append(parts)
    return out
