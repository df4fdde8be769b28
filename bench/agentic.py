"""Agentic RL on a multi-turn environment: throughput with slow tools, and learning.

Part 1, throughput (same sample budget, same SFT-warmed model, one run after the other): the
calculator-tool environment of configs/agentic_calculator.yaml with every tool call waiting a
lognormal time (median 0.3 s, log-spread 1.2: most calls are quick, a few take seconds).
Synchronous (alpha 0, no redundancy: every step waits for its slowest episode) against alpha 2
with environment-level async and two redundant episodes per group (the first 8 of 10 to finish
are kept); and alpha 2 alone. The three take turns over `--rounds` rounds; each ratio is against
the same round's sync run, and the figures are medians with the spread. Figure: kept episodes per
second of generation, alpha 2 with redundancy over sync, stated beside the mean reward of the
episodes each trained on: keeping the first episodes to finish favours those that skip the slow
tool, so redundancy changes which episodes are trained, not only how fast.

Part 2, learning: configs/agentic_calculator.yaml as a user runs it (SFT on the environment's
demonstrations, half of which use the tool, then async GRPO). Figure: mean reward of the last
10% of steps minus the first batch's (sampled by the SFT model).

    python bench/agentic.py              # writes bench/results/agentic.json (about 25 minutes)
    python bench/agentic.py --steps 8    # a quicker look at part 1
    python bench/agentic.py --keep DIR --reuse   # report runs already under DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import print_table, write_result  # noqa: E402
from flashq.reporting.metrics import read_metrics  # noqa: E402

CONFIG = ROOT / "configs" / "agentic_calculator.yaml"
SLOW_TOOLS = ["env.kwargs={max_value: 9, max_turns: 3, latency_s: 0.3, latency_sigma: 1.2}", "env.step_timeout_s=120"]
SYSTEMS = [
    ("sync", ["async_ratio=0", "env.redundancy=0"]),
    ("alpha2+redundant", ["async_ratio=2", "env.redundancy=2"]),
    ("alpha2", ["async_ratio=2", "env.redundancy=0"]),  # what redundancy adds, and what it costs
]
TAGS = {"sync": "sync", "alpha2+redundant": "alpha2", "alpha2": "alpha2_without_redundancy"}  # system -> its figures' names


def launch(run_dir: Path, overrides: list[str], reuse: bool = False) -> dict:
    if reuse and (run_dir / "ledger.json").exists():
        return json.loads((run_dir / "ledger.json").read_text())
    cmd = [sys.executable, "-m", "flashq.cli", "launch", str(CONFIG), "--no-progress", f"log.run_dir={run_dir}", *overrides]
    print("running:", " ".join(overrides), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if proc.returncode != 0:
        raise RuntimeError(f"run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads((run_dir / "ledger.json").read_text())


def throughput(run_dir: Path, ledger: dict) -> dict:
    steps = read_metrics(run_dir / "metrics.jsonl")
    last = steps[-1]
    seconds = last["time/since_generation_s"]
    return {
        "episodes_trained": ledger["samples_trained"],
        "episodes_failed": ledger["episodes_failed"],
        "episodes_discarded": ledger["episodes_discarded"] + ledger["episodes_withdrawn"],
        "seconds": seconds,
        "episodes_per_s": ledger["samples_trained"] / seconds,
        "rollout_idle_share": sum(r.get("rollout/idle_share", 0.0) for r in steps[1:]) / max(1, len(steps) - 1),
        "reward_mean": sum(r["reward/mean"] for r in steps) / len(steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=16, help="trainer steps of each throughput run")
    ap.add_argument("--learn-steps", type=int, default=100, help="trainer steps of the learning run (0: skip it)")
    ap.add_argument("--rounds", type=int, default=3, help="throughput runs of each system, taking turns")
    ap.add_argument("--keep", type=Path, help="keep the runs here")
    ap.add_argument("--reuse", action="store_true", help="with --keep: report runs already there instead of launching them")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="flashq-agentic-") as tmp:
        root = args.keep or Path(tmp)
        sft = [f"sft.output_dir={root / 'sft'}"]  # one warm start, shared by every run
        rows = []
        for rnd in range(args.rounds):  # systems take turns, so the host's drift hits them alike
            for name, overrides in SYSTEMS:
                run = root / f"{name}-{rnd}"
                ledger = launch(run, [*SLOW_TOOLS, f"trainer.steps={args.steps}", "trainer.batch_groups=8", *sft, *overrides], args.reuse)
                rows.append({"system": name, "round": rnd, **throughput(run, ledger)})
        learn = None
        if args.learn_steps:
            run = root / "learn"
            launch(run, [f"trainer.steps={args.learn_steps}", *sft], args.reuse)
            summary = json.loads((run / "summary.json").read_text())
            learn = {k: summary[k] for k in ("steps", "reward_start", "reward_start_source", "reward_final", "reward_gain", "wall_minutes")}

    for r in rows:
        r["vs_sync"] = r["episodes_per_s"] / next(b["episodes_per_s"] for b in rows if b["round"] == r["round"] and b["system"] == "sync")
    print_table(
        "agentic throughput: calculator tool with heavy-tailed latency (same sample budget)",
        rows,
        [("round", "round", "d"), ("system", "system", ""), ("episodes_trained", "episodes", "d"), ("seconds", "seconds", ".1f"),
         ("episodes_per_s", "episodes/s", ".2f"), ("vs_sync", "vs sync", ".2f"), ("rollout_idle_share", "engine idle", ".0%"),
         ("episodes_discarded", "discarded", "d"), ("episodes_failed", "failed", "d"), ("reward_mean", "mean reward", ".3f")],
    )
    figures = {}
    for name in ("alpha2+redundant", "alpha2"):
        tag, ratios = TAGS[name], [r["vs_sync"] for r in rows if r["system"] == name]
        figures[f"episodes_per_s_{tag}_vs_sync"] = statistics.median(ratios)
        figures[f"episodes_per_s_{tag}_vs_sync_spread"] = [min(ratios), max(ratios)]
        figures[f"episodes_per_s_{tag}_vs_sync_by_round"] = ratios
    for name, tag in TAGS.items():
        figures[f"reward_trained_{tag}"] = statistics.median(r["reward_mean"] for r in rows if r["system"] == name)
    print(f"headline: alpha 2 with redundancy at {figures['episodes_per_s_alpha2_vs_sync']:.2f}x sync episodes/s "
          f"(rounds {', '.join(f'{x:.2f}' for x in figures['episodes_per_s_alpha2_vs_sync_by_round'])}), training on episodes of "
          f"mean reward {figures['reward_trained_alpha2']:.3f} against sync's {figures['reward_trained_sync']:.3f}")
    if learn:
        print_table("agentic learning: configs/agentic_calculator.yaml", [learn],
                    [("steps", "steps", "d"), ("reward_start", "first batch", ".3f"), ("reward_final", "final", ".3f"),
                     ("reward_gain", "gain", "+.3f"), ("wall_minutes", "minutes", ".1f")])
        figures["reward_gain"] = learn["reward_gain"]
        figures["reward_gain_bound"] = 0.5  # as it learned before d32828a (about +0.6): issue 55's bound
    path = write_result("agentic", {"throughput": rows, "learning": learn}, figures,
                        notes="episodes/s = episodes trained / seconds since generation started, at the last step; ratios "
                              "against the same round's sync run, medians over rounds. reward_trained_* = mean reward of the "
                              "episodes each run trained on (median over rounds). "
                              "reward_gain = mean reward of the last 10% of steps minus the first batch's (SFT model).")
    print(f"figures: {figures}\nwrote {path}")


if __name__ == "__main__":
    main()
