"""What a response cut off at the length limit means for training (DAPO, Yu et al. 2025).

A truncated response has no final answer, so its reward says little about its tokens. Two fixes:
  filter   its tokens leave the loss (overlong filtering); its reward still counts in its group
  penalty  a soft length penalty added to every reward (soft overlong punishment), with
           L = the most tokens a sample may generate and m = the margin:
             0                      if |y| <= L - m
             ((L - m) - |y|) / m    if L - m < |y| <= L   (falls linearly to -1 at L)
             -1                     if |y| > L
"""

from __future__ import annotations

import numpy as np

def soft_overlong_penalty(lengths: np.ndarray, max_len: int, margin: int) -> np.ndarray:
    lengths = np.asarray(lengths, dtype=np.float64)
    start = max_len - margin
    penalty = np.where(lengths <= start, 0.0, (start - lengths) / margin)
    return np.maximum(penalty, -1.0).astype(np.float32)


def filtered_loss_mask(loss_mask: np.ndarray, response_offsets: np.ndarray, truncated: np.ndarray) -> np.ndarray:
    """`loss_mask` (empty: all ones) with every token of the truncated sequences set to 0."""
    n_tokens = int(response_offsets[-1])
    mask = np.ones(n_tokens, np.uint8) if not len(loss_mask) else loss_mask.copy()
    for i in np.flatnonzero(truncated):
        mask[response_offsets[i] : response_offsets[i + 1]] = 0
    return mask
