"""Group-relative advantages: one scalar per sample, computed from the rewards of its group.

Each function takes `rewards` [N] and `group_index` [N] (which group each sample belongs to)
and returns advantages [N]. Groups may differ in size.
"""

from __future__ import annotations

import torch


def _group_sums(values: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    groups = int(group_index.max().item()) + 1 if len(group_index) else 0
    counts = torch.zeros(groups, dtype=values.dtype).index_add_(0, group_index, torch.ones_like(values))
    sums = torch.zeros(groups, dtype=values.dtype).index_add_(0, group_index, values)
    return sums, counts


def grpo(rewards: torch.Tensor, group_index: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: A_i = (r_i - mean_g) / (std_g + eps), std the unbiased sample std (as verl).

    Without `normalize_std` this is the centred reward of Dr. GRPO (Liu et al. 2025), which
    removes the std's preference for groups that are nearly all right or all wrong. A group of
    one sample gets 0.
    """
    sums, counts = _group_sums(rewards, group_index)
    centred = rewards - (sums / counts)[group_index]
    if not normalize_std:
        return centred
    sq, _ = _group_sums(centred**2, group_index)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    return centred / (std[group_index] + eps)


def rloo(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: A_i = r_i - mean_{j != i} r_j = n/(n-1) * (r_i - mean_g).

    A group of one sample has no baseline and gets 0.
    """
    sums, counts = _group_sums(rewards, group_index)
    n = counts[group_index]
    others = (sums[group_index] - rewards) / (n - 1).clamp(min=1)
    return torch.where(n > 1, rewards - others, torch.zeros_like(rewards))


def compute(kind: str, rewards: torch.Tensor, group_index: torch.Tensor, normalize_std: bool = True) -> torch.Tensor:
    if kind == "grpo":
        return grpo(rewards, group_index, normalize_std)
    if kind == "drgrpo":
        return grpo(rewards, group_index, normalize_std=False)
    if kind == "rloo":
        return rloo(rewards, group_index)
    raise ValueError(f"unknown advantage estimator {kind!r}")
