"""Acceptance as the responses show it (flashq.drafting.acceptance), and the coordinator's
per-step window over the rollout workers' counters. Counts here are written out by hand; the
engine's own are checked against its responses in tests/integration/test_speculation.py."""

from types import SimpleNamespace

import pytest

from flashq.drafting.acceptance import emitted_acceptance
from flashq.roles.coordinator_metrics import StepMetrics


def counts(requests: int, tokens_each: int, steps_each: int, draft_len: int, verified_extra: int = 0) -> dict:
    """`requests` responses of `tokens_each` tokens, each emitted over `steps_each` request-steps
    of which all but the first (prefill) verified a draft of `draft_len`; vLLM's count of accepted
    tokens over-counts by `verified_extra` a request (drafts accepted past its end)."""
    drafts = requests * (steps_each - 1)
    kept = requests * (tokens_each - steps_each)
    return {"emitted_tokens": float(requests * tokens_each), "request_steps": float(requests * steps_each),
            "spec_drafts": float(drafts), "spec_draft_tokens": float(drafts * draft_len),
            "spec_accepted_tokens": float(kept + requests * verified_extra)}


def test_acceptance_counts_only_draft_tokens_the_responses_kept():
    # 9-token answers in 3 forwards (the first emits 1, each drafted one 4), drafts of 8, and vLLM
    # counting 12 more accepted per request past its end: as emitted, at most 9 tokens per forward
    got = emitted_acceptance(counts(16, 9, 3, 8, verified_extra=12))
    assert got == {"tokens_per_forward": 3.0, "acceptance_length": 4.0, "draft_acceptance_rate": pytest.approx(96 / 256)}


def test_acceptance_without_drafts_is_one_token_per_forward():
    assert emitted_acceptance({"emitted_tokens": 40.0, "request_steps": 40.0}) == {"tokens_per_forward": 1.0}
    assert emitted_acceptance({}) == {}


def test_the_coordinator_reports_each_steps_window_and_starts_again_after_a_restart():
    metrics = SimpleNamespace(prev_spec={}, worker_stats={
        "rollout-0": counts(16, 9, 3, 8, verified_extra=12), "rollout-1": {"tokens": 5.0}})  # rollout-1 does not speculate
    first = StepMetrics._speculation(metrics)
    assert first == {"spec/tokens_per_forward": 3.0, "spec/acceptance_length": 4.0,
                     "spec/draft_acceptance_rate": pytest.approx(96 / 256)}
    # the next step: only what came since counts (16 more responses, all in one drafted forward after prefill)
    later = counts(16, 9, 3, 8)
    more = counts(16, 9, 2, 8)
    metrics.worker_stats["rollout-0"] = {k: later[k] + more[k] for k in later}
    assert StepMetrics._speculation(metrics)["spec/acceptance_length"] == 1 + (16 * 7) / 16
    # nothing new: no acceptance to report for the step
    assert StepMetrics._speculation(metrics) == {}
    # a restarted worker counts from zero again: its totals are the window
    metrics.worker_stats["rollout-0"] = counts(4, 9, 3, 8)
    assert StepMetrics._speculation(metrics)["spec/acceptance_length"] == 4.0
