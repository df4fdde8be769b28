"""Long-tail scheduling on the real engine: FIFO vs context-aware vs context-aware + divided vs
an oracle, on one replayed workload (bench/configs/sched.yaml).

Each policy is a full synchronous `flashq launch` (two vLLM rollout workers, reward, trainer with
weight sync), so every step's rollout is one phase: all of the step's requests are admitted
together and the step's makespan runs from the first request sent to the last response back.
Tail time is the part of it after 90% of the step's responses were back (Seer's "last 10%").
The request trace (`requests.jsonl`) gives both, per step; the table shows means over steps.
The policies take turns over `--rounds` rounds, so a drifting host slows them alike; the figures
pool every round's steps and list each round's ratio beside them.

The divided chunk size is chosen before the reported runs, on calibration runs of their own:
context-aware scheduling undivided and divided at each of `--chunk`, once each, on other replayed
lengths (`sampling.forced_lengths.seed` 2, against 1 for the reported runs). The smallest chunk
whose steps cost at most 5% over undivided there (`pick_chunk`) is the one the reported runs use.
A separate measurement gives the engine's share of a chunk's cost, with the prefix cache on and
off (`chunk_overhead`).

    python bench/longtail.py                     # writes bench/results/longtail.json
    python bench/longtail.py --rounds 2 trainer.steps=6   # each policy twice, 5 measured steps a run
    python bench/longtail.py --chunk 128 256     # calibrate the chunk over these sizes (default 64 128 256)
    python bench/longtail.py --overhead-only     # only the engine's share of what a chunk costs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import plot_path, print_table, write_result  # noqa: E402
from flashq.config import load_config  # noqa: E402
from flashq.scheduling.lengths import forced_length  # noqa: E402

CONFIG = ROOT / "bench" / "configs" / "sched.yaml"


CALIBRATION = ["sampling.forced_lengths.seed=2"]  # other lengths than the reported runs' (seed 1)


# The long-tail issue's bounds on divided rollout with context-aware scheduling: the tail at most a
# quarter of FIFO's, the whole step within 10% of an oracle that knows every length in advance.
BOUNDS = {"tail_time_vs_fifo": "<= 0.25", "makespan_vs_oracle": "<= 1.10"}


def divided(chunk: int) -> tuple[str, list[str]]:
    return f"context_aware+divided/{chunk}", ["rollout.scheduler=context_aware", f"rollout.chunk_tokens={chunk}"]


def policies(chunk: int) -> list[tuple[str, list[str]]]:
    """The reported comparison, divided rollout at the calibrated chunk."""
    return [("fifo", ["rollout.scheduler=fifo"]), ("context_aware", ["rollout.scheduler=context_aware"]), divided(chunk),
            ("oracle", ["rollout.scheduler=oracle"])]


def step_times(trace: list[dict]) -> list[dict]:
    by_step: dict[int, list[dict]] = {}
    for r in trace:
        by_step.setdefault(r["admitted_version"], []).append(r)
    out = []
    for step in sorted(by_step):
        rs = by_step[step]
        start = min(r["sent"] for r in rs)
        done = np.sort([r["finished"] for r in rs]) - start
        t90 = float(done[int(np.ceil(0.9 * len(done))) - 1])
        out.append({"step": step, "requests": len(rs), "makespan_s": float(done[-1]), "tail_s": float(done[-1] - t90),
                    "tokens": int(sum(r["tokens"] for r in rs)), "finish_s": [round(float(t), 4) for t in done]})
    return out


def run(name: str, overrides: list[str], extra: list[str], run_dir: Path, skip_first: int) -> list[dict]:
    """One `flashq launch` of the workload under `overrides`: its steps, the first `skip_first` left out."""
    cmd = [sys.executable, "-m", "flashq.cli", "launch", str(CONFIG), "--no-progress", f"log.run_dir={run_dir}", *overrides, *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stdout[-3000:]}")
    trace = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    return step_times(trace)[skip_first:]


def summarize(name: str, steps: list[dict]) -> dict:
    return {
        "policy": name,
        "steps_measured": len(steps),
        "makespan_s": float(np.mean([s["makespan_s"] for s in steps])),
        "tail_s": float(np.mean([s["tail_s"] for s in steps])),
        "tail_share": float(np.mean([s["tail_s"] / s["makespan_s"] for s in steps])),
        "tokens_per_s": float(np.sum([s["tokens"] for s in steps]) / np.sum([s["makespan_s"] for s in steps])),
        "per_step": steps,
    }


def plot(rows: list[dict], path: Path) -> None:
    """Left: mean step makespan split into the first 90% of responses and the tail. Right: how
    many of a step's responses are back over time (all measured steps pooled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = [r["policy"] for r in rows]
    body = [r["makespan_s"] - r["tail_s"] for r in rows]
    ax1.barh(names, body, color="tab:blue", label="first 90% of responses")
    ax1.barh(names, [r["tail_s"] for r in rows], left=body, color="tab:red", label="last 10% (tail)")
    ax1.invert_yaxis()
    ax1.set_xlabel("seconds per step (mean)")
    ax1.legend(loc="lower right", fontsize=8)
    for r in rows:
        times = np.sort(np.concatenate([s["finish_s"] for s in r["per_step"]]))
        frac = np.arange(1, len(times) + 1) / len(times)
        ax2.plot(times, frac, label=r["policy"])
    ax2.set_xlabel("seconds since the step's first request")
    ax2.set_ylabel("share of responses back")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    fig.suptitle("long-tail rollout on the real engine: the same replayed lengths under each scheduler")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def workload(extra: list[str]) -> dict:
    cfg = load_config(CONFIG, extra)
    fl, n = cfg.sampling.forced_lengths, cfg.sampling.group_size
    per_step = cfg.trainer.batch_groups * n
    lengths = np.array([forced_length(fl, i, n) for i in range(cfg.total_groups * n)])
    return {
        "requests_per_step": per_step,
        "median_tokens": float(np.median(lengths)),
        "mean_tokens": float(lengths.mean()),
        "max_over_median": float(lengths.max() / np.median(lengths)),
        "engine_batch": cfg.rollout.max_num_seqs,
        "rollout_workers": cfg.rollout.num_workers,
    }


CHUNK_BUDGET = 1.05  # a chunk size may cost at most this much step time over undivided rollout


def chunk_overhead(chunks: list[int], extra: list[str], repeats: int = 3, length: int = 512) -> list[dict]:
    """What dividing costs the engine: two batches' worth of forced-length responses generated
    whole and in chunks, on flashq's own engine (`RolloutEngine`, napping as on any CPU run) with
    its own `DividedRollout`, each continuation sent the moment its chunk is back. The engine and
    this process share one core, as each of the workload's two workers has one core's worth of the
    host. With the prefix cache on and off: the cache is what keeps re-prefill cheap. Sizes take
    turns `repeats` times; each row is the median. This is the engine's share of what a chunk
    costs; the runs add the rest (a round trip through the coordinator per chunk), and the chunk
    size is picked from them (`pick_chunk`)."""
    import asyncio
    import time

    from flashq.engine.vllm_engine import RolloutEngine
    from flashq.models.tiny import TinyModelSpec, ensure_tiny_model
    from flashq.scheduling.divided import DividedRollout
    from flashq.wire.protocol import GenerateRequest

    model = ensure_tiny_model(TinyModelSpec(), ROOT / ".cache" / "flashq")
    seconds: dict[tuple[bool, int], list[float]] = {}

    async def generate(engine: RolloutEngine, chunk: int, tag: str) -> float:
        divided = DividedRollout(chunk if chunk < length else 0)
        n = 2 * engine.cfg.rollout.max_num_seqs

        async def one(i: int) -> None:
            prompt = np.array([2, 100 + i, 120, 14, 53, 47, 9 + i % 7], dtype=np.int32)
            req = divided.first(GenerateRequest(f"{tag}-{i}", f"g{i}", prompt, max_tokens=length, min_tokens=length))
            while True:
                done = divided.on_chunk(req, await engine.generate(req))
                if not isinstance(done, GenerateRequest):
                    return
                req = done

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - t0

    async def measure(cache: bool) -> None:
        cfg = load_config(CONFIG, [*extra, f"rollout.engine_kwargs={{enable_prefix_caching: {str(cache).lower()}}}"])
        engine = RolloutEngine(cfg, model, 0, "cpu")
        await engine.start()
        try:
            await generate(engine, length, "warm")  # not timed
            sizes = [length, *chunks]
            for rep in range(repeats):
                for k, chunk in enumerate(sizes[rep % len(sizes):] + sizes[: rep % len(sizes)]):
                    seconds.setdefault((cache, chunk), []).append(await generate(engine, chunk, f"r{rep}-{k}"))
        finally:
            await engine.shutdown()

    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})  # inherited by the engine's processes
    try:
        for cache in (True, False):
            asyncio.run(measure(cache))
    finally:
        os.sched_setaffinity(0, cores)
    out = []
    for (cache, chunk), times in seconds.items():
        whole = float(np.median(seconds[(cache, length)]))
        out.append({"prefix_cache": cache, "chunk_tokens": chunk, "seconds": float(np.median(times)),
                    "runs_s": [round(t, 3) for t in times], "time_vs_whole": float(np.median(times)) / whole})
    return out


def pick_chunk(by_policy: dict[str, dict], chunks: list[int]) -> int:
    """The smallest chunk (the finest re-balancing) whose calibration run's mean step makespan is
    within CHUNK_BUDGET of undivided context-aware scheduling on the same steps; the largest if none is."""
    undivided = by_policy["context_aware"]["makespan_s"]
    cost = {c: by_policy[f"context_aware+divided/{c}"]["makespan_s"] / undivided for c in chunks}
    fits = [c for c in sorted(cost) if cost[c] <= CHUNK_BUDGET]
    return fits[0] if fits else max(cost)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunk", type=int, nargs="+", default=[64, 128, 256],
                    help="divided rollout chunk sizes calibrated over; the reported runs use the picked one (pick_chunk)")
    ap.add_argument("--overhead-only", action="store_true", help="only measure the engine's share of a chunk's cost")
    ap.add_argument("--skip-first", type=int, default=1, help="steps left out of the means (engine warm-up)")
    ap.add_argument("--rounds", type=int, default=3, help="reported runs of each policy, taking turns; their steps are pooled")
    ap.add_argument("--keep", type=Path, help="keep the run directories here (bench/sim.py reads them)")
    ap.add_argument("overrides", nargs="*", help="config overrides applied to every run")
    args = ap.parse_args()

    wl = workload(args.overrides)
    print(f"workload: {wl}", flush=True)
    chunks = sorted(set(args.chunk))
    overhead = chunk_overhead(sorted({32, *chunks}), args.overrides)
    print_table(
        f"cost of dividing 512-token responses into chunks ({2 * wl['engine_batch']} requests, engine batch "
        f"{wl['engine_batch']}; median of 3 interleaved runs)",
        overhead,
        [("prefix_cache", "prefix cache", ""), ("chunk_tokens", "chunk", "d"), ("seconds", "seconds", ".2f"), ("time_vs_whole", "vs whole", ".2f")],
    )
    if args.overhead_only:
        return
    with tempfile.TemporaryDirectory(prefix="flashq-longtail-") as tmp:
        root = args.keep or Path(tmp)

        def measure(name: str, policy: list[str], extra: list[str], tag: str) -> dict:
            run_dir = root / f"sched-{name.replace('/', '-').replace('+', '-')}-{tag}"
            row = summarize(name, [{**s, "round": tag} for s in run(name, policy, [*args.overrides, *extra], run_dir, args.skip_first)])
            print(f"{tag} {name}: makespan {row['makespan_s']:.2f}s, tail {row['tail_s']:.2f}s", flush=True)
            return row

        calibration = [measure(name, policy, CALIBRATION, "calibration")
                       for name, policy in [("context_aware", ["rollout.scheduler=context_aware"]), *map(divided, chunks)]]
        picked = pick_chunk({r["policy"]: r for r in calibration}, chunks)
        print(f"picked chunk: {picked} tokens (the smallest whose calibration steps took at most {CHUNK_BUDGET:.2f}x undivided)")
        by_round = [{name: measure(name, policy, [], f"round {rnd}") for name, policy in policies(picked)}
                    for rnd in range(args.rounds)]  # policies take turns, so the host's drift hits them alike
    rows = [summarize(name, [s for rnd in by_round for s in rnd[name]["per_step"]]) for name, _ in policies(picked)]
    by_policy = {r["policy"]: r for r in rows}
    fifo, oracle, undivided = by_policy["fifo"], by_policy["oracle"], by_policy["context_aware"]
    for r in rows:
        r["tail_vs_fifo"] = r["tail_s"] / fifo["tail_s"]
        r["makespan_vs_fifo"] = r["makespan_s"] / fifo["makespan_s"]
        r["makespan_vs_oracle"] = r["makespan_s"] / oracle["makespan_s"]
    print_table(
        "long-tail scheduling: same replayed lengths, 2 rollout workers (means over steps)",
        rows,
        [("policy", "policy", ""), ("makespan_s", "makespan s", ".2f"), ("tail_s", "tail s (last 10%)", ".2f"),
         ("tail_share", "tail share", ".0%"), ("tail_vs_fifo", "tail vs FIFO", ".2f"),
         ("makespan_vs_fifo", "makespan vs FIFO", ".2f"), ("makespan_vs_oracle", "vs oracle", ".2f"),
         ("tokens_per_s", "tokens/s", ",.0f")],
    )
    plot(rows, plot_path("longtail.png"))
    best = divided(picked)[0]
    chosen = by_policy[best]
    figures = {
        "tail_time_vs_fifo": chosen["tail_vs_fifo"],
        "tail_time_vs_fifo_by_round": [rnd[best]["tail_s"] / rnd["fifo"]["tail_s"] for rnd in by_round],
        "makespan_vs_oracle": chosen["makespan_vs_oracle"],
        "makespan_vs_fifo": chosen["makespan_vs_fifo"],
        "makespan_vs_fifo_by_round": [rnd[best]["makespan_s"] / rnd["fifo"]["makespan_s"] for rnd in by_round],
        "context_aware_tail_time_vs_fifo": undivided["tail_vs_fifo"],
        "context_aware_tail_time_vs_fifo_by_round": [rnd["context_aware"]["tail_s"] / rnd["fifo"]["tail_s"] for rnd in by_round],
        "divided_chunk_tokens": picked,
        "divided_makespan_vs_undivided": chosen["makespan_s"] / undivided["makespan_s"],
        "bounds": BOUNDS,
    }
    for cache in (True, False):  # the engine's share of that cost, and what the prefix cache saves of it
        figures[f"engine_chunk_overhead_{'with' if cache else 'without'}_prefix_cache"] = next(
            r["time_vs_whole"] for r in overhead if r["prefix_cache"] == cache and r["chunk_tokens"] == picked)
    calibrated = [{k: v for k, v in r.items() if k != "per_step"} for r in calibration]
    path = write_result("longtail", {"workload": wl, "runs": rows, "calibration": calibrated, "chunk_overhead": overhead},
                        figures,
                        notes="Synchronous steps on the real engine; makespan from the first request sent to the last "
                              "response back, per step; tail = makespan minus the time 90% of responses were back. The "
                              "chunk size was picked on calibration runs over other replayed lengths (results.calibration), "
                              f"before the {args.rounds} reported rounds.")
    print(f"figures: {figures}\nwrote {path}")


if __name__ == "__main__":
    main()
