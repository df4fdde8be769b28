"""A rogue reward worker, for bench/chaos.py: it joins a run as a reward worker does (hello, start
message, heartbeats) and scores what it is sent honestly, so the run can finish; after each
answer it sends the coordinator a burst of well-formed messages that are wrong: rewards twice,
rewards and samples for requests never sent to it or to anyone, samples naming another group or
carrying versions from the future, and the trainer's messages (batch requests, step reports,
weight-sync calls and replies). The coordinator must reject each with a counted reason and
leave the books as they were. Started with `flashq launch --external reward-N`.

With IMPOSTOR_ANSWERS, after each of its first that many answers it also speaks under the other
roles' names: on connections that pass the handshake with its own credential but are named
trainer, rollout-N, reward-N (hellos with its token and with forged ones, `Fatal`s, weight-sync
calls pointing the engines elsewhere, rewards for real requests, batch requests), each of which
the hub must refuse and count; and from links that try the handshake under those names with its
token, which must never get a frame in.

    python bench/rogue.py RUN_DIR/config.yaml ADDRESS reward-2 COUNTS.json [IMPOSTOR_ANSWERS]
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import zmq
import zmq.asyncio
from msgspec.structs import replace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flashq.config import load_config  # noqa: E402
from flashq.credentials import own_token  # noqa: E402
from flashq.rewards.runner import RewardRunner  # noqa: E402
from flashq.roles.common import connect, handshake, heartbeat, hello, resolve_model  # noqa: E402
from flashq.roles.reward import RewardScorer  # noqa: E402
from flashq.wire.codec import Encoder, pack  # noqa: E402
from flashq.wire.fuzz import raw_peer  # noqa: E402
from flashq.wire.protocol import (  # noqa: E402
    BatchRequest,
    Fatal,
    RewardResult,
    ScoreRequest,
    Shutdown,
    StepStats,
    WeightSyncCall,
    WeightSyncReply,
)
from flashq.wire.transport import PeerLost  # noqa: E402

OTHERS = ("trainer", "rollout-0", "rollout-1", "reward-0", "reward-1")


def hostile(req: ScoreRequest, answered: RewardResult) -> list[tuple[str, object]]:
    """Wrong messages built from a real request: (kind, message)."""
    s = req.sample
    gid, k = s.request_id.rsplit("/", 1)
    if not k.isdigit():  # an evaluation request ("greedy"): only training ones are used
        return []
    sibling = f"{gid}/{(int(k) + 1) % 4}"  # sent to a rollout or reward worker, but not to this one
    return [
        ("reward twice", answered),
        ("reward for a request sent elsewhere", RewardResult(sibling, 1.0)),
        ("reward for a request never sent", RewardResult("g99999999/0", 1.0)),
        ("sample from the wrong worker", s),
        ("sample naming another group", replace(s, group_id="g99999999")),
        ("sample with versions from the future", replace(s, versions=np.full(len(s.token_ids), 10**6, np.int32))),
        ("batch request", BatchRequest(credits=8)),
        ("step report", StepStats(step=10**6, metrics={"loss": 0.0})),
        ("weight-sync call", WeightSyncCall(call_id=10**6, method="push_weights", payload={}, version=10**6)),
        ("weight-sync reply", WeightSyncReply(call_id=10**6, ok=True)),
    ]


class Impostors:
    """Connections named as the other roles that pass the handshake as `role` (with its token), and
    connections that try the handshake as the other roles with that token (refused there)."""

    def __init__(self, address: str, role: str):
        self.token = own_token()
        self.socks = {name: self._socket(address, name, role) for name in OTHERS}
        self.encoder = Encoder()
        self.refused = []
        for name in OTHERS:  # each queues a Fatal as it connects; its handshake fails, so it is never delivered
            sock = self._socket(address, name, name)
            sock.send_multipart(self.encoder.encode(Fatal(role=name, reason="an impostor stops the run")), flags=zmq.NOBLOCK)
            self.refused.append(sock)

    def _socket(self, address: str, name: str, user: str) -> zmq.asyncio.Socket:
        return raw_peer(address, f"{name}#{secrets.token_hex(4)}", user=user, token=self.token)

    async def burst(self, req: ScoreRequest, sent: Counter) -> None:
        for name, sock in self.socks.items():
            for kind, msg in [
                ("hello with this worker's token", hello(name, token=self.token, rendezvous="203.0.113.7:29500")),
                ("hello with a forged token", hello(name, token=secrets.token_hex(16))),
                ("fatal", Fatal(role=name, reason="an impostor stops the run")),
                ("weight-sync call to another rendezvous", WeightSyncCall(
                    call_id=10**6, method="init_weight_transfer_engine", payload={"master_address": "203.0.113.7", "master_port": 29500})),
                ("reward for a real request", RewardResult(req.sample.request_id, 1.0)),
                ("batch request", BatchRequest(credits=8)),
            ]:
                await sock.send(pack([self.encoder.encode(msg)]))
                sent[f"impostor: {kind}"] += 1

    def close(self) -> None:
        for sock in [*self.socks.values(), *self.refused]:
            sock.close(linger=0)


async def session(cfg, address: str, role: str, sent: Counter, out: Path, impostor_answers: int) -> bool:
    """One connection; True once the run is over."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(cfg)))
    runner = RewardRunner(cfg.reward.function, "thread", 1, cfg.reward.timeout_s)
    scorer = RewardScorer(runner, lambda ids: tokenizer.decode(ids.tolist(), skip_special_tokens=True))
    link = connect(cfg, address, role)
    impostors = Impostors(address, role) if impostor_answers else None
    answers = 0
    try:
        await handshake(link, cfg, hello(role))
        beat = asyncio.create_task(heartbeat(link, cfg))
        try:
            while True:
                msg = await link.recv()
                if isinstance(msg, ScoreRequest):
                    result = await scorer.score(msg)
                    await link.send(result)
                    for kind, bad in hostile(msg, result):
                        await link.send(bad)
                        sent[kind] += 1
                    answers += 1
                    if impostors is not None and answers <= impostor_answers and msg.sample.request_id[-1].isdigit():
                        await impostors.burst(msg, sent)
                    out.write_text(json.dumps(dict(sent)))  # the bench may kill this process at any time
                elif isinstance(msg, Shutdown):
                    return not msg.restart
        finally:
            beat.cancel()
    finally:
        runner.close()
        link.close()
        if impostors is not None:
            impostors.close()


async def main(config: Path, address: str, role: str, out: Path, impostor_answers: int = 0) -> None:
    cfg = load_config(config, [])
    sent: Counter = Counter()
    try:
        while True:  # the coordinator restarts when the run resumes from a checkpoint: join it again
            try:
                if await session(cfg, address, role, sent, out, impostor_answers):
                    return
            except (PeerLost, RuntimeError, asyncio.TimeoutError):
                await asyncio.sleep(1)
    finally:
        out.write_text(json.dumps(dict(sent)))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else 0))
