"""The device check: what flashq's trainer costs and does on one GPU, in one command of a few minutes.

A session is lent a GPU for 15 minutes at most, so this is prepared in advance and run first. Each
section runs in its own process (its peak memory is its own; a crash or an out-of-memory ends that
section alone) under a time limit cut to what is left of `--budget-s`:

  ceiling      a bf16 8192^3 matrix product: the rate model FLOP/s are compared with, beside the datasheet's
  step-1.5b    Qwen2.5-1.5B's architecture (random weights, built on the device), flashq's `Learner.train_step`
               as the 1.5B configs run it (float32 masters, bf16 compute, checkpointing, 16k-token micro-batches
               filled at 2,048 tokens of overhead a pass)
               on one rank's 256 samples: step time, peak memory, model TFLOP/s and MFU; then one step under
               torch.profiler: how busy the GPU was, the top kernels, the host syncs
  race         issue 53 item 2: right after `train_step` returns, the parameters cast to bf16 on a side stream
               (as vLLM's broadcast does) against a cast after a full sync, many trials, with and without
               the `UpdateFence` wait the push makes (0.5B, lr 1e-3 so every update shows in bf16)
  fsdp-mp      FSDP2 over a one-rank group with mixed precision (float32 masters gathered in bf16, 0.5B from
               a checkpoint on disk): how many bf16 weights (what a push sends) one step at lr 1e-6 changes
  step-7b      Qwen2.5-7B's architecture, float32 masters: does it fit one GPU, and at what speed (64 samples)
  lora-1.5b    the 1.5B step with a rank-16 LoRA adapter on the frozen bf16 base
  packed-1.5b  the 1.5B step with packing on

Weights are built on the device in bf16 and cast to the masters' dtype (as a real checkpoint loads):
nothing is downloaded, what is computed is meaningless, what it costs is not.

    python bench/gpu_check.py                       # on a CUDA machine: bench/results/gpu_check.json
    python bench/gpu_check.py --smoke --out none    # every section at toy size on a CPU (the test suite)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 2**30
RESULT_TAG = "GPU_CHECK_RESULT "
# dense bf16 FLOP/s of the SXM parts by NVIDIA's datasheet (no sparsity), by the name torch reports: the PCIe and
# NVL H100s are slower and are left out (no MFU rather than a wrong one)
DENSE_BF16_PEAK = {"NVIDIA H200": 989e12, "NVIDIA H100 80GB HBM3": 989e12}
MFU_BOUND = 0.40  # issue 53 item 7
SECTIONS = ["ceiling", "step-1.5b", "race", "fsdp-mp", "step-7b", "lora-1.5b", "packed-1.5b"]
# per section: (preset, groups, group size, median response, max tokens, timed steps, time limit s); --smoke shrinks
SHAPES = {
    "step-1.5b": ("qwen2.5-1.5b", 16, 16, 300, 1536, 2, 150),
    "race": ("qwen2.5-0.5b", 1, 8, 64, 128, 0, 90),
    "fsdp-mp": ("qwen2.5-0.5b", 2, 8, 200, 512, 3, 120),
    "step-7b": ("qwen2.5-7b", 4, 16, 300, 1536, 2, 180),
    "lora-1.5b": ("qwen2.5-1.5b", 16, 16, 300, 1536, 2, 120),
    "packed-1.5b": ("qwen2.5-1.5b", 16, 16, 300, 1536, 2, 120),
}
SMOKE_SHAPE = ("qwen2-smoke", 1, 4, 12, 24, 1, 120)
RACE_TRIALS = 24  # per mode, alternating


# ----------------------------------------------------------------------------- child: one section


def shape_of(a, section: str) -> SimpleNamespace:
    preset, groups, group_size, median_len, max_tokens, steps, limit = SMOKE_SHAPE if a.smoke else SHAPES[section]
    return SimpleNamespace(preset=preset, groups=groups, group_size=group_size, median_len=median_len,
                           max_tokens=max_tokens, steps=steps, limit=limit, device=a.device, model=None)


def build_on_device(preset: str) -> None:
    """The Learner's loader builds the preset on the device (bf16, seeded) instead of reading a path."""
    import torch
    from transformers import Qwen2ForCausalLM

    from flashq.models.real_size import RealSizeSpec, build_config
    from flashq.trainer import learner

    def load(path, dtype, device):
        torch.manual_seed(0)
        with torch.device(device):
            model = Qwen2ForCausalLM._from_config(build_config(RealSizeSpec(preset)), dtype=torch.bfloat16)
        return model.to(dtype)

    learner.load_causal_lm = load


def with_signal(batch):
    """Rewards alternating 0, 1 within each group: every group has an advantage, so every step moves
    the weights (the random rewards of a small batch can leave a group, or all, without one)."""
    import msgspec
    import numpy as np

    return msgspec.structs.replace(batch, rewards=(np.arange(len(batch.rewards)) % 2).astype(np.float32))


def learner_config(s: SimpleNamespace, *extra: str):
    from flashq.config import load_config

    return load_config(None, [
        f"model.name={s.model or 'built-on-device'}", f"trainer.device={s.device}", "trainer.param_dtype=float32",
        "trainer.compute_dtype=bfloat16", "trainer.gradient_checkpointing=true", "trainer.micro_batch_tokens=16384",
        "trainer.micro_batch_overhead_tokens=2048",  # the GPU default, set so a CPU smoke run splits the same way
        f"sampling.max_tokens={s.max_tokens}", f"sampling.group_size={s.group_size}", f"trainer.batch_groups={s.groups}",
        "trainer.lr=1e-6", "trainer.loss.policy=ppo", "trainer.loss.correction=tis_token",
        f"rollout.max_model_len={s.max_tokens + 256}", "trainer.share_prompts=false", *extra,
    ])


def section_ceiling(a) -> dict:
    import torch

    n, reps = (8192, 10) if a.device == "cuda" else (256, 3)
    x = torch.randn(n, n, device=a.device, dtype=torch.bfloat16)
    y = torch.randn(n, n, device=a.device, dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    sync(a)
    t0 = time.perf_counter()
    for _ in range(reps):
        x @ y
    sync(a)
    row = {"matmul_n": n, "matmul_bf16_tflops": 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12}
    if a.device == "cuda":
        p = torch.cuda.get_device_properties(0)
        row.update(gpu=p.name, capability=f"{p.major}.{p.minor}", multiprocessors=p.multi_processor_count,
                   memory_gib=p.total_memory / GIB, torch=torch.__version__, cuda=torch.version.cuda)
        peak = DENSE_BF16_PEAK.get(p.name)
        row["datasheet_dense_bf16_tflops"] = peak / 1e12 if peak else None
    return row


def sync(a) -> None:
    import torch

    if a.device == "cuda":
        torch.cuda.synchronize()


def section_step(a, section: str, *extra: str) -> dict:
    """A Learner step timed as bench/trainer_gpu.py times it; with `profile`, one more under torch.profiler."""
    from bench.trainer_gpu import prepare, time_steps

    s = shape_of(a, section)
    build_on_device(s.preset)
    row = {"preset": s.preset, "overrides": list(extra)}
    learner, batch, prompt_tokens, response_tokens = prepare(s, learner_config(s, *extra), row)
    batch = with_signal(batch)
    row["trained_params"] = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
    time_steps(s, learner, batch, prompt_tokens, response_tokens, row)
    if row["fits"] and section == "step-1.5b":
        row.update(offload_round_trip(learner))
        print(RESULT_TAG + json.dumps(row), flush=True)  # kept if the profiled step outlasts the limit
        row.update(profile_step(a, learner, batch))
    return row


def profile_step(a, learner, batch) -> dict:
    """One more step under torch.profiler: the GPU's busy share of the wall, top kernels, host syncs."""
    import msgspec
    from torch.profiler import ProfilerActivity, profile

    # on a GPU the kernels and the runtime's calls alone: recording every host op of a 142k-token step
    # took the device check past its limit
    activities = [ProfilerActivity.CUDA] if a.device == "cuda" else [ProfilerActivity.CPU]
    batch = msgspec.structs.replace(batch, batch_index=learner.version)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        learner.train_step(batch)
        sync(a)
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    device_time = lambda e: getattr(e, "self_device_time_total", 0) or 0  # noqa: E731
    kernels = sorted((e for e in events if device_time(e) > 0), key=device_time, reverse=True)
    busy_us = sum(device_time(e) for e in kernels)
    calls = {e.key: e.count for e in events}
    return {
        "profiled_step_wall_s": wall,
        "gpu_busy_frac": busy_us / 1e6 / wall if a.device == "cuda" else None,
        "top_ops": [{"name": e.key[:90], "device_ms": device_time(e) / 1e3, "calls": e.count} for e in kernels[:15]],
        # the runtime's calls on a GPU (host ops are not recorded there), the host ops on a CPU
        "host_syncs": {k: calls.get(k, 0) for k in (
            ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync") if a.device == "cuda"
            else ("aten::item", "aten::_local_scalar_dense", "aten::nonzero"))},
    }


def section_race(a) -> dict:
    """Issue 53 item 2, both ways round (module docstring)."""
    import msgspec
    import torch

    from bench.trainer_gpu import prepare

    s = shape_of(a, "race")
    build_on_device(s.preset)
    row = {"preset": s.preset}
    learner, batch, _, _ = prepare(s, learner_config(s, "trainer.lr=1e-3", "trainer.gradient_checkpointing=false"), row)
    batch = with_signal(batch)
    params = [p for p in learner.model.parameters()]
    side = torch.cuda.Stream() if a.device == "cuda" else None
    counts = {"unfenced": [0, 0], "fenced": [0, 0]}  # [trials with a stale tensor, stale tensors]
    trials = RACE_TRIALS if a.device == "cuda" else 2
    for i in range(2 * trials):
        mode = "fenced" if i % 2 else "unfenced"
        batch = msgspec.structs.replace(batch, batch_index=learner.version)
        learner.train_step(batch)
        if mode == "fenced":
            learner.updated.wait()  # what the push does before reading the weights
        if side is not None:  # no wait_stream: the side stream orders nothing after the default one
            with torch.cuda.stream(side):
                sent = [p.detach().to(torch.bfloat16) for p in params]
        else:
            sent = [p.detach().to(torch.bfloat16) for p in params]
        sync(a)
        stale = sum(int(not torch.equal(x, p.detach().to(torch.bfloat16))) for x, p in zip(sent, params))
        counts[mode][0] += int(stale > 0)
        counts[mode][1] += stale
    row.update(trials_per_mode=trials, tensors=len(params),
               unfenced_trials_stale=counts["unfenced"][0], unfenced_tensors_stale=counts["unfenced"][1],
               fenced_trials_stale=counts["fenced"][0], fenced_tensors_stale=counts["fenced"][1])
    return row


def section_fsdp(a) -> dict:
    """FSDP2 mixed precision over a one-rank group: the sharding code of a multi-rank trainer, on one device."""
    import msgspec
    import numpy as np
    import torch

    from bench.trainer_gpu import prepare
    from flashq.models.real_size import RealSizeSpec, ensure_real_size_model
    from flashq.trainer import parallel

    s = shape_of(a, "fsdp-mp")
    s.model = str(ensure_real_size_model(RealSizeSpec(s.preset), a.cache_dir))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    parallel.Ranks.sharded = property(lambda self: True)  # one rank, sharded all the same
    row = {"preset": s.preset}
    learner, batch, _, _ = prepare(s, learner_config(s), row)
    batch = with_signal(batch)
    row["sharded"] = type(learner.model).__name__
    before = {k: v.to(torch.bfloat16) for k, v in parallel.full_model_state(learner.model, learner.ranks).items()}
    masters = {k: v.clone() for k, v in parallel.full_model_state(learner.model, learner.ranks).items()}
    changed, master_changed, times = [], [], []
    for _ in range(s.steps):
        batch = msgspec.structs.replace(batch, batch_index=learner.version)
        t0 = time.perf_counter()
        stats = learner.train_step(batch)
        sync(a)
        times.append(time.perf_counter() - t0)
        state = parallel.full_model_state(learner.model, learner.ranks)
        total = sum(v.numel() for v in state.values())
        changed.append(sum(int((v.to(torch.bfloat16) != before[k]).sum()) for k, v in state.items()) / total)
        master_changed.append(sum(int((v != masters[k]).sum()) for k, v in state.items()) / total)
        row["grad_norm"] = stats["grad_norm"]
    row.update(master_dtype=str(next(iter(state.values())).dtype), steps=s.steps, step_s=float(np.mean(times)),
               bf16_changed_frac_by_step=changed, master_changed_frac_by_step=master_changed,
               grad_finite=bool(np.isfinite(row["grad_norm"])))
    return row


def offload_round_trip(learner) -> dict:
    """placement.colocate's optimizer offload at this size (trainer.offload_optimizer): the bytes
    moved off the device, the memory torch's allocator gave back, and the seconds each way."""
    import torch

    from flashq.trainer.offload import OptimizerOffload, give_back_device_memory

    if learner.device.type != "cuda":
        return {}
    offload = OptimizerOffload(learner.optimizer)
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    t0 = time.perf_counter()
    moved = give_back_device_memory(offload)
    t1 = time.perf_counter()
    freed = reserved - torch.cuda.memory_reserved()
    offload.restore()
    torch.cuda.synchronize()
    return {"offload_gib": moved / GIB, "offload_s": t1 - t0, "restore_s": time.perf_counter() - t1,
            "offload_reserved_freed_gib": freed / GIB}


def child(a) -> dict:
    if a.section == "ceiling":
        return section_ceiling(a)
    if a.section == "race":
        return section_race(a)
    if a.section == "fsdp-mp":
        return section_fsdp(a)
    extra = {"step-1.5b": (), "step-7b": (), "lora-1.5b": ("trainer.lora.rank=16",),
             "packed-1.5b": ("trainer.packing=true",)}[a.section]
    return section_step(a, a.section, *extra)


# ----------------------------------------------------------------------------- parent


def run_section(a, section: str, limit: float) -> dict:
    cmd = [sys.executable, __file__, "--child", section, "--device", a.device, "--cache-dir", str(a.cache_dir)]
    cmd += ["--smoke"] if a.smoke else []
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as e:  # a row printed before the limit is kept, marked
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        sys.stderr.write(err[-3000:])
        lines = [ln for ln in out.splitlines() if ln.startswith(RESULT_TAG)]
        row = {"section": section, **(json.loads(lines[-1][len(RESULT_TAG):]) if lines else {})}
        row.update(ok=bool(lines), error=f"timed out after {limit:.0f}s", wall_s=time.monotonic() - t0)
        return row
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
    if lines:
        row = {"section": section, "ok": True, **json.loads(lines[-1][len(RESULT_TAG):])}
        row["ok"] = row.get("fits", True)
    else:
        last = proc.stderr.strip().splitlines()[-1:] or [""]
        row = {"section": section, "ok": False, "error": f"exit {proc.returncode}: {last[0][:400]}"}
        sys.stderr.write(proc.stderr[-3000:])
    row["wall_s"] = time.monotonic() - t0
    return row


def figures_of(rows: dict[str, dict]) -> dict:
    ceiling, step = rows.get("ceiling", {}), rows.get("step-1.5b", {})
    peak = ceiling.get("datasheet_dense_bf16_tflops")
    tflops = step.get("model_tflops_per_s")
    mfu = tflops / peak if tflops and peak else None
    race, fsdp = rows.get("race", {}), rows.get("fsdp-mp", {})
    b7, lora, packed = rows.get("step-7b", {}), rows.get("lora-1.5b", {}), rows.get("packed-1.5b", {})
    return {
        "gpu": ceiling.get("gpu"),
        "matmul_bf16_tflops": ceiling.get("matmul_bf16_tflops"),
        "datasheet_dense_bf16_tflops": peak,
        "step_1_5b_s": step.get("step_s"),
        "step_1_5b_tokens": (step.get("prompt_tokens") or 0) + (step.get("response_tokens") or 0) or None,
        "step_1_5b_peak_allocated_gib": step.get("peak_allocated_gib"),
        "step_1_5b_model_tflops": tflops,
        "trainer_mfu_1_5b": mfu,
        "trainer_mfu_1_5b_vs_measured_matmul": tflops / ceiling["matmul_bf16_tflops"] if tflops and ceiling.get("matmul_bf16_tflops") else None,
        "trainer_mfu_1_5b_bound": MFU_BOUND,
        "trainer_mfu_1_5b_met": (mfu >= MFU_BOUND) if mfu is not None else None,
        "gpu_busy_frac_1_5b": step.get("gpu_busy_frac"),
        "offload_1_5b_gib": step.get("offload_gib"),  # placement.colocate: AdamW's state off the device between steps
        "offload_1_5b_s": step.get("offload_s"),
        "restore_1_5b_s": step.get("restore_s"),
        "offload_1_5b_reserved_freed_gib": step.get("offload_reserved_freed_gib"),
        "host_syncs_1_5b": step.get("host_syncs"),
        "race_unfenced_trials_stale": race.get("unfenced_trials_stale"),
        "race_fenced_trials_stale": race.get("fenced_trials_stale"),
        "race_trials_per_mode": race.get("trials_per_mode"),
        "race_fenced_met": (race.get("fenced_trials_stale") == 0) if race.get("ok") else None,
        "fsdp_mp_bf16_changed_frac_step1": (fsdp.get("bf16_changed_frac_by_step") or [None])[0],
        "fsdp_mp_master_changed_frac_step1": (fsdp.get("master_changed_frac_by_step") or [None])[0],
        "step_7b_fits": b7.get("fits"),
        "step_7b_s": b7.get("step_s"),
        "step_7b_peak_allocated_gib": b7.get("peak_allocated_gib"),
        "step_7b_model_tflops": b7.get("model_tflops_per_s"),
        "lora_1_5b_step_s": lora.get("step_s"),
        "lora_1_5b_peak_allocated_gib": lora.get("peak_allocated_gib"),
        "packed_1_5b_step_s": packed.get("step_s"),
        "packing_speedup_1_5b": step["step_s"] / packed["step_s"] if step.get("step_s") and packed.get("step_s") else None,
        "sections_failed": sorted(k for k, r in rows.items() if not r.get("ok")),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", nargs="*", default=SECTIONS, choices=SECTIONS)
    ap.add_argument("--device", default=None, help="cuda where it is visible, else cpu")
    ap.add_argument("--smoke", action="store_true", help="every section at toy size (the architecture of qwen2-smoke)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="all sections together; each is cut to what is left")
    ap.add_argument("--cache-dir", type=Path, default=ROOT / ".cache/flashq")
    ap.add_argument("--out", default="gpu_check", help="result name under bench/results ('none': do not write)")
    ap.add_argument("--save", type=Path, default=None, help="also write {figures, rows} here (the smoke test reads it)")
    ap.add_argument("--keep-rows", type=Path, default=None, help="a --save file whose other sections' rows are kept")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.device is None:
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.child:
        a.section = a.child
        print(RESULT_TAG + json.dumps(child(a)), flush=True)
        return

    from bench.common import git_commit, print_table, write_result

    deadline = time.monotonic() + a.budget_s
    rows: dict[str, dict] = {}
    if a.keep_rows:  # an earlier run's sections, where this one runs others
        rows = {k: v for k, v in json.loads(a.keep_rows.read_text())["rows"].items() if k not in a.sections}
    for section in a.sections:
        left = deadline - time.monotonic()
        limit = min(left, (SMOKE_SHAPE if a.smoke else SHAPES.get(section, (0,) * 6 + (60,)))[-1])
        if limit < 20:
            rows[section] = {"section": section, "ok": False, "error": f"not run: {left:.0f}s of the budget left"}
            continue
        rows[section] = {**run_section(a, section, limit), "git_commit": git_commit()}
        print(json.dumps(rows[section]), flush=True)
        if a.save:  # as it goes: what a device's time limit cuts short is kept
            a.save.write_text(json.dumps({"figures": figures_of(rows), "rows": rows}, indent=1))
    figures = figures_of(rows)
    print_table(f"device check on {figures['gpu'] or a.device}{' (smoke)' if a.smoke else ''}", list(rows.values()), [
        ("section", "section", ""), ("ok", "ok", ""), ("step_s", "step s", ".2f"), ("model_tflops_per_s", "model TFLOP/s", ".0f"),
        ("peak_allocated_gib", "peak GiB", ".1f"), ("wall_s", "wall s", ".0f"), ("error", "error", ""),
    ])
    print(json.dumps(figures, indent=1))
    if a.save:
        a.save.write_text(json.dumps({"figures": figures, "rows": rows}, indent=1))
    if a.out != "none":
        print(f"wrote {write_result(a.out, list(rows.values()), figures)}")
    if a.smoke and figures["sections_failed"]:
        raise SystemExit(f"sections failed: {figures['sections_failed']}")


if __name__ == "__main__":
    main()
