"""Job B of bench/vs_trl.py: write a letter n times, with n long-tailed.

A prompt names a letter and a count ("q 7"); the answer is the letter written that many times
("qqqqqqq"). Counts are drawn log-normally (median 3, sigma 1.6: p95 43, 2% at the cap of 80),
so after the supervised warm start the tiny model writes answers about as long as the prompt
asks, give or take what sampling adds: a long tail that comes from the prompts and the model,
not from forced lengths.

Sigma was chosen on calibration runs (seed 100, never reported), as the smallest of 1.2/1.4/1.6
whose SFT policy (60 steps) wrote answers with p99 at least 10x the median in the first 10 of
100 RL steps: 6.6x, 9.6x and 11.9x. Until then it was 1.2, and the reported runs' tail was 6.1x.
The reward is graded (1 - |written - n| / n for an answer of that letter alone, else 0), so an
answer that is close but not exact still tells RL which way to go.
"""

from __future__ import annotations

import json
import math
import random
import string
from pathlib import Path

from flashq.rewards import quick

MEDIAN, SIGMA, LONGEST = 3, 1.6, 80


def write_tasks(path: Path, count: int, seed: int = 0) -> Path:
    """`count` tasks as JSONL (prompt, answer, letter, n), for flashq's file source and TRL alike."""
    rng = random.Random(seed)
    lines = []
    for _ in range(count):
        n = min(max(round(MEDIAN * math.exp(rng.gauss(0.0, SIGMA))), 1), LONGEST)
        letter = rng.choice(string.ascii_lowercase)
        lines.append(json.dumps({"prompt": f"{letter} {n}", "answer": letter * n, "letter": letter, "n": n}))
    path.write_text("\n".join(lines) + "\n")
    return path


@quick
def repeat_reward(task: dict, response: str) -> float:
    """1 for exactly n copies of the letter, less the further the count is off; 0 for anything else."""
    text, n = response.strip(), int(task["n"])
    if not text or set(text) != {task["letter"]}:
        return 0.0
    return max(0.0, 1.0 - abs(len(text) - n) / n)
