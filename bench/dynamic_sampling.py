"""Dynamic sampling (DAPO) on the quickstart task: with and without, alpha 2, same sample budget.

Each run is `flashq launch configs/quickstart.yaml` from the same SFT checkpoint with one seed;
only `trainer.dynamic_sampling` differs. Without it, every group is trained; with it, groups
whose 8 samples all scored the same are dropped and replaced, so a trained step costs more
samples. The comparison is therefore at equal samples generated: the budget is what the run
without dynamic sampling scored in its `--steps` steps, and each run's reward is the mean reward
of every sample its rollout scored (trained or dropped: `reward/scored_mean`, the policy's own
accuracy; the trainer's batch reward is biased by the selection) over the last 10% of that budget.
The run with dynamic sampling gets `--steps` steps too, which spends more than the budget; its
curve is read up to the budget.

Figures: `zero_variance_groups_trained` (summed over the runs with it on; 0 is the rule),
`staleness_violations` (all runs), `reward_difference_at_equal_samples` (on minus off, mean over
seeds), the groups dropped, and the wall time of each. Curves go to docs/dynamic_sampling.png.

    python bench/dynamic_sampling.py                 # 3 seeds x 2 modes, writes bench/results/dynamic_sampling.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import plot_path, print_table, write_result  # noqa: E402
from flashq.reporting.metrics import read_metrics  # noqa: E402

CONFIG = ROOT / "configs" / "quickstart.yaml"


def run(dynamic: bool, seed: int, steps: int, sft_dir: Path, run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "flashq.cli", "launch", str(CONFIG), "--no-progress", "async_ratio=2", f"seed={seed}",
           f"task.seed={seed}", f"trainer.seed={seed}", f"trainer.steps={steps}", f"trainer.dynamic_sampling={str(dynamic).lower()}",
           f"sft.output_dir={sft_dir}", f"log.run_dir={run_dir}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false"))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"dynamic_sampling={dynamic} seed={seed} failed:\n{proc.stdout[-3000:]}")
    steps_rows = list(read_metrics(run_dir / "metrics.jsonl"))
    ledger = json.loads((run_dir / "ledger.json").read_text())
    return {
        "dynamic_sampling": dynamic,
        "seed": seed,
        "steps": len(steps_rows),
        "launch_minutes": wall / 60,
        "samples_scored": [r["samples_scored_total"] for r in steps_rows],
        "scored_reward": [r.get("reward/scored_mean", float("nan")) for r in steps_rows],
        "zero_variance_groups_trained": int(sum(r["train/zero_variance_groups"] for r in steps_rows)),
        "staleness_violations": int(sum(r["staleness/violations"] for r in steps_rows)),
        "groups_dropped": int(ledger.get("groups_dropped", 0)),
        "groups_admitted": int(ledger["groups_admitted"]),
    }


def reward_at(row: dict, budget: float) -> float:
    """Mean scored reward over the steps whose cumulative samples lie in the last 10% of `budget`,
    each step weighted by the samples it scored."""
    scored = np.array(row["samples_scored"])
    rewards = np.array(row["scored_reward"])
    new = np.diff(np.concatenate([[0.0], scored]))
    window = (scored > 0.9 * budget) & (scored <= budget) & (new > 0)
    if not window.any():
        raise RuntimeError(f"seed {row['seed']}: no step ends inside the last 10% of {budget:.0f} samples")
    return float(np.average(rewards[window], weights=new[window]))


def plot(rows: list[dict], budget: dict[int, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from flashq.reporting.report import smooth

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for dynamic, color in ((False, "tab:gray"), (True, "tab:blue")):
        for k, r in enumerate(x for x in rows if x["dynamic_sampling"] == dynamic):
            x = np.array(r["samples_scored"])
            y = smooth(np.nan_to_num(np.array(r["scored_reward"]), nan=0.0), max(1, len(x) // 20))
            label = ("with" if dynamic else "without") + " dynamic sampling" if k == 0 else None
            ax.plot(x, y, color=color, lw=1.2, alpha=0.8, label=label)
    for b in set(budget.values()):
        ax.axvline(b, color="k", lw=0.6, ls=":")
    ax.set_xlabel("samples generated and scored")
    ax.set_ylabel("mean reward of every scored sample (smoothed)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("dynamic sampling at alpha 2, same SFT start (dotted: the sample budget)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=600, help="trainer steps per run; the run without sets the sample budget")
    args = ap.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="flashq-dynamic-") as tmp:
        sft_dir = Path(tmp) / "sft"  # trained by the first run, reused by the others
        for seed in args.seeds:
            for dynamic in (False, True):  # the modes take turns
                row = run(dynamic, seed, args.steps, sft_dir, Path(tmp) / f"ds{int(dynamic)}-seed{seed}")
                rows.append(row)
                print(f"dynamic_sampling={dynamic} seed={seed}: {row['samples_scored'][-1]:.0f} samples scored, "
                      f"{row['groups_dropped']} groups dropped, {row['launch_minutes']:.1f} min", flush=True)

    budget = {s: next(r for r in rows if r["seed"] == s and not r["dynamic_sampling"])["samples_scored"][-1] for s in args.seeds}
    for r in rows:
        r["reward_at_budget"] = reward_at(r, budget[r["seed"]])
    table = [{k: v for k, v in r.items() if not isinstance(v, list)} for r in rows]
    print_table(f"dynamic sampling: {len(args.seeds)} seeds x {args.steps} steps, alpha 2, same SFT start", table,
                [("dynamic_sampling", "dynamic", ""), ("seed", "seed", "d"), ("reward_at_budget", "reward at budget", ".3f"),
                 ("groups_dropped", "groups dropped", "d"), ("zero_variance_groups_trained", "equal groups trained", "d"),
                 ("staleness_violations", "staleness violations", "d"), ("launch_minutes", "minutes", ".2f")])
    on = [r for r in rows if r["dynamic_sampling"]]
    off = [r for r in rows if not r["dynamic_sampling"]]
    figures = {
        "zero_variance_groups_trained": sum(r["zero_variance_groups_trained"] for r in on),
        "zero_variance_groups_trained_without": sum(r["zero_variance_groups_trained"] for r in off),
        "staleness_violations": sum(r["staleness_violations"] for r in rows),
        "reward_at_budget_with": float(np.mean([r["reward_at_budget"] for r in on])),
        "reward_at_budget_without": float(np.mean([r["reward_at_budget"] for r in off])),
        "reward_difference_at_equal_samples": float(np.mean([r["reward_at_budget"] for r in on]) - np.mean([r["reward_at_budget"] for r in off])),
        "groups_dropped_share": float(np.mean([r["groups_dropped"] / r["groups_admitted"] for r in on])),
        "seeds": len(args.seeds),
        "steps": args.steps,
    }
    if len(args.seeds) >= 3:
        plot(rows, budget, plot_path("dynamic_sampling.png"))
    path = write_result("dynamic_sampling", rows, figures,
                        notes="Same SFT checkpoint, task, seeds; alpha 2; only trainer.dynamic_sampling differs. Rewards are "
                              "reward/scored_mean (every sample the rollout scored) over the last 10% of the sample budget "
                              "(what the run without dynamic sampling scored in its steps).")
    print(f"figures: {json.dumps(figures, indent=1)}\nwrote {path}")


if __name__ == "__main__":
    main()
