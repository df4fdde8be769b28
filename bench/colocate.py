"""Colocated turns against the other placements, on the real-model example's job on this CPU.

`placement.colocate` makes generation and training take turns on the same devices by protocol:
before each step the engine is released (its scheduler paused) and the step's push brings it
back, so each phase has every core to itself; turns leave nothing to overlap, so it trains
synchronously (async_ratio 0). Against it, the same job (configs/smollm2_arithmetic.yaml,
SmolLM2-135M-Instruct, evaluation off) as shipped, "turns" by priority at async_ratio 2 (engine
and trainer on both cores, the engine niced), and "split" at async_ratio 2 (the engine on core 0,
every other role on core 1: bench/vs_trl.py's split setting). The modes take turns seed by seed;
nothing is chosen from these runs. Figures: seconds a step once the run is under way (after its
first 10% of steps), each other mode's over colocated (above 1: colocated is faster), the same
for steps/s of the whole command, and the final reward (mean of the last 10% of steps) of each.
The first step is left out of the headline because it is a lottery the placement does not
decide: the shipped model almost never answers in the tags, dynamic sampling drops every group
that scored all 0, and the first batch waited for 64 to 524 dropped groups in three 3-step trial
runs of the same seed (2 to 17 minutes). Results: docs/benchmarks/colocate.md.

The six runs take one to three hours (the first batches decide); each is kept as it ends (RUNS),
so a rerun cut off goes on where it stopped, on the same committed code, kind of CPU and steps.

    python bench/colocate.py                      # writes bench/results/colocate.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import KEPT, KeptRuns, code_fingerprint, cpu_model, print_table, write_result  # noqa: E402
from bench.vs_trl import ENV, FLASHQ_SETTINGS, REAL_CONFIG, breakdown, final_reward, timed_launch  # noqa: E402

COLOCATE = ["async_ratio=0", "placement.colocate=true", "placement.rollout_nice=0"]  # both on both cores, by protocol
MODES = {"colocate": COLOCATE, "turns": FLASHQ_SETTINGS["turns"], "split": FLASHQ_SETTINGS["split"]}
RUNS = KEPT / "colocate_runs.jsonl"  # each finished run, kept as it ends


def run(mode: str, work: Path, steps: int, seed: int) -> dict:
    run_dir = work / f"{mode}-{seed}"
    cmd = [sys.executable, "-m", "flashq.cli", "launch", str(REAL_CONFIG), "--no-progress", f"log.run_dir={run_dir}", "eval=null",
           f"trainer.steps={steps}", f"seed={seed}", f"task.seed={seed}", f"trainer.seed={seed}", *MODES[mode]]
    _, wall, rows = timed_launch(cmd, run_dir, f"{mode} run")
    parts = breakdown(rows)
    return {"mode": mode, "seed": seed, "steps": steps, "wall_s": wall, "steps_per_s": steps / wall,
            "final_reward": final_reward([(r["time"], r["reward/mean"]) for r in rows]),
            "trainer_compute_s": parts["trainer_compute_s"], "step_s": parts["step_s"],
            "engine_generating_s": parts["engine_generating_s"], "engine_idle_s": parts["engine_idle_s"]}


def measured_runs(steps: int, seeds: list[int]) -> list[dict]:
    """Every mode at every seed, the modes taking turns seed by seed; a run kept from before (same
    committed code, CPU model and steps) is taken as it was, each new one kept as it ends."""
    kept = KeptRuns(RUNS, {"code": code_fingerprint("bench/colocate.py", "bench/vs_trl.py"), "cpu_model": cpu_model(),
                           "steps": steps})
    with tempfile.TemporaryDirectory(prefix="flashq-colocate-") as tmp:
        return [kept.run({"mode": mode, "seed": seed}, lambda: run(mode, Path(tmp), steps, seed))
                for seed in seeds for mode in MODES]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = ap.parse_args()
    subprocess.run([sys.executable, "-m", "flashq.cli", "fetch", str(REAL_CONFIG)], cwd=ROOT, env=ENV, check=True,
                   capture_output=True)  # fetched once, before any run is timed
    rows = measured_runs(args.steps, args.seeds)
    mean = lambda mode, key: statistics.mean(r[key] for r in rows if r["mode"] == mode)  # noqa: E731
    print_table(f"real-model job on 2 CPU cores, {args.steps} steps: colocated turns against the other placements", rows,
                [("mode", "placement", ""), ("seed", "seed", "d"), ("wall_s", "wall s", ".0f"), ("steps_per_s", "steps/s", ".3f"),
                 ("step_s", "s/step", ".1f"), ("trainer_compute_s", "trainer computes", ".1f"),
                 ("engine_generating_s", "engine generates", ".1f"), ("engine_idle_s", "engine idle", ".1f"),
                 ("final_reward", "final reward", ".3f")])
    figures = {"colocate_step_speed_vs_split": mean("split", "step_s") / mean("colocate", "step_s"),
               "colocate_step_speed_vs_turns": mean("turns", "step_s") / mean("colocate", "step_s"),
               "colocate_steps_per_s_vs_split": mean("colocate", "steps_per_s") / mean("split", "steps_per_s"),
               "colocate_steps_per_s_vs_turns": mean("colocate", "steps_per_s") / mean("turns", "steps_per_s"),
               **{f"{mode}_final_reward": mean(mode, "final_reward") for mode in MODES},
               **{f"{mode}_steps_per_s": mean(mode, "steps_per_s") for mode in MODES},
               "seeds": args.seeds, "steps": args.steps, "settings": MODES}
    path = write_result("colocate", rows, figures,
                        notes="Whole `flashq launch` commands (start-up included) of configs/smollm2_arithmetic.yaml with "
                              "evaluation off; colocate at async_ratio 0 (turns leave nothing to overlap), turns and split "
                              "at the config's async_ratio 2. s/step and the per-step parts are means after each run's first 10% of "
                              "steps (colocate_step_speed_*: the other mode's s/step over colocated's); steps/s is the whole "
                              "command's, its first step a lottery of dropped groups. "
                              "Each row has the commit and date it ran at (a run cut off goes on where it stopped).")
    print(f"figures: {json.dumps(figures, indent=1)}\nwrote {path}")


if __name__ == "__main__":
    main()
