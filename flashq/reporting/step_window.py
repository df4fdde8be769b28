"""Rates over the last few steps, for what a person watches (the coordinator's progress line, the
launcher's panel).

One step's tokens/s and idle shares swing with what happened to finish inside it: under async
training a step often completes from groups already buffered, receiving no tokens, and the next
one receives two steps' worth (the quickstart's log went 0, 7,000, 0 tokens/s). Averaged over a
window the line says what the run is doing. metrics.jsonl keeps the per-step values.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping

WINDOW_STEPS = 10
STEP_S = "time/step_s"


def window_mean(records: Iterable[Mapping[str, float]], key: str) -> float | None:
    """The mean of a per-step rate or share over `records`, each step weighted by its duration
    (so tokens/s is the window's tokens over the window's seconds); None if no record has it."""
    total = seconds = 0.0
    for rec in records:
        if key in rec:
            s = max(float(rec.get(STEP_S, 1.0)), 0.0)
            total += float(rec[key]) * s
            seconds += s
    return total / seconds if seconds > 0 else None


class StepWindow:
    """The last `steps` step records."""

    def __init__(self, steps: int = WINDOW_STEPS):
        self.records: deque[Mapping[str, float]] = deque(maxlen=steps)

    def add(self, record: Mapping[str, float]) -> None:
        self.records.append(record)

    def mean(self, key: str, default: float = 0.0) -> float:
        value = window_mean(self.records, key)
        return default if value is None else value

    def __len__(self) -> int:
        return len(self.records)

    def label(self) -> str:
        """What the mean covers, for the line that shows it."""
        return f"last {len(self)} step{'s' if len(self) != 1 else ''}"
