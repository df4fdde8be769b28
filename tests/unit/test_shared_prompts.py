"""A prompt's forward pass shared by its group against one whole row per sample."""

import numpy as np
import pytest
import torch

from flashq.buffer import Group, pack_batch
from flashq.config import ConfigError, load_config
from flashq.staleness import Admission
from flashq.trainer.learner import Learner, load_causal_lm
from flashq.trainer.logprobs import install_logprob_head, token_logprobs
from flashq.trainer.shared_prompts import layout, shared_token_logprobs
from flashq.wire.protocol import RewardResult, Sample


def test_shared_passes_give_each_response_token_the_logprob_of_its_whole_row(tiny_model):
    model = load_causal_lm(tiny_model, torch.float64, torch.device("cpu"))
    install_logprob_head(model, 4)
    rng = np.random.default_rng(1)
    a, b = rng.integers(5, 200, 9), rng.integers(5, 200, 4)  # prompts of different lengths
    prompts = [a, b, b, a, a]
    responses = [rng.integers(5, 200, n) for n in (3, 1, 7, 5, 2)]
    rows = layout(prompts, responses, torch.device("cpu"))
    assert rows.prompt_ids.shape == (2, 9) and rows.response_ids.shape == (5, 7)
    select = rows.response_attn.bool().clone()
    select[2, 0] = select[3, 2] = False  # e.g. environment tokens: not read, 0 in the output
    logp, entropy = shared_token_logprobs(model, rows, select, 0.7)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids = torch.from_numpy(np.concatenate([p, r])[None]).long()
        whole_lp, whole_h = token_logprobs(model, ids, torch.ones_like(ids), 0.7)
        want_lp, want_h = whole_lp[0, len(p) - 1 :], whole_h[0, len(p) - 1 :]
        read = select[i, : len(r)]
        torch.testing.assert_close(logp[i, : len(r)][read], want_lp[read], rtol=0, atol=1e-10)
        torch.testing.assert_close(entropy[i, : len(r)][read], want_h[read], rtol=0, atol=1e-10)
        assert not logp[i, : len(r)][~read].any() and not logp[i, len(r) :].any()


def two_groups(batch_index: int = 0, seed: int = 0):
    """Two groups with prompts of 8 and 5 tokens, responses of 1 to 9 tokens, some of whose
    tokens (the first of one, two inside another) are masked out of the loss."""
    rng = np.random.default_rng(seed)
    groups = []
    for g, prompt in enumerate([np.array([2, 121, 119, 14, 53, 47, 54, 65], np.int32), np.array([2, 121, 58, 65, 14], np.int32)]):
        group = Group(task={}, prompt_ids=prompt, size=4, admission=Admission(f"g{g}", 0, 0))
        for k, n in enumerate([3, 9, 1, 6] if g == 0 else [5, 2, 7, 4]):
            resp = rng.integers(5, 200, n).astype(np.int32)
            mask = np.ones(n, np.uint8)
            if (g, k) == (0, 1):
                mask[0] = 0
            if (g, k) == (1, 2):
                mask[2:4] = 0
            rid = f"g{g}/{k}"
            lp = (-rng.random(n)).astype(np.float32)
            group.samples[rid] = Sample(rid, f"g{g}", 0, resp, lp, np.full(n, batch_index, np.int32), "stop", loss_mask=mask)
            group.rewards[rid] = RewardResult(rid, float(k % 2))
        groups.append(group)
    return pack_batch(groups, batch_index)


def test_the_learner_trains_the_same_with_shared_prompt_passes_on_fewer_tokens(tiny_model):
    rows = Learner(load_config(None, ["trainer.share_prompts=false"]), tiny_model)
    shared = Learner(load_config(None, ["trainer.share_prompts=true"]), tiny_model)
    batch = two_groups()
    a, b = rows.train_step(batch), shared.train_step(batch)
    for key in ("loss", "loss/is_weight_mean", "loss/entropy", "loss/clip_frac", "train/tokens"):
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    for (name, x), y in zip(rows.model.named_parameters(), shared.model.parameters()):
        torch.testing.assert_close(y.grad, x.grad, rtol=1e-4, atol=1e-7, msg=lambda m, name=name: f"{name}: {m}")
    # 8 rows of the longest prompt + response (17), against 2 prompts of 8 (padded) and 8 responses of 9
    assert rows._micro(batch, np.arange(8), torch.zeros(8)).computed_tokens == 8 * 17
    assert shared._micro(batch, np.arange(8), torch.zeros(8)).computed_tokens == 2 * 8 + 8 * 9


def test_sharing_is_on_by_default_off_where_ruled_out_and_refused_when_asked_for_there(tiny_model):
    assert Learner(load_config(None), tiny_model).share_prompts
    assert not Learner(load_config(None, ["trainer.gradient_checkpointing=true"]), tiny_model).share_prompts
    assert not Learner(load_config(None, ["trainer.packing=true"]), tiny_model).share_prompts
    with pytest.raises(ConfigError, match="share_prompts cannot be combined with trainer.gradient_checkpointing"):
        load_config(None, ["trainer.share_prompts=true", "trainer.gradient_checkpointing=true"])


def test_a_model_whose_cache_cannot_be_shared_is_refused_or_left_unshared(tiny_model, monkeypatch):
    from transformers import cache_utils

    monkeypatch.setattr(cache_utils.Cache, "reorder_cache", lambda self, index: None)  # one prompt copy for every response
    with pytest.raises(ValueError, match="trainer.share_prompts"):
        Learner(load_config(None, ["trainer.share_prompts=true"]), tiny_model)
    assert not Learner(load_config(None), tiny_model).share_prompts


@pytest.mark.parametrize("setting", [{"layer_types": ["full_attention", "sliding_attention"]}, {"sliding_window": 16},
                                     {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}])
def test_sliding_windows_and_length_scaled_ropes_are_ruled_out_from_the_config(setting):
    from types import SimpleNamespace

    from flashq.trainer.shared_prompts import unsupported

    assert unsupported(SimpleNamespace(**setting)) is not None
    assert unsupported(SimpleNamespace(layer_types=["full_attention"] * 2, sliding_window=4096)) is None  # Qwen2's default
