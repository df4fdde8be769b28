"""Score with reasoning-gym's own checker for whichever generator made the task."""

from __future__ import annotations

import re

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> str | None:
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else None


def score(task: dict, response: str) -> float:
    """The generator's `score_answer` on the last <answer>...</answer> span (0 if none)."""
    import reasoning_gym

    entry = task["rg_entry"]
    answer = extract_answer(response)
    if answer is None:
        return 0.0
    fn = reasoning_gym.get_score_answer_fn(entry["metadata"]["source_dataset"])
    return float(fn(answer, entry))
