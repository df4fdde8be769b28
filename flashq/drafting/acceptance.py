"""Acceptance as the responses show it: how many of the drafted tokens ended up in them.

vLLM's scheduler counts a draft's accepted tokens before it cuts the response at its stop (end of
sequence, `max_tokens`), so drafted tokens accepted past a response's end count as accepted though
they are never emitted; on SmolLM2's 9-token answers that put tokens per forward at 24.6 where it
can be at most 9 (docs/benchmarks/specdec.md). A rollout engine's counters
(`flashq.engine.engine_counters`) also keep the tokens it emitted and the request-steps that emitted
them. Every request-step emits one token of its own, so whatever a step emitted beyond that one
was a draft token accepted and kept; only steps with a draft have any.
"""

from __future__ import annotations


def emitted_acceptance(counts: dict[str, float]) -> dict[str, float]:
    """From an engine's counters, or their differences over a window: tokens per forward (tokens
    emitted per request-step) and, where steps had drafts, the mean tokens a step with a draft
    emitted (`acceptance_length`, its own token included) and the share of draft tokens kept
    (`draft_acceptance_rate`). Empty where nothing was emitted."""
    steps, emitted = counts.get("request_steps", 0.0), counts.get("emitted_tokens", 0.0)
    if not steps:
        return {}
    kept = max(emitted - steps, 0.0)
    out = {"tokens_per_forward": emitted / steps}
    if counts.get("spec_drafts"):
        out["acceptance_length"] = 1 + kept / counts["spec_drafts"]
    if counts.get("spec_draft_tokens"):
        out["draft_acceptance_rate"] = kept / counts["spec_draft_tokens"]
    return out
