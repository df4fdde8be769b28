"""The whole loop at Qwen2.5-0.5B's real size on this CPU, and its weight push against a bare broadcast.

`flashq launch` with the real-size architecture (random weights, flashq.models.real_size): vLLM
serves it in bfloat16 on core 0, the trainer keeps float32 masters and computes in bfloat16 on
core 1, weights are pushed after every step. Every role's peak RSS (its process tree) is sampled
while it runs. Then, in the same invocation and on the same cores, a bare `torch.distributed`
broadcast over gloo of the same bytes in the same buckets: the push's cost beyond moving bytes.

    python bench/scale_loop.py              # adds figures.steps_at_0_5b and
                                            # figures.weight_sync_vs_raw_broadcast to
                                            # bench/results/trainer_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, command_line, git_commit, machine  # noqa: E402


def digit_share(task: dict, response: str) -> float:
    """A reward a random model's samples differ in (exact match would be 0 for all of them, so
    every advantage 0 and no update): the share of the response's characters that are digits."""
    return sum(c.isdigit() for c in response) / max(len(response), 1)


def watch_rss(root_pid: int, peaks: dict[str, float], stop: threading.Event) -> None:
    """Peak RSS (GiB) of each flashq role's process tree (a rollout worker's vLLM engine included)."""
    import psutil

    while not stop.is_set():
        try:
            for proc in psutil.Process(root_pid).children():
                cmd = proc.cmdline()
                if "role" not in cmd:
                    continue
                role = cmd[cmd.index("role") + 1]
                tree = [proc, *proc.children(recursive=True)]
                rss = sum(p.memory_info().rss for p in tree if p.is_running()) / 2**30
                peaks[role] = max(peaks.get(role, 0.0), rss)
        except Exception:  # noqa: BLE001 - processes come and go
            pass
        stop.wait(0.5)


def run_loop(model: Path, run_dir: Path, steps: int, extra: tuple[str, ...] = ()) -> dict:
    """`extra`: overrides after the loop's own (bench/lora.py adds trainer.lora)."""
    overrides = [
        f"model.name={model}", "model.dtype=bfloat16", "trainer.param_dtype=float32", "trainer.compute_dtype=bfloat16",
        f"trainer.steps={steps}", "trainer.batch_groups=2", "sampling.group_size=4", "sampling.max_tokens=16",
        "trainer.lr=1e-6", "trainer.threads=1", "async_ratio=1", "rollout.num_workers=1", "rollout.kv_cache_gib=1",
        "rollout.max_model_len=256", "reward.function=bench.scale_loop:digit_share", "sft.warm_start=false",
        "placement.rollout=[0]", "placement.trainer=[1]", "transport.startup_timeout_s=900", f"log.run_dir={run_dir}",
        *extra,
    ]
    cmd = [sys.executable, "-m", "flashq.cli", "launch", "configs/quickstart.yaml", "--no-progress", *overrides]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks: dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_rss, args=(proc.pid, peaks, stop), daemon=True)
    watcher.start()
    out = proc.communicate()[0]
    stop.set()
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"the 0.5B run failed (exit {proc.returncode}):\n{out[-6000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps_rows = [r for r in rows if r.get("kind") == "step"]
    times = [r["time"] for r in steps_rows]
    return {
        "overrides": overrides,
        "wall_s": time.monotonic() - t0,
        "steps": len(steps_rows),
        "step_interval_s": [b - a for a, b in zip(times, times[1:])],
        "train_s": [r["train/seconds"] for r in steps_rows],
        "weight_sync_s": [r["trainer/weight_sync_s"] for r in steps_rows],
        "push_bytes": [r.get("trainer/push_bytes") for r in steps_rows],
        "grad_norm": [r["grad_norm"] for r in steps_rows],
        "reward_mean": [r["reward/mean"] for r in steps_rows],
        "peak_rss_gib": {k: round(v, 2) for k, v in sorted(peaks.items())},
    }


def _raw_rank(rank: int, port: int, sizes: list[int], bucket: int, repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.sched_setaffinity(0, {1 - rank})  # the sender on the trainer's core, the receiver on the engine's
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    total = sum(sizes)
    data = torch.empty(total, dtype=torch.uint8)
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.monotonic()
        for start in range(0, total, bucket):
            dist.broadcast(data[start : start + bucket], src=0)
        dist.barrier()
        times.append(time.monotonic() - t0)
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def raw_broadcast(model: Path, bucket_mb: int, repeats: int) -> dict:
    """The same bytes as the push (the bf16 weights vLLM receives), bare gloo broadcasts of the
    same bucket size between two processes on the same two cores."""
    import tempfile

    import torch.multiprocessing as mp
    from transformers import AutoConfig

    from flashq.roles.common import free_port

    cfg = AutoConfig.from_pretrained(model)
    from transformers import AutoModelForCausalLM

    with __import__("torch").device("meta"):
        meta = AutoModelForCausalLM.from_config(cfg)
    sizes = [p.numel() * 2 for p in meta.parameters()]  # bfloat16 on the wire; tied weights once
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        mp.start_processes(_raw_rank, args=(free_port(), sizes, bucket_mb << 20, repeats, f.name), nprocs=2, start_method="spawn")
        times = json.loads(Path(f.name).read_text())
    return {"bytes": sum(sizes), "bucket_mb": bucket_mb, "seconds": times, "median_s": statistics.median(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--preset", default="qwen2.5-0.5b")
    ap.add_argument("--repeats", type=int, default=3, help="bare broadcasts timed")
    ap.add_argument("--layers", type=int, default=None, help="fewer decoder layers (smoke test; writes no result)")
    ap.add_argument("--keep", type=Path, default=Path("/tmp/flashq-scale-loop"), help="run directory")
    args = ap.parse_args()

    from flashq.models.real_size import RealSizeSpec, ensure_real_size_model

    model = ensure_real_size_model(RealSizeSpec(preset=args.preset, num_hidden_layers=args.layers), ROOT / ".cache" / "flashq")
    import shutil

    shutil.rmtree(args.keep, ignore_errors=True)
    loop = run_loop(model, args.keep, args.steps)
    raw = raw_broadcast(model, bucket_mb=64, repeats=args.repeats)
    push_s = statistics.median(loop["weight_sync_s"][1:])  # the first push also pays one-time setup
    ratio = raw["median_s"] / push_s

    print(f"\n{args.preset}: {loop['steps']} steps in {loop['wall_s']:.0f} s (startup included)")
    print(f"{'step':>4} {'interval s':>10} {'train s':>8} {'push s':>7} {'reward':>7}")
    for i in range(loop["steps"]):
        interval = loop["step_interval_s"][i - 1] if i else float("nan")
        print(f"{i + 1:>4} {interval:>10.1f} {loop['train_s'][i]:>8.1f} {loop['weight_sync_s'][i]:>7.2f} {loop['reward_mean'][i]:>7.3f}")
    print("peak RSS (GiB): " + ", ".join(f"{k} {v}" for k, v in loop["peak_rss_gib"].items()))
    print(f"push {push_s:.2f} s (median of steps 2+) vs bare gloo broadcast of {raw['bytes'] / 2**30:.2f} GiB "
          f"{raw['median_s']:.2f} s: ratio {ratio:.2f} (bound >= 0.8: {'pass' if ratio >= 0.8 else 'FAIL'})")

    if args.layers is not None:
        return
    path = RESULTS / "trainer_scale.json"
    result = json.loads(path.read_text()) if path.exists() else {"benchmark": "trainer_scale", "figures": {}}
    result["loop"] = {"command": command_line(), "git_commit": git_commit(), "machine": machine(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      "preset": args.preset, **loop, "raw_broadcast": raw, "push_median_s": push_s}
    result.setdefault("figures", {}).update({
        "steps_at_0_5b": loop["steps"],
        "steps_at_0_5b_bound": 5,
        "weight_sync_vs_raw_broadcast": round(ratio, 3),
        "weight_sync_vs_raw_broadcast_bound": 0.8,
    })
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
