"""GRPO advantages and loss against values derived by hand."""

import math

import pytest
import torch

from flashq.algos.grpo import group_advantages, policy_loss


def test_advantages_with_and_without_std():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0])
    g = torch.tensor([0, 0, 0, 0, 1])
    # group 0: mean 0.5, unbiased std sqrt(1/3); group 1 is a single sample -> 0
    centred = group_advantages(r, g, normalize_std=False)
    assert torch.allclose(centred, torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0]))
    norm = group_advantages(r, g, normalize_std=True)
    s = math.sqrt(1 / 3)
    assert torch.allclose(norm, torch.tensor([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0.0]), atol=1e-5)
    assert abs(float(norm[:4].sum())) < 1e-5  # zero-sum within a group


def test_all_equal_rewards_give_zero_advantage():
    r = torch.tensor([1.0, 1.0, 1.0])
    assert torch.equal(group_advantages(r, torch.zeros(3, dtype=torch.long)), torch.zeros(3))


def test_on_policy_loss_is_minus_mean_advantage_and_its_gradient_is_reinforce():
    logp = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_()
    adv = torch.tensor([[2.0, 2.0]])
    mask = torch.ones(1, 2)
    loss, stats = policy_loss(logp, logp.detach(), logp.detach(), adv, mask)
    assert loss.item() == pytest.approx(-2.0)  # ratio 1, weight 1: -(2+2)/2
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -1.0]]))  # -A / n_tokens
    assert stats["is_weight_mean"] == pytest.approx(1.0)


def test_tis_weight_is_truncated_and_detached():
    # behaviour prob 0.1, proximal 0.5 -> pi_prox/pi_behav = 5, capped at 2
    prox = torch.log(torch.tensor([[0.5, 0.5]]))
    behav = torch.log(torch.tensor([[0.1, 0.5]]))
    logp = prox.clone().requires_grad_()
    adv = torch.tensor([[1.0, 1.0]])
    loss, stats = policy_loss(logp, prox, behav, adv, torch.ones(1, 2), is_cap=2.0)
    assert loss.item() == pytest.approx(-(2.0 * 1 + 1.0 * 1) / 2)
    assert stats["is_truncated_frac"] == pytest.approx(0.5)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -0.5]]))  # weight scales, never differentiated
    no_is, _ = policy_loss(prox, prox, behav, adv, torch.ones(1, 2), is_correction="none")
    assert no_is.item() == pytest.approx(-1.0)


def test_ppo_clip_stops_the_gradient_beyond_the_trust_region():
    prox = torch.log(torch.tensor([[0.5, 0.5]]))
    logp = torch.log(torch.tensor([[0.75, 0.25]])).requires_grad_()  # ratios 1.5 and 0.5
    adv = torch.tensor([[1.0, -1.0]])
    loss, stats = policy_loss(logp, prox, prox, adv, torch.ones(1, 2), clip_eps=0.2)
    # min(1.5*1, 1.2*1) = 1.2 ; min(0.5*-1, 0.8*-1) = -0.8  -> loss = -(1.2 - 0.8)/2
    assert loss.item() == pytest.approx(-0.2)
    loss.backward()
    assert torch.allclose(logp.grad, torch.zeros(1, 2))  # both clipped: no gradient
    assert stats["clip_frac"] == pytest.approx(1.0)


def test_masking_and_aggregation_modes():
    logp = torch.zeros(2, 3)
    adv = torch.tensor([[1.0] * 3, [3.0] * 3])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    tok, _ = policy_loss(logp, logp, logp, adv, mask, aggregation="token_mean")
    assert tok.item() == pytest.approx(-(1 + 9) / 4)
    seq, _ = policy_loss(logp, logp, logp, adv, mask, aggregation="sequence_mean")
    assert seq.item() == pytest.approx(-(1 + 3) / 2)
    with pytest.raises(ValueError):
        policy_loss(logp, logp, logp, adv, mask, aggregation="mystery")
