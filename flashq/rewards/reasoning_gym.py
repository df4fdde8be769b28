"""Score with reasoning-gym's own checker for whichever generator made the task."""

from __future__ import annotations

import re

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def answers(text: str) -> list[str]:
    """The non-empty <answer>...</answer> spans (an empty one, as in the prompt's own
    instruction, is no answer)."""
    return [a.strip() for a in _ANSWER.findall(text) if a.strip()]


def extract_answer(text: str) -> str | None:
    """The answer inside the tags when the response gives exactly one; None for none or several.
    Several are a guess at each: scored by its last span, SmolLM2-135M-Instruct learned within
    25 RL steps to write an operand, then the sum, each in tags ("<answer>3</answer> 3 + 10 =
    30 ... <answer>13</answer>"), until every response ran to the token limit."""
    found = answers(text)
    return found[0] if len(found) == 1 else None


def check(task: dict, answer: str) -> float:
    """The task's generator's own `score_answer` on `answer`."""
    import reasoning_gym

    entry = task["rg_entry"]
    return float(reasoning_gym.get_score_answer_fn(entry["metadata"]["source_dataset"])(answer, entry))


def score(task: dict, response: str) -> float:
    """The generator's `score_answer` on the response's one <answer>...</answer> span (0 if it
    gives none or several)."""
    answer = extract_answer(response)
    return 0.0 if answer is None else check(task, answer)


FORMAT_CREDIT = 0.1


def score_with_format(task: dict, response: str) -> float:
    """`score`, with `FORMAT_CREDIT` for an answer the checker rejects but given inside the tags
    the prompt asks for. A model that never answers in them (SmolLM2-135M at the start) scores 0
    on every sample of a group under `score` alone, leaving GRPO nothing to learn from; GRPO
    normalises rewards within a group, so a small credit already makes a full-sized advantage.
    Empty tags earn nothing: copying the prompt's "<answer></answer>" is not an answer (SmolLM2
    learned to repeat it within 12 steps when it was paid); nor do several answers (see
    `extract_answer`). A response passes (greedy accuracy, pass@k) only at 1."""
    if not extract_answer(response):
        return 0.0
    return max(score(task, response), FORMAT_CREDIT)


ACCURACY_WEIGHT, TAGS_WEIGHT = 0.8, 0.2


def score_accuracy_and_format(task: dict, response: str) -> float:
    """An accuracy reward plus a format reward, the usual GRPO recipe (TRL's examples sum the two),
    for a model that rarely uses the tags: the answer is the one non-empty <answer> span or, when
    there is none, the response's last number; several spans are several guesses and earn
    nothing (see `extract_answer`); `ACCURACY_WEIGHT` for the checker accepting it and
    `TAGS_WEIGHT` for giving it inside the tags. SmolLM2-135M-Instruct asked to show its working
    ends on the right number in ~8% of samples at T = 1 but answers in the tags in none of them, so
    under `score_with_format` a group is all 0 and, without dynamic sampling, nothing is learned.
    A response passes (greedy accuracy, pass@k) only at 1: right and in the tags."""
    found = answers(response)
    if len(found) > 1:
        return 0.0
    tagged = found[0] if found else None
    numbers = _NUMBER.findall(response)
    answer = tagged or (numbers[-1] if numbers else None)
    if not answer:
        return 0.0
    right = check(task, answer) >= 1.0
    return ACCURACY_WEIGHT * right + (TAGS_WEIGHT if tagged else 0.0)
