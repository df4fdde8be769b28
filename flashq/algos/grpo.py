"""GRPO advantages and the policy-gradient loss with an off-policy correction.

Notation per response token t: pi_theta is the policy being trained, pi_prox the trainer's
policy at the start of this step (detached), pi_behav the policy that sampled the token (the
behaviour logprob vLLM returned, possibly several versions old under async training).
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_index: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: A_i = (r_i - mean_g(r)) / (std_g(r) + eps), over the samples of i's group g.

    std is the unbiased sample std (as verl); without `normalize_std` the advantage is the
    centred reward (Dr. GRPO). A group of one sample gets advantage 0.
    """
    groups = int(group_index.max().item()) + 1 if len(group_index) else 0
    counts = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, group_index, torch.ones_like(rewards))
    sums = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, group_index, rewards)
    mean = sums / counts
    centred = rewards - mean[group_index]
    if not normalize_std:
        return centred
    sq = torch.zeros(groups, dtype=rewards.dtype).index_add_(0, group_index, centred**2)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    return centred / (std[group_index] + eps)


def policy_loss(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behav_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    is_correction: str = "tis",
    is_cap: float = 2.0,
    aggregation: str = "token_mean",
    normalizer: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO (AReaL) with truncated importance sampling (TIS) for staleness.

    Per token:  L_t = -w_t * min(r_t * A_t, clip(r_t, 1 - eps, 1 + eps) * A_t)
      r_t = pi_theta / pi_prox                 (the PPO ratio; 1 on the first pass of a step)
      w_t = min(pi_prox / pi_behav, is_cap)    (detached; w_t = 1 with is_correction="none")
    All tensors are [sequences, tokens]; `mask` is 1 on response tokens. "token_mean" divides
    the masked sum by the number of tokens (`normalizer` overrides it, for micro-batches);
    "sequence_mean" averages each sequence's token mean.
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - prox_logp)
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    if is_correction == "tis":
        weight = torch.exp(prox_logp - behav_logp).clamp(max=is_cap).detach()
    elif is_correction == "none":
        weight = torch.ones_like(logp)
    else:
        raise ValueError(f"unknown is_correction {is_correction!r}")
    per_token = -weight * surrogate * mask
    if aggregation == "token_mean":
        denom = normalizer if normalizer is not None else mask.sum().clamp(min=1)
        loss = per_token.sum() / denom
    elif aggregation == "sequence_mean":
        seq = per_token.sum(-1) / mask.sum(-1).clamp(min=1)
        loss = seq.sum() / (normalizer if normalizer is not None else max(len(seq), 1))
    else:
        raise ValueError(f"unknown aggregation {aggregation!r}")
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        raw_is = torch.exp(prox_logp - behav_logp)
        stats = {
            "is_weight_mean": float((weight * mask).sum() / n),
            "is_truncated_frac": float(((raw_is > is_cap).to(mask.dtype) * mask).sum() / n),
            "clip_frac": float((((ratio - clipped).abs() > 1e-6).to(mask.dtype) * mask).sum() / n),
            "behav_kl": float(((behav_logp - prox_logp) * mask).sum() / n),
        }
    return loss, stats
