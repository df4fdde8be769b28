"""Encode messages to ZeroMQ frames and back, with numpy arrays as raw out-of-band frames.

A message encodes to frames: frame 0 is the msgpack `Envelope`; each array at least
`INLINE_LIMIT` bytes long is replaced by `[dtype, shape, frame_index]` and its bytes become their
own frame, encoded without a copy and viewed without a copy on arrival (`np.frombuffer` over the
received bytes). Smaller arrays ride inline as bytes.

Decoding is also validation: schema version, message type, field types, array dtype/shape
against the frame length, then the message's own `validate()`. Anything wrong raises
`RejectedFrame` with a reason; callers count and log it and go on.

On the wire every ZeroMQ message is **one frame** (`pack`/`unpack`): a message that encoded to a
lone frame goes as itself; anything else, several messages for one peer or one message with
array frames, goes as a bundle, `BUNDLE_MARK`, the length of a size table, the table (each
message's frame sizes), then every frame joined. One frame because libzmq 4.3.5 aborts the
sending process when a socket closes while its I/O thread has written part of a multi-part
message to a peer that drops the connection at the same moment (libzmq issue 3442, the
assertion at session_base.cpp:233): a coordinator and a worker ending a run together could die
of it. The join costs one copy of the arrays on the sending side. Bundling several messages
matters too: each ZeroMQ message costs a send, a wake-up of ZeroMQ's I/O thread and a receive on
both sides, and a rollout worker answers about a hundred requests per engine step. Inside a
bundle each message is decoded and rejected on its own, so a bad one costs only itself.
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec
import numpy as np

from flashq.wire.protocol import SCHEMA_VERSION, Envelope, Message

INLINE_LIMIT = 1024
# a bundle's first bytes; 0xc1 is the one byte msgpack never uses, so no envelope starts with it
BUNDLE_MARK = b"\xc1flashq-bundle-2"
_TABLE_LENGTH = struct.Struct("<I")  # after the mark: the size table's length in bytes
BUNDLE_HEADER_BYTES = len(BUNDLE_MARK) + _TABLE_LENGTH.size + 5  # mark, table length, the table's array header
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


def bundled_nbytes(frames: list[Any]) -> int:
    """What one encoded message adds to a bundle: its frames and, at most, its row of the size table."""
    return frames_nbytes(frames) + 5 * len(frames) + 5


def pack(messages: list[list[Any]]) -> Any:
    """The one frame that carries `messages` (each a list of frames from `Encoder.encode`) to a
    peer: a lone frame as itself, anything else as a bundle (see the module's docstring)."""
    if len(messages) == 1 and len(messages[0]) == 1:
        return messages[0][0]
    if not 1 <= len(messages) <= MAX_BUNDLE:
        raise ValueError(f"a bundle holds 1 to {MAX_BUNDLE} messages, not {len(messages)}")
    table = msgspec.msgpack.encode([[_view(f).nbytes for f in m] for m in messages])
    return b"".join([BUNDLE_MARK, _TABLE_LENGTH.pack(len(table)), table, *(f for m in messages for f in m)])


_sizes = msgspec.msgpack.Decoder(list[list[int]])


def _view(frame: Any) -> memoryview:
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def unpack(frames: list[Any]) -> list[list[Any]]:
    """The messages in one received ZeroMQ message, each a list of frames still to be decoded
    (views into the bundle, not copies); raises `RejectedFrame` when the ZeroMQ message is not
    one frame or a bundle's own layout is wrong (then none of it can be trusted)."""
    if len(frames) != 1:
        raise RejectedFrame(f"a ZeroMQ message of {len(frames)} frames; a flashq message is one frame")
    whole = _view(frames[0]).cast("B")
    mark = len(BUNDLE_MARK)
    if whole[:mark] != BUNDLE_MARK:
        return [frames]
    if whole.nbytes < mark + _TABLE_LENGTH.size:
        raise RejectedFrame(f"bundle of {whole.nbytes} bytes, too short for its size table's length")
    start = mark + _TABLE_LENGTH.size
    (table_bytes,) = _TABLE_LENGTH.unpack_from(whole, mark)
    if table_bytes > whole.nbytes - start:
        raise RejectedFrame(f"bundle size table of {table_bytes} bytes in a bundle of {whole.nbytes}")
    try:
        sizes = _sizes.decode(whole[start:start + table_bytes])
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise RejectedFrame(f"bundle frame sizes unreadable: {e}") from None
    start += table_bytes
    joined = whole[start:]
    if (not 1 <= len(sizes) <= MAX_BUNDLE or any(not m for m in sizes) or any(n < 0 for m in sizes for n in m)
            or sum(map(sum, sizes)) != joined.nbytes):
        raise RejectedFrame(f"bundle frame sizes do not split its {joined.nbytes} bytes into 1 to {MAX_BUNDLE} messages")
    out, start = [], 0
    for message in sizes:
        parts = []
        for n in message:
            parts.append(joined[start:start + n])
            start += n
        out.append(parts)
    return out
