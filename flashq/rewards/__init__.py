"""Reward plug-ins, named in config as "package.module:function"."""

from __future__ import annotations

import importlib
from typing import Any, Callable


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
