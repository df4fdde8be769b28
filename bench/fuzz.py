"""Hostile input through a real socket: a stray peer sends random and mutated frames to a live
coordinator hub (ROUTER, the codec, the rejection path a role runs), then one valid message.

The hub must take every frame without crashing, reject each bad one with a counted reason, pass
on the few mutations that are still valid messages, and then deliver the final message. Its
side by side: frames per second through the rejection path vs valid heartbeats through the same
hub. Figures: `fuzz_frames_rejected_without_crash`, `rejection_rate_vs_valid`.

    python bench/fuzz.py                     # writes bench/results/fuzz.json
    python bench/fuzz.py --frames 20000      # a quicker look
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import print_table, write_result  # noqa: E402
from flashq.wire import fuzz  # noqa: E402
from flashq.wire.codec import Encoder  # noqa: E402
from flashq.wire.protocol import Heartbeat  # noqa: E402
from flashq.wire.transport import Hub  # noqa: E402

SENTINEL = Heartbeat(-12345.0)


async def blast(batches: list[list[bytes]]) -> dict:
    """Send each encoded message (its frames) to a live hub as a peer speaking flashq's wire would
    (`fuzz.as_sent`: one ZeroMQ frame), so the mutations reach the decoder rather than stopping at
    the hub's one-frame check; count what the hub rejected and what it passed on."""
    batches = [fuzz.as_sent(frames) for frames in batches]
    hub = Hub("tcp://127.0.0.1:0", hwm=100_000, max_message_bytes=1 << 20)
    rogue = fuzz.raw_peer(hub.address, hwm=100_000)
    accepted = 0

    async def send():
        for frames in batches:
            await rogue.send_multipart([f if f else b"" for f in frames] or [b""])
        await rogue.send_multipart(Encoder().encode(SENTINEL))

    t0 = time.perf_counter()
    sender = asyncio.create_task(send())
    while True:
        _, msg = await hub.recv()
        if msg == SENTINEL:
            break
        accepted += 1
    seconds = time.perf_counter() - t0
    await sender
    rejected = sum(hub.rejected.values())
    reasons = dict(hub.rejected.most_common(8))
    rogue.close()
    hub.close()
    return {"frames": len(batches), "rejected": rejected, "accepted_valid": accepted, "seconds": seconds,
            "frames_per_s": len(batches) / seconds, "top_reasons": reasons}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=130_000)
    args = ap.parse_args()
    hostile = list(fuzz.frames(args.frames, seed=7))
    valid = [[bytes(memoryview(f)) for f in Encoder().encode(Heartbeat(float(i)))] for i in range(args.frames)]
    bad = asyncio.run(blast(hostile))
    good = asyncio.run(blast(valid))
    assert bad["rejected"] + bad["accepted_valid"] == bad["frames"], "a frame was lost without a verdict"
    rows = [{"input": "hostile (random, mutated)", **bad}, {"input": "valid heartbeats", **good}]
    print_table("fuzzing a live coordinator hub over ZeroMQ", rows,
                [("input", "input", ""), ("frames", "frames", ",d"), ("rejected", "rejected", ",d"),
                 ("accepted_valid", "accepted", ",d"), ("frames_per_s", "frames/s", ",.0f")])
    figures = {"fuzz_frames_rejected_without_crash": bad["rejected"],
               "rejection_rate_vs_valid": bad["frames_per_s"] / good["frames_per_s"]}
    path = write_result("fuzz", {"runs": rows}, figures,
                        notes="Every hostile frame got a verdict (rejected with a reason, or decoded as a valid message "
                              "when a mutation left one) and the hub then delivered the final valid message.")
    print(f"figures: {figures}\nwrote {path}")


if __name__ == "__main__":
    main()
