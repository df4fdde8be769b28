"""The coordinator's logic, driven by hand: these tests play the rollout, reward and trainer
roles with plain function calls (no engines, no sockets) to check scheduling and bookkeeping."""

import numpy as np
import pytest

from flashq.config import load_config
from flashq.orchestrator.core import Orchestrator
from flashq.scheduling.lengths import forced_length
from flashq.wire.protocol import EpisodeRequest, GenerateRequest, RewardResult, Sample, ScoreRequest, TrainBatch


class Tasks:
    def task(self, i):
        return {"id": f"t{i}", "prompt": f"{i}+0=", "answer": str(i)}


def make(overrides=(), workers=("rollout-0", "rollout-1")):
    cfg = load_config(None, ["sampling.group_size=4", "trainer.batch_groups=2", "trainer.steps=3", *overrides])
    return Orchestrator(cfg, Tasks(), lambda t: np.array([1, 2, 3], np.int32), list(workers), ["reward-0"])


def drain(orch):
    out, orch.outbox = orch.outbox, []
    return out


def finish(orch, req: GenerateRequest, worker: str, version: int = 0, n_tokens: int = 3):
    orch.on_sample(
        worker,
        Sample(req.request_id, req.group_id, 0, np.arange(n_tokens, dtype=np.int32), np.zeros(n_tokens, np.float32),
               np.full(n_tokens, version, np.int32), "stop"),
    )



def play(orch, reward_of, failure_of=lambda req: ""):
    """Every role until the run is done: each response finishes as soon as it is sent, at the
    engines' version (or fails, with `failure_of(request)` when that is not empty), and scores
    `reward_of(request_id)`; each batch is trained and its weights served at once. Returns the
    batches, the requests sent and, per batch, the versions its groups were admitted at."""
    batches, sent, admitted = [], [], []
    orch.on_batch_request(1)
    while not orch.done:
        orch.pump()
        out = drain(orch)
        for peer, msg in out:
            if isinstance(msg, GenerateRequest):
                sent.append(msg)
                if error := failure_of(msg):
                    orch.on_sample(peer, Sample(msg.request_id, msg.group_id, 0, *Sample.empty_arrays(), "error", error=error))
                    continue
                finish(orch, msg, peer, version=orch.engine_version)
            elif isinstance(msg, ScoreRequest):
                orch.on_reward(peer, RewardResult(msg.sample.request_id, reward_of(msg.sample.request_id)))
            elif isinstance(msg, TrainBatch):
                batches.append(msg)
                admitted.append([g.admission.version for g in orch.on_step_trained(msg.batch_index + 1)])
                orch.on_weights_served(msg.batch_index + 1)
                orch.on_batch_request(1)
        if not out:
            raise AssertionError("nothing to do and not done: the run stalled")
    return batches, sent, admitted

def test_each_prompt_becomes_n_independent_requests_spread_over_workers():
    orch = make(["async_ratio=0", "rollout.max_inflight_per_worker=8", "sampling.seed_requests=true"])
    orch.pump()
    sent = drain(orch)
    reqs = [(peer, m) for peer, m in sent if isinstance(m, GenerateRequest)]
    assert len(reqs) == 2 * 4  # sync: exactly one batch of 2 groups x 4 samples admitted
    assert len({m.request_id for _, m in reqs}) == 8
    assert {peer for peer, _ in reqs} == {"rollout-0", "rollout-1"}
    per_group = {}
    for peer, m in reqs:
        per_group.setdefault(m.group_id, set()).add(peer)
    assert all(len(peers) == 2 for peers in per_group.values())  # replicas of one prompt on both workers
    assert len({m.seed for _, m in reqs}) == 8


def test_finished_sample_goes_to_reward_at_once_and_groups_reach_the_trainer_whole():
    orch = make(["async_ratio=0"])
    orch.pump()
    reqs = [(p, m) for p, m in drain(orch) if isinstance(m, GenerateRequest)]
    orch.on_batch_request(1)
    p, first = reqs[0]
    finish(orch, first, p)
    orch.pump()
    scores = [m for _, m in drain(orch) if isinstance(m, ScoreRequest)]
    assert [s.sample.request_id for s in scores] == [first.request_id]  # no batch barrier
    orch.on_reward("reward-0", RewardResult(first.request_id, 1.0))
    for p, r in reqs[1:]:
        finish(orch, r, p)
        orch.pump()
        for _, s in [x for x in drain(orch) if isinstance(x[1], ScoreRequest)]:
            orch.on_reward("reward-0", RewardResult(s.sample.request_id, 0.0))
    orch.pump()
    batches = [m for _, m in drain(orch) if isinstance(m, TrainBatch)]
    assert len(batches) == 1 and batches[0].batch_index == 0
    b = batches[0]
    assert len(b.request_ids) == 8 and sorted(np.bincount(b.group_index)) == [4, 4]
    assert orch.ledger.samples_batched == 8


def test_sync_mode_waits_for_new_weights_before_admitting_more():
    orch = make(["async_ratio=0"])
    orch.pump()
    drain(orch)
    assert orch.gate.capacity(orch.engine_version) == 0
    orch.on_weights_served(1)
    orch.pump()
    assert sum(isinstance(m, GenerateRequest) for _, m in drain(orch)) == 8


def test_async_ratio_admits_ahead():
    orch = make(["async_ratio=1", "trainer.steps=10"])
    orch.pump()
    assert sum(isinstance(m, GenerateRequest) for _, m in drain(orch)) == (1 + 1) * 2 * 4


def test_unrequested_duplicate_and_misrouted_samples_are_refused():
    orch = make(["async_ratio=0"])
    orch.pump()
    peer, req = next((p, m) for p, m in drain(orch) if isinstance(m, GenerateRequest))
    other = "rollout-1" if peer == "rollout-0" else "rollout-0"
    with pytest.raises(KeyError, match="was sent to"):
        finish(orch, req, other)
    finish(orch, req, peer)
    with pytest.raises(KeyError, match="not requested"):
        finish(orch, req, peer)
    with pytest.raises(KeyError, match="not requested"):
        orch.on_reward("reward-0", RewardResult("g99/0", 1.0))


def test_overlong_prompts_are_skipped_and_counted():
    cfg_over = ["async_ratio=0", "rollout.max_model_len=20", "sampling.max_tokens=18"]
    orch = make(cfg_over)
    orch.encode_prompt = lambda t: np.arange(10 if t["id"] == "t0" else 2, dtype=np.int32)
    orch.pump()
    assert orch.ledger.tasks_skipped == {"prompt longer than max_model_len - max_tokens": 1}
    assert orch.ledger.groups_admitted == 2


def test_forced_lengths_are_deterministic_and_heavy_tailed():
    cfg = load_config(None, ["sampling.max_tokens=400", "rollout.max_model_len=512",
                             "sampling.forced_lengths={median: 10, sigma: 1.5, min: 1, max: 400}"])
    fl = cfg.sampling.forced_lengths
    lengths = [forced_length(fl, i) for i in range(2000)]
    assert lengths == [forced_length(fl, i) for i in range(2000)]
    assert np.median(lengths) == pytest.approx(10, abs=1)
    assert max(lengths) >= 20 * np.median(lengths)


class RepeatingTasks:
    """Two prompts, asked in turn: every other group is a later epoch of the same prompt."""

    def task(self, i):
        return {"id": f"t{i % 2}", "prompt": f"{i % 2}+0=", "answer": str(i % 2)}


def test_a_prompt_asked_again_keeps_its_share_of_the_replayed_length():
    cfg = load_config(None, ["sampling.group_size=4", "trainer.batch_groups=2", "trainer.steps=3", "async_ratio=2",
                             "rollout.max_inflight_per_worker=64", "sampling.max_tokens=400", "rollout.max_model_len=512",
                             "sampling.forced_lengths={median: 10, sigma: 1.5, min: 1, max: 400, group_share: 1.0}"])
    def replayed(tasks, encode) -> dict[int, list[int]]:
        orch = Orchestrator(cfg, tasks, encode, ["rollout-0"], ["reward-0"])
        orch.pump()
        by_group = {}
        for _, m in drain(orch):
            if isinstance(m, GenerateRequest):
                by_group.setdefault(int(m.group_id[1:]), []).append(m.max_tokens)
        return by_group

    by_group = replayed(RepeatingTasks(), lambda t: np.array([1, 2, 3 + int(t["id"][1:])], np.int32))
    assert len(by_group) == 6  # 3 epochs of 2 prompts
    # all of the log-variance is the prompt's, so each prompt answers at one length in every epoch
    assert {g: set(v) for g, v in by_group.items()} == {g: {by_group[g % 2][0]} for g in by_group}
    assert by_group[0][0] != by_group[1][0]
    fl = cfg.sampling.forced_lengths
    assert by_group[0] == [forced_length(fl, k, 4) for k in range(4)]  # a prompt's first group: as if asked once
    # a prompt is its token ids, as the scheduler's history keys it: other tasks with the same text share its length
    assert replayed(Tasks(), lambda t: np.array([1, 2, 3 + int(t["id"][1:]) % 2], np.int32)) == by_group


def test_grouped_speculation_keeps_each_prompt_on_one_worker_across_its_groups():
    cfg = load_config(None, ["sampling.group_size=4", "trainer.batch_groups=2", "trainer.steps=3", "async_ratio=2",
                             "rollout.speculation=grouped", "rollout.max_inflight_per_worker=64"])
    prompt_of = lambda t: np.array([int(t["id"][1:]) % 3 + 1, 7], np.int32)  # noqa: E731 - tasks 0 and 3 share a prompt
    orch = Orchestrator(cfg, Tasks(), prompt_of, ["rollout-0", "rollout-1"], ["reward-0"])
    orch.pump()
    reqs = [(peer, m) for peer, m in drain(orch) if isinstance(m, GenerateRequest)]
    worker_of_prompt = {}
    for peer, m in reqs:
        worker_of_prompt.setdefault(tuple(m.prompt_ids.tolist()), set()).add(peer)
    assert len(reqs) >= 4 * 4 and all(len(w) == 1 for w in worker_of_prompt.values())  # siblings + later groups meet
    assert len({w for ws in worker_of_prompt.values() for w in ws}) == 2  # different prompts still spread
    spread = make(["async_ratio=0", "rollout.speculation=grouped", "rollout.group_affinity=false"])
    spread.pump()
    assert len({p for p, m in drain(spread) if isinstance(m, GenerateRequest)}) == 2


def test_grouped_speculation_keeps_each_episode_task_on_one_worker():
    """Episodes carry a task, not prompt ids (the environment renders the prompt on the worker):
    the task and its seed stand for the prompt."""
    cfg = load_config(None, ["env={name: flashq.envs.guess:GuessNumberEnv}", "sampling.group_size=3", "trainer.batch_groups=2",
                             "trainer.steps=2", "async_ratio=1", "rollout.speculation=grouped", "rollout.num_workers=2"])
    tasks = type("T", (), {"task": lambda self, i: {"id": str(i % 2), "seed": 7 + i % 2}})()  # tasks 0 and 2 are the same
    orch = Orchestrator(cfg, tasks, None, ["rollout-0", "rollout-1"], ["reward-0"])
    orch.on_batch_request(2)
    orch.pump()
    sent = [(w, m) for w, m in orch.outbox if isinstance(m, EpisodeRequest)]
    workers_of_task: dict[str, set] = {}
    for w, m in sent:
        workers_of_task.setdefault(m.task["id"], set()).add(w)
    assert len(sent) == 4 * 3 and all(len(ws) == 1 for ws in workers_of_task.values())
    assert workers_of_task["0"] != workers_of_task["1"]  # different tasks still spread


def test_a_divided_response_continues_on_the_worker_that_holds_its_prefix():
    orch = make(["async_ratio=0", "rollout.chunk_tokens=4", "sampling.max_tokens=12", "rollout.max_inflight_per_worker=8"])
    orch.pump()
    reqs = [(p, m) for p, m in drain(orch) if isinstance(m, GenerateRequest)]
    peer, first = next((p, m) for p, m in reqs if p == "rollout-1")
    assert first.max_tokens == 4
    finish(orch, next(m for p, m in reqs if p == "rollout-0"), "rollout-0")  # now both have 3 in flight
    orch.on_sample(peer, Sample(first.request_id, first.group_id, 1, np.arange(4, dtype=np.int32),
                                np.zeros(4, np.float32), np.zeros(4, np.int32), "length"))
    orch.pump()
    (p2, cont), = [(p, m) for p, m in drain(orch) if isinstance(m, GenerateRequest)]
    assert cont.request_id == first.request_id and cont.generated == 4
    assert p2 == "rollout-1"  # rollout-0 is as free (and first), but rollout-1's prefix cache holds the tokens so far
    assert orch.chunk_worker == {}


def test_a_sample_that_contradicts_its_request_is_refused_and_stays_owed():
    orch = make(["async_ratio=0"])
    orch.pump()
    peer, req = next((p, m) for p, m in drain(orch) if isinstance(m, GenerateRequest))
    tokens = lambda n: (np.arange(n, dtype=np.int32), np.zeros(n, np.float32), np.zeros(n, np.int32))  # noqa: E731
    with pytest.raises(KeyError, match="names group g1, but was requested for group g0"):
        orch.on_sample(peer, Sample(req.request_id, "g1", 0, *tokens(3), "stop"))
    load = dict(orch.gen_queue.load)
    with pytest.raises(ValueError, match=f"at most {req.max_tokens} were asked"):
        orch.on_sample(peer, Sample(req.request_id, req.group_id, 0, *tokens(req.max_tokens + 1), "stop"))
    with pytest.raises(ValueError, match="no engine has been sent a version past 0"):
        orch.on_sample(peer, Sample(req.request_id, req.group_id, 0, tokens(3)[0], tokens(3)[1], np.array([0, 1, 1], np.int32), "stop"))
    orch.on_push_started(1)  # once version 1 is on its way, an engine may sample with it before all serve it
    assert orch.request_worker[req.request_id] == peer and orch.gen_queue.load == load  # nothing changed
    finish(orch, req, peer, version=1)  # the right answer is still taken
    assert orch.ledger.samples_received == 1 and req.request_id not in orch.request_worker


def test_only_the_trainer_may_ask_for_batches_or_report_steps():
    from flashq.roles.coordinator import Coordinator
    from flashq.wire.protocol import BatchRequest, StepStats

    for msg in (BatchRequest(credits=5), StepStats(step=1, metrics={})):
        with pytest.raises(ValueError, match="only the trainer sends it"):
            Coordinator._from_trainer("rollout-0", msg)
        Coordinator._from_trainer("trainer", msg)
