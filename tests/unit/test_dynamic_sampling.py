"""Dynamic sampling in the coordinator's logic, driven by hand: plain calls play the rollout,
reward and trainer roles (no engines, no sockets), as in test_orchestrator."""

import numpy as np
import pytest

from flashq.protocol import GenerateRequest, RewardResult, ScoreRequest, TrainBatch
from tests.unit.test_orchestrator import drain, finish, make


def run(orch, reward_of, steps):
    """Play every role until the trainer has taken `steps` batches: each response finishes as
    soon as it is sent, at the engines' version, and scores `reward_of(group number, k)`; each
    batch is trained and its weights served at once. Returns the batches and, per batch, the
    versions its groups were admitted at."""
    batches, admitted = [], []
    orch.on_batch_request(1)
    while len(batches) < steps:
        orch.pump()
        out = drain(orch)
        for peer, msg in out:
            if isinstance(msg, GenerateRequest):
                finish(orch, msg, peer, version=orch.engine_version)
            elif isinstance(msg, ScoreRequest):
                gid, k = msg.sample.request_id[1:].split("/")
                orch.on_reward(peer, RewardResult(msg.sample.request_id, reward_of(int(gid), int(k))))
            elif isinstance(msg, TrainBatch):
                batches.append(msg)
                groups = orch.on_step_trained(msg.batch_index + 1)
                admitted.append([g.admission.version for g in groups])
                orch.on_weights_served(msg.batch_index + 1)
                orch.on_batch_request(1)
        if not out:
            raise AssertionError("nothing to do and no batch: the run stalled")
    return batches, admitted


def test_groups_with_equal_rewards_are_dropped_and_replaced_and_batches_stay_full_and_fresh():
    orch = make(["async_ratio=2", "trainer.steps=8", "trainer.dynamic_sampling=true"])
    equal = lambda g: g % 3 == 0  # noqa: E731 - a third of the prompts score the same for every sample
    batches, admitted = run(orch, lambda g, k: 1.0 if equal(g) else float(k % 2), steps=8)
    for b in batches:
        assert len(b.request_ids) == 2 * 4  # full: two groups of four
        for g in np.unique(b.group_index):
            assert np.ptp(b.rewards[b.group_index == g]) > 0  # no group without an advantage was trained
    for index, versions in enumerate(admitted):
        assert all(index - v <= 2 for v in versions)  # the staleness bound (ceil(alpha) = 2) still holds
    books = orch.ledger
    assert books.groups_dropped > 0 and books.samples_dropped == 4 * books.groups_dropped
    # every admitted group was either trained or dropped or is still in the buffer
    assert books.groups_admitted == 8 * 2 + books.groups_dropped + len(orch.buffer)
    assert orch.gate.admitted == 8 * 2 + len(orch.buffer)


def test_without_dynamic_sampling_equal_groups_are_trained():
    orch = make(["async_ratio=2", "trainer.steps=4"])
    batches, _ = run(orch, lambda g, k: 1.0, steps=4)
    assert all(np.ptp(b.rewards) == 0 for b in batches) and orch.ledger.groups_dropped == 0


def test_a_run_whose_groups_all_score_the_same_stops_and_says_why():
    orch = make(["async_ratio=2", "trainer.steps=50", "trainer.dynamic_sampling=true", "trainer.max_dropped_in_row=10"])
    with pytest.raises(RuntimeError, match="dropped 10 groups in a row.*solved or out of reach"):
        run(orch, lambda g, k: 0.0, steps=1)
