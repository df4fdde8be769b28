"""The one statistics logger a flashq rollout engine keeps: engine steps and speculative-decoding
totals, which the rollout worker reports with every weight version.

vLLM's front end adds its Prometheus logger to every engine that keeps statistics, unless one of
the loggers it is given already is one (an `isinstance` check in `StatLoggerManager`). That logger
sets a dozen gauges and counters per engine step and observes histograms per finished request, and
reading its counters back meant collecting vLLM's whole registry; flashq serves no Prometheus
endpoint, yet it cost 12% of the rollout front end's CPU in bench/vs_trl.py's job B (py-spy, 25 s of
steady state). So `EngineCounters` is a `PrometheusStatLogger` by type only: it keeps six sums.
Statistics stay on in the engine core, whose scheduler is what counts drafts and accepted tokens.

It also counts the tokens the engine emitted and the request-steps that emitted them: vLLM's count
of accepted draft tokens includes those past a response's end, which are never emitted
(`flashq.drafting.acceptance`).
"""

from __future__ import annotations

from vllm.v1.metrics.loggers import PrometheusStatLogger


class EngineCounters(PrometheusStatLogger):
    """Totals since the engine started: engine steps (outputs received with iteration statistics,
    one per engine step), tokens emitted and the request-steps that emitted them, verification
    steps with a draft, draft tokens, and draft tokens verification accepted (vLLM's count, the
    ones past a response's end included)."""

    def __init__(self, vllm_config, engine_indexes: list[int] | None = None):
        """Deliberately not PrometheusStatLogger's: no registry, no metrics."""
        self.engine_indexes = engine_indexes or [0]
        self.vllm_config = vllm_config
        self.totals = {"engine_steps": 0.0, "emitted_tokens": 0.0, "request_steps": 0.0,
                       "spec_drafts": 0.0, "spec_draft_tokens": 0.0, "spec_accepted_tokens": 0.0}

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        if iteration_stats is not None:
            self.totals["engine_steps"] += 1
            self.totals["emitted_tokens"] += iteration_stats.num_generation_tokens
            # one entry per request that got an output this step: its first token, or one more
            self.totals["request_steps"] += (len(iteration_stats.time_to_first_tokens_iter)
                                             + len(iteration_stats.inter_token_latencies_iter))
        spec = scheduler_stats.spec_decoding_stats if scheduler_stats is not None else None
        if spec is not None:
            self.totals["spec_drafts"] += spec.num_drafts
            self.totals["spec_draft_tokens"] += spec.num_draft_tokens
            self.totals["spec_accepted_tokens"] += spec.num_accepted_tokens

    def record_admission_rejection(self, reason: str) -> None:
        pass

    def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
        pass

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass


def engine_counters(llm) -> EngineCounters | None:
    """The `EngineCounters` an `AsyncLLM` built with it holds (None with statistics off)."""
    manager = getattr(llm, "logger_manager", None)
    return next((lg for lg in (manager.stat_loggers if manager else ()) if isinstance(lg, EngineCounters)), None)
