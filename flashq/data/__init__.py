"""Prompt sources. `make_task_source(cfg.task)` returns an object with `task(index) -> dict`.

A task is a JSON-serialisable dict with at least `id` and `prompt` (the user message); reward
functions read the rest (`answer`, `metadata`, ...). Task k of a run depends only on the source
and k, so a run resumes at its saved position and two runs with the same seed see the same
prompts in the same order.
"""

from flashq.config import TaskConfig


def make_task_source(cfg: TaskConfig):
    if cfg.kind == "arithmetic":
        from flashq.data.arithmetic import ArithmeticTasks

        return ArithmeticTasks(cfg.arithmetic, cfg.seed)
    if cfg.kind == "file":
        from flashq.data.files import FileTasks

        return FileTasks(cfg.file, cfg.seed)
    if cfg.kind == "reasoning_gym":
        from flashq.data.reasoning_gym import ReasoningGymTasks

        return ReasoningGymTasks(cfg.reasoning_gym, cfg.seed)
    raise ValueError(f"unknown task kind {cfg.kind!r}")


def chat_messages(task: dict, system_prompt: str | None) -> list[dict]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": task["prompt"]}]
