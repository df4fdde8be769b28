"""LoRA against full fine-tuning: what a push carries, what the trainer holds, what RL learns.

Two parts, each running both modes in the same invocation on the same machine:

- scale: the whole loop at Qwen2.5-0.5B's real size (random weights; bench/scale_loop.py's run:
  vLLM serves bfloat16 on core 0, the trainer computes in bfloat16 on core 1), once with full
  fine-tuning (float32 masters) and once with `trainer.lora` (rank 16, alpha 32, every linear
  layer of the decoder; the base frozen in bfloat16). Figures: bytes per push and push seconds
  (median over steps 2+), and the trainer process's peak RSS, LoRA over full.
- reward: the quickstart as a user runs it (`bash launch/quickstart.sh`: SFT, then async GRPO at
  alpha 2), once as it is and once with `trainer.lora.rank=16 trainer.lr=1e-3`. The LoRA lr is
  10x the full run's, the ratio "LoRA Without Regret" (Schulman et al., Thinking Machines, 2025)
  found optimal across tasks; it was set before any LoRA run, not tuned on this task.

LoRA engines serve as `trainer.lora.serve` defaults (merged into their weights since cae575e; the
figures in `figures.earlier` from before it were served by vLLM's LoRA layers).

    python bench/lora.py                       # both parts: bench/results/lora.json
    python bench/lora.py --parts reward        # one part; the other's figures are kept
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, command_line, git_commit, print_table, write_result  # noqa: E402

LORA_SCALE = ("trainer.lora.rank=16", "trainer.lora.alpha=32")
SCALE_BOTH = ("eval=null",)  # the loop's evaluation rounds measure neither pushes nor the trainer's memory
LORA_REWARD = ("trainer.lora.rank=16", "trainer.lr=1e-3")
BOUNDS = {"adapter_push_bytes_vs_full": 0.05, "lora_reward_gain": 0.2, "lora_wall_minutes": 15.0, "trainer_peak_memory_vs_full": 0.5}


def scale(steps: int) -> dict:
    from bench.scale_loop import run_loop
    from flashq.models.real_size import RealSizeSpec, ensure_real_size_model

    model = ensure_real_size_model(RealSizeSpec(preset="qwen2.5-0.5b"), ROOT / ".cache" / "flashq")
    rows = {}
    for mode, extra in (("full", SCALE_BOTH), ("lora", (*SCALE_BOTH, *LORA_SCALE))):
        run_dir = Path(tempfile.mkdtemp(prefix=f"flashq-lora-scale-{mode}-"))
        try:
            loop = run_loop(model, run_dir, steps, extra)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
        rows[mode] = {
            "mode": mode, "overrides": loop["overrides"], "steps": loop["steps"], "wall_s": loop["wall_s"],
            "push_bytes": loop["push_bytes"][-1], "push_s": statistics.median(loop["weight_sync_s"][1:]),
            "train_s": statistics.median(loop["train_s"][1:]), "trainer_peak_rss_gib": loop["peak_rss_gib"]["trainer"],
            "peak_rss_gib": loop["peak_rss_gib"], "weight_sync_s": loop["weight_sync_s"], "reward_mean": loop["reward_mean"],
        }
    full, lora = rows["full"], rows["lora"]
    print_table("Qwen2.5-0.5B size (random weights), 2 CPU cores: full fine-tuning vs LoRA", list(rows.values()), [
        ("mode", "mode", ""), ("push_bytes", "bytes / push", ",.0f"), ("push_s", "push s", ".3f"),
        ("train_s", "train s / step", ".1f"), ("trainer_peak_rss_gib", "trainer peak RSS GiB", ".2f")])
    return {"rows": rows, "figures": {
        "adapter_push_bytes_vs_full": lora["push_bytes"] / full["push_bytes"],
        "adapter_push_s": lora["push_s"], "full_push_s": full["push_s"],
        "trainer_peak_memory_vs_full": lora["trainer_peak_rss_gib"] / full["trainer_peak_rss_gib"],
    }}


def quickstart(extra: tuple[str, ...]) -> dict:
    from bench.quickstart import run_quickstart

    with tempfile.TemporaryDirectory(prefix="flashq-lora-quickstart-") as tmp:
        wall, s = run_quickstart(Path(tmp) / "run", Path(tmp) / "sft", extra)
    return {"overrides": list(extra), "wall_minutes": wall / 60, "reward_start": s["reward_start"], "reward_final": s["reward_final"],
            "reward_gain": s["reward_gain"], "eval_greedy_gain": s.get("eval_greedy_accuracy_gain"),
            "staleness_violations": s["staleness_violations"], "weight_sync_s": s["weight_sync_s"], "tokens_per_s": s["tokens_per_s"]}


def reward() -> dict:
    rows = {"full": {"mode": "full", **quickstart(())}, "lora": {"mode": "lora", **quickstart(LORA_REWARD)}}
    print_table("the quickstart (SFT, then async GRPO at alpha 2) on 2 CPU cores: full fine-tuning vs LoRA", list(rows.values()), [
        ("mode", "mode", ""), ("wall_minutes", "wall min", ".1f"), ("reward_start", "reward after SFT", ".3f"),
        ("reward_final", "final", ".3f"), ("reward_gain", "gain", "+.3f"), ("eval_greedy_gain", "held-out greedy gain", "+.3f"),
        ("weight_sync_s", "push s", ".3f")])
    return {"rows": rows, "figures": {
        "lora_reward_gain": rows["lora"]["reward_gain"], "lora_wall_minutes": rows["lora"]["wall_minutes"],
        "full_reward_gain": rows["full"]["reward_gain"], "full_wall_minutes": rows["full"]["wall_minutes"],
    }}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", nargs="+", choices=["scale", "reward"], default=["scale", "reward"])
    ap.add_argument("--steps", type=int, default=6, help="steps of each 0.5B run")
    args = ap.parse_args()

    path = RESULTS / "lora.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    results, figures = dict(old.get("results") or {}), dict(old.get("figures") or {})
    for part in args.parts:
        out = scale(args.steps) if part == "scale" else reward()
        before = {k: figures[k] for k in out["figures"] if k in figures}
        if before:  # a re-run keeps what the last one measured beside it
            figures.setdefault("earlier", []).append({**before, **{k: (results.get(part) or {}).get(k) for k in ("command", "git_commit", "date")}})
        results[part] = {"command": command_line(), "git_commit": git_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                         "rows": out["rows"]}
        figures.update(out["figures"])
    for name, bound in BOUNDS.items():
        if name in figures:
            above = name in ("lora_reward_gain",)
            ok = figures[name] >= bound if above else figures[name] <= bound
            figures[f"{name}_bound"] = bound
            print(f"{name}: {figures[name]:.4g} ({'>=' if above else '<='} {bound}: {'met' if ok else 'FAILS'})")
    write_result("lora", results, figures, notes=(
        "scale: bench/scale_loop.py's 0.5B loop (random weights, pinned: engine core 0, trainer core 1) with and without "
        f"{' '.join(LORA_SCALE)}; push bytes from the trainer's trainer/push_bytes, push seconds the median of steps 2+, "
        "peak RSS of the trainer's process. LoRA engines serve trainer.lora.serve's default (merged since cae575e, "
        "vLLM's LoRA layers before). reward: `bash launch/quickstart.sh` with and without "
        f"{' '.join(LORA_REWARD)} (lr 10x full fine-tuning's, set a priori); reward_gain as in bench/quickstart.py."))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
