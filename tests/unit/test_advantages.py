"""Advantage estimators against values derived by hand."""

import math

import pytest
import torch

from flashq.algos.advantages import compute, grpo, rloo


def test_grpo_with_and_without_std():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0])
    g = torch.tensor([0, 0, 0, 0, 1])
    # group 0: mean 0.5, unbiased std sqrt(1/3); group 1 is a single sample -> 0
    assert torch.allclose(grpo(r, g, normalize_std=False), torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0]))
    s = math.sqrt(1 / 3)
    assert torch.allclose(grpo(r, g), torch.tensor([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0]), atol=1e-5)


def test_all_equal_rewards_give_zero_advantage():
    r = torch.tensor([1.0, 1.0, 1.0])
    assert torch.equal(grpo(r, torch.zeros(3, dtype=torch.long)), torch.zeros(3))


def test_rloo_uses_the_mean_of_the_others():
    r = torch.tensor([3.0, 0.0, 0.0, 3.0, 7.0])
    g = torch.tensor([0, 0, 0, 0, 1])
    # sample 0: 3 - (0+0+3)/3 = 2 ; sample 1: 0 - (3+0+3)/3 = -2 ; singleton -> 0
    assert torch.allclose(rloo(r, g), torch.tensor([2.0, -2.0, -2.0, 2.0, 0.0]))
    # equals n/(n-1) times the centred reward
    assert torch.allclose(rloo(r, g)[:4], 4 / 3 * grpo(r, g, normalize_std=False)[:4])


def test_groups_of_different_sizes_and_order():
    r = torch.tensor([1.0, 2.0, 0.0, 4.0])
    g = torch.tensor([1, 0, 1, 0])
    assert torch.allclose(grpo(r, g, normalize_std=False), torch.tensor([0.5, -1.0, -0.5, 1.0]))


def test_dispatch_by_name():
    r, g = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    assert torch.allclose(compute("drgrpo", r, g), torch.tensor([0.5, -0.5]))
    assert torch.allclose(compute("rloo", r, g), torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="unknown advantage"):
        compute("gae", r, g)
