"""Prompt sources. `make_task_source(cfg.task)` returns an object with `task(index) -> dict`.

A task is a JSON-serialisable dict with at least `id` and `prompt` (the user message); reward
functions read the rest (`answer`, `metadata`, ...). Task k of a run depends only on the source
and k, so a run resumes at its saved position and two runs with the same seed see the same
prompts in the same order.
"""

from flashq.config import FlashqConfig, TaskConfig


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


def training_tasks(cfg: FlashqConfig, task: TaskConfig | None = None):
    """The source training (and SFT) draws from: `task` (default cfg.task) without the prompts
    held out for evaluation, when evaluation holds some out of it."""
    source = make_task_source(task or cfg.task)
    if cfg.eval is not None and cfg.eval.task is None:
        from flashq.data.holdout import TrainingSplit

        return TrainingSplit(source, cfg.eval.holdout)
    return source


def evaluation_tasks(cfg: FlashqConfig) -> list[dict]:
    """The held-out prompts of every evaluation round (none without `eval`)."""
    if cfg.eval is None:
        return []
    from flashq.data.holdout import held_out_tasks

    if cfg.eval.task is not None:
        source = make_task_source(cfg.eval.task)
        return [source.task(i) for i in range(cfg.eval.prompts)]
    return held_out_tasks(make_task_source(cfg.task), cfg.eval.holdout, cfg.eval.prompts)


def chat_messages(task: dict, system_prompt: str | None) -> list[dict]:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": task["prompt"]}]
