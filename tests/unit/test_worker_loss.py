"""Losing a worker mid-run, driven by hand (no engines, no sockets): what it held is re-queued
to the survivors first, anything it sends afterwards is rejected, and a restarted worker takes
work again. Every sample is still trained exactly once."""

import pytest

from flashq.wire.protocol import GenerateRequest, RewardResult, ScoreRequest, TrainBatch
from tests.unit.test_orchestrator import drain, finish, make


def sent(orch, kind):
    return [(peer, m) for peer, m in drain(orch) if isinstance(m, kind)]


def test_requests_of_a_lost_rollout_worker_go_to_the_survivor_first_in_line():
    orch = make(["async_ratio=0", "rollout.max_inflight_per_worker=8"])
    orch.pump()
    reqs = sent(orch, GenerateRequest)
    lost = [m.request_id for p, m in reqs if p == "rollout-1"]
    assert lost
    orch.on_worker_lost("rollout-1")
    orch.pump()
    again = sent(orch, GenerateRequest)
    assert {p for p, _ in again} == {"rollout-0"}
    assert sorted(m.request_id for _, m in again) == sorted(lost)
    assert orch.ledger.requests_requeued == len(lost) and orch.ledger.requests_sent == 8  # sent again, not counted twice
    assert orch.ledger.workers_lost["rollout-1"] == 1


def test_a_sample_from_the_lost_worker_is_rejected_and_the_survivors_is_kept():
    orch = make(["async_ratio=0", "rollout.max_inflight_per_worker=8"])
    orch.pump()
    reqs = sent(orch, GenerateRequest)
    peer, req = next((p, m) for p, m in reqs if p == "rollout-1")
    orch.on_worker_lost("rollout-1")
    orch.pump()
    drain(orch)
    with pytest.raises(KeyError):
        finish(orch, req, "rollout-1")  # the dead incarnation answers late: not trained
    finish(orch, req, "rollout-0")
    assert orch.ledger.samples_received == 1


def test_scores_in_flight_on_a_lost_reward_worker_are_scored_again_elsewhere():
    orch = make(["async_ratio=0"], workers=("rollout-0",))
    orch.score_queue.add_worker("reward-1")
    orch.pump()
    reqs = sent(orch, GenerateRequest)
    for p, r in reqs:
        finish(orch, r, p)
    orch.pump()
    scores = sent(orch, ScoreRequest)
    on_1 = [s.sample.request_id for p, s in scores if p == "reward-1"]
    assert on_1
    orch.on_worker_lost("reward-1")
    orch.pump()
    again = sent(orch, ScoreRequest)
    assert sorted(s.sample.request_id for _, s in again) == sorted(on_1) and {p for p, _ in again} == {"reward-0"}
    with pytest.raises(KeyError):
        orch.on_reward("reward-1", RewardResult(on_1[0], 1.0))
    for p, s in [x for x in scores if x[0] == "reward-0"] + again:
        orch.on_reward(p, RewardResult(s.sample.request_id, 1.0))
    orch.on_batch_request(1)
    orch.pump()
    batch = sent(orch, TrainBatch)[0][1]
    assert sorted(batch.request_ids) == sorted(r.request_id for _, r in reqs)  # every sample once


def test_a_restarted_worker_takes_requests_again():
    orch = make(["async_ratio=2", "rollout.max_inflight_per_worker=2"])
    orch.pump()
    drain(orch)
    orch.on_worker_lost("rollout-1")
    orch.on_worker_joined("rollout-1")
    orch.pump()
    assert any(p == "rollout-1" for p, _ in sent(orch, GenerateRequest))


def test_with_every_rollout_worker_lost_requests_wait_instead_of_failing():
    orch = make(["async_ratio=0"])
    orch.pump()
    n = len(sent(orch, GenerateRequest))
    orch.on_worker_lost("rollout-0")
    orch.on_worker_lost("rollout-1")
    orch.pump()
    assert sent(orch, GenerateRequest) == [] and len(orch.gen_queue.waiting) == n
    orch.on_worker_joined("rollout-0")
    orch.pump()
    back = sent(orch, GenerateRequest)
    assert len(back) == n and {p for p, _ in back} == {"rollout-0"}


def test_a_checkpoint_keeps_the_loss_counts_as_they_were():
    from flashq.checkpoint import decode_state, encode_state

    orch = make(["async_ratio=0"])
    orch.pump()
    drain(orch)
    orch.on_worker_lost("rollout-1")
    state = decode_state(encode_state(orch.snapshot(0)))
    again = make(["async_ratio=0"])
    again.restore(state)
    assert dict(again.ledger.workers_lost) == {"rollout-1": 1}
