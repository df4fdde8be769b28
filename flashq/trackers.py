"""Experiment trackers beside TensorBoard: Weights & Biases and trackio, under the same names.

The coordinator's `MetricsLog` hands every record to each tracker `log.trackers` names. A step
record's keys go as they are ("reward/mean", "rollout/tokens_per_s"); another kind's are prefixed
with it ("eval/pass@1"), as in TensorBoard. Lists (histograms of counts, e.g. "hist/staleness")
become a W&B histogram; trackio takes numbers only. Both packages are optional and imported only
when asked for, with the install line in the error if they are missing.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

EXTRAS = {"wandb": "wandb", "trackio": "trackio"}


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise RuntimeError(f"log.trackers names {name!r}, which is not installed: pip install 'flashq[{EXTRAS[name]}]' ({e})") from None


def flatten(record: dict[str, Any], kind: str) -> dict[str, Any]:
    prefix = "" if kind == "step" else f"{kind}/"
    return {prefix + k: v for k, v in record.items() if isinstance(v, (int, float, list)) and not isinstance(v, bool)}


class WandbTracker:
    def __init__(self, project: str, name: str, run_dir: Path, config: dict):
        self.wandb = _import("wandb")
        self.run = self.wandb.init(project=project, name=name, dir=str(run_dir), config=config, reinit="finish_previous")
        # each kind on its own x axis: an evaluation round at version 4 may finish after step 6 is
        # logged, and W&B drops values logged at a step below its latest
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        self.run.define_metric("eval/step")
        self.run.define_metric("eval/*", step_metric="eval/step")

    def log(self, step: int, record: dict[str, Any], kind: str) -> None:
        values = {"step" if kind == "step" else f"{kind}/step": step}
        for k, v in flatten(record, kind).items():
            if isinstance(v, list):
                if v:  # counts per bucket 0, 1, 2, ...
                    values[k] = self.wandb.Histogram(np_histogram=(v, list(range(len(v) + 1))))
            else:
                values[k] = v
        self.run.log(values)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    def __init__(self, project: str, name: str, run_dir: Path, config: dict):
        self.trackio = _import("trackio")
        self.run = self.trackio.init(project=project, name=name, config=config)

    def log(self, step: int, record: dict[str, Any], kind: str) -> None:
        self.trackio.log({k: v for k, v in flatten(record, kind).items() if not isinstance(v, list)}, step=step)

    def close(self) -> None:
        self.trackio.finish()


def make_trackers(names: list[str], project: str, run_dir: Path, config: dict) -> list:
    kinds = {"wandb": WandbTracker, "trackio": TrackioTracker}
    return [kinds[n](project, run_dir.name, run_dir, config) for n in names]
