"""Does asynchronous training learn as well as synchronous? alpha=2 vs alpha=0, same budget.

Each run is a full `flashq launch configs/quickstart.yaml` from the same SFT checkpoint, with the
same task, seed and number of samples (trainer.steps x batch); only the async ratio differs.
Both use the quickstart's decoupled-PPO loss with token-level truncated IS, which is the
identity at alpha=0 (every token is on-policy) and corrects stale tokens at alpha=2, at a learning
rate of 2e-4 (`--lr`): at the quickstart's 5e-4 each step moves the tiny policy so far that
samples two versions old learn visibly worse (seed 0: 0.61 vs 0.79 after 800 steps).
Figures: `final_reward_gap_alpha2_vs_sync`, the absolute difference of the final mean rewards
(last 10% of steps) averaged over seeds, and `wall_ratio_alpha2_vs_sync`. The curves go to
docs/parity.png.

    python bench/parity.py                         # 3 seeds x 2 alphas, writes bench/results/parity.json
    python bench/parity.py --seeds 0 trainer.steps=200   # a quicker look
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
from flashq.reporting.report import smooth  # noqa: E402

CONFIG = ROOT / "configs" / "quickstart.yaml"


def run(alpha: float, seed: int, steps: int, lr: float, sft_dir: Path, run_dir: Path, overrides: list[str]) -> dict:
    cmd = [sys.executable, "-m", "flashq.cli", "launch", str(CONFIG), "--no-progress", f"async_ratio={alpha}", f"seed={seed}",
           f"trainer.steps={steps}", f"trainer.lr={lr}", f"sft.output_dir={sft_dir}", f"log.run_dir={run_dir}", *overrides]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"alpha={alpha} seed={seed} failed:\n{proc.stdout[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    rewards = [r["reward/mean"] for r in read_metrics(run_dir / "metrics.jsonl")]
    return {
        "async_ratio": alpha,
        "seed": seed,
        "steps": summary["steps"],
        "reward_after_sft": summary["reward_start"],
        "reward_final": summary["reward_final"],
        "reward_gain": summary["reward_gain"],
        "rl_minutes": summary["wall_minutes"],
        "launch_minutes": wall / 60,
        "staleness_max": summary["staleness_max"],
        "staleness_mean": summary["staleness_mean"],
        "staleness_violations": summary["staleness_violations"],
        "samples_trained": summary.get("samples_trained"),
        "rewards": rewards,
    }


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for alpha, color in ((0.0, "tab:gray"), (2.0, "tab:blue")):
        curves = [r["rewards"] for r in rows if r["async_ratio"] == alpha]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        window = max(1, n // 20)
        for c in curves:
            ax.plot(range(1, n + 1), smooth(c[:n], window), color=color, alpha=0.25, lw=0.8)
        mean = smooth(np.mean([c[:n] for c in curves], axis=0), window)
        label = "synchronous (alpha=0)" if alpha == 0 else f"async (alpha={alpha:g})"
        ax.plot(range(1, n + 1), mean, color=color, lw=2, label=f"{label}, mean of {len(curves)} seeds")
    ax.set_xlabel("trainer step (same samples per step)")
    ax.set_ylabel("batch mean reward (smoothed)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title("async vs sync GRPO from the same SFT checkpoint")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=800, help="trainer steps per run (the sample budget)")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("overrides", nargs="*", help="config overrides applied to every run")
    args = ap.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="flashq-parity-") as tmp:
        sft_dir = Path(tmp) / "sft"  # trained by the first run, reused by the others
        for seed in args.seeds:
            for alpha in (0.0, 2.0):
                row = run(alpha, seed, args.steps, args.lr, sft_dir, Path(tmp) / f"alpha{alpha:g}-seed{seed}", args.overrides)
                rows.append(row)
                print(f"alpha={alpha:g} seed={seed}: reward {row['reward_after_sft']:.3f} -> {row['reward_final']:.3f} "
                      f"in {row['rl_minutes']:.1f} min", flush=True)

    def mean(alpha: float, key: str) -> float:
        return float(np.mean([r[key] for r in rows if r["async_ratio"] == alpha]))

    per_seed_gaps = [abs(a["reward_final"] - s["reward_final"])
                     for a in rows if a["async_ratio"] == 2 for s in rows if s["async_ratio"] == 0 and s["seed"] == a["seed"]]
    summary = [
        {"alpha": alpha, "reward_after_sft": mean(alpha, "reward_after_sft"), "reward_final": mean(alpha, "reward_final"),
         "reward_gain": mean(alpha, "reward_gain"), "rl_minutes": mean(alpha, "rl_minutes"),
         "staleness_mean": mean(alpha, "staleness_mean"), "staleness_max": max(r["staleness_max"] for r in rows if r["async_ratio"] == alpha)}
        for alpha in (0.0, 2.0)
    ]
    print_table(
        f"parity: {len(args.seeds)} seeds x {args.steps} steps (lr {args.lr:g}) from the same SFT checkpoint",
        summary,
        [("alpha", "alpha", "g"), ("reward_after_sft", "after SFT", ".3f"), ("reward_final", "final reward", ".3f"),
         ("reward_gain", "gain", "+.3f"), ("rl_minutes", "RL min", ".2f"), ("staleness_mean", "mean staleness", ".2f"),
         ("staleness_max", "max staleness", ".0f")],
    )
    figures = {
        "final_reward_gap_alpha2_vs_sync": abs(mean(2.0, "reward_final") - mean(0.0, "reward_final")),
        "final_reward_gap_per_seed_mean": float(np.mean(per_seed_gaps)),
        "final_reward_alpha2": mean(2.0, "reward_final"),
        "final_reward_sync": mean(0.0, "reward_final"),
        "wall_ratio_alpha2_vs_sync": mean(2.0, "rl_minutes") / mean(0.0, "rl_minutes"),
        "seeds": len(args.seeds),
    }
    if not args.overrides and len(args.seeds) >= 3:
        plot(rows, plot_path("parity.png"))
    path = write_result("parity", {"summary": summary, "runs": rows}, figures,
                        notes="Same SFT checkpoint, task, seeds and samples per run; only async_ratio differs. "
                              "reward_final: mean batch reward over the last 10% of steps. wall ratio: RL time "
                              "(first request to last step), alpha=2 over alpha=0.")
    print(f"figures: {figures}\nwrote {path}")


if __name__ == "__main__":
    main()
