"""A rogue reward worker, for bench/chaos.py: it joins a run as a reward worker does (hello, start
message, heartbeats) and scores what it is sent honestly, so the run can finish; after each
answer it sends the coordinator a burst of well-formed messages that are wrong: rewards twice,
rewards and samples for requests never sent to it or to anyone, samples naming another group or
carrying versions from the future, and the trainer's messages (batch requests, step reports,
weight-sync calls and replies). The coordinator must reject each with a counted reason and
leave the books as they were. Started with `flashq launch --external reward-N`.

    python bench/rogue.py RUN_DIR/config.yaml ADDRESS reward-2 COUNTS.json
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from msgspec.structs import replace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flashq.config import load_config  # noqa: E402
from flashq.protocol import (  # noqa: E402
    BatchRequest, RewardResult, Sample, ScoreRequest, Shutdown, StepStats, WeightSyncCall, WeightSyncReply,
)
from flashq.rewards.runner import RewardRunner  # noqa: E402
from flashq.roles.common import connect, handshake, heartbeat, hello, resolve_model  # noqa: E402
from flashq.roles.reward import RewardScorer  # noqa: E402
from flashq.transport import PeerLost  # noqa: E402


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


async def session(cfg, address: str, role: str, sent: Counter, out: Path) -> bool:
    """One connection; True once the run is over."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(cfg)))
    runner = RewardRunner(cfg.reward.function, "thread", 1, cfg.reward.timeout_s)
    scorer = RewardScorer(runner, lambda ids: tokenizer.decode(ids.tolist(), skip_special_tokens=True))
    link = connect(cfg, address, role)
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
                    out.write_text(json.dumps(dict(sent)))  # the bench may kill this process at any time
                elif isinstance(msg, Shutdown):
                    return not msg.restart
        finally:
            beat.cancel()
    finally:
        runner.close()
        link.close()


async def main(config: Path, address: str, role: str, out: Path) -> None:
    cfg = load_config(config, [])
    sent: Counter = Counter()
    try:
        while True:  # the coordinator restarts when the run resumes from a checkpoint: join it again
            try:
                if await session(cfg, address, role, sent, out):
                    return
            except (PeerLost, RuntimeError, asyncio.TimeoutError):
                await asyncio.sleep(1)
    finally:
        out.write_text(json.dumps(dict(sent)))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])))
