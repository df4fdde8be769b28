"""Procedural tasks from reasoning-gym (105 generators, offline, deterministic from a seed).

The reward `flashq.rewards.reasoning_gym:score` scores with the generator's own checker, which
reads the task's `metadata`.
"""

from __future__ import annotations

import json

from flashq.config import ReasoningGymConfig

class ReasoningGymTasks:
    def __init__(self, cfg: ReasoningGymConfig, seed: int):
        import reasoning_gym

        self.cfg = cfg
        self.seed = seed
        self._make = lambda epoch: reasoning_gym.create_dataset(cfg.name, size=cfg.size, seed=seed + 7919 * epoch, **cfg.config)
        self._epoch, self._dataset = 0, self._make(0)

    def task(self, index: int) -> dict:
        epoch, pos = divmod(index, self.cfg.size)
        if epoch != self._epoch:
            self._epoch, self._dataset = epoch, self._make(epoch)
        entry = json.loads(json.dumps(self._dataset[pos], default=str))
        return {
            "id": f"{self.cfg.name}-{self.seed}-{index}",
            "prompt": f"{entry['question']}\n{self.cfg.instruction}",
            "answer": "" if entry.get("answer") is None else str(entry["answer"]),
            "rg_entry": entry,
        }
