"""Rollout worker process: a thin shell around `RolloutEngine`.

Each `GenerateRequest` becomes its own asyncio task, so the engine batches whatever is in flight
and every sample goes back the moment it finishes; one that raises or runs past its deadline is
answered as failed and takes nothing else down. Each `EpisodeRequest` is likewise its own task
playing one environment episode (`flashq.episode`): no barrier between episodes, and their turns
batch together in the engine. A `Cancel` stops an episode (aborting its engine request); it still
answers with one sample. Weight-sync calls run in arrival order.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from flashq.config import FlashqConfig
from flashq.engine.vllm_engine import RolloutEngine, prepare_engine_process
from flashq.placement import lower_priority, pin_process
from flashq.reporting.metrics import BusyClock
from flashq.roles.common import connect, handshake, heartbeat, hello, resolve_model, role_index, serve_until_done
from flashq.roles.heap import CollectorClock, freeze_startup_heap
from flashq.wire.protocol import (
    Cancel,
    EpisodeRequest,
    GenerateRequest,
    Heartbeat,
    Sample,
    Shutdown,
    WeightSyncCall,
    WeightSyncReply,
    WorkerStats,
)
from flashq.wire.transport import Link, PeerLost

log = logging.getLogger("flashq.rollout")


STALL_PUSH_ENV = "FLASHQ_FAULT_STALL_PUSH"


def stall_engine_at_push(version: int, loop: asyncio.AbstractEventLoop) -> None:
    """Fault injection for tests: with FLASHQ_FAULT_STALL_PUSH="<version>:<seconds>" the engine
    processes under this worker are stopped (SIGSTOP) as push `version` first arrives and continued
    `seconds` later, so a push meets a stalled engine at a known moment instead of by chance (the
    worker itself goes on heartbeating, as it does when an engine hangs). Once: the variable is
    taken out, so the retry of the same version finds the engine running again."""
    spec = os.environ.get(STALL_PUSH_ENV)
    if not spec:
        return
    try:
        at, seconds = int(spec.split(":")[0]), float(spec.split(":")[1])
    except (IndexError, ValueError):
        raise ValueError(f"{STALL_PUSH_ENV}={spec!r}: expected <version>:<seconds>") from None
    if at != version:
        return
    import psutil

    del os.environ[STALL_PUSH_ENV]
    stopped = psutil.Process().children(recursive=True)
    for p in stopped:
        p.suspend()
    loop.call_later(seconds, lambda: [p.resume() for p in stopped])
    log.warning("%s set: engine processes %s stopped for %gs at push %d", STALL_PUSH_ENV, [p.pid for p in stopped], seconds, version)


async def answer(engine: RolloutEngine, req: GenerateRequest, timeout_s: float | None) -> Sample:
    """The engine's response to `req`, or a sample saying why there is none: a request whose
    generation raises, or that is still unanswered after `timeout_s` (it is then aborted in the
    engine), fails alone with finish_reason "error", and the coordinator sends it again or
    quarantines it. A dead engine is the worker's failure, not the request's: it propagates, the
    worker exits and is restarted, and its requests go to the other workers. The deadline is a
    timer on the request's own task (`asyncio.timeout`), not a task of its own per request
    (`asyncio.wait_for`): one task and one loop turn fewer per request on the worker's core."""
    from vllm.v1.engine.exceptions import EngineDeadError

    try:
        async with asyncio.timeout(timeout_s):
            return await engine.generate(req)
    except TimeoutError:
        error = f"overdue: unanswered after {timeout_s:g} s (rollout.request_timeout_s), aborted"
    except EngineDeadError:
        raise
    except Exception as e:  # noqa: BLE001 - one request's failure, answered as such
        error = f"{type(e).__name__}: {e}"
    return Sample(req.request_id, req.group_id, engine.worker_index, *Sample.empty_arrays(), "error", error=error[:500])


class RolloutWorker:
    def __init__(self, cfg: FlashqConfig, role: str, address: str):
        self.cfg = cfg
        self.role = role
        self.address = address
        self.index = role_index(role)
        self.link: Link | None = None
        self.clock = BusyClock()
        self.tokens = 0
        self.requests = 0
        self.sync_s = 0.0
        self.sync_lock = asyncio.Lock()
        self.episodes: dict[str, asyncio.Task] = {}  # request id -> its episode task
        self.episode_counts = {"episodes": 0, "episodes_failed": 0, "episodes_cancelled": 0, "env_s": 0.0}

    async def run(self) -> None:
        lower_priority(self.cfg.placement.rollout_nice)  # the engine processes inherit it
        prepare_engine_process(self.cfg)  # before vLLM's import below
        from vllm.platforms import current_platform

        device = "cpu" if current_platform.is_cpu() else "cuda"
        model_path = resolve_model(self.cfg)
        engine = RolloutEngine(self.cfg, model_path, self.index, device)
        await engine.start()
        self.engine = engine
        if self.cfg.placement.rollout_frontend:
            pin_process(self.cfg.placement.rollout_frontend)
        self.players = None
        if self.cfg.env is not None and self.cfg.env.agent is not None:
            from flashq.agents.player import AgentPlayer

            self.players = AgentPlayer(self.cfg, model_path, engine)
            await self.players.start()
        elif self.cfg.env is not None:
            from flashq.roles.episodes import EpisodePlayer

            self.players = EpisodePlayer(self.cfg, model_path, engine)
        frozen = freeze_startup_heap()
        self.collector = CollectorClock()
        try:
            self.link = connect(self.cfg, self.address, self.role)
            await handshake(self.link, self.cfg, hello(self.role, engine_ranks=engine.engine_ranks))
            log.info("%s ready (%s engine, %d rank(s)); %s start-up objects frozen out of garbage collection",
                     self.role, device, engine.engine_ranks, f"{frozen:,}")
            await serve_until_done(self._serve, heartbeat(self.link, self.cfg), self._report_stats())
        finally:
            self.collector.close()
            if hasattr(self.players, "stop"):
                await self.players.stop()
            await engine.shutdown()

    async def _serve(self, tg: asyncio.TaskGroup) -> None:
        while True:
            msg = await self.link.recv()
            if isinstance(msg, GenerateRequest):
                tg.create_task(self._generate(msg))
            elif isinstance(msg, EpisodeRequest):
                self.episodes[msg.request_id] = tg.create_task(self._episode(msg))
            elif isinstance(msg, Cancel):
                for rid in msg.request_ids:
                    if rid in self.episodes:
                        self.episodes[rid].cancel()
            elif isinstance(msg, WeightSyncCall):
                tg.create_task(self._weight_sync(msg))
            elif isinstance(msg, Shutdown):
                if msg.restart:
                    raise PeerLost(msg.reason)
                log.info("%s: shutdown (%s)", self.role, msg.reason)
                return
            elif not isinstance(msg, Heartbeat):
                log.warning("%s: ignoring unexpected %s", self.role, type(msg).__name__)

    async def _generate(self, req: GenerateRequest) -> None:
        self.clock.begin()
        try:
            sample = await answer(self.engine, req, self.cfg.rollout.request_timeout_s)
        finally:
            self.clock.end()
        self.tokens += len(sample.token_ids)
        self.requests += 1
        await self.link.send(sample)

    async def _episode(self, req: EpisodeRequest) -> None:
        self.clock.begin()
        try:
            if self.players is None:
                sample = Sample(req.request_id, req.group_id, self.index, *Sample.empty_arrays(), "error",
                                error=f"{self.role} has no env configured")
            else:
                sample = await self.players.play(req, self.index)
        except asyncio.CancelledError:
            sample = Sample(req.request_id, req.group_id, self.index, *Sample.empty_arrays(), "abort", error="cancelled")
        finally:
            self.clock.end()
            self.episodes.pop(req.request_id, None)
        counts = self.episode_counts
        counts["episodes"] += 1
        counts["episodes_failed"] += sample.finish_reason == "error"
        counts["episodes_cancelled"] += sample.finish_reason == "abort"
        counts["env_s"] += sample.env_seconds
        self.tokens += int(sample.loss_mask.sum()) if len(sample.loss_mask) else len(sample.token_ids)
        await self.link.send(sample)

    async def _weight_sync(self, call: WeightSyncCall) -> None:
        async with self.sync_lock:
            t0 = time.monotonic()
            try:
                if call.method == "push_weights":
                    stall_engine_at_push(call.version, asyncio.get_running_loop())
                await self.engine.weight_sync(call.method, call.payload, call.version)
                reply = WeightSyncReply(call.call_id, ok=True, seconds=time.monotonic() - t0)
            except Exception as e:  # noqa: BLE001 - reported to the trainer, which stops the run
                log.exception("%s: %s failed", self.role, call.method)
                reply = WeightSyncReply(call.call_id, ok=False, error=f"{self.role}: {type(e).__name__}: {e}")
            self.sync_s += time.monotonic() - t0
            await self.link.send(reply)
            if reply.ok and call.method == "push_weights":
                # counters once per new version as well as on the timer: they reach the coordinator
                # before the next push's reply does, so a run shorter than the timer's interval still
                # carries them in its step records
                await self.link.send(self._stats())

    async def _report_stats(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.log.stats_interval_s)
            await self.link.send(self._stats())

    def _stats(self) -> WorkerStats:
        busy, idle = self.clock.snapshot()
        return WorkerStats(
            role="rollout",
            index=self.index,
            metrics={
                "busy_s": busy,
                "idle_s": idle,
                "tokens": float(self.tokens),
                "requests": float(self.requests),
                "in_flight": float(self.clock.in_flight),
                "weight_sync_s": self.sync_s,  # the pushes' calls, whole
                "weight_pause_s": self.engine.paused_s,  # of which generation stood paused
                "released_s": self.engine.released_s,  # colocated: the devices given to the trainer
                "version": float(self.engine.version),
                "gc_s": self.collector.total_s,  # the process's garbage collections, cumulative
                **{k: float(v) for k, v in self.episode_counts.items()},
                **self.engine.speculation_counters(),
            },
        )
