"""Policy-gradient losses with off-policy corrections for stale samples.

Per response token t of a sequence, with A_t the sequence's advantage:
  pi_theta  the policy being trained (gradients flow here)
  pi_prox   the trainer's policy when this batch's update began (detached)
  pi_behav  the policy that sampled the token: the behaviour logprob vLLM returned,
            up to ceil(alpha) versions older than pi_prox under async training
  pi_ref    an optional frozen reference policy for a KL penalty

Objectives J_t (the loss is -J_t, aggregated over tokens), each a small function:
  ppo        min(r A, clip(r, 1-eps_lo, 1+eps_hi) A), r = pi_theta/pi_prox, with optional dual
             clip: for A < 0, J = max(J, c A)  (Ye et al. 2020; c > 1)
  reinforce  A log pi_theta
  cispo      sg(clip(rho, 1-eps_lo, 1+eps_hi)) A log pi_theta, rho = pi_theta/pi_behav
             (MiniMax-M1: clip the IS weight, never drop a token's gradient)
  topr       A log pi_theta if A >= 0, else sg(clip(rho, 0, 1)) A log pi_theta
             (Tapered Off-Policy REINFORCE, Le Roux et al. 2025)
  gspo       min(s A, clip(s, 1-eps_lo, 1+eps_hi) A) per sequence, s = (pi_theta/pi_prox)^(1/|y|)
             = exp(mean_t (log pi_theta - log pi_prox)), the length-normalised sequence ratio
             (Zheng et al. 2025). Written per token as GSPO-token: s_t = sg(s) pi_theta(y_t)/
             sg(pi_theta(y_t)), equal to s in value, so every token of a sequence carries its
             sequence's clipped objective and the gradient is s A (1/|y|) sum_t grad log pi_theta(y_t)
             under sequence_mean aggregation (the paper's).

Behaviour correction w (detached, multiplies J), for staleness:
  none          w = 1
  tis_token     w_t = min(pi_prox/pi_behav, cap)          (ppo + tis_token = decoupled PPO, AReaL)
  tis_sequence  w = min(prod_t pi_prox/pi_behav, cap) for the whole sequence
  mask_token    w_t = 1 if mask_low <= pi_prox/pi_behav <= mask_high else 0: a token the two
                policies disagree on is dropped, not down-weighted (IcePop; MIS)
  mask_sequence w = 1 if mask_low <= exp(mean_t log(pi_prox/pi_behav)) <= mask_high else 0: the
                geometric-mean ratio decides for the whole sequence

KL to the reference (k3, Schulman): kl_t = exp(q) - q - 1, q = log pi_ref - log pi_theta.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

POLICIES = ("ppo", "reinforce", "cispo", "topr", "gspo")
CORRECTIONS = ("none", "tis_token", "tis_sequence", "mask_token", "mask_sequence")
AGGREGATIONS = ("token_mean", "sequence_mean", "token_sum_norm")


def ppo_objective(logp, prox_logp, adv, eps_low: float, eps_high: float, dual_clip: float | None = None):
    ratio = torch.exp(logp - prox_logp)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    j = torch.minimum(ratio * adv, clipped * adv)
    if dual_clip is not None:
        j = torch.where(adv < 0, torch.maximum(j, dual_clip * adv), j)
    return j, ratio


def reinforce_objective(logp, adv):
    return adv * logp


def cispo_objective(logp, behav_logp, adv, eps_low: float, eps_high: float):
    rho = torch.exp(logp.detach() - behav_logp)
    return torch.clamp(rho, 1 - eps_low, 1 + eps_high) * adv * logp


def topr_objective(logp, behav_logp, adv):
    rho = torch.exp(logp.detach() - behav_logp).clamp(0.0, 1.0)
    return torch.where(adv >= 0, adv * logp, rho * adv * logp)


def gspo_objective(logp, prox_logp, adv, mask, eps_low: float, eps_high: float):
    n = mask.sum(-1, keepdim=True).clamp(min=1)
    seq_ratio = torch.exp(((logp - prox_logp) * mask).sum(-1, keepdim=True) / n)  # s, one per sequence
    ratio = seq_ratio.detach() * torch.exp(logp - logp.detach())  # s_t: s in value, grad of log pi_theta(y_t)
    s_clip = torch.clamp(seq_ratio.detach(), 1 - eps_low, 1 + eps_high)
    # min(s A, clip(s) A): where the clip binds, the clipped value has no gradient
    j = torch.where(seq_ratio.detach() * adv <= s_clip * adv, ratio * adv, s_clip * adv)
    return j, seq_ratio.detach().expand_as(logp)


def behaviour_weight(prox_logp, behav_logp, mask, kind: str, cap: float, low: float = 0.5, high: float = 2.0) -> torch.Tensor:
    if kind == "none":
        return torch.ones_like(prox_logp)
    log_ratio = (prox_logp - behav_logp) * mask
    if kind == "tis_token":
        return torch.exp(log_ratio).clamp(max=cap)
    if kind == "tis_sequence":
        seq = torch.exp(log_ratio.sum(-1, keepdim=True).clamp(max=30.0)).clamp(max=cap)
        return seq.expand_as(prox_logp)
    if kind == "mask_token":
        ratio = torch.exp(log_ratio)
        return ((ratio >= low) & (ratio <= high)).to(prox_logp.dtype)
    if kind == "mask_sequence":
        geo = torch.exp(log_ratio.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1))
        return ((geo >= low) & (geo <= high)).to(prox_logp.dtype).expand_as(prox_logp)
    raise ValueError(f"unknown behaviour correction {kind!r}; one of {CORRECTIONS}")


def k3_kl(logp, ref_logp):
    q = ref_logp - logp
    return torch.exp(q) - q - 1


@dataclass(frozen=True)
class Normalizer:
    """Batch-wide denominators, so micro-batches add up to exactly the full-batch loss."""

    tokens: float  # response tokens in the whole batch
    sequences: float  # sequences in the whole batch
    max_len: float  # Dr. GRPO's constant length


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, norm: Normalizer) -> torch.Tensor:
    """token_mean: sum / tokens. sequence_mean: mean over sequences of each one's token mean.
    token_sum_norm (Dr. GRPO): sum / (sequences * max_len), no length bias either way."""
    masked = per_token * mask
    if mode == "token_mean":
        return masked.sum() / max(norm.tokens, 1.0)
    if mode == "sequence_mean":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / max(norm.sequences, 1.0)
    if mode == "token_sum_norm":
        return masked.sum() / max(norm.sequences * norm.max_len, 1.0)
    raise ValueError(f"unknown aggregation {mode!r}; one of {AGGREGATIONS}")


def policy_loss(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    norm: Normalizer,
    *,
    policy: str = "ppo",
    correction: str = "tis_token",
    is_cap: float = 2.0,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    aggregation: str = "token_mean",
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    mask_low: float = 0.5,
    mask_high: float = 2.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """All tensors are [sequences, tokens]; `mask` is 1 on response tokens. The statistics stay
    0-dim tensors on the loss's device: reading each back would stall a GPU once per statistic
    and micro-batch (the trainer reads them all at once per batch)."""
    mask = mask.to(logp.dtype)
    ratio = None
    if policy == "ppo":
        j, ratio = ppo_objective(logp, prox_logp, adv, eps_low, eps_high, dual_clip)
    elif policy == "reinforce":
        j = reinforce_objective(logp, adv)
    elif policy == "cispo":
        j = cispo_objective(logp, behav_logp, adv, eps_low, eps_high)
    elif policy == "topr":
        j = topr_objective(logp, behav_logp, adv)
    elif policy == "gspo":
        j, ratio = gspo_objective(logp, prox_logp, adv, mask, eps_low, eps_high)
    else:
        raise ValueError(f"unknown policy loss {policy!r}; one of {POLICIES}")
    weight = behaviour_weight(prox_logp, behav_logp, mask, correction, is_cap, mask_low, mask_high).detach()
    per_token = -weight * j
    kl = None
    if kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs reference logprobs")
        kl = k3_kl(logp, ref_logp)
        per_token = per_token + kl_coef * kl
    loss = aggregate(per_token, mask, aggregation, norm)
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        raw_is = torch.exp((prox_logp - behav_logp) * mask)
        stats = {
            "is_weight_mean": (weight * mask).sum() / n,
            "is_truncated_frac": ((raw_is > is_cap).to(mask.dtype) * mask).sum() / n,
            "masked_frac": ((weight == 0).to(mask.dtype) * mask).sum() / n,
            "behav_kl": ((behav_logp - prox_logp) * mask).sum() / n,
            "tokens": mask.sum(),
        }
        if ratio is not None:
            outside = (ratio < 1 - eps_low) | (ratio > 1 + eps_high)
            stats["clip_frac"] = (outside.to(mask.dtype) * mask).sum() / n
        if kl is not None:
            stats["ref_kl"] = (kl * mask).sum() / n
    return loss, stats
