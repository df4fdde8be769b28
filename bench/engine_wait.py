"""How vLLM's engine core waits for its worker, on the CPU backend: spinning (vLLM's own) vs
napping (flashq's default on CPU, `rollout.engine_wait`).

Each run is a full synchronous `flashq launch` of the long-tail workload (bench/configs/sched.yaml:
two vLLM rollout workers on two cores, FIFO), so the engine cores compete for the cores with their
workers as they do in every CPU run. The engines run vLLM's multiprocess executor (`mp`), whose
worker is a process of its own behind the shared-memory queue the two modes wait on, as with
several ranks: a one-rank CPU engine runs its worker inside the engine core (cebb29b) and waits on
no queue, so from cebb29b until this was set the two modes ran the same code (1.18x at ff25a2b,
1.07x at 1378258, 0.94-1.01x at df252e2-2889437: the host's noise). The two modes alternate, so drift of the host hits both.
Per step: output tokens per second of rollout (step 0, the engines' warm-up, is left out); per
mode: the mean, and the spread across steps and runs (coefficient of variation).

    python bench/engine_wait.py                 # 2 runs per mode, 5 steps each
    python bench/engine_wait.py --runs 3 trainer.steps=8
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import print_table, write_result  # noqa: E402
from bench.longtail import run, summarize  # noqa: E402

MODES = ("spin", "nap")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2, help="runs per mode, alternated")
    ap.add_argument("overrides", nargs="*", help="config overrides applied to every run")
    args = ap.parse_args()
    # the worker in a process of its own, where the wait applies; such an engine cannot receive pushes while it generates
    overrides = ["trainer.steps=5", "rollout.engine_kwargs.distributed_executor_backend=mp", *args.overrides]

    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="flashq-engine-wait-") as tmp:
        for i in range(args.runs):
            for mode in MODES:
                row = summarize(mode, run(f"{mode}-{i}", ["rollout.scheduler=fifo", f"rollout.engine_wait={mode}"], overrides,
                                          Path(tmp) / f"{mode}-{i}", skip_first=1))
                rates = [s["tokens"] / s["makespan_s"] for s in row["per_step"]]
                runs.append({"mode": mode, "run": i, "makespan_s": row["makespan_s"], "step_tokens_per_s": rates,
                             "per_step": [{k: s[k] for k in ("step", "makespan_s", "tail_s", "tokens")} for s in row["per_step"]]})
                print(f"{mode} run {i}: makespan {row['makespan_s']:.2f}s, tokens/s per step {[round(r) for r in rates]}", flush=True)
    rows = []
    for mode in MODES:
        rates = np.concatenate([r["step_tokens_per_s"] for r in runs if r["mode"] == mode])
        rows.append({"mode": mode, "steps": len(rates), "makespan_s": float(np.mean([r["makespan_s"] for r in runs if r["mode"] == mode])),
                     "tokens_per_s": float(rates.mean()), "min": float(rates.min()), "max": float(rates.max()),
                     "cv": float(rates.std() / rates.mean())})
    spin, nap = rows
    for r in rows:
        r["tokens_per_s_vs_spin"] = r["tokens_per_s"] / spin["tokens_per_s"]
    print_table(
        "engine core waiting for its worker: spin vs nap (2 engines on 2 cores, FIFO, per step)",
        rows,
        [("mode", "mode", ""), ("steps", "steps", "d"), ("makespan_s", "makespan s", ".2f"), ("tokens_per_s", "tokens/s", ",.0f"),
         ("min", "min", ",.0f"), ("max", "max", ",.0f"), ("cv", "spread (cv)", ".0%"), ("tokens_per_s_vs_spin", "vs spin", ".2f")],
    )
    figures = {"nap_tokens_per_s_vs_spin": nap["tokens_per_s_vs_spin"], "nap_makespan_vs_spin": nap["makespan_s"] / spin["makespan_s"],
               "spin_step_cv": spin["cv"], "nap_step_cv": nap["cv"]}
    path = write_result("engine_wait", {"modes": rows, "runs": runs}, figures,
                        notes="Synchronous steps of bench/configs/sched.yaml under FIFO, engines on vLLM's mp executor (the "
                              "worker behind the shared-memory queue the modes wait on; from cebb29b to 2889437 the one-rank "
                              "engines ran in one process and both modes ran the same code); tokens/s = a step's output tokens over "
                              "its rollout makespan; runs alternate between the modes.")
    print(f"figures: {figures}\nwrote {path}")


if __name__ == "__main__":
    main()
