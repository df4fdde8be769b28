"""Dynamic sampling in the coordinator's logic, driven by hand: plain calls play the rollout,
reward and trainer roles (no engines, no sockets), as in test_orchestrator."""

import numpy as np
import pytest

from flashq.wire.protocol import GenerateRequest, RewardResult, ScoreRequest
from tests.unit.test_orchestrator import drain, finish, make, play


def group_of(rid: str) -> int:
    return int(rid[1:].split("/")[0])


def test_groups_with_equal_rewards_are_dropped_and_replaced_and_batches_stay_full_and_fresh():
    orch = make(["async_ratio=2", "trainer.steps=8", "trainer.dynamic_sampling=true"])
    equal = lambda g: g % 3 == 0  # noqa: E731 - a third of the prompts score the same for every sample
    batches, _, admitted = play(orch, lambda rid: 1.0 if equal(group_of(rid)) else float(int(rid.rsplit("/", 1)[1]) % 2))
    for b in batches:
        assert len(b.request_ids) == 2 * 4  # full: two groups of four
        for g in np.unique(b.group_index):
            assert np.ptp(b.rewards[b.group_index == g]) > 0  # no group without an advantage was trained
    for index, versions in enumerate(admitted):
        assert all(index - v <= 2 for v in versions)  # the staleness bound (ceil(alpha) = 2) still holds
    books = orch.ledger
    assert books.groups_dropped > 0 and books.samples_dropped == 4 * books.groups_dropped
    trained = {rid.split("/")[0] for b in batches for rid in b.request_ids}
    assert len(set(books.dropped_groups)) == books.groups_dropped and trained.isdisjoint(books.dropped_groups)
    # every admitted group was either trained or dropped or is still in the buffer
    assert books.groups_admitted == 8 * 2 + books.groups_dropped + len(orch.buffer)
    assert orch.gate.admitted == 8 * 2 + len(orch.buffer)


def test_without_dynamic_sampling_equal_groups_are_trained():
    orch = make(["async_ratio=2", "trainer.steps=4"])
    batches, _, _ = play(orch, lambda rid: 1.0)
    assert all(np.ptp(b.rewards) == 0 for b in batches) and orch.ledger.groups_dropped == 0


def test_a_run_whose_groups_all_score_the_same_stops_and_says_why():
    orch = make(["async_ratio=2", "trainer.steps=50", "trainer.dynamic_sampling=true", "trainer.max_dropped_in_row=10"])
    with pytest.raises(RuntimeError, match="10 groups dropped in a row, every sample of each scoring the same.*solved or out of reach"):
        play(orch, lambda rid: 0.0)


def scored(orch, reward_of):
    """Answer every request at once and score it with `reward_of(request_id, attempt)` -> (reward, error)."""
    attempts = {}
    orch.pump()
    for _ in range(50):
        out = drain(orch)
        if not out:
            return
        for peer, msg in out:
            if isinstance(msg, GenerateRequest):
                finish(orch, msg, peer)
            elif isinstance(msg, ScoreRequest):
                rid = msg.sample.request_id
                attempts[rid] = attempts.get(rid, 0) + 1
                value, error = reward_of(rid, attempts[rid])
                orch.on_reward(peer, RewardResult(rid, value, error=error))
        orch.pump()


def test_a_failed_reward_is_scored_again_then_its_group_dropped_never_trained_as_zero():
    orch = make(["async_ratio=0", "trainer.steps=3"])  # reward.on_error drop, one retry: the defaults
    flaky = {"g0/1": 1, "g1/2": 5}  # g0/1 fails once, g1/2 fails every time

    def reward_of(rid, attempt):
        return (0.0, "ValueError: boom") if attempt <= flaky.get(rid, 0) else (float(rid.endswith("/0")), "")

    scored(orch, reward_of)
    books = orch.ledger
    assert books.scores_retried == 2 and books.reward_errors == 3
    assert books.dropped_groups == ["g1"] and books.groups_dropped_by_reason == {"reward failed": 1}
    assert "g0" in orch.buffer.complete and "g1" not in orch.buffer.groups  # g0 recovered on its retry
    assert orch.buffer.groups["g0"].rewards["g0/1"].reward == 0.0 and not orch.buffer.groups["g0"].rewards["g0/1"].error
    assert orch.gate.admitted == 2 and books.groups_admitted == 3  # g2 took g1's place


def test_with_on_error_zero_a_failed_reward_is_trained_as_zero():
    orch = make(["async_ratio=0", "trainer.steps=3", "reward.on_error=zero"])
    scored(orch, lambda rid, attempt: (0.0, "TimeoutError") if rid == "g1/2" else (1.0, ""))
    assert orch.ledger.groups_dropped == 0 and orch.ledger.scores_retried == 0 and orch.buffer.complete == {"g0", "g1"}


def test_a_reward_for_a_group_that_is_not_waiting_is_refused_and_still_owed():
    orch = make(["async_ratio=0"])
    orch.pump()
    peer, req = next((p, m) for p, m in drain(orch) if isinstance(m, GenerateRequest))
    finish(orch, req, peer)
    orch.pump()
    rpeer, score = next((p, m) for p, m in drain(orch) if isinstance(m, ScoreRequest))
    orch.buffer.groups[req.group_id].rewards[req.request_id] = RewardResult(req.request_id, 1.0)  # as if already filed
    with pytest.raises(KeyError, match="not waiting for it"):
        orch.on_reward(rpeer, RewardResult(req.request_id, 0.0))
    assert orch.score_worker[req.request_id] == rpeer  # still owed
