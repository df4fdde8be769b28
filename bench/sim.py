"""How well does `flashq sim` predict real runs? Calibrate on some real runs, predict the others.

Reads run directories kept by the real-engine benchmarks:
    python bench/async_rollout.py --keep runs/bench      # alpha 0, 1, 2 on the long-tail workload
    python bench/longtail.py --keep runs/bench           # FIFO, context-aware (+divided), oracle
    python bench/sim.py runs/bench                       # writes bench/results/sim.json
The calibration uses the alpha=0 and alpha=2 runs (engine step time from their different batch
sizes, trainer time, weight sync); every run, those two included, is then simulated from its own
resolved config, and the predicted seconds per trainer step are compared with the measured ones.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import print_table, write_result  # noqa: E402
from flashq.config import load_config  # noqa: E402
from flashq.metrics import read_metrics  # noqa: E402
from flashq.sim import Calibration, Simulation  # noqa: E402


def measured(run: Path) -> dict:
    steps = read_metrics(run / "metrics.jsonl")
    last = steps[-1]
    return {"steps": last["step"], "step_s": last["time/since_generation_s"] / last["step"],
            "tokens_per_s": last["rollout/tokens_total"] / last["time/since_generation_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs_root", type=Path)
    ap.add_argument("--calibrate-on", nargs="+", default=["async-alpha0", "async-alpha2"])
    args = ap.parse_args()

    runs = sorted(p for p in args.runs_root.iterdir() if (p / "metrics.jsonl").exists() and (p / "config.yaml").exists())
    cal = Calibration.fit([args.runs_root / name for name in args.calibrate_on])
    print(f"calibration: {cal}")
    rows = []
    for run in runs:
        cfg = load_config(run / "config.yaml")
        real = measured(run)
        sim = Simulation(cfg, cal).run()
        pred = sim["seconds"] / sim["steps"]
        rows.append({"run": run.name, "calibration_run": run.name in args.calibrate_on, "measured_step_s": real["step_s"],
                     "predicted_step_s": pred, "rel_error": pred / real["step_s"] - 1,
                     "measured_tokens_per_s": real["tokens_per_s"], "predicted_tokens_per_s": sim["tokens_per_s"]})
    print_table(
        "flashq sim vs real runs (seconds per trainer step)",
        rows,
        [("run", "run", ""), ("calibration_run", "calibrated on", ""), ("measured_step_s", "measured s", ".3f"),
         ("predicted_step_s", "predicted s", ".3f"), ("rel_error", "error", "+.1%"),
         ("measured_tokens_per_s", "measured tok/s", ",.0f"), ("predicted_tokens_per_s", "predicted tok/s", ",.0f")],
    )
    held_out = [r for r in rows if not r["calibration_run"]]
    figures = {
        "max_abs_error_vs_real_runs": max(abs(r["rel_error"]) for r in rows),
        "max_abs_error_held_out": max((abs(r["rel_error"]) for r in held_out), default=None),
        "real_configurations": len(rows),
    }
    path = write_result("sim", {"calibration": cal.__dict__, "runs": rows}, figures,
                        notes="Relative error of predicted vs measured seconds per trainer step; the paper-figure "
                              "comparison (max_abs_error_vs_paper_figures) is not done yet.")
    print(f"figures: {figures}\nwrote {path}")


if __name__ == "__main__":
    main()
