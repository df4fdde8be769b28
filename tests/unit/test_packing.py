"""Padding-free micro-batches: packed rows give the padded layout's logprobs and gradients."""

import numpy as np
import pytest
import torch

from flashq.config import load_config
from flashq.trainer.learner import Learner
from flashq.trainer.logprobs import install_logprob_head, token_logprobs
from flashq.trainer.packing import first_fit_rows, pack, unpack
from tests.unit.test_learner import make_batch
from tests.unit.test_logprobs import small_model


def test_first_fit_rows_places_every_sequence_once_within_capacity():
    lengths = np.array([9, 3, 5, 2, 9, 4, 1])
    rows = first_fit_rows(lengths, 9)
    assert sorted(j for row in rows for j in row) == list(range(7))
    assert rows == [[0], [4], [2, 5], [1, 3, 6]]  # 9 | 9 | 5 4 | 3 2 1: longest first, first row it fits
    with pytest.raises(ValueError, match="does not fit"):
        first_fit_rows(np.array([4, 10]), 9)


def test_packed_rows_give_the_padded_logprobs_and_gradients():
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 97, (n,), generator=g).numpy() for n in (11, 4, 6, 3, 9)]
    T = max(len(s) for s in seqs)
    mask = np.zeros((len(seqs), T - 1), np.float32)
    for j, s in enumerate(seqs):
        mask[j, 1 : len(s) - 1] = 1
    weights = torch.linspace(-1, 1, T - 1, dtype=torch.float64)

    model = small_model(tied=True)
    install_logprob_head(model, 4)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for j, s in enumerate(seqs):
        ids[j, : len(s)] = torch.from_numpy(s)
        attn[j, : len(s)] = 1
    select = torch.from_numpy(mask > 0)
    logp, _ = token_logprobs(model, ids, attn, 1.0, select)
    (logp * weights).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}

    model.zero_grad()
    packed = pack(seqs, mask, torch.device("cpu"))
    assert packed.ids.shape[0] < len(seqs) and packed.computed_tokens < ids.numel()
    got_p, _ = token_logprobs(model, packed.ids, None, 1.0, packed.select, None, packed.positions)
    got = unpack(got_p, packed.index)
    (got * weights).sum().backward()
    assert torch.allclose(got[select], logp[select], atol=1e-10) and torch.all(got[~select] == 0)
    for name, grad in want.items():
        assert torch.allclose(dict(model.named_parameters())[name].grad, grad, atol=1e-10), name


def test_the_learner_trains_the_same_packed_or_padded_with_less_padding(tiny_model):
    padded = Learner(load_config(None, ["trainer.packing=false", "trainer.share_prompts=false", "trainer.micro_batch_tokens=256"]), tiny_model)
    packed = Learner(load_config(None, ["trainer.packing=true", "trainer.micro_batch_tokens=256"]), tiny_model)
    # a long tail after an 8-token prompt: responses of 2 to 40 tokens
    lengths = [2, 3, 40, 4, 2, 30, 5, 3, 6, 2, 25, 3, 4, 8, 2, 3]
    batch = make_batch(padded, [1, 0] * 8, lengths=lengths)
    a, b = padded.train_step(batch), packed.train_step(batch)
    assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)  # on-policy GRPO: about 0; the gradients carry it
    assert a["train/padding_frac"] == pytest.approx(0.233, abs=1e-3) and b["train/padding_frac"] == pytest.approx(0.0625)
    for x, y in zip(padded.model.parameters(), packed.model.parameters()):
        assert torch.allclose(x.grad, y.grad, atol=1e-6, rtol=1e-4)


def test_a_model_that_lets_packed_sequences_see_each_other_is_refused(tiny_model, monkeypatch):
    import transformers.masking_utils as masking

    monkeypatch.setattr(masking, "find_packed_sequence_indices", lambda position_ids: None)  # one causal block per row
    with pytest.raises(ValueError, match="lets packed sequences attend to each other"):
        Learner(load_config(None, ["trainer.packing=true"]), tiny_model)
    Learner(load_config(None), tiny_model)
