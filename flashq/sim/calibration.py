"""The simulator's constants, and how they are read from real flashq runs.

The trainer's line (seconds per step against tokens) and the weight-sync pause come straight
from each step's metrics. The engine's constants (step_s, step_s_per_seq, dispatch_s,
engine_cores, contention, switch_s) cannot: a run records the combined effect of batching, the
long tail, engines sharing cores and the overhead around the engine. So they are fitted by
simulation: each calibration run is simulated from its own config, and the constants are
searched (Nelder-Mead in log space, from several starts) to minimise the squared log errors of
- the seconds per trainer step, in steady state;
- each engine's output tokens per busy second, where the run wrote a request trace
  (`log.request_trace`): what it generated while it had requests, from the first trainer step on.
The second pins the engine's speed apart from the time around it (dispatch, the trainer, the
tail). Runs at different engine batch sizes, with one and two engines on the same cores, pin
the rest. Runs of the same configuration are repeats: on a shared 2-core host a run's step time
moved by up to 54% from one repeat to the next (the engines' core slowed down for minutes at a
time, the trainer's did not), so each configuration is simulated once and fitted to the mean
of its repeats.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np


@dataclass
class Calibration:
    """Defaults: the tiny model's flashq runs on a 2-core CPU with napping engines (the CPU
    default), nine configurations repeated three times, as `python bench/sim.py` fitted them."""

    step_s: float = 1.8e-3  # decode step of one engine at full speed, fixed part
    step_s_per_seq: float = 1.8e-4  # added per running request
    step_s_per_kv_token: float = 0.0  # added per token held in the KV cache (attention reads it every step)
    prefill_s_per_token: float = 2e-5
    train_s: float = 0.76
    train_s_per_token: float = 9.2e-5
    weight_sync_s: float = 0.082
    reward_s: float = 0.002
    dispatch_s: float = 0.012  # from a freed slot to the next request's admission: per-request overhead
    engine_cores: float = 1.35  # CPU cores one engine keeps busy at full speed (its engine and worker processes)
    contention: float = 1.46  # exponent on the slowdown of oversubscribed cores
    switch_s: float = 2.3e-4  # per step, waiting for a core another engine holds (per engine beyond the cores)
    kv_tokens: float = 0.0  # tokens one engine's KV cache holds (0: unlimited); full, it preempts
    spec_accept: float = 0.0  # per-draft-token acceptance probability; 0: no speculation
    # grouped drafts: acceptance for a request whose group has n finished responses to draft from
    # (entry n; the last holds beyond); empty: spec_accept for every request
    spec_accept_by_refs: list[float] = field(default_factory=list)
    spec_max_draft: int = 8
    verify_s_per_token: float = 0.0  # added per draft token verified
    source: list[str] = field(default_factory=list)

    def step_time(self, batch: int, kv: float = 0.0) -> float:
        return self.step_s + self.step_s_per_seq * batch + self.step_s_per_kv_token * kv

    def accept(self, refs: int) -> float:
        """Per-draft-token acceptance of a request whose group has `refs` finished responses."""
        table = self.spec_accept_by_refs
        return table[min(refs, len(table) - 1)] if table else self.spec_accept

    def decode(self, accept: np.ndarray, kv: float = 0.0) -> tuple[float, np.ndarray]:
        """(seconds per step, tokens each request advances per step) for running requests whose
        draft tokens are accepted with probabilities `accept`, holding `kv` tokens of context, at
        the draft length that minimises time per token (Seer's marginal-benefit rule)."""
        base = self.step_time(len(accept), kv)
        best_step, best = base, np.ones(len(accept))
        if len(accept) and accept.max() > 0:
            for g in range(1, self.spec_max_draft + 1):
                step, tokens = base + self.verify_s_per_token * len(accept) * g, (1 - accept ** (g + 1)) / (1 - accept)
                if step * best.sum() < best_step * tokens.sum():
                    best_step, best = step, tokens
        return best_step, best

    @classmethod
    def load(cls, path: Path) -> Calibration:
        """Read constants saved by `save` (or written by hand); a bad file names what is wrong."""
        from flashq.config import ConfigError

        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"calibration {path}: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"calibration {path}: expected a JSON object of constants, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(data) - known):
            raise ConfigError(f"calibration {path}: unknown constant(s) {unknown}; known: {sorted(known)}")
        for name, value in data.items():
            if name == "source":
                continue
            if name == "spec_accept_by_refs":
                if not isinstance(value, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < 1 for x in value):
                    raise ConfigError(f"calibration {path}: spec_accept_by_refs must be a list of probabilities in [0, 1), got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(f"calibration {path}: {name} must be a number >= 0, got {value!r}")
        return cls(**data)

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def fit(cls, run_dirs: list[Path], starts: int = 4, evaluations: int = 160) -> Calibration:
        from flashq.reporting.metrics import read_metrics

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
        return fit_engine(cal, run_dirs, starts, evaluations)


def measured_step_s(run: Path) -> float:
    """Seconds per trainer step of a real run in steady state: from its first step to its last
    (the first step also holds the engines' warm-up, which the simulator does not model)."""
    from flashq.reporting.metrics import read_metrics

    steps = read_metrics(Path(run) / "metrics.jsonl")
    if len(steps) < 2:
        raise ValueError(f"{run}: a steady-state step time needs at least two trainer steps")
    return (steps[-1]["time/since_generation_s"] - steps[0]["time/since_generation_s"]) / (steps[-1]["step"] - steps[0]["step"])


def measured_engine_rates(run: Path) -> dict[str, float]:
    """Output tokens per busy second of each rollout worker, from the run's request trace, between
    its first and last trainer step (a response's tokens counted evenly over its lifetime); {}
    without a trace."""
    from flashq.reporting.metrics import read_metrics

    trace = Path(run) / "requests.jsonl"
    if not trace.exists():
        return {}
    steps = read_metrics(Path(run) / "metrics.jsonl")
    t0, t1 = steps[0]["time/since_generation_s"], steps[-1]["time/since_generation_s"]
    spans: dict[str, list[tuple[float, float, float]]] = {}
    for line in trace.read_text().splitlines():
        r = json.loads(line)
        if r["finished"] > r["sent"]:
            spans.setdefault(r["worker"], []).append((r["sent"], r["finished"], r["tokens"]))
    rates = {}
    for worker, items in spans.items():
        tokens = sum(n * max(0.0, min(b, t1) - max(a, t0)) / (b - a) for a, b, n in items)
        busy, end = 0.0, t0  # the union of the responses' lifetimes inside the window
        for a, b, _ in sorted(items):
            a, b = max(a, end), min(b, t1)
            if b > a:
                busy, end = busy + b - a, b
        if busy > 0:
            rates[worker] = tokens / busy
    return rates


def configurations(run_dirs: list[Path]) -> list[list[Path]]:
    """The runs grouped by configuration, in order of first appearance: runs whose resolved
    configs agree, their log section aside, are repeats of one configuration."""
    from flashq.config import load_config

    groups: dict[str, list[Path]] = {}
    for run in map(Path, run_dirs):
        cfg = load_config(run / "config.yaml").model_dump(mode="json", exclude={"log"})
        groups.setdefault(json.dumps(cfg, sort_keys=True), []).append(run)
    return list(groups.values())


def measured_mean(repeats: list[Path]) -> tuple[float, dict[str, float]]:
    """Seconds per trainer step and each engine's tokens per busy second, averaged over the
    repeats of one configuration (rates over the repeats that traced requests)."""
    rates: dict[str, list[float]] = {}
    for run in repeats:
        for worker, rate in measured_engine_rates(run).items():
            rates.setdefault(worker, []).append(rate)
    return float(np.mean([measured_step_s(r) for r in repeats])), {w: float(np.mean(v)) for w, v in rates.items()}


def simulated_step_s(result: dict) -> float:
    """The same measure on a simulation's result."""
    return float(np.mean(result["step_s_per_step"][1:]))


ENGINE_CONSTANTS = ("step_s", "step_s_per_seq", "dispatch_s", "engine_cores", "contention", "switch_s")
# where the search starts (an earlier fit's constants), fixed so that a fit does not depend on the defaults
FIT_START = (2.08e-3, 4.6e-5, 1.8e-3, 1.41, 1.18, 1e-3)


def fit_engine(cal: Calibration, run_dirs: list[Path], starts: int = 4, evaluations: int = 160) -> Calibration:
    from flashq.config import load_config
    from flashq.sim.simulator import Simulation

    runs = [(load_config(repeats[0] / "config.yaml"), *measured_mean(repeats)) for repeats in configurations(run_dirs)]

    def at(x: np.ndarray) -> Calibration:
        return replace(cal, **{name: float(math.exp(v)) for name, v in zip(ENGINE_CONSTANTS, x)})

    def loss(x: np.ndarray) -> float:
        c, total = at(x), 0.0
        for cfg, step_s, rates in runs:
            result = Simulation(cfg, c).run()
            total += math.log(simulated_step_s(result) / step_s) ** 2
            for worker, rate in rates.items():
                engine = result["engines"][worker]
                total += math.log(engine["tokens"] / max(engine["busy_s"], 1e-12) / rate) ** 2
        return total

    # starts: the engine from fast to slow, one or two cores' worth of work per engine
    base = np.log(FIT_START)
    offsets = [np.zeros(6), np.log([2, 4, 1, 2, 1.2, 0.1]), np.log([0.5, 2, 10, 1.5, 1, 3]), np.log([1, 1, 100, 1, 0.8, 1])]
    best = min((nelder_mead(loss, base + o, evaluations) for o in offsets[:starts]), key=lambda r: r[1])
    return at(best[0])


def nelder_mead(f, x0: np.ndarray, evaluations: int, step: float = 0.5) -> tuple[np.ndarray, float]:
    """Minimise f from x0 (the textbook simplex method; numpy only, no scipy dependency)."""
    points = [np.asarray(x0, float)] + [x0 + step * e for e in np.eye(len(x0))]
    values = [f(p) for p in points]
    used = len(points)
    while used < evaluations:
        order = np.argsort(values)
        points, values = [points[i] for i in order], [values[i] for i in order]
        centre = np.mean(points[:-1], axis=0)
        reflected = centre + (centre - points[-1])
        fr = f(reflected)
        used += 1
        if fr < values[0]:
            expanded = centre + 2 * (centre - points[-1])
            fe = f(expanded)
            used += 1
            points[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            points[-1], values[-1] = reflected, fr
        else:
            contracted = centre + 0.5 * (points[-1] - centre)
            fc = f(contracted)
            used += 1
            if fc < values[-1]:
                points[-1], values[-1] = contracted, fc
            else:
                points = [points[0]] + [points[0] + 0.5 * (p - points[0]) for p in points[1:]]
                values = [values[0]] + [f(p) for p in points[1:]]
                used += len(points) - 1
    i = int(np.argmin(values))
    return points[i], values[i]
