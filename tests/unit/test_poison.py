"""Requests whose generation fails: sent again, and quarantined at the Nth failure without
stalling the run or the books. The coordinator's logic driven by hand (no engines: the failure
is an error sample as a rollout worker sends it; tests/integration/test_poison.py has the real one)."""

from collections import Counter

import numpy as np
import pytest

from flashq.evaluation import is_eval
from flashq.wire.protocol import GenerateRequest, Sample
from tests.unit.test_evaluation import make as make_evaluating
from tests.unit.test_orchestrator import drain, make, play

RUN = ["async_ratio=1", "trainer.steps=4", "rollout.max_request_failures=3"]


def flaky(failures: dict[str, int]):
    """Fail each named request that many times, then let it succeed."""
    left = dict(failures)

    def failure_of(req):
        if left.get(req.request_id, 0) > 0:
            left[req.request_id] -= 1
            return "RuntimeError: boom"
        return ""

    return failure_of


def test_a_failed_request_is_sent_again_and_trained_once_it_succeeds():
    orch = make(RUN)
    batches, sent, _ = play(orch, lambda rid: float(rid.endswith("/0")), flaky({"g1/2": 2}))
    assert [m.request_id for m in sent].count("g1/2") == 3
    books = orch.ledger
    assert (books.requests_failed, books.requests_retried, books.requests_quarantined, books.groups_dropped) == (2, 2, 0, 0)
    assert "g1/2" in {rid for b in batches for rid in b.request_ids}
    assert orch.request_failures == {}  # a success clears its strikes


def test_a_request_failing_every_time_is_quarantined_and_its_group_replaced():
    orch = make(RUN)
    batches, sent, _ = play(orch, lambda rid: float(rid.endswith("/0")), lambda req: "overdue" if req.request_id == "g1/2" else "")
    books = orch.ledger
    assert [m.request_id for m in sent].count("g1/2") == 3  # max_request_failures attempts, then no more
    assert (books.requests_quarantined, books.groups_dropped, books.dropped_groups) == (1, 1, ["g1"])
    assert books.groups_dropped_by_reason == Counter({"poison request": 1})
    (entry,) = books.quarantined
    assert (entry["request_id"], entry["group_id"]) == ("g1/2", "g1")
    assert [why.split(": ", 1)[1] for why in entry["reasons"]] == ["overdue"] * 3
    trained = [rid for b in batches for rid in b.request_ids]
    assert not any(rid.startswith("g1/") for rid in trained)  # nothing of the group is trained
    assert len(batches) == 4 and all(len(b.request_ids) == 8 for b in batches)  # another prompt took its place
    summary = books.summary(orch.buffer)
    assert summary["requests_in_flight"] == 0 and summary["samples_in_buffer"] == 0


def test_on_poison_fail_stops_the_run_naming_the_request():
    orch = make([*RUN, "rollout.on_poison=fail"])
    with pytest.raises(RuntimeError, match="request g0/1 failed 3 times .* the last: rollout-\\d: ValueError: bad token"):
        play(orch, lambda rid: 1.0, lambda req: "ValueError: bad token" if req.request_id == "g0/1" else "")


def test_a_failed_chunk_of_a_divided_response_is_sent_again_as_that_chunk():
    orch = make(["async_ratio=0", "rollout.chunk_tokens=4", "sampling.max_tokens=12", "rollout.max_request_failures=2"])
    orch.pump()
    peer, first = next((p, m) for p, m in drain(orch) if isinstance(m, GenerateRequest) and m.request_id == "g0/0")
    tokens = (np.arange(4, dtype=np.int32), np.zeros(4, np.float32), np.zeros(4, np.int32))
    orch.on_sample(peer, Sample("g0/0", "g0", 0, *tokens, "length"))  # a full chunk: the next one is asked for
    orch.pump()
    peer, second = next((p, m) for p, m in drain(orch) if isinstance(m, GenerateRequest) and m.request_id == "g0/0")
    assert second.generated == 4
    orch.on_sample(peer, Sample("g0/0", "g0", 0, *Sample.empty_arrays(), "error", error="boom"))
    orch.pump()
    _, again = next((p, m) for p, m in drain(orch) if isinstance(m, GenerateRequest) and m.request_id == "g0/0")
    assert again.generated == 4 and list(again.prompt_ids) == list(second.prompt_ids)
    orch.on_sample(_, Sample("g0/0", "g0", 0, *Sample.empty_arrays(), "error", error="boom"))
    assert orch.ledger.requests_quarantined == 1 and "g0/0" not in orch.divided.partial


def test_a_quarantined_evaluation_request_leaves_its_round_one_score_short():
    orch = make_evaluating(["async_ratio=1", "trainer.steps=2", "eval.every=1", "eval.prompts=2", "eval.samples=2",
                            "eval.k=[1]", "rollout.max_request_failures=2"])
    play(orch, lambda rid: 1.0, lambda req: "boom" if is_eval(req.request_id) and req.request_id.endswith("/0/0") else "")
    rounds = [rec for _, rec in orch.eval_records]
    assert len(rounds) == 3 and all(rec["requests_lost"] == 1.0 for rec in rounds)
    assert orch.ledger.eval_requests_quarantined == 3 and orch.ledger.requests_quarantined == 0
