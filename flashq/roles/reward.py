"""Reward worker process: decode each sample and score it with the configured plug-in.

A reward function that raises or runs past `reward.timeout_s` is answered with the error (the
coordinator retries it or drops its group, per `reward.on_error`); it never stalls the run (see
`rewards.runner` for how a stuck call is stopped).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from flashq.config import FlashqConfig
from flashq.reporting.metrics import BusyClock
from flashq.reporting.samples import SampleLog
from flashq.rewards.runner import RewardFailed, RewardRunner
from flashq.roles.common import connect, handshake, heartbeat, hello, resolve_model, role_index, serve_until_done
from flashq.wire.protocol import Heartbeat, RewardResult, ScoreRequest, Shutdown, WorkerStats
from flashq.wire.transport import Link, PeerLost

log = logging.getLogger("flashq.reward")


class RewardScorer:
    """Plain, socket-free scoring: the response's text, the plug-in under a timeout, never raise.
    The text comes decoded by the rollout worker; `decode` (token ids -> text) serves samples
    that arrive without it."""

    def __init__(self, runner: RewardRunner, decode):
        self.runner = runner
        self.decode = decode

    def text(self, req: ScoreRequest) -> str:
        return req.sample.text if req.sample.text is not None else self.decode(req.sample.token_ids)

    async def score(self, req: ScoreRequest) -> RewardResult:
        t0 = time.monotonic()
        rid = req.sample.request_id
        try:
            text = self.text(req)
            value = float(await self.runner(req.task, text))
            if value != value or value in (float("inf"), float("-inf")):
                raise ValueError(f"reward function returned {value}")
            return RewardResult(rid, value, seconds=time.monotonic() - t0)
        except asyncio.TimeoutError:
            return RewardResult(rid, 0.0, error=f"timed out after {self.runner.timeout_s}s", seconds=time.monotonic() - t0)
        except RewardFailed as e:
            return RewardResult(rid, 0.0, error=str(e)[:500], seconds=time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - a broken reward scores 0 and is counted, by design
            return RewardResult(rid, 0.0, error=f"{type(e).__name__}: {e}"[:500], seconds=time.monotonic() - t0)


class RewardWorker:
    def __init__(self, cfg: FlashqConfig, role: str, address: str):
        self.cfg = cfg
        self.role = role
        self.address = address
        self.link: Link | None = None
        self.clock = BusyClock()
        self.scored = 0
        self.errors = 0
        self.tokenizer = None
        every, run_dir = cfg.log.samples_every, cfg.log.run_dir
        self.samples = SampleLog(Path(run_dir) / f"samples-{role}.jsonl", every) if every and run_dir is not None else None

    async def run(self) -> None:
        rc = self.cfg.reward
        runner = RewardRunner(rc.function, rc.executor, rc.pool_workers, rc.timeout_s)
        self.scorer = RewardScorer(runner, self._decode)
        await runner.start()
        self.link = connect(self.cfg, self.address, self.role)
        await handshake(self.link, self.cfg, hello(self.role))
        try:
            await serve_until_done(self._serve, heartbeat(self.link, self.cfg), self._report_stats())
        finally:
            runner.close()
            if self.samples is not None:
                self.samples.close()

    def _decode(self, ids) -> str:
        """For a sample that arrives without its text; the tokenizer loads on first use only."""
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(self.cfg)))
        return self.tokenizer.decode(ids.tolist(), skip_special_tokens=True)

    async def _serve(self, tg: asyncio.TaskGroup) -> None:
        while True:
            msg = await self.link.recv()
            if isinstance(msg, ScoreRequest):
                tg.create_task(self._score(msg))
            elif isinstance(msg, Shutdown):
                if msg.restart:
                    raise PeerLost(msg.reason)
                return
            elif not isinstance(msg, Heartbeat):
                log.warning("%s: ignoring unexpected %s", self.role, type(msg).__name__)

    async def _score(self, req: ScoreRequest) -> None:
        self.clock.begin()
        try:
            result = await self.scorer.score(req)
        finally:
            self.clock.end()
        self.scored += 1
        if self.samples is not None and self.samples.due():
            self._keep_sample(req, result)
        if result.error:
            self.errors += 1
            if self.errors <= 10 or self.errors % 100 == 0:
                log.warning("reward for %s failed (%d so far): %s", result.request_id, self.errors, result.error)
        await self.link.send(result)

    def _keep_sample(self, req: ScoreRequest, result: RewardResult) -> None:
        try:
            text = self.scorer.text(req)
        except Exception:  # noqa: BLE001 - the score already carries the decode's error
            text = None
        self.samples.write(req, text, result)

    async def _report_stats(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.log.stats_interval_s)
            busy, idle = self.clock.snapshot()
            await self.link.send(
                WorkerStats(
                    role="reward",
                    index=role_index(self.role),
                    metrics={
                        "busy_s": busy,
                        "idle_s": idle,
                        "scored": float(self.scored),
                        "errors": float(self.errors),
                        "pool_restarts": float(self.scorer.runner.restarts),
                    },
                )
            )
