"""Prompt sources: `make_task_source(cfg.task)` returns an object with `task(index) -> dict`.

A task is a JSON-serialisable dict with at least `id` and `prompt` (the user message); reward
functions read the other fields (e.g. `answer`).
"""

from flashq.config import TaskConfig


def make_task_source(cfg: TaskConfig):
    if cfg.kind == "arithmetic":
        from flashq.data.arithmetic import ArithmeticTasks

        return ArithmeticTasks(cfg.arithmetic, cfg.seed)
    raise ValueError(f"unknown task kind {cfg.kind!r}")
