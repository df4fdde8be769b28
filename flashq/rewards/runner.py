"""Run a reward function with a hard timeout, whatever it does.

Async functions run on the event loop under `asyncio.wait_for`. Sync functions run in a pool:
"process" (the default) because a stuck pure-Python or C call can only be stopped by killing
its process, and because math-verify's own timeouts use signals, which work only in a
process's main thread; "thread" is lighter but a call that never returns leaves its thread
behind. When a process-pool call times out, the pool is killed and rebuilt; calls that were
running or queued beside it are retried once, since they did nothing wrong. `start` builds the
pool before the first call, so a slow process start never counts against a call's timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing
from concurrent.futures import BrokenExecutor, Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

from flashq.rewards import load_reward_fn

_FN = None


def _init_worker(spec: str) -> None:
    global _FN
    _FN = load_reward_fn(spec)


def _call(task: dict, text: str) -> Any:
    return _FN(task, text)


def _ready() -> bool:
    return _FN is not None


class RewardRunner:
    def __init__(self, spec: str, executor: str = "process", workers: int = 2, timeout_s: float = 10.0):
        self.spec = spec
        self.fn = load_reward_fn(spec)  # fail fast, in this process, on a bad spec
        self.timeout_s = timeout_s
        self.kind = "async" if inspect.iscoroutinefunction(self.fn) else executor
        self.workers = workers
        self.pool: Executor | None = None
        self.restarts = 0
        if self.kind not in ("async", "process", "thread"):
            raise ValueError(f"reward.executor must be 'process' or 'thread', got {executor!r}")

    def _pool(self) -> Executor:
        if self.pool is None:
            if self.kind == "process":
                self.pool = ProcessPoolExecutor(
                    self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker, initargs=(self.spec,)
                )
            else:
                self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="reward")
        return self.pool

    async def start(self, timeout_s: float = 300.0) -> None:
        """Start the pool's processes (and load the function in them) now."""
        if self.kind == "process":
            pool = self._pool()
            await asyncio.wait_for(asyncio.gather(*[asyncio.wrap_future(pool.submit(_ready)) for _ in range(self.workers)]), timeout_s)

    async def __call__(self, task: dict, text: str) -> float:
        if self.kind == "async":
            return await asyncio.wait_for(self.fn(task, text), self.timeout_s)
        for attempt in range(2):
            pool = self._pool()
            fut = pool.submit(_call, task, text) if self.kind == "process" else pool.submit(self.fn, task, text)
            try:
                return await asyncio.wait_for(asyncio.wrap_future(fut), self.timeout_s)
            except asyncio.TimeoutError:
                self._kill(pool)
                raise
            except BrokenExecutor:
                if attempt == 1:
                    raise
                self._kill(pool)
            except asyncio.CancelledError:
                if not fut.cancelled() or asyncio.current_task().cancelling():
                    raise  # this call itself is being cancelled
                if attempt == 1:  # queued in a pool that was killed for another call, twice
                    raise RuntimeError("reward call cancelled twice by pool restarts") from None
        raise AssertionError("unreachable")

    def _kill(self, pool: Executor) -> None:
        """Stop a pool whose worker is stuck (processes are killed; threads cannot be)."""
        if self.pool is not pool:
            return
        self.pool = None
        self.restarts += 1
        if isinstance(pool, ProcessPoolExecutor):
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop the pool for good. A process pool's manager thread is joined once its processes
        are killed, so nothing is left for the interpreter's exit hook to trip over."""
        pool, self.pool = self.pool, None
        if pool is None:
            return
        if isinstance(pool, ProcessPoolExecutor):
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.kill()
        pool.shutdown(wait=isinstance(pool, ProcessPoolExecutor), cancel_futures=True)
