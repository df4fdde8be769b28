"""Where the quickstart's SFT ends, without RL: per seed, SFT alone (configs/quickstart.yaml plus
overrides), then greedy accuracy on the RL run's held-out sums, decoded with transformers. The
quickstart's SFT settings are calibrated with it (bench/results/quickstart_calibration.json);
it prints rows and writes no result file, as calibration is never reported as a figure.

    python bench/sft_only.py sft.stop_at_greedy_accuracy=0.72 --seeds 1 2 100 101 102
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flashq.config import load_config
    from flashq.data import evaluation_tasks
    from flashq.rewards import load_reward_fn
    from flashq.sft import evaluate, run_sft

    from bench.quickstart import seed_overrides

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="config overrides")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 100, 101, 102])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="flashq-sft-only-") as tmp:
        for seed in args.seeds:
            out = Path(tmp) / f"sft-{seed}"
            cfg = load_config(ROOT / "configs/quickstart.yaml", [*seed_overrides(seed), f"sft.output_dir={out}", *args.overrides])
            t0 = time.monotonic()
            run_sft(cfg)
            sft_s = time.monotonic() - t0
            summary = json.loads((out / "flashq_sft.json").read_text())
            held = evaluation_tasks(cfg)
            source = type("HeldOut", (), {"task": lambda self, i: held[i]})()
            model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
            result = evaluate(model, AutoTokenizer.from_pretrained(str(out)), source, cfg.task.system_prompt,
                              load_reward_fn(cfg.reward.function), len(held), cfg.sampling.max_tokens, torch.device("cpu"), modes=("greedy",))
            print(json.dumps({"seed": seed, "heldout_greedy": result["greedy_accuracy"], "heldout_n": len(held), "sft_steps": summary["steps"],
                              "train_greedy": summary.get("greedy_accuracy"), "sft_s": round(sft_s, 1),
                              "stop_checks": summary.get("stop_checks")}), flush=True)


if __name__ == "__main__":
    main()
