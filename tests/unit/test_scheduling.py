"""Length estimates, request orders and divided rollout, as plain logic (no engine: the tests
below play the engine by hand, which only scheduling decisions need)."""

import numpy as np
import pytest

from flashq.config import ForcedLengths, load_config
from flashq.orchestrator.core import Orchestrator
from flashq.scheduling.divided import DividedRollout
from flashq.scheduling.lengths import LengthEstimates, forced_length, prompt_key
from flashq.scheduling.order import ContextAwareOrder, FifoOrder, OracleOrder
from flashq.wire.protocol import GenerateRequest, Sample


def req(gid, k, generated=0, max_tokens=100):
    prompt = np.arange(1, 4 + generated, dtype=np.int32)
    return GenerateRequest(f"{gid}/{k}", gid, prompt, max_tokens=max_tokens, generated=generated)


def sample(r: GenerateRequest, n, reason="stop", version=0):
    return Sample(r.request_id, r.group_id, 0, np.arange(n, dtype=np.int32) + 7, np.full(n, -0.5, np.float32),
                  np.full(n, version, np.int32), reason)


def test_estimates_grow_with_siblings_and_carry_to_the_next_epoch():
    est = LengthEstimates(history_epochs=2)
    prompt = np.array([5, 6, 7], np.int32)
    est.add_group("g0", prompt)
    assert not est.known("g0") and est.estimate("g0", default=512) == 512  # unknown: the budget
    est.observe("g0", 40, finished=False)  # a divided request has generated 40 so far
    assert est.estimate("g0", 512) == 512
    est.observe("g0", 30, finished=True)
    assert est.known("g0") and est.estimate("g0", 512) == 40  # longest seen, conservatively
    est.observe("g0", 90, finished=True)
    assert est.estimate("g0", 512) == 90
    est.close_group("g0")
    est.add_group("g7", prompt.copy())  # the same prompt in the next epoch
    assert est.known("g7") and est.estimate("g7", 512) == 90
    for epoch in range(2):  # the window keeps the last two epochs only
        est.add_group(f"h{epoch}", prompt)
        est.observe(f"h{epoch}", 10, finished=True)
        est.close_group(f"h{epoch}")
    assert est.estimate("g7", 512) == 10


def test_context_aware_probes_first_then_longest_group_first():
    est = LengthEstimates()
    order = ContextAwareOrder(est, budget=512)
    for gid in ("g0", "g1", "g2"):
        est.add_group(gid, np.array([int(gid[1:]) + 1], np.int32))
        for k in range(3):
            order.push(req(gid, k))
    probes = [order.pop() for _ in range(3)]
    assert [r.request_id for r in probes] == ["g0/0", "g1/0", "g2/0"]  # one probe per group, first
    est.observe("g0", 10, finished=True)  # g0 is short, g2 long; g1 unknown: assumed the budget
    est.observe("g2", 300, finished=True)
    rest = [order.pop().group_id for _ in range(6)]
    assert rest == ["g1", "g1", "g2", "g2", "g0", "g0"]
    with pytest.raises(IndexError):
        order.pop()


def test_a_prompt_with_history_needs_no_probe():
    est = LengthEstimates()
    prompt = np.array([9, 9], np.int32)
    est.add_group("g0", prompt)
    est.observe("g0", 700, finished=True)
    est.close_group("g0")
    order = ContextAwareOrder(est, budget=1000)
    est.add_group("g1", np.array([1], np.int32))  # new prompt: probed
    est.add_group("g5", prompt)  # seen last epoch: 700 tokens
    order.push(req("g1", 0))
    order.push(req("g1", 1))
    order.push(req("g5", 0))
    order.push(req("g5", 1))
    est.observe("g1", 20, finished=True)
    assert [order.pop().request_id for _ in range(4)] == ["g1/0", "g5/0", "g5/1", "g1/1"]


def test_probes_go_shortest_generated_first_and_starved_requests_jump_the_queue():
    now = [0.0]
    est = LengthEstimates()
    order = ContextAwareOrder(est, budget=512, starvation_s=10, clock=lambda: now[0])
    for gid in ("g0", "g1"):
        est.add_group(gid, np.array([int(gid[1:]) + 1], np.int32))
    order.push(req("g0", 0, generated=64))  # a probe coming back for its next chunk
    order.push(req("g1", 0))
    assert order.pop().request_id == "g1/0"
    order.push(req("g0", 1))
    est.observe("g1", 500, finished=True)
    now[0] = 5.0
    order.push(req("g1", 1))
    now[0] = 11.0  # g0/1 has waited past the guard, g1/1 not yet
    assert [order.pop().request_id for _ in range(2)] == ["g0/1", "g0/0"]


def test_oracle_is_longest_first_and_fifo_is_arrival_order():
    lengths = {"g0/0": 5, "g0/1": 50, "g1/0": 20}
    oracle, fifo = OracleOrder(lambda r: lengths[r.request_id]), FifoOrder()
    for rid in lengths:
        g, k = rid.split("/")
        oracle.push(req(g, int(k)))
        fifo.push(req(g, int(k)))
    assert [oracle.pop().request_id for _ in range(3)] == ["g0/1", "g1/0", "g0/0"]
    assert [fifo.pop().request_id for _ in range(3)] == list(lengths)


def test_divided_rollout_joins_chunks_into_one_sample():
    div = DividedRollout(chunk_tokens=4)
    full = GenerateRequest("g0/0", "g0", np.array([1, 2, 3], np.int32), max_tokens=10, min_tokens=10)
    first = div.first(full)
    assert (first.max_tokens, first.min_tokens, first.generated) == (4, 4, 0)
    nxt = div.on_chunk(first, sample(first, 4, "length", version=0))
    assert isinstance(nxt, GenerateRequest) and nxt.generated == 4 and nxt.max_tokens == 4
    assert nxt.prompt_ids.tolist() == [1, 2, 3, 7, 8, 9, 10]  # prompt + tokens so far
    last = div.on_chunk(nxt, sample(nxt, 4, "length", version=1))
    assert last.max_tokens == 2 and last.min_tokens == 2  # what is left of the budget
    joined = div.on_chunk(last, sample(last, 2, "length", version=1))
    assert isinstance(joined, Sample) and len(joined.token_ids) == 10 and joined.finish_reason == "length"
    assert joined.versions.tolist() == [0] * 4 + [1] * 6 and joined.logprobs.dtype == np.float32
    stop = div.first(GenerateRequest("g0/1", "g0", np.array([1], np.int32), max_tokens=10))
    assert isinstance(div.on_chunk(stop, sample(stop, 2, "stop")), Sample)  # stopped early: done
    assert div.first(GenerateRequest("g0/2", "g0", np.array([1], np.int32), max_tokens=3)).max_tokens == 3


def test_forced_lengths_share_a_group_component():
    iid = ForcedLengths(median=32, sigma=1.0, max=1024)
    grouped = ForcedLengths(median=32, sigma=1.0, max=1024, group_share=0.8)
    assert [forced_length(iid, i, 8) for i in range(16)] == [forced_length(iid, i) for i in range(16)]
    logs = np.log([[forced_length(grouped, g * 8 + k, 8) for k in range(8)] for g in range(200)])
    within, between = logs.var(axis=1).mean(), logs.mean(axis=1).var()
    assert between > 2 * within  # siblings' lengths are correlated


def test_orchestrator_with_context_aware_and_divided_rollout_keeps_one_sample_per_response():
    cfg = load_config(None, ["sampling.group_size=2", "trainer.batch_groups=2", "trainer.steps=1", "async_ratio=0",
                             "rollout.scheduler=context_aware", "rollout.chunk_tokens=4", "sampling.max_tokens=10",
                             "rollout.max_inflight_per_worker=1"])
    tasks = type("T", (), {"task": lambda self, i: {"id": str(i), "prompt": "p", "answer": ""}})()
    orch = Orchestrator(cfg, tasks, lambda t: np.array([1, 2], np.int32), ["rollout-0"], ["reward-0"])
    orch.pump()
    lengths = {"g0/0": 3, "g0/1": 3, "g1/0": 10, "g1/1": 9}
    dispatched = []
    for _ in range(20):
        reqs = [(p, m) for p, m in orch.outbox if isinstance(m, GenerateRequest)]
        orch.outbox = []
        if not reqs:
            break
        for peer, m in reqs:
            dispatched.append((m.request_id, m.generated))
            n = min(m.max_tokens, lengths[m.request_id] - m.generated)
            orch.on_sample(peer, sample(m, n, "length" if n == m.max_tokens else "stop"))
        orch.pump()
    # the probes went first; then g1's siblings (g1 probe still running = long) before g0's
    assert dispatched[:2] == [("g0/0", 0), ("g1/0", 0)]
    assert [rid for rid, gen in dispatched if gen == 0][2:] == ["g1/1", "g0/1"]
    assert ("g1/0", 8) in dispatched  # chunks of 4, 4, 2
    received = {s.request_id: len(s.token_ids) for g in orch.buffer.groups.values() for s in g.samples.values()}
    assert received == lengths
    assert orch.ledger.samples_received == 4 and orch.ledger.requests_sent == 4
    assert [r["request_id"] for r in orch.finished_requests][0] == "g0/0"


def test_length_history_forgets_the_least_recently_seen_prompts_past_its_cap():
    """A generated task source never runs out of new prompts: the history map is bounded."""
    est = LengthEstimates(history_epochs=2, max_prompts=3)
    prompts = {name: np.array(ids, dtype=np.int32) for name, ids in (("a", [1]), ("b", [2]), ("c", [3]), ("d", [4]))}
    for epoch, order in enumerate(("abc", "a", "d")):
        for name in order:
            gid = f"{name}{epoch}"
            est.add_group(gid, prompts[name])
            est.observe(gid, 10 + epoch, finished=True)
            est.close_group(gid)
    # b was seen least recently when d arrived; a, seen again in epoch 1, stays with both epochs
    assert set(est.history) == {prompt_key(prompts[n]) for n in "acd"}
    assert list(est.history[prompt_key(prompts["a"])]) == [[10], [11]]
