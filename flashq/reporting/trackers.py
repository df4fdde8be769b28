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
        # a resumed run (same directory) continues its W&B run
        self.run = self.wandb.init(project=project, name=name, id=_run_id(name), resume="allow", dir=str(run_dir), config=config)
        # each kind on its own x axis: an evaluation round at version 4 may finish after step 6 is
        # logged, and W&B drops values logged at a step below its latest. Steps take the glob; each
        # other kind's keys are defined by name as they appear (a name is more specific than a glob)
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")
        self.defined: set[str] = set()

    def log(self, step: int, record: dict[str, Any], kind: str) -> None:
        axis = "step" if kind == "step" else f"{kind}/step"
        values = {axis: step}
        if kind != "step":
            for key in [axis, *flatten(record, kind)]:
                if key not in self.defined:
                    self.run.define_metric(key, step_metric=axis if key != axis else None)
                    self.defined.add(key)
        for k, v in flatten(record, kind).items():
            if isinstance(v, list):
                if v:  # counts per bucket 0, 1, 2, ...
                    values[k] = self.wandb.Histogram(np_histogram=(v, list(range(len(v) + 1))))
            else:
                values[k] = v
        self.run.log(values)

    def close(self, ok: bool = True) -> None:
        self.run.finish(exit_code=0 if ok else 1)


def _run_id(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:64]


class TrackioTracker:
    def __init__(self, project: str, name: str, run_dir: Path, config: dict):
        self.trackio = _import("trackio")
        self.run = self.trackio.init(project=project, name=name, config=config)

    def log(self, step: int, record: dict[str, Any], kind: str) -> None:
        self.trackio.log({k: v for k, v in flatten(record, kind).items() if not isinstance(v, list)}, step=step)

    def close(self, ok: bool = True) -> None:
        self.trackio.finish()


def make_trackers(names: list[str], project: str, run_dir: Path, config: dict) -> list:
    kinds = {"wandb": WandbTracker, "trackio": TrackioTracker}
    return [kinds[n](project, run_dir.name, run_dir, config) for n in names]
