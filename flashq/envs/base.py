"""The environment protocol: how a multi-turn, tool-using task talks to flashq.

An environment is one episode's state. flashq calls `reset(task, seed)` for the opening chat
messages, then, after every assistant turn, `step(assistant_message)` for what the environment
says back. Messages are OpenAI chat messages ({"role", "content"}, plus "tool_calls" on an
assistant message when the model called a tool and "tool_call_id" on the tool's reply); `tools()`
describes the tools as OpenAI function schemas for the chat template.

Environments see text, never tokens: the rollout worker keeps the sampled token ids and renders
only the new environment messages (`flashq.episode`), so nothing is re-tokenised.

Methods may be `async def` or plain functions; plain ones run in a thread, off the event loop, so
a blocking environment never stalls the other episodes of its worker. A user's class is named in
config as "package.module:Class" (importable, or a module in the working directory) or by an
entry point in the `flashq.envs` group, and built with `env.kwargs`.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import math
import os
import sys
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol

ChatMessage = dict[str, Any]


@dataclass
class StepResult:
    messages: list[ChatMessage]  # environment or tool messages to append (role user | tool)
    reward: float = 0.0  # this step's reward; an episode's reward is the sum
    terminated: bool = False  # the task is over (solved or failed)
    truncated: bool = False  # cut off by a limit (turns, time) before the task was over
    info: dict[str, Any] = field(default_factory=dict)


class Env(Protocol):
    def reset(self, task: dict, seed: int) -> list[ChatMessage]: ...  # or async
    def step(self, assistant: ChatMessage) -> StepResult: ...  # or async
    def tools(self) -> list[dict]: ...  # optional: OpenAI function schemas
    def close(self) -> None: ...  # optional, or async


class EnvError(Exception):
    """An environment broke its contract (bad return value) or raised; the episode fails."""


def load_env_class(spec: str) -> type:
    """'package.module:Class', or the name of an entry point in the `flashq.envs` group."""
    if ":" not in spec:
        found = [ep for ep in entry_points(group="flashq.envs") if ep.name == spec]
        if not found:
            raise ValueError(f"env {spec!r}: not 'package.module:Class' and no 'flashq.envs' entry point has that name")
        return found[0].load()
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:  # a module beside the user's config is found, as `python -m` would
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"env {spec!r}: cannot import {module_name}: {e}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"env {spec!r}: {module_name} has no attribute {attr!r}") from None


class AsyncEnv:
    """Any environment seen through one async interface that checks what it returns."""

    def __init__(self, env: Any):
        self.env = env

    async def _call(self, name: str, *args):
        fn = getattr(self.env, name)
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        return await asyncio.to_thread(fn, *args)

    async def reset(self, task: dict, seed: int) -> list[ChatMessage]:
        messages = _check_messages(await self._call("reset", task, seed), "reset")
        if not messages:
            raise EnvError("reset() returned no messages: the model needs something to answer")
        return messages

    async def step(self, assistant: ChatMessage) -> StepResult:
        result = await self._call("step", assistant)
        if not isinstance(result, StepResult):
            raise EnvError(f"step() returned {type(result).__name__}, expected flashq.envs.base.StepResult")
        _check_messages(result.messages, "step")
        try:
            result.reward = float(result.reward)
        except (TypeError, ValueError):
            raise EnvError(f"step() returned a reward that is not a number: {result.reward!r}") from None
        if not math.isfinite(result.reward):
            raise EnvError(f"step() returned a non-finite reward: {result.reward}")
        return result

    def tools(self) -> list[dict]:
        return list(getattr(self.env, "tools", lambda: [])() or [])

    async def close(self) -> None:
        if hasattr(self.env, "close"):
            await self._call("close")


def _check_messages(messages: Any, where: str) -> list[ChatMessage]:
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise EnvError(f"{where}() must return a list of chat-message dicts, got {type(messages).__name__}")
    for m in messages:
        if m.get("role") not in ("system", "user", "tool") or not isinstance(m.get("content"), str):
            raise EnvError(f"{where}() returned a message without role system|user|tool and string content: {m!r}")
    return messages
