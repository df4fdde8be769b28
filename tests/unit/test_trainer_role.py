"""The trainer role's overlapped push, with a fake weight pusher (no engines): only the order in
which pushes, transfer-group rebuilds and training steps take the trainer's threads is tested."""

import asyncio
from types import SimpleNamespace

import pytest
import torch

from flashq.config import load_config
from flashq.roles.trainer import TrainerRole
from flashq.trainer.parallel import Ranks
from flashq.trainer.update_fence import UpdateFence
from flashq.wire.protocol import Regroup, WeightSyncReply


class FakePusher:
    """Stands in for flashq.engine.weights.WeightPusher: records what it was asked to do."""

    built: list[int] = []

    def __init__(self, cfg, model, rpc, inference_world_size, port, device, rank=0, wire_dtype=None, adapter=False, colocate=False):
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


def trainer_role(tmp_path, overrides: list[str] | None = None) -> TrainerRole:
    return TrainerRole(load_config(None, overrides or []), "trainer", "tcp://127.0.0.1:1", tmp_path)


def fake_learner(version: int) -> SimpleNamespace:
    return SimpleNamespace(ranks=Ranks(), model=torch.nn.Linear(2, 2), device=torch.device("cpu"), version=version,
                           updated=UpdateFence(torch.device("cpu")))


def run_on(role: TrainerRole, scenario):
    """`scenario()` on a fresh event loop, which becomes the role's; its threads are let go after."""

    async def main():
        role.loop = asyncio.get_running_loop()
        role.port = 0
        return await scenario()

    try:
        return asyncio.run(main())
    finally:
        role.pool.shutdown(wait=False, cancel_futures=True)
        role.push_pool.shutdown(wait=False, cancel_futures=True)


def test_a_push_rebuilt_for_new_workers_does_not_wait_for_the_step_that_waits_for_it(monkeypatch, tmp_path):
    """The push of version v runs while step v+1 computes; step v+1 then waits for it before its
    optimizer step. If the rollout workers changed, that push first rebuilds the transfer group:
    on the torch thread, which the waiting step holds, it would never run (a deadlock)."""
    monkeypatch.setattr("flashq.engine.weights.WeightPusher", FakePusher)
    role, learner = trainer_role(tmp_path), fake_learner(1)

    async def scenario():
        role.pusher = FakePusher(None, None, None, 1, 0, None)
        role.regroup = Regroup(inference_world_size=2, members=["rollout-0", "rollout-1"], reason="rollout-1 joined")
        role.regrouped.set()
        role.pending_push = asyncio.ensure_future(role._push(learner, 1))
        step = role.loop.run_in_executor(role.pool, role._await_push)  # step 2's hook, holding the torch thread
        await asyncio.wait_for(asyncio.gather(role.pending_push, step), timeout=60)

    try:
        run_on(role, scenario)
    except asyncio.TimeoutError:
        pytest.fail("the push waited for the torch thread, which waited for the push")
    assert FakePusher.built[-1] == 2 and role.pusher.pushed == [1]  # rebuilt for the new set, then pushed


class StalledOncePusher(FakePusher):
    """A pusher whose first push on the first group is aborted past its deadline, as an NCCL
    push to a peer that stopped taking part is (flashq.engine.push_deadline)."""

    def push(self, version: int) -> float:
        from flashq.engine.push_deadline import PushDeadlineExceeded

        if len(FakePusher.built) == 1:
            raise PushDeadlineExceeded(f"weight push {version} passed its deadline")
        return super().push(version)


def test_a_push_past_its_deadline_with_no_worker_lost_is_retried_on_a_group_rebuilt_for_the_same_workers(monkeypatch, tmp_path):
    """No Regroup comes (every rollout worker is alive: one stalled, and its own deadline freed
    it), so the trainer rebuilds the group for the workers it had and pushes the version again,
    rather than stopping the run."""
    monkeypatch.setattr("flashq.engine.weights.WeightPusher", StalledOncePusher)
    FakePusher.built = []
    role, learner = trainer_role(tmp_path, ["fault.worker_timeout_s=0.2", "transport.heartbeat_s=0.05"]), fake_learner(3)

    async def scenario():
        role.pusher = StalledOncePusher(None, None, None, 2, 0, None)
        role.membership = Regroup(inference_world_size=2, members=["rollout-0", "rollout-1"], reason="start")
        return await asyncio.wait_for(role._push(learner, 3), timeout=60)

    run_on(role, scenario)
    assert FakePusher.built == [2, 2]  # the first group, then one rebuilt for the same two engine ranks
    assert role.pusher.pushed == [3] and role.membership.members == ["rollout-0", "rollout-1"]
    assert "push 3 failed" in role.membership.reason


def test_a_colocated_turn_waits_for_the_last_push_then_has_the_engines_release_the_devices(tmp_path):
    """placement.colocate: before a step computes, the last push has landed (the engine is back
    and serving it), then the engines release the devices, then the optimizer's state comes back.
    A release that fails (a worker lost) costs only the turn: training goes on."""
    role, events = trainer_role(tmp_path, ["async_ratio=0", "placement.colocate=true"]), []

    async def call(method, payload, version):
        events.append(method)
        return WeightSyncReply(0, ok=len(events) > 2, error="rollout-0 lost during release_devices")

    class Offload:
        def restore(self):
            events.append("restore")

    async def scenario():
        landed = asyncio.Event()

        async def push():
            await landed.wait()
            events.append("push landed")
            return 0.1

        role._call = call
        role.pending_push = asyncio.ensure_future(push())
        role.loop.call_soon(landed.set)
        await role._take_turn(Offload())  # its release fails: a warning, not an error
        await role._take_turn(None)

    run_on(role, scenario)
    assert events == ["push landed", "release_devices", "restore", "release_devices"]
