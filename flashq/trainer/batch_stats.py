"""What a `TrainBatch` says before any model runs: each sequence's advantage (a split agent
episode's segments share their sample's), the tokens the loss sees, token staleness, and the
groups that carry no advantage. Plain numpy and torch over the batch's flat arrays."""

from __future__ import annotations

import numpy as np
import torch

from flashq.algos import advantages as adv_fns
from flashq.algos.overlong import soft_overlong_penalty
from flashq.wire.protocol import TrainBatch


def sequence_advantages(batch: TrainBatch, lc, max_sample_tokens: int) -> tuple[torch.Tensor, np.ndarray]:
    """Each sequence's advantage and each sample's shaped reward. Advantages are computed over
    samples, then given to each of a sample's sequences: an agent episode split into segments
    counts once in its group's statistics, and every segment gets the episode's advantage."""
    of = batch.sample_index()
    first = batch.sample_starts()
    shaped = np.array(batch.rewards, dtype=np.float32)[first]
    if lc.overlong == "penalty":
        shaped = shaped + soft_overlong_penalty(per_sample(trained_lengths(batch), of, len(first)), max_sample_tokens, lc.overlong_margin)
    groups = torch.from_numpy(np.array(batch.group_index, dtype=np.int64)[first])
    adv = adv_fns.compute(lc.advantage, torch.from_numpy(shaped), groups, lc.normalize_std)
    return adv[torch.from_numpy(of)], shaped


def per_sample(values: np.ndarray, of: np.ndarray, n_samples: int) -> np.ndarray:
    """Per-sequence `values` summed over each sample's sequences."""
    return np.bincount(of, weights=values, minlength=n_samples).astype(np.int64)


def zero_variance_groups(batch: TrainBatch) -> int:
    """Groups of the batch whose samples all scored the same."""
    groups = np.asarray(batch.group_index)
    rewards = np.asarray(batch.rewards)
    return sum(int(np.ptp(rewards[groups == g]) == 0) for g in np.unique(groups))


def trained_lengths(batch: TrainBatch) -> np.ndarray:
    """Per sequence, the response tokens the loss sees (all of them unless a loss mask says not)."""
    if not len(batch.loss_mask):
        return np.diff(batch.response_offsets)
    cum = np.concatenate([[0], np.cumsum(batch.loss_mask, dtype=np.int64)])
    return cum[batch.response_offsets[1:]] - cum[batch.response_offsets[:-1]]


def staleness_stats(batch: TrainBatch, bound: int) -> dict:
    """Token staleness = trainer version (= batch index) - the version that sampled the token
    (trained tokens only: an episode's environment tokens were not sampled)."""
    versions = np.asarray(batch.versions, dtype=np.int64)
    if len(batch.loss_mask):
        versions = versions[batch.loss_mask.astype(bool)]
    staleness = batch.batch_index - versions
    if not len(staleness):
        return {"staleness/max": 0.0, "staleness/mean": 0.0, "staleness/violations": 0.0, "hist/staleness": [0] * (bound + 1)}
    hist = np.bincount(np.clip(staleness, 0, bound + 1), minlength=bound + 2)
    return {
        "staleness/max": float(staleness.max()),
        "staleness/mean": float(staleness.mean()),
        "staleness/violations": float((staleness > bound).sum() + (staleness < 0).sum()),
        "hist/staleness": [int(c) for c in hist[: bound + 1]] + ([int(hist[bound + 1])] if hist[bound + 1] else []),
    }
