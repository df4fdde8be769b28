"""A flood of hostile frames through a live coordinator's socket, for bench/chaos.py.

Sixteen connections pass the handshake with one role's token (a role whose credential leaked)
but never prove a name, under made-up names and random binary identities; they send
`flashq.wire.fuzz.hostile` frames: random and mutated messages, lists nested up to 100,000 deep,
multi-part messages just over the coordinator's size limit, a flood of schema versions. A
stranger with no credential sends beside them (its handshake fails: nothing of it gets in). The
coordinator must refuse every frame with a counted reason and carry on with its run.

    python bench/flood.py ADDRESS ROLE TOKEN FRAMES MAX_MESSAGE_BYTES OUT.json
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import time
from pathlib import Path

import zmq
import zmq.asyncio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flashq.wire import fuzz  # noqa: E402

CONNECTIONS = 16
STRANGER_FRAMES = 1000


async def main(address: str, role: str, token: str, n: int, max_message_bytes: int, out: Path) -> None:
    names = [f"{secrets.token_hex(3)}-{i}#{secrets.token_hex(4)}".encode() if i % 2 else b"\x01" + secrets.token_bytes(7)
             for i in range(CONNECTIONS)]
    socks = [fuzz.raw_peer(address, name, user=role, token=token, hwm=1000) for name in names]
    stranger = fuzz.raw_peer(address, b"stranger#0", hwm=1000)
    report = {"frames_sent": 0, "bytes_sent": 0, "stranger_frames_queued": 0, "started": time.time()}
    for i in range(STRANGER_FRAMES):  # queued for a connection whose handshake fails; dropped, never delivered
        try:
            await stranger.send_multipart(fuzz.huge_multipart(1, 1024), flags=zmq.NOBLOCK)
            report["stranger_frames_queued"] += 1
        except zmq.Again:
            break
    for i, frames in enumerate(fuzz.hostile(n, seed=11, max_message_bytes=max_message_bytes)):
        await socks[i % CONNECTIONS].send_multipart(frames, copy=len(frames) < 8)
        report["frames_sent"] += 1
        report["bytes_sent"] += sum(len(f) for f in frames)
        if i % 20_000 == 0:
            out.write_text(json.dumps(report))
    stranger.close(linger=0)
    for sock in socks:  # what is still queued goes out before the process ends
        sock.close(linger=120_000)
    zmq.asyncio.Context.instance().term()
    report["finished"] = time.time()
    out.write_text(json.dumps(report))


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(a[0], a[1], a[2], int(a[3]), int(a[4]), Path(a[5])))
