"""Micro-batches split by length: the split is the cheapest there is, and training on it gives
the gradient of one big micro-batch for far fewer computed tokens."""

import itertools

import numpy as np
import pytest
import torch

from flashq.config import load_config
from flashq.trainer.learner import Learner
from flashq.trainer.micro_batches import length_chunks
from tests.unit.test_learner import make_batch


def chunk_cost(chunk, r, overhead, p=None, g=None):
    tokens = len(chunk) * r[chunk].max()
    if g is not None:
        tokens += len(set(g[chunk])) * p[chunk].max()
    return overhead + tokens


def cheapest_by_enumeration(r, overhead, budget, p=None, g=None):
    """Every split of the length-sorted sequences into consecutive runs, the cheapest kept."""
    order = np.argsort(r, kind="stable")
    best = np.inf
    for cuts in itertools.product([False, True], repeat=len(r) - 1):
        bounds = [0] + [k + 1 for k, c in enumerate(cuts) if c] + [len(r)]
        runs = [order[a:b] for a, b in zip(bounds, bounds[1:])]
        costs = [chunk_cost(c, r, overhead, p, g) for c in runs]
        if all(c - overhead <= budget or len(run) == 1 for c, run in zip(costs, runs)):
            best = min(best, sum(costs))
    return best


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_the_split_is_the_cheapest_of_all_splits_in_length_order(shared, seed):
    rng = np.random.default_rng(seed)
    n = 9
    r = np.minimum(np.round(3 * np.exp(rng.normal(0, 1.4, n))), 60).astype(np.int64) + 1
    p, g = (rng.integers(5, 30, n), rng.integers(0, 3, n)) if shared else (None, None)
    if shared:
        p = np.array([p[k] for k in g])  # one length per prompt
    overhead, budget = int(rng.integers(0, 80)), int(rng.integers(60, 400))
    chunks = length_chunks(r, overhead, budget, p, g)
    assert sorted(np.concatenate(chunks).tolist()) == list(range(n))  # every sequence once
    got = sum(chunk_cost(c, r, overhead, p, g) for c in chunks)
    assert got == cheapest_by_enumeration(r, overhead, budget, p, g)


def test_one_long_response_no_longer_pads_every_row(tiny_model):
    """16 short answers and one of 60 tokens: one micro-batch would pad all 17 rows to 60."""
    lengths = [3, 4, 3, 5, 60, 3, 4, 4, 3, 5, 3, 4, 3, 3, 4, 5, 3]
    rewards = [1, 0] * 8 + [1]
    for share in (False, True):
        whole = Learner(load_config(None, [f"trainer.share_prompts={share}", "trainer.micro_batch_overhead_tokens=100000"]), tiny_model)
        split = Learner(load_config(None, [f"trainer.share_prompts={share}"]), tiny_model)
        batch = make_batch(whole, rewards, lengths=lengths)
        assert len(whole._micro_batches(batch, np.arange(len(lengths)))) == 1
        a, b = whole.train_step(batch), split.train_step(batch)
        assert b["train/padding_frac"] < a["train/padding_frac"] / 2, share
        for x, y in zip(whole.model.parameters(), split.model.parameters()):
            assert torch.allclose(x.grad, y.grad, atol=1e-6, rtol=1e-4)


def test_the_pass_overhead_defaults_to_the_device_s():
    """Unset, a pass costs 128 tokens' worth on a CPU and 2,048 on a GPU: the CPU's value split a 1.5B
    step on an H100 into 31 passes (9.6 s) where 11 filled ones took 6.6 s. Set, it is the setting."""
    from types import SimpleNamespace

    from flashq.trainer.micro_batches import MicroBatching

    overhead = MicroBatching.micro_batch_overhead_tokens.fget
    unset, set_ = load_config(None, []), load_config(None, ["trainer.micro_batch_overhead_tokens=512"])
    assert overhead(SimpleNamespace(cfg=unset, device=torch.device("cpu"))) == 128
    assert overhead(SimpleNamespace(cfg=unset, device=torch.device("cuda", 0))) == 2048
    assert overhead(SimpleNamespace(cfg=set_, device=torch.device("cuda", 0))) == 512
