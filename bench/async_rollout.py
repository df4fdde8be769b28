"""Asynchronous vs synchronous RL on a long-tail workload, with the real engine end to end.

Each configuration is a full `flashq launch` of bench/configs/longtail.yaml: two vLLM rollout
workers, a reward worker and the GRPO trainer with weight broadcast after every step, on the
same prompts and the same forced per-request output lengths (lognormal, tail well past 20x the
median). Only the async ratio differs:
  alpha = 0   synchronous: generate the whole batch, wait for its longest response, train;
  alpha = 1,2 queue scheduling with generation up to alpha batches ahead of training.
Tokens/s is all generated tokens over the time from the first request to the last optimizer
step; idle share is the fraction of time a rollout worker had nothing in flight, and mean
batch is the time-averaged number of requests running on it.

Single runs move: the 2.29x (alpha 2 vs sync) first recorded was 1.94x when re-run from a fresh
clone. So the configurations take turns over --rounds rounds (alpha 0, 1, 2, then again), each
round's ratios are taken against that round's synchronous run, and the figures are the median
over rounds with the spread (min, max) beside them. Nothing is chosen from the results.

    python bench/async_rollout.py                 # writes bench/results/async_rollout.json
    python bench/async_rollout.py trainer.steps=10 --alphas 0 2 --rounds 1   # a quicker look
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import print_table, write_result  # noqa: E402
from flashq.config import load_config  # noqa: E402
from flashq.scheduling.lengths import forced_length  # noqa: E402

CONFIG = ROOT / "bench" / "configs" / "longtail.yaml"


def run(alpha: float, overrides: list[str], run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "flashq.cli", "launch", str(CONFIG), "--no-progress",
           f"async_ratio={alpha}", f"log.run_dir={run_dir}", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if proc.returncode != 0:
        raise RuntimeError(f"alpha={alpha} run failed:\n{proc.stdout[-3000:]}")
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if r["kind"] == "step"]
    last = steps[-1]
    workers = sorted({k.rsplit("/", 1)[1] for k in last if k.startswith("rollout/busy_s_total/")})
    busy = np.array([last[f"rollout/busy_s_total/{w}"] for w in workers])
    idle = np.array([last[f"rollout/idle_s_total/{w}"] for w in workers])
    load = np.array([last[f"rollout/load_s_total/{w}"] for w in workers])
    seconds = last["time/since_generation_s"]
    tokens = last["rollout/tokens_total"]
    return {
        "async_ratio": alpha,
        "steps": last["step"],
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "engine_idle_share": float(np.mean(idle / (busy + idle))),
        "mean_batch_per_worker": float(np.mean(load / (busy + idle))),
        "trainer_idle_share": float(np.mean([r.get("trainer/idle_share", 0.0) for r in steps])),
        "mean_step_s": seconds / last["step"],
        "max_staleness": max(r["staleness/max"] for r in steps),
        "weight_sync_s_mean": float(np.mean([r["trainer/weight_sync_s"] for r in steps])),
        "run_dir": str(run_dir),
    }


def workload(overrides: list[str]) -> dict:
    cfg = load_config(CONFIG, overrides)
    n = cfg.total_groups * cfg.sampling.group_size
    lengths = np.array([forced_length(cfg.sampling.forced_lengths, i, cfg.sampling.group_size) for i in range(n)])
    med = float(np.median(lengths))
    return {
        "requests": n,
        "median_tokens": med,
        "p99_tokens": float(np.percentile(lengths, 99)),
        "max_tokens": int(lengths.max()),
        "p99_over_median": float(np.percentile(lengths, 99) / med),
        "max_over_median": float(lengths.max() / med),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=3, help="the configurations take turns this many times")
    ap.add_argument("--keep", type=Path, help="keep the run directories here (bench/sim.py reads them)")
    ap.add_argument("overrides", nargs="*", help="config overrides applied to every run")
    args = ap.parse_args()
    if 0 not in args.alphas:
        raise SystemExit("--alphas must include 0: every ratio is against the synchronous run of the same round")

    wl = workload(args.overrides)
    print(f"workload: {wl}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="flashq-bench-") as tmp:
        for k in range(args.rounds):
            for alpha in args.alphas:
                row = {"round": k, **run(alpha, args.overrides, (args.keep or Path(tmp)) / f"async-alpha{alpha:g}-{k}")}
                rows.append(row)
                print(f"round {k} alpha={alpha:g}: {row['tokens_per_s']:,.0f} tok/s, engine idle {100 * row['engine_idle_share']:.0f}%",
                      flush=True)
    for r in rows:
        base = next(b for b in rows if b["round"] == r["round"] and b["async_ratio"] == 0)
        r["tokens_per_s_vs_sync"] = r["tokens_per_s"] / base["tokens_per_s"]
    print_table(
        "long-tail rollout: synchronous vs async ratio (same workload, taking turns)",
        rows,
        [("round", "round", "d"), ("async_ratio", "alpha", "g"), ("tokens_per_s", "tokens/s", ",.0f"),
         ("tokens_per_s_vs_sync", "vs sync", ".2f"), ("engine_idle_share", "engine idle", ".0%"),
         ("mean_batch_per_worker", "mean batch", ".1f"), ("trainer_idle_share", "trainer idle", ".0%"),
         ("mean_step_s", "s/step", ".2f"), ("max_staleness", "max staleness", ".0f")],
    )
    figures = {"rounds": args.rounds}
    for alpha in args.alphas:
        mine = [r for r in rows if r["async_ratio"] == alpha]
        ratios = [r["tokens_per_s_vs_sync"] for r in mine]
        if alpha:
            figures[f"tokens_per_s_alpha{alpha:g}_vs_sync"] = statistics.median(ratios)
            figures[f"tokens_per_s_alpha{alpha:g}_vs_sync_by_round"] = ratios
            figures[f"tokens_per_s_alpha{alpha:g}_vs_sync_spread"] = [min(ratios), max(ratios)]
        figures[f"engine_idle_share_alpha{alpha:g}"] = statistics.median(r["engine_idle_share"] for r in mine)
    path = write_result("async_rollout", {"workload": wl, "runs": rows}, figures,
                        notes="Full system runs (2 rollout workers, reward, trainer with per-step weight broadcast) on one 2-core CPU "
                        "machine; configurations take turns each round; ratios against the same round's alpha 0; figures are medians "
                        "over rounds with the spread.")
    print(f"figures: {figures}\nwrote {path}")


if __name__ == "__main__":
    main()
