"""The quickstart, timed end to end as a user runs it: `bash launch/quickstart.sh`.

SFT warm start (into a fresh output directory, so nothing is reused from an earlier run), then
async GRPO with alpha=2 on two CPU cores. Figures: `reward_gain`, the final mean reward (last 10%
of steps) minus the SFT model's sampled reward on fresh prompts; `eval_greedy_gain`, greedy accuracy
on held-out sums after RL minus at the start of RL; and `wall_minutes` for the whole
command including setup, SFT, engine start and the report. The run's plot is copied to
docs/quickstart.png for the README.

    python bench/quickstart.py                    # writes bench/results/quickstart.json
    python bench/quickstart.py trainer.steps=200  # a quicker look (overrides go to the launcher)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import keep_earlier, print_table, write_result  # noqa: E402


def run_quickstart(run_dir: Path, sft_dir: Path, overrides) -> tuple[float, dict]:
    """`bash launch/quickstart.sh` with `overrides`, as a user runs it: (wall seconds, summary.json)."""
    cmd = ["bash", "launch/quickstart.sh", "--no-progress", f"log.run_dir={run_dir}", f"sft.output_dir={sft_dir}", *overrides]
    print("running:", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, COLUMNS="120"))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"the quickstart failed (exit {proc.returncode}); its logs are in {run_dir}/logs")
    return wall, json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="config overrides passed to launch/quickstart.sh")
    ap.add_argument("--keep", type=Path, help="keep the run directory here instead of a temporary one")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="flashq-quickstart-") as tmp:
        run_dir = args.keep or Path(tmp) / "run"
        wall, summary = run_quickstart(run_dir, Path(tmp) / "sft", args.overrides)
        docs = ROOT / "docs"
        docs.mkdir(exist_ok=True)
        if not args.overrides:
            shutil.copy(run_dir / "report.png", docs / "quickstart.png")

    row = {
        "wall_minutes": wall / 60,
        "rl_minutes": summary["wall_minutes"],
        "sft_seconds": summary["sft"]["seconds"],
        "steps": summary["steps"],
        "reward_after_sft": summary["reward_start"],
        "reward_final": summary["reward_final"],
        "reward_gain": summary["reward_gain"],
        "staleness_max": summary["staleness_max"],
        "staleness_violations": summary["staleness_violations"],
        "tokens_per_s": summary["tokens_per_s"],
        "eval_greedy_after_sft": summary["eval_first"]["greedy_accuracy"],
        "eval_greedy_final": summary["eval_last"]["greedy_accuracy"],
        "eval_greedy_gain": summary["eval_greedy_accuracy_gain"],
        "eval_prompts": summary["eval_first"]["prompts"],
    }
    print_table(
        "quickstart: SFT warm start, then async GRPO (alpha=2) on 2 CPU cores",
        [row],
        [("wall_minutes", "wall min", ".1f"), ("sft_seconds", "SFT s", ".0f"), ("steps", "RL steps", "d"),
         ("reward_after_sft", "reward after SFT", ".3f"), ("reward_final", "final reward", ".3f"),
         ("reward_gain", "gain", "+.3f"), ("eval_greedy_after_sft", "held-out greedy after SFT", ".3f"),
         ("eval_greedy_final", "after RL", ".3f"), ("staleness_max", "max staleness", ".0f"), ("tokens_per_s", "tokens/s", ",.0f")],
    )
    figures = {"reward_gain": summary["reward_gain"], "eval_greedy_gain": summary["eval_greedy_accuracy_gain"], "wall_minutes": wall / 60}
    path = write_result("quickstart", {"run": row, "summary": summary}, keep_earlier("quickstart", figures),
                        notes="reward_gain: mean reward over the last 10% of RL steps minus the SFT model's sampled "
                              "(T=1) accuracy on fresh prompts; eval_greedy_gain: greedy accuracy on the held-out sums "
                              "(never trained) at the final weights minus at the SFT checkpoint (version 0); "
                              "wall_minutes: the whole `bash launch/quickstart.sh`.")
    print(f"figures: {figures}\nwrote {path}")


if __name__ == "__main__":
    main()
