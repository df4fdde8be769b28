"""Slow tools for benchmarks: any environment whose every step first waits a heavy-tailed time.

`WithLatency` wraps the environment named by `env` (built with `kwargs`) and sleeps a lognormal
time (median `latency_s`, log-spread `sigma`) before each step, asynchronously, as a remote tool
or sandbox would make an agent wait. Everything else is the wrapped environment's.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

from flashq.envs.base import AsyncEnv, StepResult, load_env_class

_episodes = itertools.count()


class WithLatency:
    def __init__(self, env: str, kwargs: dict[str, Any] | None = None, latency_s: float = 0.5, sigma: float = 1.0):
        if latency_s < 0 or sigma < 0:
            raise ValueError("WithLatency needs latency_s >= 0 and sigma >= 0")
        self.inner = load_env_class(env)(**(kwargs or {}))
        self.env = AsyncEnv(self.inner)
        self.latency_s, self.sigma = latency_s, sigma
        self.rng = random.Random()

    def tools(self) -> list[dict]:
        return self.env.tools()

    async def reset(self, task: dict, seed: int) -> list[dict]:
        self.rng = random.Random(f"{seed}:{next(_episodes)}")  # each episode its own waits
        return await self.env.reset(task, seed)

    async def step(self, assistant: dict) -> StepResult:
        await asyncio.sleep(self.latency_s * self.rng.lognormvariate(0.0, self.sigma))
        return await self.env.step(assistant)

    async def close(self) -> None:
        await self.env.close()

    def demonstration(self, task: dict, seed: int) -> list[dict]:
        return self.inner.demonstration(task, seed)
