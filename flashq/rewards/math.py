"""Math answers checked with math-verify (symbolic equivalence: 1/2 == 0.5 == \\frac{1}{2}).

math-verify times out with signals, which only work in a process's main thread: run this in the
reward worker's process pool (`reward.executor: process`, the default), never in threads.
"""

from __future__ import annotations


def math_verify(task: dict, response: str) -> float:
    """1.0 if the response's final answer (\\boxed{...} or the last expression) equals the task's."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold = parse(f"${task['answer']}$", extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()])
    if not gold:
        gold = parse(str(task["answer"]), extraction_config=[ExprExtractionConfig()])
    pred = parse(response, extraction_config=[LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()])
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred) else 0.0
