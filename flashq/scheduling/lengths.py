"""Output-length estimates per prompt group, for scheduling the long tail.

Two sources, both kept with the group and updated live:
- siblings (Seer): the longest response of the group seen so far, counting the tokens a request
  has generated before it finished or was divided; a lower bound that only grows;
- history (RhymeRL): the lengths of this prompt's responses in earlier epochs, keyed by the
  prompt's token ids, for a window of recent epochs.
A group with neither is unknown; the scheduler then assumes the generation budget.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import deque

import numpy as np


def prompt_key(prompt_ids: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(prompt_ids, dtype=np.int32).tobytes(), digest_size=12).hexdigest()


class LengthEstimates:
    def __init__(self, history_epochs: int = 2, max_prompts: int = 200_000):
        """`max_prompts`: prompts whose history is kept, the least recently seen forgotten first
        (a generated task source has no end of new prompts)."""
        self.history_epochs = history_epochs
        self.max_prompts = max_prompts
        self.sibling_max: dict[str, int] = {}  # group id -> longest seen so far
        self.finished: dict[str, int] = {}  # group id -> responses finished
        self.group_key: dict[str, str] = {}
        self.history: dict[str, deque[list[int]]] = {}  # prompt key -> lengths, one list per epoch
        self._current: dict[str, list[int]] = {}  # group id -> lengths of this epoch

    def add_group(self, group_id: str, prompt_ids: np.ndarray) -> None:
        self.group_key[group_id] = prompt_key(prompt_ids)
        self.sibling_max.setdefault(group_id, 0)
        self.finished.setdefault(group_id, 0)

    def observe(self, group_id: str, generated: int, finished: bool) -> None:
        """A request of the group has generated `generated` tokens (all of them if finished)."""
        self.sibling_max[group_id] = max(self.sibling_max.get(group_id, 0), generated)
        if finished:
            self.finished[group_id] = self.finished.get(group_id, 0) + 1
            self._current.setdefault(group_id, []).append(generated)

    def close_group(self, group_id: str) -> None:
        """The group is complete: its lengths become history for the prompt's next epoch."""
        key = self.group_key.pop(group_id, None)
        lengths = self._current.pop(group_id, [])
        self.sibling_max.pop(group_id, None)
        self.finished.pop(group_id, None)
        if key is not None and lengths:
            past = self.history.pop(key, None) or deque(maxlen=self.history_epochs)
            past.append(lengths)
            self.history[key] = past  # now the most recently seen
            if len(self.history) > self.max_prompts:
                del self.history[next(iter(self.history))]

    def known(self, group_id: str) -> bool:
        return self.finished.get(group_id, 0) > 0 or self.group_key.get(group_id) in self.history

    def estimate(self, group_id: str, default: int) -> int:
        """L^_g: the longest of finished siblings, progress seen, and history; `default` (the
        budget) for a group with nothing finished and no history."""
        seen = self.sibling_max.get(group_id, 0)
        if not self.known(group_id):
            return max(seen, default)
        past = self.history.get(self.group_key.get(group_id, ""))
        return max(seen, max(max(e) for e in past) if past else 0)


def forced_length(fl, index: int, group_size: int = 1, prompt: int | None = None) -> int:
    """Benchmark replay: the length of request `index` (= group * group_size + k), lognormal and
    clipped. `fl.group_share` of the log-variance belongs to the prompt, as sibling responses'
    lengths are correlated (Seer's premise for length probes) and a prompt asked again in a later
    epoch answers at much the same length (RhymeRL's): `prompt` numbers the prompt (by default
    the group, a prompt asked once), while each response's own part is drawn anew."""
    z_request = random.Random(f"{fl.seed}:{index}").gauss(0.0, 1.0)
    z = z_request
    if fl.group_share > 0:
        key = index // group_size if prompt is None else prompt
        z_group = random.Random(f"{fl.seed}:group:{key}").gauss(0.0, 1.0)
        z = math.sqrt(fl.group_share) * z_group + math.sqrt(1 - fl.group_share) * z_request
    return int(min(fl.max, max(fl.min, round(fl.median * math.exp(fl.sigma * z)))))
