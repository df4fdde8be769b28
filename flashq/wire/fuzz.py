"""Hostile frames for the message decoder: random bytes, and valid messages mutated.

`frames(n, seed)` yields n encoded messages (lists of frames, as `Encoder.encode` makes them),
each either pure noise or a real message (of every kind the protocol has) with bytes flipped,
truncated, extended, dropped or duplicated frames, or a header that lies about its arrays; a
socket carries each as `as_sent` makes it. A role must reject every one with a reason and carry
on; `tests/unit/test_fuzz.py` and `bench/fuzz.py` check that. `hostile` yields what a socket
carries, adding what would exhaust a receiver: deep nesting, huge multi-part messages, floods of
schema versions (`bench/flood.py` sends it through a live coordinator's socket).
"""

from __future__ import annotations

import random
from typing import Iterator

import msgspec
import numpy as np
import zmq
import zmq.asyncio

from flashq.wire import protocol as P
from flashq.wire.codec import Encoder, pack


def raw_peer(address: str, identity: str | bytes | None = None, *, user: str | None = None, token: str | None = None,
             hwm: int | None = None, blocking: bool = False, connect: bool = True):
    """A bare DEALER towards a hub, as a stranger or an impostor plays it: any `identity` (the
    name a role's socket would carry), and at the handshake any `user` with any `token` (ZeroMQ
    PLAIN; None: no credential). Nothing of flashq's `Link` (no hello, no codec, no monitor), so
    tests and benches can send whatever frames they like. `blocking`: a plain zmq socket rather
    than an asyncio one; `connect=False` leaves the connect to the caller (to watch it first)."""
    ctx = zmq.Context.instance() if blocking else zmq.asyncio.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if hwm is not None:
        sock.setsockopt(zmq.SNDHWM, hwm)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity.encode() if isinstance(identity, str) else identity)
    if user is not None:
        sock.plain_username, sock.plain_password = user.encode(), (token or "").encode()
    if connect:
        sock.connect(address)
    return sock


def samples_of_every_kind() -> list[P.Message]:
    ids = np.arange(600, dtype=np.int32)
    sample = P.Sample("g1/0", "g1", 0, ids, np.zeros(600, np.float32), np.zeros(600, np.int32), "stop",
                      loss_mask=np.ones(600, np.uint8), env_reward=1.0)
    return [
        P.Hello("rollout", 0, 1, "h"), P.Start("r", 1, 0), P.Heartbeat(1.0), P.Shutdown("x"), P.Fatal("t", "x"),
        P.GenerateRequest("g1/0", "g1", ids, 8), P.EpisodeRequest("g1/0", "g1", {"id": "t"}, 3, 8), P.Cancel(["g1/0"]),
        sample, P.ScoreRequest(sample, {"answer": "1"}), P.RewardResult("g1/0", 1.0), P.BatchRequest(1),
        P.StepStats(1, {"loss": 0.1}), P.WeightSyncCall(1, "push_weights", {"names": ["w"]}), P.WeightSyncReply(1, True),
        P.WorkerStats("rollout", 0, {"busy_s": 1.0}),
    ]


def _mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    frames = list(frames)
    kind = rng.randrange(6)
    i = rng.randrange(len(frames))
    b = bytearray(frames[i])
    if kind == 0 and b:  # flip bytes
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1 and b:  # truncate
        del b[rng.randrange(len(b)):]
    elif kind == 2:  # extend with noise
        b += rng.randbytes(rng.randint(1, 64))
    elif kind == 3 and len(frames) > 1:  # drop a frame
        del frames[i]
        return frames
    elif kind == 4:  # duplicate a frame
        frames.insert(i, frames[i])
        return frames
    else:  # overwrite a window with noise
        if b:
            j = rng.randrange(len(b))
            b[j : j + 8] = rng.randbytes(min(8, len(b) - j))
    frames[i] = bytes(b)
    return frames


def frames(n: int, seed: int = 0) -> Iterator[list[bytes]]:
    rng = random.Random(seed)
    enc = Encoder()
    valid = [[bytes(memoryview(f)) for f in enc.encode(m)] for m in samples_of_every_kind()]
    for _ in range(n):
        if rng.random() < 0.2:
            yield [rng.randbytes(rng.randint(0, 200)) for _ in range(rng.randint(1, 3))]
        else:
            yield _mutate(rng, rng.choice(valid))


def as_sent(frames: list[bytes]) -> list[bytes]:
    """The ZeroMQ message a peer speaking flashq's wire format sends for an encoded message: one
    frame (a message of several frames packed as a bundle), so its contents reach the decoder."""
    return frames if len(frames) == 1 else [bytes(pack([frames]))]


# What a peer that passed the handshake could send to exhaust the receiver rather than confuse it.

def deeply_nested(depth: int) -> list[bytes]:
    """A score request whose task holds lists nested `depth` deep: msgspec recurses once per level."""
    marker = "\x00nest\x00"
    sample = P.Sample("g1/0", "g1", 0, np.arange(4, dtype=np.int32), np.zeros(4, np.float32), np.zeros(4, np.int32), "stop")
    (envelope,) = Encoder().encode(P.ScoreRequest(sample, {"x": marker}))  # arrays this small travel inline
    return [bytes(envelope).replace(msgspec.msgpack.encode(marker), b"\x91" * depth + b"\xc0")]


def huge_multipart(parts: int, part_bytes: int) -> list[bytes]:
    """A heartbeat followed by `parts` data frames nothing references: the receiver holds the
    whole message before it can look at it."""
    block = bytes(part_bytes)
    return [bytes(Encoder().encode(P.Heartbeat(1.0))[0]), *([block] * parts)]


def other_schema(version: int) -> list[bytes]:
    """A valid heartbeat under another schema version (a flood of distinct ones must not grow the books)."""
    return [msgspec.msgpack.encode([version, msgspec.Raw(msgspec.msgpack.encode(P.Heartbeat(1.0)))])]


def hostile(n: int, seed: int, max_message_bytes: int) -> Iterator[list[bytes]]:
    """ZeroMQ messages: `frames` as sent, with exhaustion mixed in: one in ten a heartbeat under a random schema version, one
    in fifty nested 1,000 to 100,000 levels deep, one in 20,000 a multi-part message of 1 MiB
    parts just over `max_message_bytes` in all (or 64 parts when that is under a part)."""
    rng = random.Random(seed)
    mutated = frames(n, seed)
    part = min(1 << 20, max_message_bytes)
    for _ in range(n):
        x = rng.random()
        if x < 0.1:
            yield other_schema(rng.randrange(2**31))
        elif x < 0.12:
            yield deeply_nested(rng.randint(1_000, 100_000))
        elif x < 0.12005:
            yield huge_multipart(max(64, max_message_bytes // part + 1), part)  # refused whole, once libzmq holds it
        else:
            yield as_sent(next(mutated))
