"""Transport throughput: flashq's typed messages vs raw pyzmq sending the same bytes.

Two processes on loopback TCP. The flashq side is the real path a sample takes from a rollout
worker to the coordinator: `Link.send` (encode, token/logprob/version arrays as raw frames) ->
`Hub.recv` (decode, validate) on asyncio + uvloop. The baseline sends the very frames flashq
produces with plain blocking pyzmq and does nothing with them on arrival. Throughput is timed
at the receiver from the first to the last message.

Also measured: encoding + decoding a small control message with msgspec (what flashq uses)
against the `msgpack` package with hand-written validation, the choice the style notes asked
to make on evidence.

    python bench/transport.py        # writes bench/results/queue.json
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import print_table, write_result  # noqa: E402
from flashq.wire.codec import Decoder, Encoder  # noqa: E402
from flashq.wire.protocol import RewardResult, Sample  # noqa: E402


def make_sample(tokens: int) -> Sample:
    rng = np.random.default_rng(0)
    return Sample(
        request_id="g123/4",
        group_id="g123",
        worker=1,
        token_ids=rng.integers(0, 150_000, tokens).astype(np.int32),
        logprobs=-rng.random(tokens, dtype=np.float32),
        versions=np.full(tokens, 7, np.int32),
        finish_reason="stop",
        gen_seconds=1.25,
    )


# ------------------------------------------------------------------ receivers (child processes)


def flashq_receiver(address_q, result_q, n: int) -> None:
    import uvloop

    from flashq.wire.transport import Hub

    async def main():
        hub = Hub("tcp://127.0.0.1:*", hwm=1000)
        address_q.put(hub.address)
        await hub.recv()  # warm-up message
        t0 = None
        for i in range(n):
            _, msg = await hub.recv()
            if t0 is None:
                t0 = time.perf_counter()
            assert len(msg.token_ids) > 0
        result_q.put(time.perf_counter() - t0)
        hub.close()

    uvloop.run(main())


def raw_receiver(address_q, result_q, n: int) -> None:
    import zmq

    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.RCVHWM, 1000)
    sock.bind("tcp://127.0.0.1:*")
    address_q.put(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    sock.recv_multipart(copy=False)
    t0 = None
    for _ in range(n):
        sock.recv_multipart(copy=False)
        if t0 is None:
            t0 = time.perf_counter()
    result_q.put(time.perf_counter() - t0)
    sock.close(linger=0)


# ------------------------------------------------------------------ senders (this process)


def flashq_send(address: str, sample: Sample, n: int) -> None:
    import uvloop

    from flashq.wire.transport import Link

    async def main():
        link = Link(address, "rollout-0", hwm=1000)
        await link.send(sample)
        for _ in range(n):
            await link.send(sample)  # encodes every time, as a rollout worker does
        await asyncio.sleep(0.5)
        link.close()

    uvloop.run(main())


def raw_send(address: str, frames: list, n: int) -> None:
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, 1000)
    sock.connect(address)
    sock.send_multipart(frames, copy=False)
    for _ in range(n):
        sock.send_multipart(frames, copy=False)
    time.sleep(0.5)
    sock.close(linger=2000)


def measure(kind: str, tokens: int, n: int) -> float:
    ctx = mp.get_context("spawn")
    address_q, result_q = ctx.Queue(), ctx.Queue()
    target = flashq_receiver if kind == "flashq" else raw_receiver
    proc = ctx.Process(target=target, args=(address_q, result_q, n))
    proc.start()
    address = address_q.get(timeout=60)
    sample = make_sample(tokens)
    if kind == "flashq":
        flashq_send(address, sample, n)
    else:
        raw_send(address, [bytes(memoryview(f)) for f in Encoder().encode(sample)], n)
    elapsed = result_q.get(timeout=300)
    proc.join(30)
    return elapsed


def codec_comparison(n: int = 50_000) -> list[dict]:
    """Small-message encode+decode+validate: msgspec typed structs vs msgpack + manual checks."""
    import msgpack

    enc, dec = Encoder(), Decoder()
    msg = RewardResult("g123/4", 1.0, "", 0.01)
    t0 = time.perf_counter()
    for _ in range(n):
        dec.decode(enc.encode(msg))
    msgspec_us = (time.perf_counter() - t0) / n * 1e6

    def check(obj):
        if not (isinstance(obj, list) and len(obj) == 2 and obj[0] == 1):
            raise ValueError("bad envelope")
        kind, rid, reward, error, seconds = obj[1]
        if kind != "reward" or not isinstance(rid, str) or not isinstance(reward, float):
            raise ValueError("bad reward message")
        if not isinstance(error, str) or not isinstance(seconds, float) or reward != reward:
            raise ValueError("bad reward message")
        return RewardResult(rid, reward, error, seconds)

    t0 = time.perf_counter()
    for _ in range(n):
        check(msgpack.unpackb(msgpack.packb([1, ["reward", msg.request_id, msg.reward, msg.error, msg.seconds]])))
    msgpack_us = (time.perf_counter() - t0) / n * 1e6
    return [
        {"codec": "msgspec (flashq)", "us_per_message": msgspec_us},
        {"codec": "msgpack + hand-written checks", "us_per_message": msgpack_us},
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0, help="rough length of each measurement")
    args = ap.parse_args()

    rows = []
    for tokens in (1024, 16384):
        msg_bytes = sum(memoryview(f).nbytes for f in Encoder().encode(make_sample(tokens)))
        n = 40_000 if tokens == 1024 else 6_000
        n = max(500, int(n * args.seconds / 2.0))
        per_kind = {}
        for kind in ("raw", "flashq"):
            rates = sorted(n / measure(kind, tokens, n) for _ in range(args.repeats))
            per_kind[kind] = statistics.median(rates)
            rows.append({
                "tokens": tokens,
                "transport": "flashq (encode+decode+validate, asyncio/uvloop)" if kind == "flashq" else "raw pyzmq (same bytes)",
                "messages": n,
                "repeats": args.repeats,
                "samples_per_s": per_kind[kind],
                "MB_per_s": per_kind[kind] * msg_bytes / 1e6,
                "samples_per_s_min": rates[0],
                "samples_per_s_max": rates[-1],
                "message_bytes": msg_bytes,
            })
        rows.append({"tokens": tokens, "transport": "ratio flashq / raw", "samples_per_s": per_kind["flashq"] / per_kind["raw"]})
    codecs = codec_comparison()
    print_table(
        "flashq transport vs raw pyzmq (median of repeats)",
        rows,
        [("tokens", "tokens", "d"), ("transport", "transport", ""), ("samples_per_s", "samples/s", ",.2f"), ("MB_per_s", "MB/s", ",.0f")],
    )
    print_table("small-message codec", codecs, [("codec", "codec", ""), ("us_per_message", "µs / message (encode+decode)", ".2f")])
    ratio = {r["tokens"]: r["samples_per_s"] for r in rows if r["transport"].startswith("ratio")}
    figures = {
        "transport_vs_raw_zmq": ratio[16384],
        "transport_vs_raw_zmq_1k": ratio[1024],
        "codec_msgspec_vs_msgpack_speedup": codecs[1]["us_per_message"] / codecs[0]["us_per_message"],
    }
    path = write_result("queue", {"throughput": rows, "codec": codecs}, figures,
                        notes="transport_vs_raw_zmq is the 16k-token case; samples carry int32 ids, float32 logprobs, int32 versions.")
    print(f"figures: {figures}\nwrote {path}")


if __name__ == "__main__":
    main()
