"""The trainer on a GPU at Qwen2.5-1.5B's real size: memory and time of whole RL steps through
flashq's own `Learner.train_step` on one rank holding the whole model (unsharded), one minibatch
a step and no KL reference model (the 1.5B configs train 4 minibatches a batch, over 4 FSDP2 ranks).

The model is the published architecture with seeded random weights (flashq/models/real_size.py,
built on the machine: nothing is downloaded). One batch is one rank's share of the 8-GPU config's
1,024 samples: 16 groups of 16, GSM8K-like lengths (prompts 100-250 tokens, responses log-normal
around 300 tokens, capped at 1,536, the config's max_tokens), random token ids, behaviour
logprobs of a uniform policy, 0/1 rewards. What it computes is meaningless; what it costs is not.

Each setting runs in its own process, so its peak memory is its own:
  1. build the Learner (float32 masters and AdamW unless --param-dtype says otherwise), train one
     step: gradients and Adam state now exist;
  2. reset the peak counter, train --steps more steps on the same batch; report the mean step
     time, the peak allocated and reserved memory, and how many of the bf16-cast weights (what a
     push sends to vLLM) one step changed.
Settings ("path"):
  flashq   flashq's logprob head (only the loss's positions projected, 1,024 rows at a time)
  naive    the same Learner step through `naive_token_logprobs`, the reference the tests compare
           against: float32 logits, log-softmax and entropy over the whole vocabulary at every
           position (the trainer before the head computed no entropy: about 3 fewer such tensors)
--shipped CONFIG measures one setting, "shipped:<config name>": that config's own trainer section
(minibatches, KL reference, loss, micro-batching, dtypes) and sampling, unchanged, on one rank
holding the whole model; the batch is one rank's share of the config's (batch_groups / world_size
groups of group_size), responses capped at its max_tokens, the preset matching its model.
A setting that runs out of GPU memory is recorded as "did not fit" with the allocator's message;
one that fails otherwise or outlasts --timeout-s, with its exit or the limit.

    python bench/trainer_gpu.py                     # on a CUDA machine, 1.5B, the settings below
    python bench/trainer_gpu.py --shipped configs/gpu/gsm8k-qwen2.5-0.5b.yaml --append
                                                    # one config's trainer as shipped (below)
    python bench/trainer_gpu.py --device cpu --preset qwen2.5-0.5b --layers 2 --groups 1 --group-size 4 \
        --median-len 40 --max-tokens 64 --out none  # a smoke test of the script itself
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 2**30
RESULT_TAG = "TRAINER_GPU_RESULT "
# (label, path, micro_batch_tokens, gradient_checkpointing, param_dtype, micro_batch_overhead_tokens),
# most telling first. With the CPU's overhead (128 tokens, the default on a CPU; these rows were measured when it
# was the default everywhere) the split into micro-batches minimises padding and, on this batch, never fills even
# 8,192 tokens; an overhead of 2,048 (the default on a GPU since 37910f2) fills them to the budget
SETTINGS = [
    ("config", "flashq", 16384, True, "float32", 128),
    ("naive-16k", "naive", 16384, True, "float32", 128),
    ("micro-32k", "flashq", 32768, True, "float32", 128),
    ("no-ckpt-16k", "flashq", 16384, False, "float32", 128),
    ("micro-8k", "flashq", 8192, True, "float32", 128),
    ("bf16-masters", "flashq", 16384, True, "bfloat16", 128),
    ("naive-8k", "naive", 8192, True, "float32", 128),
    ("filled-16k", "flashq", 16384, True, "float32", 2048),
    ("naive-filled-16k", "naive", 16384, True, "float32", 2048),
    ("filled-32k", "flashq", 32768, True, "float32", 2048),
]


# ----------------------------------------------------------------------------- child: one setting


def make_batch(a, vocab: int):
    """One rank's batch: `groups` prompts, `group_size` responses each (seeded)."""
    import numpy as np

    from flashq.wire.protocol import TrainBatch

    rng = np.random.default_rng(0)
    n = a.groups * a.group_size
    prompt_lens = np.repeat(rng.integers(100, 251, a.groups), a.group_size)
    resp_lens = np.minimum(np.maximum(rng.lognormal(np.log(a.median_len), 0.7, n).astype(int), 8), a.max_tokens)
    prompts = [rng.integers(300, vocab, p) for p in prompt_lens]
    prompt_ids = np.concatenate([prompts[g * a.group_size] for g in range(a.groups) for _ in range(a.group_size)]).astype(np.int32)
    response_ids = rng.integers(300, vocab, int(resp_lens.sum())).astype(np.int32)
    rewards = rng.integers(0, 2, n).astype(np.float32)
    batch = TrainBatch(
        batch_index=0,
        request_ids=[f"r{i}" for i in range(n)],
        group_index=np.repeat(np.arange(a.groups), a.group_size).astype(np.int32),
        rewards=rewards,
        prompt_ids=prompt_ids,
        prompt_offsets=np.concatenate([[0], np.cumsum(prompt_lens)]).astype(np.int64),
        response_ids=response_ids,
        response_offsets=np.concatenate([[0], np.cumsum(resp_lens)]).astype(np.int64),
        logprobs=np.full(len(response_ids), -float(np.log(vocab)), np.float32),
        versions=np.zeros(len(response_ids), np.int32),
        finish_reasons=["length" if r >= a.max_tokens else "stop" for r in resp_lens],
    )
    batch.validate()
    return batch, int(prompt_lens.sum()), int(resp_lens.sum())


def use_naive_logprobs() -> None:
    """Route the Learner's logprobs through full float32 logits (the head left unbound)."""
    import torch

    from flashq.trainer import learner
    from flashq.trainer.logprobs import naive_token_logprobs

    def naive(model, input_ids, attention_mask, temperature, select=None, banned=None, position_ids=None):
        logp, entropy = naive_token_logprobs(model, input_ids, attention_mask, temperature, banned)
        if select is None:
            select = attention_mask[:, 1:].bool()
        return torch.where(select, logp, 0.0), torch.where(select, entropy, 0.0)

    learner.token_logprobs = naive


def child(a) -> dict:
    from flashq.config import load_config

    if a.shipped:
        return shipped_child(a)
    label, path, micro, ckpt, param_dtype, overhead = next(s for s in SETTINGS if s[0] == a.setting)
    cfg = load_config(None, [
        f"model.name={a.model}", f"trainer.device={a.device}", f"trainer.param_dtype={param_dtype}",
        "trainer.compute_dtype=bfloat16", f"trainer.gradient_checkpointing={str(ckpt).lower()}",
        f"trainer.micro_batch_tokens={micro}", f"trainer.micro_batch_overhead_tokens={overhead}", f"sampling.max_tokens={a.max_tokens}", f"sampling.group_size={a.group_size}",
        f"trainer.batch_groups={a.groups}", "trainer.lr=1e-6", "trainer.loss.policy=ppo", "trainer.loss.correction=tis_token",
        f"rollout.max_model_len={a.max_tokens + 256}", "trainer.share_prompts=false",
    ])
    if path == "naive":
        use_naive_logprobs()
    row = {"label": label, "path": path, "micro_batch_tokens": micro, "micro_batch_overhead_tokens": overhead,
           "grad_ckpt": ckpt, "param_dtype": param_dtype, "compute_dtype": "bfloat16"}
    return measure(a, cfg, row)


def shipped_child(a) -> dict:
    """A config file's trainer exactly as shipped, on one unsharded rank."""
    from flashq.config import load_config

    cfg = load_config(a.shipped, [f"model.name={a.model}", f"trainer.device={a.device}", "trainer.world_size=1",
                                    "placement.trainer_gpus=[]", "placement.rollout_gpus=[]"])
    tc = cfg.trainer
    row = {"label": f"shipped:{cfg.name}", "path": "flashq", "config": str(a.shipped), "micro_batch_tokens": tc.micro_batch_tokens,
           "grad_ckpt": tc.gradient_checkpointing,
           "param_dtype": tc.param_dtype, "compute_dtype": tc.compute_dtype, "minibatches": tc.minibatches,
           "kl_coef": tc.loss.kl_coef, "share_prompts_config": tc.share_prompts}
    return measure(a, cfg, row)


def measure(a, cfg, row: dict) -> dict:
    """Build the Learner, train one step, then time `a.steps` more (module docstring)."""
    learner, batch, prompt_tokens, response_tokens = prepare(a, cfg, row)
    return time_steps(a, learner, batch, prompt_tokens, response_tokens, row)


def prepare(a, cfg, row: dict):
    """The Learner (its load time in `row`) and one rank's batch, with how it splits."""
    import numpy as np

    from flashq.models.real_size import VOCAB_SIZE
    from flashq.trainer.learner import Learner

    t0 = time.monotonic()
    learner = Learner(cfg, a.model)
    row["load_s"] = time.monotonic() - t0
    row["micro_batch_overhead_tokens"] = learner.micro_batch_overhead_tokens  # the device's default where unset
    row["share_prompts"] = learner.share_prompts
    row["params"] = sum(p.numel() for p in learner.model.parameters())
    batch, prompt_tokens, response_tokens = make_batch(a, VOCAB_SIZE)
    row.update(sequences=len(batch.request_ids), prompt_tokens=prompt_tokens, response_tokens=response_tokens,
               median_len=a.median_len, max_tokens=a.max_tokens)
    micros = [m for mb in learner._minibatches(len(batch.request_ids)) for m in learner._micro_batches(batch, mb)]
    lens = np.diff(batch.prompt_offsets) + np.diff(batch.response_offsets)
    row["micro_batches"] = len(micros)
    row["largest_micro_batch_tokens"] = int(max(len(m) * lens[m].max() for m in micros))  # rows x longest: what it computes
    return learner, batch, prompt_tokens, response_tokens


def time_steps(a, learner, batch, prompt_tokens: int, response_tokens: int, row: dict) -> dict:
    """One untimed step (gradients and Adam state come to exist), then `a.steps` timed ones."""
    import msgspec
    import numpy as np
    import torch

    cuda = a.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    try:
        t0 = time.monotonic()
        stats = learner.train_step(batch)
        sync()
        row["first_step_s"] = time.monotonic() - t0
        if cuda:
            torch.cuda.empty_cache()
            row["state_gib"] = torch.cuda.memory_allocated() / GIB  # weights, gradients and Adam state
            torch.cuda.reset_peak_memory_stats()
        # on the host: a copy on the GPU would count in the peak (it did in the first H100 runs)
        before = {n: p.detach().to("cpu", torch.bfloat16) for n, p in learner.model.named_parameters()}
        times = []
        for i in range(a.steps):
            batch = msgspec.structs.replace(batch, batch_index=learner.version)
            t0 = time.monotonic()
            stats = learner.train_step(batch)
            sync()
            times.append(time.monotonic() - t0)
            if i == 0:  # what one step at lr 1e-6 changed in the weights a push would send
                changed = sum(int((p.detach().to("cpu", torch.bfloat16) != before[n]).sum()) for n, p in learner.model.named_parameters())
                row["bf16_weights_changed_frac"] = changed / row["params"]
                del before
        row["step_s"] = float(np.mean(times))
        row["step_s_all"] = times
        row["padding_frac"] = stats["train/padding_frac"]
        row["loss"] = stats["loss"]
        row["grad_norm"] = stats["grad_norm"]
        row["grad_finite"] = bool(np.isfinite(stats["grad_norm"]))
        computed = (prompt_tokens + response_tokens) / max(1e-9, 1.0 - stats["train/padding_frac"])
        row["computed_tokens"] = computed
        row["tokens_per_s"] = (prompt_tokens + response_tokens) / row["step_s"]
        # model FLOPs: 6 N per token for forward + backward (the recompute of checkpointing not counted)
        row["model_tflops_per_s"] = 6 * row["params"] * (prompt_tokens + response_tokens) / row["step_s"] / 1e12
        if cuda:
            row["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
            row["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
            row["device_total_gib"] = torch.cuda.get_device_properties(0).total_memory / GIB
        row["fits"] = True
    except torch.OutOfMemoryError as e:
        row["fits"] = False
        row["error"] = str(e).splitlines()[0][:400]
        if cuda:
            row["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
    return row


# ----------------------------------------------------------------------------- parent


def shipped_shape(a) -> None:
    """--shipped: the batch, preset and setting come from the config file, not the flags."""
    from flashq.config import load_config

    cfg = load_config(a.shipped, [])
    a.groups = a.groups or cfg.trainer.batch_groups // cfg.trainer.world_size  # --groups: smoke tests
    a.group_size, a.max_tokens = cfg.sampling.group_size, cfg.sampling.max_tokens
    presets = {"Qwen/Qwen2.5-0.5B-Instruct": "qwen2.5-0.5b", "Qwen/Qwen2.5-1.5B-Instruct": "qwen2.5-1.5b"}
    if cfg.model.name not in presets:
        raise SystemExit(f"--shipped {a.shipped}: model.name {cfg.model.name!r} has no real-size preset (one of {sorted(presets)})")
    a.preset = presets[cfg.model.name]
    a.settings = [f"shipped:{cfg.name}"]


def run_setting(a, setting: str) -> dict:
    from bench.common import git_commit

    cmd = [sys.executable, __file__, "--child", "--setting", setting, "--model", a.model, "--device", a.device,
           "--steps", str(a.steps), "--groups", str(a.groups), "--group-size", str(a.group_size),
           "--median-len", str(a.median_len), "--max-tokens", str(a.max_tokens)] + (["--shipped", str(a.shipped)] if a.shipped else [])
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout_s)
    except subprocess.TimeoutExpired:
        return {"label": setting, "fits": False, "error": f"timed out after {a.timeout_s:.0f}s", "wall_s": time.monotonic() - t0}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if lines:
        row = json.loads(lines[-1][len(RESULT_TAG):])
    else:
        last = proc.stderr.strip().splitlines()[-1:] or [""]
        row = {"label": setting, "fits": False, "error": f"exit {proc.returncode}: {last[0]}"}
        sys.stderr.write(proc.stderr[-4000:])
    row["wall_s"] = time.monotonic() - t0
    row["git_commit"] = git_commit()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen2.5-1.5b")
    ap.add_argument("--layers", type=int, default=None, help="override the preset's depth (smoke tests)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--settings", nargs="*", default=[s[0] for s in SETTINGS])
    ap.add_argument("--steps", type=int, default=2, help="timed steps after the first")
    ap.add_argument("--groups", type=int, default=None, help="16; with --shipped, the config's share")
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--median-len", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=1536)
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--cache-dir", type=Path, default=ROOT / ".cache/flashq")
    ap.add_argument("--out", default="trainer_gpu", help="result name under bench/results ('none': do not write)")
    ap.add_argument("--append", action="store_true", help="keep the result file's rows of settings not measured now")
    ap.add_argument("--jsonl", type=Path, default=None, help="also append each row here as it is measured")
    ap.add_argument("--shipped", type=Path, default=None, help="measure this config's trainer as shipped (module docstring)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--setting", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(RESULT_TAG + json.dumps(child(a)), flush=True)
        return

    from bench.common import machine, print_table, write_result
    from flashq.models.real_size import RealSizeSpec, ensure_real_size_model

    if a.shipped:
        shipped_shape(a)
    a.groups = a.groups or 16
    t0 = time.monotonic()
    a.model = str(ensure_real_size_model(RealSizeSpec(a.preset, a.layers), a.cache_dir))
    print(f"model {a.model} ready in {time.monotonic() - t0:.0f}s", flush=True)
    rows = []
    for setting in a.settings:
        row = run_setting(a, setting)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if a.jsonl:
            with a.jsonl.open("a") as f:
                f.write(json.dumps(row) + "\n")
    print_table(f"trainer steps at {a.preset}{f' ({a.layers} layers)' if a.layers else ''} on {machine().get('gpu') or a.device}", rows, [
        ("label", "setting", ""), ("micro_batch_tokens", "micro-batch", "d"), ("largest_micro_batch_tokens", "largest", "d"), ("fits", "fits", ""),
        ("step_s", "step s", ".2f"), ("tokens_per_s", "tokens/s", ".0f"), ("model_tflops_per_s", "model TFLOP/s", ".0f"),
        ("state_gib", "state GiB", ".1f"), ("peak_allocated_gib", "peak GiB", ".1f"), ("bf16_weights_changed_frac", "bf16 changed", ".4f"),
    ])
    if a.out == "none":
        return
    if a.append:
        from bench.common import RESULTS

        old = json.loads((RESULTS / f"{a.out}.json").read_text())["results"]
        rows = [r for r in old if r["label"] not in a.settings] + rows
    by = {r["label"]: r for r in rows}
    cfg_row, naive = by.get("config", {}), by.get("naive-16k", {})
    figures = {
        "preset": a.preset,
        "config_micro_batch_fits": cfg_row.get("fits"),
        "config_step_s": cfg_row.get("step_s"),
        "config_peak_allocated_gib": cfg_row.get("peak_allocated_gib"),
        "naive_16k_fits": naive.get("fits"),
        "naive_16k_peak_allocated_gib": naive.get("peak_allocated_gib"),
        "filled_16k_peak_allocated_gib": by.get("filled-16k", {}).get("peak_allocated_gib"),
        "naive_filled_16k_fits": by.get("naive-filled-16k", {}).get("fits"),
        "naive_filled_16k_peak_allocated_gib": by.get("naive-filled-16k", {}).get("peak_allocated_gib"),
        "bf16_changed_frac_float32_masters": cfg_row.get("bf16_weights_changed_frac"),
        "bf16_changed_frac_bf16_masters": by.get("bf16-masters", {}).get("bf16_weights_changed_frac"),
    }
    path = write_result(a.out, rows, figures)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
