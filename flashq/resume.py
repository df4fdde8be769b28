"""`flashq launch --resume`: the stopped run's own config, pointed at its newest checkpoint that
reads back, and refused where the config given now disagrees with what the checkpoint holds.

A checkpoint holds groups generated from one model, one prompt sequence and one group size, and
a prompt position in that sequence (`flashq/checkpoint.py`); the trainer's half is one model's
weights in one form. Changing those under it would train on what no config asked for (another
dataset silently continued from the old one's position) or wait for ever (a smaller batch than the
groups already admitted for it), so overrides of them are refused by name. Everything else may
change (more steps, another learning rate, logging) by giving it as an override.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flashq.config import ConfigError, FlashqConfig, load_config

# (dotted field, what a change would break)
FROZEN = (
    ("model.name", "the checkpoint holds this model's weights"),
    ("model.revision", "the checkpoint holds this model's weights"),
    ("task", "the checkpoint holds a position in this prompt sequence and groups made from it"),
    ("env", "the held groups were played in this environment"),
    ("sampling.group_size", "the held groups were admitted at this size"),
    ("trainer.batch_groups", "the held groups were admitted for batches of this size"),
    ("trainer.lora", "the trainer's half of the checkpoint is in this form"),
)


def resume_config(cfg: FlashqConfig, which: str, overrides: list[str]) -> FlashqConfig:
    """The stopped run's own resolved config (plus any new overrides), pointed at its newest
    complete checkpoint; an override of a frozen field is refused. The config file given on the
    command line only names the run (`--resume latest`): the run's own `config.yaml` holds the
    overrides it was started with, which the file does not."""
    from flashq import checkpoint

    if which == "latest":  # each run's checkpoint is read back once (`checkpoint.latest` decodes its state)
        runs = {p: ckpt for p in cfg.log.root.glob(f"{cfg.name}-*") if (ckpt := checkpoint.latest(p))}
        if not runs:
            raise ConfigError(f"--resume: no run of {cfg.name!r} with a complete checkpoint under {cfg.log.root}/")
        run_dir = max(runs, key=lambda p: p.stat().st_mtime)
        ckpt = runs[run_dir]
    else:
        run_dir = Path(which)
        ckpt = checkpoint.latest(run_dir)
    if ckpt is None:
        raise ConfigError(f"--resume: {run_dir} holds no complete checkpoint")
    resumed = load_config(run_dir / "config.yaml", [*overrides, f"log.run_dir={run_dir}", "transport.port=0", f"resume_from={ckpt}"])
    stored = load_config(run_dir / "config.yaml", [])
    for field, why in FROZEN:
        if (now := _field(resumed, field)) != (then := _field(stored, field)):
            raise ConfigError(f"--resume: the overrides given change {field} ({_show(then)} -> {_show(now)}), which cannot "
                              f"change in a resumed run: {why}. Drop the override, or start a new run")
    if checkpoint.version_of(ckpt) >= resumed.trainer.steps:
        raise ConfigError(f"--resume: {run_dir} already finished all {resumed.trainer.steps} steps (raise trainer.steps to continue)")
    return resumed


def _field(cfg: FlashqConfig, dotted: str) -> Any:
    value: Any = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
