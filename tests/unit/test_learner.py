"""One real GRPO step of the tiny model in torch."""

import math

import numpy as np
import pytest
import torch

from flashq.buffer import Group, pack_batch
from flashq.config import load_config
from flashq.staleness import Admission
from flashq.trainer.learner import Learner
from flashq.trainer.logprobs import token_logprobs
from flashq.wire.protocol import RewardResult, Sample


def make_batch(learner, rewards, versions=0, batch_index=0, behaviour=None, lengths=None):
    """A batch of one group; behaviour logprobs default to the learner's own (on-policy);
    response k has `lengths[k]` tokens (default 3 + k)."""
    rng = np.random.default_rng(0)
    prompt = np.array([2, 121, 119, 14, 53, 47, 54, 65], np.int32)
    group = Group(task={}, prompt_ids=prompt, size=len(rewards), admission=Admission("g0", 0, 0))
    for k, r in enumerate(rewards):
        resp = rng.integers(5, 200, size=lengths[k] if lengths is not None else 3 + k).astype(np.int32)
        ids = torch.tensor(np.concatenate([prompt, resp])[None].astype(np.int64))
        with torch.no_grad():
            lp = token_logprobs(learner.model, ids, torch.ones_like(ids), 1.0)[0][0, len(prompt) - 1 :].numpy()
        if behaviour is not None:
            lp = lp + behaviour
        rid = f"g0/{k}"
        group.samples[rid] = Sample(rid, "g0", 0, resp, lp.astype(np.float32), np.full(len(resp), versions, np.int32), "stop")
        group.rewards[rid] = RewardResult(rid, float(r))
    return pack_batch([group], batch_index)


@pytest.fixture
def learner(tiny_model):
    cfg = load_config(None, ["async_ratio=2"])
    return Learner(cfg, tiny_model)


def test_a_step_changes_the_weights_and_bumps_the_version(learner):
    before = [p.detach().clone() for p in learner.model.parameters()]
    marks = []
    learner.updated.mark = lambda: marks.append(learner.version)  # the fence a push waits on (test_update_fence)
    m = learner.train_step(make_batch(learner, [1, 0, 0, 1]))
    assert marks == [0] and learner.version == 1  # marked once, after the optimizer step of version 0
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
    assert np.isfinite(m["loss"]) and m["grad_norm"] > 0
    assert m["reward/mean"] == 0.5 and m["train/sequences"] == 4


@pytest.mark.parametrize("minibatches", [1, 2])
def test_before_update_runs_once_with_gradients_ready_and_parameters_untouched(tiny_model, minibatches):
    """The trainer role pushes version v while step v+1 computes, and waits in `before_update`:
    so the hook must come after the gradients and before the optimizer changes any parameter."""
    learner = Learner(load_config(None, ["async_ratio=2", f"trainer.minibatches={minibatches}"]), tiny_model)
    params = list(learner.model.parameters())
    before = [p.detach().clone() for p in params]
    calls = []

    def hook():
        calls.append((all(p.grad is not None for p in params), all(torch.equal(a, b) for a, b in zip(before, params))))

    learner.train_step(make_batch(learner, [1, 0, 0, 1]), before_update=hook)
    assert calls == [(True, True)]
    assert any(not torch.equal(a, b) for a, b in zip(before, params))


def test_on_policy_batch_has_unit_importance_weights(learner):
    """Behaviour logprobs computed by the same model must line up token for token."""
    m = learner.train_step(make_batch(learner, [1, 0, 1, 0]))
    assert m["loss/is_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert abs(m["loss/behav_kl"]) < 1e-5


def test_stale_behaviour_is_reweighted(learner):
    m = learner.train_step(make_batch(learner, [1, 0, 1, 0], behaviour=-3.0))  # behaviour far less likely
    assert m["loss/is_truncated_frac"] == pytest.approx(1.0)
    assert m["loss/is_weight_mean"] == pytest.approx(learner.cfg.trainer.loss.is_cap)


def test_staleness_histogram_and_violations(learner):
    learner.version = 3
    m = learner.train_step(make_batch(learner, [1, 0], versions=1, batch_index=3))
    assert m["staleness/max"] == 2 and m["staleness/violations"] == 0
    assert m["hist/staleness"] == [0, 0, int(m["train/tokens"])]
    m = learner.train_step(make_batch(learner, [1, 0], versions=0, batch_index=4))
    assert m["staleness/violations"] == m["train/tokens"]  # 4 versions old > ceil(alpha)


def test_out_of_order_batch_is_refused(learner):
    with pytest.raises(RuntimeError, match="arrived at trainer version 0"):
        learner.train_step(make_batch(learner, [1, 0], batch_index=2))


@pytest.mark.parametrize("share", [False, True])
def test_micro_batches_give_the_same_gradient(tiny_model, share):
    big = Learner(load_config(None, [f"trainer.share_prompts={share}"]), tiny_model)
    small = Learner(load_config(None, [f"trainer.share_prompts={share}", "trainer.micro_batch_tokens=64"]), tiny_model)
    batch = make_batch(big, [1, 0, 0, 1, 1, 0], lengths=[10, 12, 14, 16, 18, 20])
    assert len(small._micro_batches(batch, np.arange(6))) > 1
    big.train_step(batch)
    small.train_step(batch)
    for a, b in zip(big.model.parameters(), small.model.parameters()):  # .grad survives the step
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-4)


def test_minibatches_take_several_optimizer_steps_against_the_pre_update_policy(tiny_model):
    learner = Learner(load_config(None, ["trainer.minibatches=3", "trainer.lr=0.05"]), tiny_model)
    steps = []
    learner.optimizer.step = (lambda orig: (lambda *a, **k: (steps.append(1), orig(*a, **k))[1]))(learner.optimizer.step)
    m = learner.train_step(make_batch(learner, [1, 0, 0, 1, 1, 0]))
    assert len(steps) == 3 and learner.version == 1  # one policy version per batch
    assert m["loss/clip_frac"] > 0  # later minibatches moved away from pi_prox and got clipped


def test_kl_penalty_loads_a_frozen_reference(tiny_model):
    learner = Learner(load_config(None, ["trainer.loss.kl_coef=0.1"]), tiny_model)
    assert learner.reference is not None
    assert not any(p.requires_grad for p in learner.reference.parameters())
    learner.train_step(make_batch(learner, [1, 0, 0, 1]))
    m = learner.train_step(make_batch(learner, [1, 0, 0, 1], batch_index=1))
    assert m["loss/ref_kl"] > 0  # the policy has moved away from the reference


@pytest.mark.parametrize("policy, correction", [("reinforce", "tis_sequence"), ("cispo", "none"), ("topr", "none"),
                                                ("gspo", "tis_token"), ("ppo", "mask_token"), ("reinforce", "mask_sequence")])
def test_every_loss_trains(tiny_model, policy, correction):
    cfg = load_config(None, [f"trainer.loss.policy={policy}", f"trainer.loss.correction={correction}", "trainer.loss.advantage=rloo"])
    learner = Learner(cfg, tiny_model)
    m = learner.train_step(make_batch(learner, [1, 0, 0, 1]))
    assert np.isfinite(m["loss"]) and m["grad_norm"] > 0


def test_environment_tokens_are_masked_out_of_the_loss(learner):
    """An episode's env tokens (loss mask 0) get no gradient and do not count as trained."""
    batch = make_batch(learner, [1, 0, 1, 0])
    masked = np.ones(len(batch.response_ids), np.uint8)
    masked[batch.response_offsets[0] : batch.response_offsets[1]] = 0  # sequence 0: all environment
    batch.loss_mask = masked
    batch.versions = batch.versions.copy()
    batch.versions[masked == 0] = -50  # would be a staleness violation if env tokens counted
    micro = learner._micro(batch, np.arange(4), torch.zeros(4))
    assert micro.mask[0].sum() == 0 and micro.mask[1].sum() == 4
    m = learner.train_step(batch)
    lens = np.diff(batch.response_offsets)
    assert m["train/tokens"] == float(lens[1:].sum()) and m["staleness/violations"] == 0


def test_bf16_compute_keeps_float32_masters_that_take_lr_sized_steps(tiny_model):
    """AdamW's first step moves every weight by about lr. In bf16 parameters a 1e-6 step rounds
    away (spacing ~1e-4 near |w| = 0.02); float32 masters keep it, and their bf16 cast (what the
    engines are sent) moves wherever the step crosses a rounding boundary."""
    learner = Learner(load_config(None, ["trainer.compute_dtype=bfloat16", "trainer.lr=1e-6"]), tiny_model)
    batch = make_batch(learner, [1, 0, 0, 1])
    seen = set()
    learner.model.model.layers[0].mlp.down_proj.register_forward_hook(lambda mod, inp, out: seen.add(out.dtype))
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    learner.train_step(batch)
    assert seen == {torch.bfloat16}
    w = dict(learner.model.named_parameters())["model.layers.0.mlp.down_proj.weight"]
    step = (w.detach() - before["model.layers.0.mlp.down_proj.weight"]).abs()
    assert w.dtype == torch.float32 and step.median() == pytest.approx(1e-6, rel=0.1)
    assert all(s["exp_avg"].dtype == torch.float32 for s in learner.optimizer.state.values())
    served = sum(int((p.detach().bfloat16() != before[n].bfloat16()).sum()) for n, p in learner.model.named_parameters())
    assert served > 0


def test_minibatch_diagnostics_are_token_weighted_over_the_whole_batch(tiny_model):
    """On-policy, every token's behaviour weight is 1, however many minibatches the batch takes."""
    learner = Learner(load_config(None, ["trainer.minibatches=2", "trainer.lr=1e-9"]), tiny_model)
    m = learner.train_step(make_batch(learner, [1, 0, 0, 1]))
    assert m["loss/is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert m["loss/entropy"] > 0


def test_token_sum_norm_divides_by_the_longest_episode_not_one_turn(tiny_model):
    """Dr. GRPO's constant is the most tokens one sample can train: max_tokens per turn times the
    turns of an episode."""
    common = ["trainer.loss.aggregation=token_sum_norm", "trainer.loss.policy=reinforce"]
    single = Learner(load_config(None, common), tiny_model)
    episodes = Learner(load_config(None, [*common, "env.name=flashq.envs.guess:GuessNumberEnv", "env.max_turns=4"]), tiny_model)
    batch = make_batch(single, [1, 0, 0, 1])
    assert episodes.train_step(batch)["loss"] == pytest.approx(single.train_step(batch)["loss"] / 4, rel=1e-5)


def test_forced_lengths_mask_the_stop_tokens_as_vllm_min_tokens_does(tiny_model):
    from transformers import AutoTokenizer

    learner = Learner(load_config(None, ["sampling.forced_lengths.median=8", "sampling.forced_lengths.max=16"]), tiny_model)
    assert learner.banned.tolist() == [AutoTokenizer.from_pretrained(str(tiny_model)).eos_token_id]
    batch = make_batch(learner, [1, 0, 0, 1])
    micro = learner._micro(batch, np.arange(4), torch.zeros(4))
    with torch.no_grad():
        masked = learner.logprobs(learner.model, micro)[0]
        learner.banned = None
        plain = learner.logprobs(learner.model, micro)[0]
    on = micro.mask > 0
    assert torch.all(masked[on] > plain[on])  # the stop token's mass is spread over the rest


def test_gradient_checkpointing_gives_the_same_gradient(tiny_model):
    plain = Learner(load_config(None), tiny_model)
    ckpt = Learner(load_config(None, ["trainer.gradient_checkpointing=true"]), tiny_model)
    assert ckpt.model.is_gradient_checkpointing and not plain.model.is_gradient_checkpointing
    batch = make_batch(plain, [1, 0, 0, 1])
    plain.train_step(batch)
    ckpt.train_step(batch)
    for a, b in zip(plain.model.parameters(), ckpt.model.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-7, rtol=1e-5)


def test_a_checkpoint_from_before_sharded_optimizer_state_still_resumes(tiny_model, tmp_path):
    """Older checkpoints hold the optimizer's full state in trainer_state.pt, not optimizer/."""
    learner = Learner(load_config(None), tiny_model)
    learner.train_step(make_batch(learner, [1, 0, 0, 1]))
    learner.save(tmp_path, tiny_model)
    import shutil

    shutil.rmtree(tmp_path / "optimizer")
    torch.save({"version": 1, "optimizer": learner.optimizer.state_dict(), "torch_rng": torch.get_rng_state()}, tmp_path / "trainer_state.pt")
    resumed = Learner(load_config(None), tmp_path)
    resumed.load_state(tmp_path)
    assert resumed.version == 1
    for a, b in zip(learner.optimizer.state.values(), resumed.optimizer.state.values()):
        assert torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])


def test_a_non_finite_gradient_skips_its_batch_and_too_many_in_a_row_stop_the_run(tiny_model):
    learner = Learner(load_config(None, ["trainer.max_nonfinite_in_row=2"]), tiny_model)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    poisoned = make_batch(learner, [float("inf"), 0, 1, 0])  # an infinite reward: NaN advantages, NaN gradients
    m = learner.train_step(poisoned)
    assert m["train/skipped_nonfinite"] == 1 and learner.version == 1 and np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"])
    assert all(torch.equal(p, before[n]) for n, p in learner.model.named_parameters())  # nothing applied
    assert learner.train_step(make_batch(learner, [1, 0, 0, 1], batch_index=1, versions=1))["train/skipped_nonfinite"] == 0
    learner.train_step(make_batch(learner, [float("inf"), 0, 1, 0], batch_index=2, versions=2))  # one in a row again
    with pytest.raises(FloatingPointError, match="non-finite gradient norm in 2 batches in a row"):
        learner.train_step(make_batch(learner, [float("inf"), 0, 1, 0], batch_index=3, versions=3))


def test_the_learning_rate_follows_its_schedule_and_a_resumed_run_continues_it(tiny_model, tmp_path):
    """Warm-up 2 of 6 steps then cosine: factors 0.5, 1, 1, (1 + cos(pi/4)) / 2, 0.5, ...; the
    optimizer steps at them, and a run resumed at version 4 steps at 0.5, not at the peak."""
    overrides = ["trainer.steps=6", "trainer.lr=0.01", "trainer.lr_schedule=cosine", "trainer.lr_warmup_steps=2"]
    learner = Learner(load_config(None, overrides), tiny_model)
    applied = []
    step = learner.optimizer.step
    learner.optimizer.step = lambda *a, **k: (applied.append(learner.optimizer.param_groups[0]["lr"]), step(*a, **k))[1]
    logged = [learner.train_step(make_batch(learner, [1, 0, 0, 1], batch_index=v))["train/lr"] for v in range(4)]
    expected = [0.005, 0.01, 0.01, 0.01 * (1 + math.cos(math.pi / 4)) / 2]
    assert applied == pytest.approx(expected) and logged == pytest.approx(expected)
    learner.save(tmp_path, tiny_model)
    resumed = Learner(load_config(None, overrides), tmp_path)
    resumed.load_state(tmp_path)
    assert resumed.train_step(make_batch(resumed, [1, 0, 0, 1], batch_index=4))["train/lr"] == pytest.approx(0.005)
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(0.005)


def test_a_warm_up_as_long_as_the_run_is_refused():
    with pytest.raises(ValueError, match="lr_warmup_steps"):
        load_config(None, ["trainer.steps=10", "trainer.lr_warmup_steps=10"])


@pytest.mark.parametrize("scope", ["all", "matrices"])
def test_weight_decay_reaches_the_parameters_its_scope_names(tiny_model, scope):
    """With zero gradients an AdamW step is the decay alone: each decayed weight x (1 - lr x decay)."""
    cfg = load_config(None, ["trainer.lr=0.1", "trainer.weight_decay=1.0", f"trainer.weight_decay_scope={scope}"])
    learner = Learner(cfg, tiny_model)
    params = dict(learner.model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items()}
    for p in params.values():
        p.grad = torch.zeros_like(p)
    learner.optimizer.step()
    vectors = [n for n, p in params.items() if p.ndim < 2]
    assert vectors and any("norm" in n for n in vectors)  # the tiny model has norm weights (and biases) to leave alone
    for n, p in params.items():
        factor = 1.0 if scope == "matrices" and p.ndim < 2 else 0.9
        torch.testing.assert_close(p.detach(), before[n] * factor, msg=f"{n} ({scope})")


def test_reads_to_the_host_do_not_grow_with_the_micro_batches(tiny_model, monkeypatch):
    """On a GPU each read of a device scalar stalls the host until the device catches up; the device
    check counted ~19 a micro-batch. The loss's statistics are summed on the device and read once per
    batch: a step split into many micro-batches reads the host as often as one in a single pass. (The
    logprob head still indexes by a mask once a forward, and so do shared prompt passes.)"""
    batch_of = lambda learner: make_batch(learner, [1, 0, 0, 1, 1, 0], lengths=[10, 12, 14, 16, 18, 20])  # noqa: E731
    common = ["trainer.loss.kl_coef=0.01", "trainer.share_prompts=false"]
    one = Learner(load_config(None, common), tiny_model)
    many = Learner(load_config(None, [*common, "trainer.micro_batch_tokens=64"]), tiny_model)
    batch = batch_of(one)
    assert len(one._micro_batches(batch, np.arange(6))) == 1 and len(many._micro_batches(batch, np.arange(6))) >= 3
    reads = []
    for name in ("item", "tolist", "__float__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name: reads.append(_n) or _o(self, *a))
    counts = []
    for learner in (one, many):
        reads.clear()
        learner.train_step(batch)
        counts.append(len(reads))
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize("minibatches", [1, 2])
def test_the_statistics_are_read_before_the_last_optimizer_step(tiny_model, minibatches, monkeypatch):
    """On a GPU `optimizer.step()` only queues AdamW; a read after it would wait for AdamW to run,
    and a push overlapping the next step would gain nothing. The statistics are read where the
    device is idle anyway: after the last minibatch's gradient norm, before its optimizer step."""
    from flashq.trainer import learner as learner_module

    learner = Learner(load_config(None, [f"trainer.minibatches={minibatches}"]), tiny_model)
    order = []
    real_read, real_step = learner_module.to_host, learner.optimizer.step
    monkeypatch.setattr(learner_module, "to_host", lambda values: order.append("read") or real_read(values))
    monkeypatch.setattr(learner.optimizer, "step", lambda *a, **k: order.append("step") or real_step(*a, **k))
    stats = learner.train_step(make_batch(learner, [1, 0, 0, 1, 1, 0]))
    assert order == ["step"] * (minibatches - 1) + ["read", "step"]
    assert np.isfinite(stats["loss"]) and "loss/entropy" in stats
