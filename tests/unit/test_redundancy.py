"""Redundant episodes in the coordinator's books: scheduling logic only, so the rollout workers
are stood in for by replies built here (real workers play episodes in the integration test)."""

import numpy as np
import pytest

from flashq.config import load_config
from flashq.orchestrator.core import Orchestrator
from flashq.redundancy import RedundantGroups
from flashq.wire.protocol import Cancel, EpisodeRequest, Sample


def test_first_to_finish_are_kept_the_rest_cancelled_and_failures_replaced():
    groups = RedundantGroups(redundancy=2, max_failures=2)
    ids = groups.start("g0", size=2)
    assert ids == ["g0/0", "g0/1", "g0/2", "g0/3"]
    assert groups.on_result("g0", "g0/2", failed=True) == "failed"
    assert groups.replacements("g0") == []  # three still running can fill two places
    assert groups.on_result("g0", "g0/3", failed=False) == "keep"
    assert groups.on_result("g0", "g0/0", failed=True) == "failed"
    assert groups.replacements("g0") == []  # g0/1 still running, one kept: enough
    with pytest.raises(KeyError, match="not started"):
        groups.on_result("g0", "g0/9", failed=False)
    assert groups.on_result("g0", "g0/1", failed=True) == "failed"
    with pytest.raises(RuntimeError, match="3 episodes failed"):
        groups.replacements("g0")


def episode_sample(req: EpisodeRequest, worker: int, reward=1.0, finish="stop"):
    n = 6
    return Sample(req.request_id, req.group_id, worker, np.arange(n, dtype=np.int32), np.zeros(n, np.float32),
                  np.zeros(n, np.int32), finish, prompt_ids=np.arange(3, dtype=np.int32),
                  loss_mask=np.array([1, 1, 0, 0, 1, 1], np.uint8), env_reward=reward if finish != "error" else None,
                  error="env raised" if finish == "error" else "")


def test_orchestrator_keeps_group_size_episodes_and_the_books_balance():
    cfg = load_config(None, ["env={name: flashq.envs.guess:GuessNumberEnv, redundancy: 2}", "sampling.group_size=3",
                             "trainer.batch_groups=1", "trainer.steps=1", "async_ratio=0", "rollout.num_workers=2"])
    orch = Orchestrator(cfg, type("T", (), {"task": lambda self, i: {"id": str(i)}})(), None, ["rollout-0", "rollout-1"], ["reward-0"])
    orch.on_batch_request(1)
    orch.pump()
    sent = [(w, m) for w, m in orch.outbox if isinstance(m, EpisodeRequest)]
    orch.outbox = []
    assert len(sent) == 5 and len({m.seed for _, m in sent}) == 1  # 3 + 2 redundant, one task and seed
    (w0, r0), (w1, r1), (w2, r2), (w3, r3), (w4, r4) = sent
    orch.on_sample(w0, episode_sample(r0, 0, finish="error"))  # failed: the redundant ones cover it
    orch.on_sample(w1, episode_sample(r1, 1, reward=1.0))
    orch.on_sample(w2, episode_sample(r2, 0, reward=0.0))
    assert not any(isinstance(m, Cancel) for _, m in orch.outbox)
    orch.on_sample(w3, episode_sample(r3, 1, reward=1.0))  # the group is full: cancel the last one
    cancels = [(w, m) for w, m in orch.outbox if isinstance(m, Cancel)]
    assert cancels == [(w4, Cancel([r4.request_id], reason="group g0 is full"))]
    orch.outbox = []
    orch.on_sample(w4, Sample(r4.request_id, "g0", 0, *Sample.empty_arrays(), "abort", error="cancelled"))
    orch.pump()
    batch = next(m for _, m in orch.outbox if type(m).__name__ == "TrainBatch")
    assert batch.request_ids == [r1.request_id, r2.request_id, r3.request_id] and list(batch.rewards) == [1.0, 0.0, 1.0]
    assert batch.loss_mask.tolist() == [1, 1, 0, 0, 1, 1] * 3 and len(batch.prompt_ids) == 9
    books = orch.ledger.summary(orch.buffer)
    assert books["episodes_failed"] == 1 and books["episodes_discarded"] == 1 and books["requests_in_flight"] == 0
    assert books["samples_received"] == books["samples_batched"] == 3 and "g0" not in orch.episodes.groups
