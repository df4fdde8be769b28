"""Math answers checked with math-verify (symbolic equivalence: 1/2 == 0.5 == \\frac{1}{2}).

math-verify times out with signals, which only work in a process's main thread: run this in the
reward worker's process pool (`reward.executor: process`, the default), never in threads.
"""

from __future__ import annotations


def gold_answer(answer: str) -> str:
    """The final answer inside a dataset's reference: GSM8K ends its worked solution with
    "#### 42"; MATH solutions put it in \\boxed{...} (left to math-verify's extraction)."""
    if "####" in answer:
        return answer.rsplit("####", 1)[1].strip().replace(",", "")
    return answer


def math_verify(task: dict, response: str) -> float:
    """1.0 if the response's final answer (\\boxed{...} or the last expression) equals the task's."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    answer = gold_answer(str(task["answer"]))
    if "\\boxed" in answer:
        gold = parse(answer, extraction_config=[LatexExtractionConfig(boxed_match_priority=0)])
    else:
        gold = parse(f"${answer}$", extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()])
        if not gold:
            gold = parse(answer, extraction_config=[ExprExtractionConfig()])
    pred = parse(response, extraction_config=[LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()])
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred) else 0.0
