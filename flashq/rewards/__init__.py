"""Reward plug-ins, named in config as "package.module:function"."""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable


def quick(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a sync reward function as quick, pure and never blocking (plain string or arithmetic
    work): `reward.executor: auto` then runs it in a thread, at a sixth of a process's cost a call,
    instead of a process, which is only needed to stop calls that may hang."""
    fn.flashq_quick = True
    return fn


def executor_for(fn: Callable[..., Any], executor: str) -> str:
    """Where `fn` runs: "async" on the event loop, else the executor asked for; auto: a thread
    for a `quick` function, else a process."""
    if inspect.iscoroutinefunction(fn):
        return "async"
    if executor == "auto":
        return "thread" if getattr(fn, "flashq_quick", False) else "process"
    return executor


def load_reward_fn(spec: str) -> Callable[..., Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f'reward.function {spec!r} must look like "package.module:function"')
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"reward.function {spec!r}: cannot import {module_name!r}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward.function {spec!r}: {module_name} has no callable {attr!r}")
    return fn
