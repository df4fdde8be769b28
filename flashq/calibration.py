"""The simulator's constants, and how they are read from real flashq runs.

The trainer's line (seconds per step against tokens) and the weight-sync pause come straight
from each step's metrics. The engine's step-time curve T(B) = step_s + step_s_per_seq * B cannot:
what a run records is the combined effect of batching, the long tail, engines sharing cores and
the overhead per request around the engine, and how many cores an engine keeps busy. So those
four constants (step_s, step_s_per_seq, dispatch_s, engine_cores) are fitted by simulation: each calibration run is simulated
from its own config and the constants are searched (in log space) to minimise the squared log
error of the predicted seconds per trainer step. Runs at different engine batch sizes (alpha 0
and 2; a small engine batch) and with and without shared cores pin them down.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np


@dataclass
class Calibration:
    step_s: float = 1.5e-3  # decode step at batch 1 (platform.md: the tiny model on this CPU)
    step_s_per_seq: float = 4e-5  # added per running request
    prefill_s_per_token: float = 2e-5
    train_s: float = 0.02
    train_s_per_token: float = 3e-5
    weight_sync_s: float = 0.1
    reward_s: float = 0.002
    dispatch_s: float = 1e-3  # from a freed slot to the next request's admission: per-request overhead
    engine_cores: float = 1.0  # CPU cores one engine keeps busy at full speed (its engine and worker processes)
    spec_accept: float = 0.0  # per-draft-token acceptance probability; 0: no speculation
    spec_max_draft: int = 8
    verify_s_per_token: float = 0.0  # added per draft token verified
    source: list[str] = field(default_factory=list)

    def step_time(self, batch: int) -> float:
        return self.step_s + self.step_s_per_seq * batch

    def decode(self, batch: int) -> tuple[float, float]:
        """(seconds per step, tokens per request per step) at the best draft length for `batch`."""
        best = (self.step_time(batch), 1.0)
        p = self.spec_accept
        for g in range(1, self.spec_max_draft + 1) if p > 0 else ():
            step, tokens = self.step_time(batch) + self.verify_s_per_token * batch * g, (1 - p ** (g + 1)) / (1 - p)
            if step / tokens < best[0] / best[1]:
                best = (step, tokens)
        return best

    @classmethod
    def load(cls, path: Path) -> Calibration:
        return cls(**json.loads(Path(path).read_text()))

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def fit(cls, run_dirs: list[Path], rounds: int = 4) -> Calibration:
        from flashq.metrics import read_metrics

        train_x, train_y, syncs = [], [], []
        for run in run_dirs:
            steps = read_metrics(Path(run) / "metrics.jsonl")
            train_x += [r["train/tokens"] for r in steps[1:]]
            train_y += [r["train/seconds"] for r in steps[1:]]
            syncs += [r["trainer/weight_sync_s"] for r in steps[1:]]
        if not train_x:
            raise ValueError("calibration needs runs of at least two trainer steps")
        tslope, tintercept = np.polyfit(train_x, train_y, 1) if len(set(train_x)) > 1 else (0.0, float(np.mean(train_y)))
        cal = cls(train_s=max(float(tintercept), 0.0), train_s_per_token=max(float(tslope), 0.0),
                  weight_sync_s=float(np.median(syncs)), source=[str(r) for r in run_dirs])
        return fit_engine(cal, run_dirs, rounds)


def measured_step_s(run: Path) -> float:
    """Seconds per trainer step of a real run in steady state: from its first step to its last
    (the first step also holds the engines' warm-up, which the simulator does not model)."""
    from flashq.metrics import read_metrics

    steps = read_metrics(Path(run) / "metrics.jsonl")
    if len(steps) < 2:
        raise ValueError(f"{run}: a steady-state step time needs at least two trainer steps")
    return (steps[-1]["time/since_generation_s"] - steps[0]["time/since_generation_s"]) / (steps[-1]["step"] - steps[0]["step"])


def simulated_step_s(result: dict) -> float:
    """The same measure on a simulation's result."""
    return float(np.mean(result["step_s_per_step"][1:]))


def fit_engine(cal: Calibration, run_dirs: list[Path], rounds: int = 4) -> Calibration:
    """Coordinate search over the engine constants in log space, halving the stride each round."""
    from flashq.config import load_config
    from flashq.sim import Simulation

    runs = [(load_config(Path(r) / "config.yaml"), measured_step_s(Path(r))) for r in run_dirs]

    def loss(c: Calibration) -> float:
        total = 0.0
        for cfg, real in runs:
            total += math.log(simulated_step_s(Simulation(cfg, c).run()) / real) ** 2
        return total

    best, best_loss = cal, loss(cal)
    stride = 1.0  # factors of e
    for _ in range(rounds):
        improved = True
        while improved:
            improved = False
            for name in ("step_s", "step_s_per_seq", "dispatch_s", "engine_cores"):
                for direction in (1, -1):
                    trial = replace(best, **{name: getattr(best, name) * math.exp(direction * stride)})
                    trial_loss = loss(trial)
                    if trial_loss < best_loss:
                        best, best_loss, improved = trial, trial_loss, True
        stride /= 2
    return best
