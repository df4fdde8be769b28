"""Losses against values derived by hand (one token per case where possible)."""

import math

import pytest
import torch

from flashq.algos.losses import Normalizer, aggregate, behaviour_weight, k3_kl, policy_loss

ONE = Normalizer(tokens=1, sequences=1, max_len=1)


def t(*xs):
    return torch.tensor([list(xs)], dtype=torch.float32)


def loss_of(logp, prox, behav, adv, **kw):
    n = logp.shape[1]
    return policy_loss(logp, prox, behav, adv, torch.ones_like(logp), Normalizer(n, 1, n), **kw)


def test_ppo_with_dual_clip_matches_hand_values():
    # ratios [2, 2, 0.5], advantages [2, -2, 2], eps 0.2, dual clip c = 1.5:
    #   r=2,A=2:   min(4, 2.4)              = 2.4   -> loss -2.4
    #   r=2,A=-2:  min(-4, -2.4) = -4; max(-4, 1.5*-2 = -3) = -3 -> loss 3.0
    #   r=.5,A=2:  min(1, 1.6)              = 1     -> loss -1.0
    prox = torch.zeros(1, 3)
    logp = torch.log(t(2.0, 2.0, 0.5))
    adv = t(2.0, -2.0, 2.0)
    per_tok = []
    for i in range(3):
        loss, _ = policy_loss(logp[:, i : i + 1], prox[:, :1], prox[:, :1], adv[:, i : i + 1], torch.ones(1, 1), ONE,
                              policy="ppo", correction="none", dual_clip=1.5)
        per_tok.append(loss.item())
    assert per_tok == pytest.approx([-2.4, 3.0, -1.0])


def test_on_policy_ppo_is_minus_mean_advantage_and_its_gradient_is_reinforce():
    logp = torch.log(t(0.5, 0.25)).requires_grad_()
    loss, stats = loss_of(logp, logp.detach(), logp.detach(), t(2.0, 2.0))
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()
    assert torch.allclose(logp.grad, t(-1.0, -1.0))  # -A / n_tokens
    assert stats["is_weight_mean"] == pytest.approx(1.0)


def test_decoupled_ppo_truncates_the_behaviour_weight_and_never_differentiates_it():
    prox = torch.log(t(0.5, 0.5))
    behav = torch.log(t(0.1, 0.5))  # pi_prox/pi_behav = 5 (capped at 2) and 1
    logp = prox.clone().requires_grad_()
    loss, stats = loss_of(logp, prox, behav, t(1.0, 1.0), is_cap=2.0)
    assert loss.item() == pytest.approx(-(2.0 + 1.0) / 2)
    assert stats["is_truncated_frac"] == pytest.approx(0.5)
    loss.backward()
    assert torch.allclose(logp.grad, t(-1.0, -0.5))


def test_sequence_level_tis():
    prox = torch.log(t(0.5, 0.5))
    behav = torch.log(t(0.25, 1.0))  # product of ratios: 2 * 0.5 = 1
    w = behaviour_weight(prox, behav, torch.ones(1, 2), "tis_sequence", cap=2.0)
    assert torch.allclose(w, t(1.0, 1.0))
    behav = torch.log(t(0.1, 0.1))  # product 25, capped at 2 for every token
    assert torch.allclose(behaviour_weight(prox, behav, torch.ones(1, 2), "tis_sequence", cap=2.0), t(2.0, 2.0))


def test_ppo_clip_stops_the_gradient_outside_the_trust_region():
    prox = torch.log(t(0.5, 0.5))
    logp = torch.log(t(0.75, 0.25)).requires_grad_()  # ratios 1.5 and 0.5
    loss, stats = loss_of(logp, prox, prox, t(1.0, -1.0), correction="none")
    assert loss.item() == pytest.approx(-(1.2 - 0.8) / 2)
    loss.backward()
    assert torch.allclose(logp.grad, torch.zeros(1, 2))
    assert stats["clip_frac"] == pytest.approx(1.0)


def test_clip_higher_widens_only_the_upper_side():
    prox = torch.zeros(1, 1)
    logp = torch.log(t(1.25))
    loss, _ = loss_of(logp, prox, prox, t(1.0), correction="none", eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx(-1.25)  # 1.25 < 1.28: not clipped


def test_cispo_clips_the_weight_but_keeps_the_gradient():
    behav = torch.log(t(0.25))
    logp = torch.log(t(0.5)).requires_grad_()  # rho = 2, clipped to 1.2
    loss, _ = loss_of(logp, logp.detach(), behav, t(1.0), policy="cispo", correction="none", eps_low=1.0, eps_high=0.2)
    assert loss.item() == pytest.approx(-1.2 * math.log(0.5))
    loss.backward()
    assert logp.grad.item() == pytest.approx(-1.2)  # a clipped token still gets a gradient (unlike PPO)


def test_topr_is_sft_like_for_positive_and_truncated_is_for_negative_advantages():
    behav = torch.log(t(0.25, 0.25))
    logp = torch.log(t(0.5, 0.125)).requires_grad_()  # rho = 2 and 0.5
    loss, _ = loss_of(logp, logp.detach(), behav, t(1.0, -1.0), policy="topr", correction="none")
    # J = 1*log .5 + clip(0.5,0,1)*(-1)*log .125 ; loss = -J / 2
    expected = -(math.log(0.5) - 0.5 * math.log(0.125)) / 2
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    assert torch.allclose(logp.grad, t(-0.5, 0.25))


def test_reinforce_and_kl_penalty():
    logp = torch.log(t(0.5)).requires_grad_()
    ref = torch.log(t(0.25))
    loss, stats = loss_of(logp, logp.detach(), logp.detach(), t(1.0), policy="reinforce", correction="none",
                          ref_logp=ref, kl_coef=0.1)
    q = math.log(0.25) - math.log(0.5)
    kl = math.exp(q) - q - 1
    assert loss.item() == pytest.approx(-math.log(0.5) + 0.1 * kl)
    assert stats["ref_kl"] == pytest.approx(kl)
    assert k3_kl(torch.zeros(1), torch.zeros(1)).item() == 0.0
    with pytest.raises(ValueError, match="reference"):
        loss_of(logp, logp, logp, t(1.0), kl_coef=0.1)


def test_aggregation_modes():
    per_token = torch.tensor([[1.0, 1.0, 1.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    norm = Normalizer(tokens=4, sequences=2, max_len=10)
    assert aggregate(per_token, mask, "token_mean", norm).item() == pytest.approx(6 / 4)
    assert aggregate(per_token, mask, "sequence_mean", norm).item() == pytest.approx((1 + 3) / 2)
    assert aggregate(per_token, mask, "token_sum_norm", norm).item() == pytest.approx(6 / 20)
    with pytest.raises(ValueError):
        aggregate(per_token, mask, "median", norm)


def test_unknown_names_are_refused():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="unknown policy loss"):
        loss_of(x, x, x, x, policy="dpo")
    with pytest.raises(ValueError, match="unknown behaviour correction"):
        loss_of(x, x, x, x, correction="magic")


def test_gspo_clips_the_length_normalised_sequence_ratio():
    # sequence a: token ratios [4, 1] -> s = exp((ln 4 + 0) / 2) = 2; A = +1: min(2, 1.2) = 1.2, clipped (no gradient)
    # sequence b: token ratios [1.21, 1] -> s = 1.1 (unnormalised it would be 1.21 and clip); A = +1:
    #   min(1.1, 1.1) = 1.1, d j / d logp_t = s A = 1.1
    # sequence_mean over 2 sequences: J = ((1.2 + 1.2) / 2 + (1.1 + 1.1) / 2) / 2 = 1.15
    prox = torch.log(torch.tensor([[0.2, 0.5], [0.4, 0.1]]))
    logp = (prox + torch.log(torch.tensor([[4.0, 1.0], [1.21, 1.0]]))).requires_grad_()
    adv = torch.ones(2, 2)
    loss, stats = policy_loss(logp, prox, prox, adv, torch.ones(2, 2), Normalizer(4, 2, 2), policy="gspo",
                              correction="none", aggregation="sequence_mean")
    assert loss.item() == pytest.approx(-1.15)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0], [-0.275, -0.275]]))  # -(1/2)(1/2)(s A) on b, 0 on a
    assert stats["clip_frac"] == pytest.approx(0.5)  # both tokens of a
    ppo, _ = policy_loss(logp, prox, prox, adv, torch.ones(2, 2), Normalizer(4, 2, 2), correction="none", aggregation="sequence_mean")
    assert ppo.item() != pytest.approx(loss.item())  # token ratios clip token by token: a gives (1.2 + 1) / 2


def test_masking_drops_tokens_or_sequences_whose_behaviour_ratio_leaves_the_band():
    # mask_token, band [0.5, 2]: pi_prox/pi_behav = [0.4, 1, 3] -> weights [0, 1, 0]; on-policy ppo: J_t = A = 1
    prox = torch.log(t(0.2, 0.5, 0.6))
    behav = prox - torch.log(t(0.4, 1.0, 3.0))
    loss, stats = loss_of(prox.clone(), prox, behav, t(1.0, 1.0, 1.0), correction="mask_token", mask_low=0.5, mask_high=2.0)
    assert loss.item() == pytest.approx(-1 / 3)
    assert stats["masked_frac"] == pytest.approx(2 / 3)
    # mask_sequence: sequence 1 ratios [0.25, 4] -> geometric mean 1, kept; sequence 2 [4, 4] -> 4, dropped whole
    prox2 = torch.zeros(2, 2)
    behav2 = -torch.log(torch.tensor([[0.25, 4.0], [4.0, 4.0]]))
    w = behaviour_weight(prox2, behav2, torch.ones(2, 2), "mask_sequence", cap=2.0, low=0.5, high=2.0)
    assert torch.equal(w, torch.tensor([[1.0, 1.0], [0.0, 0.0]]))
