"""Evaluation during training: pass@k, the held-out split, and rounds in the coordinator's logic
(driven by hand: plain calls play the rollout, reward and trainer roles; no engines, no sockets)."""

import itertools
import math

import numpy as np
import pytest

from flashq.config import ConfigError, load_config
from flashq.data import evaluation_tasks, training_tasks
from flashq.data.holdout import is_held_out
from flashq.evaluation import is_eval, pass_at_k
from flashq.orchestrator.core import Orchestrator
from flashq.wire.protocol import GenerateRequest, RewardResult, ScoreRequest, TrainBatch
from tests.unit.test_orchestrator import Tasks, drain, finish, play


def make(overrides):
    cfg = load_config(None, ["sampling.group_size=4", "trainer.batch_groups=2", *overrides])
    held_out = [{"id": f"e{i}", "prompt": f"{i}+100=", "answer": str(i + 100)} for i in range(cfg.eval.prompts)]
    return Orchestrator(cfg, Tasks(), lambda t: np.array([1, 2, 3], np.int32), ["rollout-0", "rollout-1"], ["reward-0"],
                        eval_tasks=held_out)


def test_pass_at_k_is_the_chance_that_k_of_n_drawn_without_replacement_hold_a_pass():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):  # against counting every k-subset of n samples, c of them passing
                subsets = list(itertools.combinations([1] * c + [0] * (n - c), k))
                assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / math.comb(n, k))
    with pytest.raises(ValueError, match="pass@5 needs at least 5 samples"):
        pass_at_k(4, 1, 5)


def test_held_out_prompts_are_never_trained_and_are_what_is_evaluated():
    cfg = load_config(None, ["eval.holdout=0.2", "eval.prompts=30"])
    train = training_tasks(cfg)
    seen = {train.task(i)["prompt"] for i in range(3000)}
    held = evaluation_tasks(cfg)
    assert len(held) == 30 and len({t["prompt"] for t in held}) == 30
    assert all(is_held_out(t, 0.2) for t in held) and not seen & {t["prompt"] for t in held}
    all_sums = {f"{a}+{b}=" for a in range(21) for b in range(21)}
    share = sum(is_held_out({"prompt": p}, 0.2) for p in all_sums) / len(all_sums)
    assert 0.12 < share < 0.28  # about the share asked, by a hash of the prompt
    assert training_tasks(load_config(None)).task(5) == training_tasks(load_config(None)).task(5)  # no eval: the source itself


def test_eval_settings_are_checked_at_load():
    with pytest.raises(ConfigError, match=r"eval.k \[8\]: each k must be between 1 and eval.samples \(4\)"):
        load_config(None, ["eval.samples=4", "eval.k=[1,8]"])


def test_rounds_run_beside_training_at_start_every_n_versions_and_end_and_are_never_trained():
    orch = make(["async_ratio=2", "trainer.steps=6", "eval.every=4", "eval.prompts=3", "eval.samples=4", "eval.k=[1,2]"])
    # a prompt's sampled responses pass on k = 0 and 1 of 4, its greedy one on the first prompt only
    reward = lambda rid: float(rid.endswith(("/0", "/1")) or rid.endswith("0/greedy")) if rid.startswith("eval") else 1.0  # noqa: E731
    batches, sent, _ = play(orch, reward)
    records = orch.eval_records
    assert [int(r["version"]) for _, r in records] == [0, 4, 6]  # start, every 4, the end
    for _, r in records:
        assert r["pass@1"] == pytest.approx(0.5) and r["pass@2"] == pytest.approx(1 - 1 / 6)  # c=2 of n=4
        assert r["mean_reward"] == pytest.approx(0.5) and r["greedy_accuracy"] == pytest.approx(1 / 3)
        assert r["token_version_min"] >= r["version"]  # tagged with what sampled them
    evals = [m for m in sent if m.request_id.startswith("eval")]
    assert len(evals) == 3 * 3 * (4 + 1) and sum(m.temperature == 0 for m in evals) == 3 * 3
    assert not any(rid.startswith("eval") for b in batches for rid in b.request_ids)
    assert orch.gate.admitted == orch.ledger.groups_admitted  # the gate never saw them
    books = orch.ledger
    assert books.eval_requests_sent == books.eval_samples_received == books.eval_rewards_received == len(evals)
    assert books.requests_sent == books.samples_received  # training's books apart from evaluation's
    assert len(batches) == 6


def test_the_run_is_done_only_when_the_final_round_is_scored():
    orch = make(["async_ratio=0", "trainer.steps=1", "eval.prompts=2", "eval.samples=1", "eval.greedy=false"])
    held = []
    orch.on_batch_request(1)
    while orch.trained_version < 1 or orch.evaluator.idle:
        orch.pump()
        for peer, msg in drain(orch):
            if isinstance(msg, GenerateRequest):
                finish(orch, msg, peer, version=orch.engine_version)
            elif isinstance(msg, ScoreRequest):
                if msg.sample.request_id.startswith("eval1"):
                    held.append((peer, msg))  # the final round's scores: not yet
                else:
                    orch.on_reward(peer, RewardResult(msg.sample.request_id, 1.0))
            elif isinstance(msg, TrainBatch):
                orch.on_step_trained(1)
                orch.on_weights_served(1)
    while len(held) < 2:
        orch.pump()
        for peer, msg in drain(orch):
            if isinstance(msg, GenerateRequest):
                finish(orch, msg, peer, version=orch.engine_version)
            elif isinstance(msg, ScoreRequest):
                held.append((peer, msg))
    assert not orch.done
    for peer, msg in held:
        orch.on_reward(peer, RewardResult(msg.sample.request_id, 0.0))
    assert orch.done and [int(r["version"]) for _, r in orch.eval_records] == [0, 1]


def test_a_resumed_round_draws_what_the_uninterrupted_one_did_and_its_old_record_goes(tmp_path):
    import json

    from flashq.roles.coordinator import truncate_metrics

    first = make(["trainer.steps=8", "eval.every=4", "eval.prompts=2", "sampling.seed_requests=true"]).evaluator
    first.start(0)
    again = make(["trainer.steps=8", "eval.every=4", "eval.prompts=2", "sampling.seed_requests=true"]).evaluator
    assert [r.seed for r in first.start(4)] == [r.seed for r in again.start(4)]  # round 1 there, round 0 here
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"kind": "eval", "step": 0}, {"kind": "step", "step": 4},
                                                             {"kind": "eval", "step": 4}, {"kind": "step", "step": 5}]))
    truncate_metrics(path, 4)
    assert [(r["kind"], r["step"]) for r in map(json.loads, path.read_text().splitlines())] == [("eval", 0), ("step", 4)]


def test_an_abandoned_round_no_longer_holds_the_run():
    orch = make(["trainer.steps=1", "eval.prompts=2"])
    orch.pump()
    assert not orch.evaluator.idle
    assert orch.evaluator.abandon() == 1 and orch.evaluator.idle


def test_evaluation_refuses_what_it_cannot_evaluate_honestly():
    with pytest.raises(ConfigError, match="eval.task is the training task"):
        load_config(None, ["eval.task={kind: arithmetic}"])
    # replays have no answers: a config built on one that evaluates runs without evaluation
    assert load_config(None, ["eval.prompts=2", "sampling.forced_lengths={median: 4, max: 6}", "sampling.max_tokens=8"]).eval is None
    assert load_config(None, ["eval.prompts=2", "env={name: 'a.b:C'}"]).eval is not None  # environments are evaluated


def test_a_file_source_without_shuffling_keeps_its_training_side(tmp_path):
    import json

    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(1024)))
    cfg = load_config(None, ["task.kind=file", f"task.file.path={path}", "task.file.prompt_field=question",
                             "task.file.answer_field=answer", "task.file.shuffle=false", "eval.prompts=5"])
    train = training_tasks(cfg)
    drawn = [train.task(i)["prompt"] for i in range(3 * 1024)]  # three epochs
    assert not any(is_held_out({"prompt": p}, 0.1) for p in drawn)
    assert len(set(drawn)) == sum(not is_held_out({"prompt": f"q{i}"}, 0.1) for i in range(1024))
    assert {t["prompt"] for t in evaluation_tasks(cfg)}.isdisjoint(drawn)


def test_environment_runs_evaluate_held_out_episodes_scored_by_the_environment():
    """Episodes are played by hand here (scheduling logic only); a real environment is evaluated
    in tests/integration/test_agentic.py."""
    from flashq.evaluation import episode_seed
    from flashq.wire.protocol import EpisodeRequest
    from tests.unit.test_redundancy import episode_sample

    cfg = load_config(None, ["env={name: flashq.envs.guess:GuessNumberEnv}", "sampling.group_size=2", "trainer.batch_groups=1",
                             "trainer.steps=2", "async_ratio=0", "eval.every=0", "eval.prompts=3", "eval.samples=2", "eval.k=[1, 2]"])
    held_out = [{"id": f"e{i}", "prompt": "?"} for i in range(3)]
    orch = Orchestrator(cfg, Tasks(), None, ["rollout-0"], ["reward-0"], eval_tasks=held_out)
    orch.on_batch_request(1)
    trained_seeds, eval_seeds = set(), []
    while not orch.done:
        orch.pump()
        out = drain(orch)
        assert out, "the run stalled"
        for peer, msg in out:
            if isinstance(msg, EpisodeRequest):
                if is_eval(msg.request_id):
                    eval_seeds.append(msg.seed)
                    p, name = msg.request_id.split("/")[1:]
                    failed = p == "2" and name == "0"  # one episode fails: lost to its round, not a 0
                    orch.on_sample(peer, episode_sample(msg, 0, reward=float(p == "0"), finish="error" if failed else "stop"))
                    continue
                trained_seeds.add(msg.seed)
                orch.on_sample(peer, episode_sample(msg, 0, reward=float(msg.request_id.endswith("/0"))))
            elif isinstance(msg, TrainBatch):
                orch.on_step_trained(msg.batch_index + 1)
                orch.on_weights_served(msg.batch_index + 1)
                orch.on_batch_request(1)
    rounds = [rec for _, rec in orch.eval_records]
    assert [r["version"] for r in rounds] == [0.0, 2.0]  # the start and the end (every=0)
    for rec in rounds:
        assert rec["greedy_accuracy"] == pytest.approx(1 / 3) and rec["requests_lost"] == 1.0
        assert rec["mean_reward"] == pytest.approx(2 / 5) and rec["pass@1"] == pytest.approx((1 + 0 + 0) / 3)
        assert rec["pass@2"] == pytest.approx((1 + 0) / 2)  # over the prompts with two samples left
    assert set(eval_seeds) == {episode_seed(cfg.task.seed, p) for p in range(3)} and not set(eval_seeds) & trained_seeds
    books = orch.ledger
    assert books.eval_rewards_received == 2 * (3 * 3 - 1) and books.rewards_received == 2 * 2  # eval never trained
