"""Encode messages to ZeroMQ frames and back, with numpy arrays as raw out-of-band frames.

Frame 0 is the msgpack `Envelope`; each array at least `INLINE_LIMIT` bytes long is replaced by
`[dtype, shape, frame_index]` and its bytes go as their own frame, sent without a copy and
viewed without a copy on arrival (`np.frombuffer` over the received frame). Smaller arrays ride
inline as bytes, where an extra frame would cost more than the copy.

Decoding is also validation: schema version, message type, field types, array dtype/shape
against the frame length, then the message's own `validate()`. Anything wrong raises
`RejectedFrame` with a reason; callers count and log it and go on.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from flashq.protocol import SCHEMA_VERSION, Envelope, Message

INLINE_LIMIT = 1024
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
        buffers = [f.buffer if hasattr(f, "buffer") else memoryview(f) for f in frames]
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
