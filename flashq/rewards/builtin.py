"""Built-in reward functions. A reward function takes the task dict and the decoded response
text and returns a float (sync or async)."""

from __future__ import annotations

from flashq.rewards import quick


@quick
def exact_match(task: dict, response: str) -> float:
    """1.0 if the response, stripped, equals the task's answer."""
    return 1.0 if response.strip() == str(task["answer"]).strip() else 0.0
