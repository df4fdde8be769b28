"""flashq against TRL's GRPOTrainer on the same job, same machine, same run.

Job A is flashq's quickstart: from the same SFT checkpoint (made once by `flashq sft`), the same
arithmetic prompts in the same order (task k of seed s), exact-match reward, 8 samples a prompt,
16 prompts a step, AdamW at a constant lr 1e-4 with gradient clipping 1.0, 6 new tokens at T = 1
over the whole vocabulary, no KL, group-normalised advantages, a token-mean clipped objective,
1500 steps. TRL generates with transformers on this CPU (its vLLM paths need vLLM <= 0.31) in one
process on both cores; flashq runs its quickstart placement (engine on core 0, the trainer,
coordinator and reward on core 1). Each system's wall time is its RL run alone (the SFT is shared).

TRL is a benchmark-only dependency:

    .venv/bin/pip install trl==1.16.0 accelerate
    python bench/vs_trl.py --seeds 3        # writes bench/results/vs_trl.json and docs/vs_trl.png

The systems take turns, seed by seed, so a drifting host slows both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, print_table, write_result  # noqa: E402

PROMPTS_PER_STEP, GROUP, MAX_TOKENS, LR = 16, 8, 6, 1e-4


def make_sft(workdir: Path) -> Path:
    out = workdir / "sft"
    cmd = [sys.executable, "-m", "flashq.cli", "sft", "configs/quickstart.yaml", f"sft.output_dir={out}"]
    subprocess.run(cmd, cwd=ROOT, check=True, env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    return out


def run_flashq(sft: Path, steps: int, seed: int, run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "flashq.cli", "launch", "configs/quickstart.yaml", "--no-progress", f"log.run_dir={run_dir}",
           f"model.name={sft}", "sft.warm_start=false", f"trainer.steps={steps}", f"seed={seed}", f"task.seed={seed}",
           f"trainer.seed={seed}"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"),
                          capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"flashq run failed:\n{proc.stdout[-4000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps_rows = [r for r in rows if r.get("kind") == "step"]
    return {"wall_s": wall, "curve": [(r["time"] - t0, r["reward/mean"]) for r in steps_rows], "breakdown": breakdown(steps_rows)}


def breakdown(steps: list[dict]) -> dict[str, float]:
    """Where a step's time goes in each role, seconds per step over the run after its first
    10% (start-up and warm-up left out). The engine's busy time includes its pauses for weight
    pushes, so generating = busy - paused."""
    a, b = len(steps) // 10, len(steps) - 1
    per_step = lambda key: (steps[b][key] - steps[a][key]) / (b - a)  # noqa: E731 - counters summed since start
    mean = lambda key: statistics.mean(r.get(key, 0.0) for r in steps[a:b])  # noqa: E731
    paused = per_step("rollout/weight_sync_s/rollout-0")
    return {
        "step_s": (steps[b]["time"] - steps[a]["time"]) / (b - a),
        "trainer_compute_s": mean("train/seconds"),
        "trainer_waits_for_batch_s": mean("trainer/wait_s"),
        "trainer_waits_for_push_s": mean("trainer/push_wait_s"),
        "push_s": mean("trainer/weight_sync_s"),
        "engine_generating_s": per_step("rollout/busy_s_total/rollout-0") - paused,
        "engine_paused_for_push_s": paused,
        "engine_idle_s": per_step("rollout/idle_s_total/rollout-0"),
    }


def _trl_main(sft: str, steps: int, seed: int, out: str) -> None:
    """One TRL run (in its own process, so each system starts cold)."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from flashq.config import ArithmeticConfig
    from flashq.data.arithmetic import ArithmeticTasks

    torch.set_num_threads(2)
    source = ArithmeticTasks(ArithmeticConfig(min_value=0, max_value=20, operators=["+"]), seed)
    tasks = [source.task(k) for k in range(steps * PROMPTS_PER_STEP)]
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": t["prompt"]}], "answer": t["answer"]} for t in tasks])

    def exact_match(completions, answer, **_):
        return [1.0 if c[0]["content"].strip() == a.strip() else 0.0 for c, a in zip(completions, answer)]

    curve: list[tuple[float, float]] = []
    t0 = time.time()

    class Clock(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                curve.append((time.time() - t0, float(logs["reward"])))

    config = GRPOConfig(
        output_dir=str(Path(out).parent / "trl-out"), seed=seed, use_cpu=True, bf16=False, report_to="none",
        save_strategy="no", logging_steps=1, max_steps=steps, shuffle_dataset=False,
        per_device_train_batch_size=PROMPTS_PER_STEP * GROUP, gradient_accumulation_steps=1, num_generations=GROUP,
        max_completion_length=MAX_TOKENS, temperature=1.0, top_k=0, top_p=1.0, beta=0.0, epsilon=0.2,
        learning_rate=LR, lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0,
        loss_type="dapo", scale_rewards="group", dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=sft, reward_funcs=exact_match, args=config, train_dataset=data, callbacks=[Clock()])
    trainer.train()
    Path(out).write_text(json.dumps({"wall_s": time.time() - t0, "curve": curve}))


def run_trl(sft: Path, steps: int, seed: int, workdir: Path) -> dict:
    out = workdir / f"trl-{seed}.json"
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from bench.vs_trl import _trl_main; _trl_main({str(sft)!r}, {steps}, {seed}, {str(out)!r})"
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false"))
    if proc.returncode != 0:
        raise SystemExit(f"TRL run failed:\n{proc.stderr[-4000:]}")
    inner = json.loads(out.read_text())
    wall = time.time() - t0  # as for flashq: the whole command, start-up included
    offset = wall - inner["wall_s"]  # imports and loading before the trainer's clock started
    return {"wall_s": wall, "curve": [(t + offset, r) for t, r in inner["curve"]]}


def final_reward(curve: list[tuple[float, float]]) -> float:
    tail = [r for _, r in curve[-max(len(curve) // 10, 1):]]
    return statistics.mean(tail)


def earlier_figures(path: Path) -> list[dict]:
    """The headline figures of the runs this one replaces, with their commits, kept in the record."""
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    figures = old.get("figures", {})
    kept = {k: v for k, v in figures.items() if k.startswith("job_") or k == "seeds"}
    return figures.get("earlier", []) + [{"git_commit": old.get("git_commit"), "date": old.get("date"), "command": old.get("command"), **kept}]


def plot(runs: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for system, color in (("flashq", "tab:blue"), ("trl", "tab:orange")):
        for i, run in enumerate(runs[system]):
            t = [x for x, _ in run["curve"]]
            r = [y for _, y in run["curve"]]
            w = 50
            smooth = [statistics.mean(r[max(0, k - w + 1) : k + 1]) for k in range(len(r))]
            ax.plot([x / 60 for x in t], smooth, color=color, alpha=0.9, label=system if i == 0 else None)
    ax.set_xlabel("wall time (min)")
    ax.set_ylabel("mean reward (50-step moving mean)")
    ax.set_title("Job A (the quickstart job): flashq vs TRL GRPOTrainer, 2 CPU cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1500)
    args = ap.parse_args()
    import trl

    with tempfile.TemporaryDirectory(prefix="flashq-vs-trl-") as tmp:
        work = Path(tmp)
        sft = make_sft(work)
        runs: dict[str, list[dict]] = {"flashq": [], "trl": []}
        for seed in range(args.seeds):  # the systems take turns
            runs["trl"].append(run_trl(sft, args.steps, seed, work))
            runs["flashq"].append(run_flashq(sft, args.steps, seed, work / f"flashq-{seed}"))

    rows = []
    for system, rs in runs.items():
        for seed, r in enumerate(rs):
            rows.append({"system": system, "seed": seed, "wall_s": r["wall_s"], "steps_per_s": args.steps / r["wall_s"],
                         "samples_per_s": args.steps * PROMPTS_PER_STEP * GROUP / r["wall_s"], "final_reward": final_reward(r["curve"])})
    mean = lambda system, key: statistics.mean(r[key] for r in rows if r["system"] == system)  # noqa: E731
    figures = {
        "seeds": args.seeds,
        "job_a_speed_vs_trl": mean("flashq", "steps_per_s") / mean("trl", "steps_per_s"),
        "job_a_speed_bound": 1.0,
        "job_a_final_reward_gap_vs_trl": mean("trl", "final_reward") - mean("flashq", "final_reward"),
        "job_a_final_reward_gap_bound": 0.03,
        "versions": {"trl": trl.__version__, "flashq_commit": None},
        "settings": {"prompts_per_step": PROMPTS_PER_STEP, "samples_per_prompt": GROUP, "max_tokens": MAX_TOKENS, "lr": LR,
                     "steps": args.steps, "trl": "GRPOConfig(loss_type=dapo, scale_rewards=group, beta=0, top_k=0, "
                     "lr_scheduler_type=constant, use_cpu, 2 torch threads, transformers generate)",
                     "flashq": "configs/quickstart.yaml (async_ratio 2, ppo + tis_token, token_mean), SFT warm start replaced by the shared checkpoint"},
    }
    from bench.common import git_commit

    figures["versions"]["flashq_commit"] = git_commit()
    print_table("Job A: flashq vs TRL GRPOTrainer", rows, [("system", "system", ""), ("seed", "seed", "d"), ("wall_s", "wall s", ".0f"),
                ("steps_per_s", "steps/s", ".2f"), ("samples_per_s", "samples/s", ".0f"), ("final_reward", "final reward", ".3f")])
    parts = [{"seed": seed, **r["breakdown"]} for seed, r in enumerate(runs["flashq"])]
    figures["job_a_flashq_breakdown"] = {k: statistics.mean(p[k] for p in parts) for k in parts[0] if k != "seed"}
    print_table("Job A: where a flashq step's time goes (s per step, after the first 10%)", parts,
                [("seed", "seed", "d")] + [(k, k.removesuffix("_s"), ".3f") for k in parts[0] if k != "seed"])
    print({k: v for k, v in figures.items() if k not in ("settings", "versions", "job_a_flashq_breakdown")})
    plot(runs, ROOT / "docs" / "vs_trl.png")
    figures["earlier"] = earlier_figures(RESULTS / "vs_trl.json")
    write_result("vs_trl", rows, figures, notes="Job A only; job B (a natural long tail) is not built yet.")
    (RESULTS / "vs_trl_curves.json").write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
