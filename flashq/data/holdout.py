"""Held-out prompts: a fixed share of a task source that training never sees, for evaluation.

Whether a task is held out depends only on its prompt (a hash of the text; for a task without a
text prompt, of its fields other than `id` and `seed`), so the split is the same in every run,
process and epoch, and a prompt that recurs (a later epoch, a duplicate record, the same sum
drawn twice) is always on the same side.
"""

from __future__ import annotations

import hashlib
import json

def prompt_text(task: dict) -> str:
    prompt = task.get("prompt")
    if isinstance(prompt, str):
        return prompt
    return json.dumps({k: v for k, v in task.items() if k not in ("id", "seed")}, sort_keys=True, default=str)


def is_held_out(task: dict, fraction: float) -> bool:
    digest = hashlib.blake2b(prompt_text(task).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


class TrainingSplit:
    """A task source without its held-out prompts: task k is the first of the source's tasks
    k, k + 1, ... that is not held out. Still a function of k alone (runs resume at a saved
    position), and it stays near k, so a file or generated dataset is read within the epoch
    it is in; the task after a held-out one is drawn twice as often, a tenth of draws at the
    default share."""

    def __init__(self, source, fraction: float):
        self.source = source
        self.fraction = fraction

    def task(self, index: int) -> dict:
        for j in range(10_000):
            task = self.source.task(index + j)
            if not is_held_out(task, self.fraction):
                return task
        raise RuntimeError(f"no task outside the held-out share {self.fraction} in the 10,000 from index {index}")


def held_out_tasks(source, fraction: float, count: int, max_draws: int = 100_000) -> list[dict]:
    """Up to `count` distinct held-out tasks, in the order the source first offers them (fewer
    when the source has fewer: e.g. the sums of two numbers up to 20 have 441 prompts)."""
    found: dict[str, dict] = {}
    for i in range(max_draws):
        task = source.task(i)
        if is_held_out(task, fraction):
            found.setdefault(prompt_text(task), task)
            if len(found) == count:
                break
    return list(found.values())
