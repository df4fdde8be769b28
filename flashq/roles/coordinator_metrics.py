"""The coordinator's per-step record: what it adds to the trainer's step metrics (queue depths,
tokens/s, each worker's idle share, the reward of everything scored, episode and speculation
counters) and the progress line it logs (tokens/s and idle shares in it averaged over recent
steps: `flashq.reporting.step_window`).

A part of `Coordinator` (flashq.roles.coordinator); the counters it compares against are the
coordinator's, set at startup and on resume.
"""

from __future__ import annotations

import logging
import time

from flashq.config import FlashqConfig
from flashq.drafting.acceptance import emitted_acceptance
from flashq.reporting.step_window import WINDOW_STEPS, StepWindow
from flashq.wire.protocol import StepStats

log = logging.getLogger("flashq.coordinator")
SPEC_COUNTS = ("spec_drafts", "spec_draft_tokens", "emitted_tokens", "request_steps")  # a worker's, summed since it started


def progress_every(cfg: FlashqConfig) -> int:
    """Steps between progress lines."""
    return cfg.log.progress_every or max(1, cfg.trainer.steps // 40)


def progress_window(cfg: FlashqConfig) -> StepWindow:
    """What a progress line averages over: the steps since the line before, at least WINDOW_STEPS."""
    return StepWindow(max(WINDOW_STEPS, progress_every(cfg)))


class StepMetrics:
    def _log_step(self, stats: StepStats) -> None:
        now = time.monotonic()
        step_s, self.last_step_at = now - self.last_step_at, now
        rec = dict(stats.metrics)
        rec.update(self.orch.queue_depths())
        rec.update(self._rates(step_s))
        rec["time/step_s"] = step_s
        rec["time/elapsed_s"] = now - self.started
        rec["time/since_generation_s"] = now - self.generation_started
        rec["rollout/tokens_total"] = float(self.orch.ledger.tokens_received)
        rec["trainer/idle_share"] = min(1.0, stats.metrics.get("trainer/wait_s", 0.0) / max(step_s, 1e-9))
        rec["engine_version"] = float(self.orch.engine_version)
        rec["groups_admitted"] = float(self.orch.ledger.groups_admitted)
        # every sample scored since the last step, trained or not: the rollout policy's own reward
        # (the trainer's reward/mean covers what it trained, which dynamic sampling selects)
        books = self.orch.ledger
        rec["samples_scored_total"] = float(books.rewards_received)
        scored = books.rewards_received - self.prev_scored[0]
        if scored:
            rec["reward/scored_mean"] = (books.reward_sum - self.prev_scored[1]) / scored
        self.prev_scored = (books.rewards_received, books.reward_sum)
        if self.cfg.trainer.dynamic_sampling:
            dropped = self.orch.ledger.groups_dropped
            rec["dynamic_sampling/groups_dropped_total"] = float(dropped)
            rec["dynamic_sampling/groups_dropped"] = float(dropped - self.prev_dropped)
            self.prev_dropped = dropped
        rec["rejected_frames"] = float(sum(self.hub.rejected.values()))
        rec["rollout/requests_failed_total"] = float(books.requests_failed)
        rec["rollout/requests_quarantined_total"] = float(books.requests_quarantined)
        if self.orch.episodes is not None:
            books = self.orch.ledger
            rec["episodes/kept_total"] = float(books.samples_received)
            rec["episodes/failed_total"] = float(books.episodes_failed)
            rec["episodes/discarded_total"] = float(books.episodes_discarded + books.episodes_withdrawn)
            rec["episodes/per_s"] = books.samples_received / max(now - self.generation_started, 1e-9)
            for peer, worker in self.worker_stats.items():
                if "env_s" in worker:
                    rec[f"rollout/env_s_total/{peer}"] = worker["env_s"]
        self.metrics.write(stats.step, rec)
        self.window.add(rec)
        if stats.step % progress_every(self.cfg) and stats.step not in (1, self.cfg.trainer.steps):
            return
        log.info(progress_line(stats.step, self.cfg.trainer.steps, rec, self.window))

    def _rates(self, step_s: float) -> dict[str, float]:
        """Per-step tokens/s and idle shares, from the dispatcher's own view of each worker
        (idle = nothing in flight on it)."""
        tokens = self.orch.ledger.tokens_received
        out = {"rollout/tokens_per_s": (tokens - self.prev_tokens) / max(step_s, 1e-9)}
        self.prev_tokens = tokens
        for kind, queue in (("rollout", self.orch.gen_queue), ("reward", self.orch.score_queue)):
            shares = []
            for worker, clock in queue.clocks.items():
                busy, idle = clock.snapshot()
                prev_busy, prev_idle = self.prev_clock.get(worker, (0.0, 0.0))
                span = (busy - prev_busy) + (idle - prev_idle)
                share = (idle - prev_idle) / span if span > 0 else 0.0
                out[f"{kind}/idle_share/{worker}"] = share
                shares.append(share)
                self.prev_clock[worker] = (busy, idle)
            out[f"{kind}/idle_share"] = sum(shares) / len(shares)
            for worker, clock in queue.clocks.items():  # cumulative, for whole-run averages
                out[f"{kind}/busy_s_total/{worker}"] = clock.busy_s
                out[f"{kind}/idle_s_total/{worker}"] = clock.idle_s
                out[f"{kind}/load_s_total/{worker}"] = clock.load_s
        for worker, tokens in self.orch.worker_tokens.items():
            out[f"rollout/tokens_total/{worker}"] = float(tokens)
        for peer, stats in self.worker_stats.items():
            if "weight_sync_s" in stats:
                out[f"rollout/weight_sync_s/{peer}"] = stats["weight_sync_s"]
            if "weight_pause_s" in stats:
                out[f"rollout/weight_pause_s/{peer}"] = stats["weight_pause_s"]
            if stats.get("released_s"):
                out[f"rollout/released_s/{peer}"] = stats["released_s"]
            if "gc_s" in stats:
                out[f"rollout/gc_s_total/{peer}"] = stats["gc_s"]
            if "spec_drafting_s" in stats:
                out[f"spec/drafting_s_total/{peer}"] = stats["spec_drafting_s"]
            if "spec_off_steps" in stats:
                out[f"spec/off_steps_total/{peer}"] = stats["spec_off_steps"]
        out.update(self._speculation())
        return out

    def _speculation(self) -> dict[str, float]:
        """Acceptance since the last step, from the rollout workers' engine counters, as the
        responses show it (`flashq.drafting.acceptance`): mean tokens a verification step with a
        draft emitted (its own token included), the share of draft tokens kept, tokens per forward.
        A restarted worker's counters start again from zero."""
        window = dict.fromkeys(SPEC_COUNTS, 0.0)
        for peer, stats in self.worker_stats.items():
            if "spec_drafts" not in stats:
                continue
            now = {k: stats.get(k, 0.0) for k in SPEC_COUNTS}
            before = self.prev_spec.get(peer, {})
            if now["spec_drafts"] < before.get("spec_drafts", 0.0):
                before = {}
            for k in SPEC_COUNTS:
                window[k] += now[k] - before.get(k, 0.0)
            self.prev_spec[peer] = now
        if not window["spec_drafts"]:
            return {}
        return {f"spec/{k}": v for k, v in emitted_acceptance(window).items()}


def progress_line(step: int, steps: int, rec: dict[str, float], window: StepWindow) -> str:
    """The step's reward and staleness, and tokens/s and rollout idle over the window (one
    step's swing with what happened to finish inside it)."""
    staleness = [int(rec[k]) for k in sorted(rec) if k.startswith("hist/staleness/")]
    return (f"step {step}/{steps}  reward {rec.get('reward/mean', 0.0):.3f}  staleness {staleness}  "
            f"{window.label()}: {window.mean('rollout/tokens_per_s'):,.0f} tok/s, "
            f"rollout idle {100 * window.mean('rollout/idle_share'):.0f}%")
