"""The coordinator's main loop over real ZeroMQ sockets: a real `Coordinator` (orchestrator,
hub, metrics) in this process, with the rollout, reward and trainer roles played by plain
`Link`s that speak the protocol (no engines, no models)."""

import asyncio

import numpy as np

from flashq.config import load_config
from flashq.protocol import GenerateRequest, Sample, ScoreRequest
from flashq.roles.common import hello
from flashq.roles.coordinator import Coordinator
from flashq.transport import Link


def test_answers_arriving_together_leave_for_the_reward_worker_as_one_message(tiny_model, tmp_path):
    """A rollout worker's answers travel as one bundle; the coordinator handles all of them
    before it pumps, so the score requests they release reach the reward worker as one ZeroMQ
    message, not one per answer (each message costs a send and a wake-up on a busy core)."""

    async def main():
        cfg = load_config(None, [f"model.name={tiny_model}", f"model.cache_dir={tmp_path / 'cache'}", "sampling.group_size=4",
                                 "trainer.batch_groups=2", "trainer.steps=2"])
        coord = Coordinator(cfg, "tcp://127.0.0.1:*", tmp_path / "run")
        run = asyncio.create_task(coord.run())
        while not hasattr(coord, "hub"):  # bound once run() has made it
            await asyncio.sleep(0.01)
        links = {role: Link(coord.hub.address, role) for role in ("rollout-0", "reward-0", "trainer")}
        score_messages = []  # per ZeroMQ message the reward worker receives: the score requests in it
        real_recv = links["reward-0"].sock.recv_multipart

        async def recv(*args, **kwargs):
            frames = await real_recv(*args, **kwargs)
            score_messages.append(sum(isinstance(m, ScoreRequest) for m in links["reward-0"].codec.decode_all("c", frames)))
            return frames

        links["reward-0"].sock.recv_multipart = recv
        for role, link in links.items():
            await link.send(hello(role, engine_ranks=1) if role.startswith("rollout") else hello(role))
        rollout = links["rollout-0"]
        requests = []
        while not requests:
            msg = await rollout.recv()
            if isinstance(msg, GenerateRequest):
                requests = [msg, *(m for m in rollout.inbox if isinstance(m, GenerateRequest))]
        assert len(requests) >= 4
        tokens = np.arange(3, dtype=np.int32)
        await asyncio.gather(*(rollout.send(Sample(r.request_id, r.group_id, 0, tokens, np.zeros(3, np.float32),
                                                   np.zeros(3, np.int32), "stop", text="3")) for r in requests))
        scored = 0
        while scored < len(requests):
            msg = await links["reward-0"].recv()
            scored += isinstance(msg, ScoreRequest)
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        for link in links.values():
            link.close()
        return len(requests), [n for n in score_messages if n]

    answered, score_messages = asyncio.run(asyncio.wait_for(main(), 60))
    assert score_messages == [answered]
