"""The built-in verifiable task: integer arithmetic, generated from a seed, needing no download.

Task k of a run depends only on (seed, k), so a source can resume at any position and two runs
with the same seed see the same prompts in the same order.
"""

from __future__ import annotations

import random

from flashq.config import ArithmeticConfig


class ArithmeticTasks:
    def __init__(self, cfg: ArithmeticConfig, seed: int):
        self.cfg = cfg
        self.seed = seed

    def task(self, index: int) -> dict:
        rng = random.Random(f"{self.seed}:{index}")
        a = rng.randint(self.cfg.min_value, self.cfg.max_value)
        b = rng.randint(self.cfg.min_value, self.cfg.max_value)
        op = rng.choice(self.cfg.operators)
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        return {"id": f"arith-{self.seed}-{index}", "prompt": f"{a}{op}{b}=", "answer": str(answer)}
