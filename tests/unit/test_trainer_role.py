"""The trainer role's overlapped push, with a fake weight pusher (no engines): only the order in
which pushes, transfer-group rebuilds and training steps take the trainer's threads is tested."""

import asyncio
from types import SimpleNamespace

import pytest
import torch

from flashq.config import load_config
from flashq.protocol import Regroup
from flashq.roles.trainer import TrainerRole
from flashq.trainer.update_fence import UpdateFence
from flashq.trainer.parallel import Ranks


class FakePusher:
    """Stands in for flashq.engine.weights.WeightPusher: records what it was asked to do."""

    built: list[int] = []

    def __init__(self, cfg, model, rpc, inference_world_size, port, device, rank=0, wire_dtype=None, adapter=False):
        self.backend = "fake"
        self.pushed: list[int] = []
        FakePusher.built.append(inference_world_size)

    def push(self, version: int) -> float:
        self.pushed.append(version)
        return 0.0

    def phases(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def test_a_push_rebuilt_for_new_workers_does_not_wait_for_the_step_that_waits_for_it(monkeypatch, tmp_path):
    """The push of version v runs while step v+1 computes; step v+1 then waits for it before its
    optimizer step. If the rollout workers changed, that push first rebuilds the transfer group:
    on the torch thread, which the waiting step holds, it would never run (a deadlock)."""
    monkeypatch.setattr("flashq.engine.weights.WeightPusher", FakePusher)
    role = TrainerRole(load_config(None, []), "trainer", "tcp://127.0.0.1:1", tmp_path)
    learner = SimpleNamespace(ranks=Ranks(), model=torch.nn.Linear(2, 2), device=torch.device("cpu"), version=1,
                              updated=UpdateFence(torch.device("cpu")))

    async def scenario():
        role.loop = asyncio.get_running_loop()
        role.port = 0
        role.pusher = FakePusher(None, None, None, 1, 0, None)
        role.regroup = Regroup(inference_world_size=2, members=["rollout-0", "rollout-1"], reason="rollout-1 joined")
        role.regrouped.set()
        role.pending_push = asyncio.ensure_future(role._push(learner, 1))
        step = role.loop.run_in_executor(role.pool, role._await_push)  # step 2's hook, holding the torch thread
        await asyncio.wait_for(asyncio.gather(role.pending_push, step), timeout=60)

    try:
        asyncio.run(scenario())
    except asyncio.TimeoutError:
        pytest.fail("the push waited for the torch thread, which waited for the push")
    finally:
        role.pool.shutdown(wait=False, cancel_futures=True)
        role.push_pool.shutdown(wait=False, cancel_futures=True)
    assert FakePusher.built[-1] == 2 and role.pusher.pushed == [1]  # rebuilt for the new set, then pushed
