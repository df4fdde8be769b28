"""The learning rate as a function of the step: linear warm-up, then constant, cosine or linear decay.

A pure function of the step, so a resumed run picks its rate up from the saved policy version
with no scheduler state to restore. Peers name the same shapes (verl's `warmup_style` and
`min_lr_ratio`, TRL's `lr_scheduler_type`)."""

from __future__ import annotations

import math
from typing import Literal

Schedule = Literal["constant", "cosine", "linear"]


def lr_factor(step: int, total: int, schedule: Schedule = "constant", warmup: int = 0, min_ratio: float = 0.0) -> float:
    """Multiplier on the peak rate for 0-based `step` of `total`.

    Warm-up: (step + 1) / warmup for the first `warmup` steps. After it, with progress
    p = (step - warmup) / (total - warmup) clamped to [0, 1]:
      constant: 1;  linear: m + (1 - m)(1 - p);  cosine: m + (1 - m)(1 + cos(pi p)) / 2,
    where m = `min_ratio`, the rate the decay ends at as a share of the peak."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    p = min(1.0, max(0.0, (step - warmup) / max(1, total - warmup)))
    if schedule == "linear":
        return min_ratio + (1 - min_ratio) * (1 - p)
    if schedule == "cosine":
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))
    raise ValueError(f"unknown learning-rate schedule {schedule!r} (constant, cosine or linear)")
