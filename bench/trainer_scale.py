"""The trainer alone at real size: memory and time of one RL micro-batch's forward and backward at
Qwen2.5-0.5B's shape (random weights, flashq/models/real_size.py), float32 master weights and
compute, on this machine's CPU, for the two log-probability paths of flashq/trainer/logprobs.py:

  naive    `naive_token_logprobs`: float32 logits over the whole vocabulary at every position
  bounded  `install_logprob_head(model, 1024)` + `token_logprobs(..., select=mask)`: only the
           response positions are projected, 1024 rows at a time, each chunk checkpointed

Each (path, micro-batch size) runs in a fresh subprocess, so its peak RSS is its own:
  1. load the model (float32), AdamW over its parameters, one full step (forward, backward,
     optimizer.step) on a small batch: gradients and Adam state now exist; RSS after it (freed
     heap trimmed) is the baseline;
  2. reset the kernel's peak-RSS counter (`echo 5 > /proc/self/clear_refs` resets VmHWM), run one
     forward + backward of `policy_loss` on a micro-batch of that many tokens (rows of 512: a
     128-token prompt, a 384-token response under the loss mask; random ids; behaviour logprobs =
     the current ones detached; advantages +-1); peak_extra = VmHWM - baseline.
The parent watches each child's RSS and kills it above --limit-gib, or when the machine's available
memory falls below --reserve-gib (the host may be shared): such a run, or one that dies, is recorded
as "did not fit", and larger sizes of that path are not tried. A kill while other processes held
more than --contention-gib is retried (--retries); a last contended attempt is marked "contended".
--append keeps the result file's other rows, each naming the command that measured it.

    python bench/trainer_scale.py                       # 0.5B, naive and bounded, 256..8192 tokens
    python bench/trainer_scale.py --quick               # 2 layers, 256 and 512 tokens: a smoke test
    python bench/trainer_scale.py --paths bounded --sizes 4096 8192 --gc-tokens 0
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 2**30
PATHS = ("naive", "bounded")
RESULT_TAG = "TRAINER_SCALE_RESULT "


# ----------------------------------------------------------------------------- child: one measurement


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _rss() -> int:
    return _status_kib("VmRSS") * 1024


def _hwm() -> int:
    return _status_kib("VmHWM") * 1024


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS; True if the kernel did it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _hwm() <= _rss() + 16 * 2**20


def _trim() -> None:
    """Hand freed heap back to the OS, so the baseline RSS is live memory, not glibc's free lists."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _micro_batch(tokens: int, row_tokens: int, vocab: int, seed: int):
    import torch

    row = min(row_tokens, tokens)
    rows, prompt = max(tokens // row, 1), row // 4
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, row), generator=g)
    attn = torch.ones_like(ids)
    mask = torch.zeros(rows, row - 1)
    mask[:, prompt - 1 :] = 1.0  # position t predicts token t+1: the response's tokens
    adv = torch.where(torch.arange(rows) % 2 == 0, 1.0, -1.0)
    return ids, attn, mask, adv


def _loss(model, path: str, ids, attn, mask, adv):
    from flashq.algos.losses import Normalizer, policy_loss
    from flashq.trainer.logprobs import naive_token_logprobs, token_logprobs

    if path == "bounded":
        logp, _ = token_logprobs(model, ids, attn, 1.0, select=mask > 0)
    else:
        logp, _ = naive_token_logprobs(model, ids, attn, 1.0)
    norm = Normalizer(tokens=float(mask.sum()), sequences=float(len(ids)), max_len=float(ids.shape[1] - 1))
    loss, _ = policy_loss(logp, logp.detach(), logp.detach(), adv[:, None].expand_as(logp), mask, norm)
    return loss


def child(args) -> dict:
    import psutil
    import torch
    from transformers import AutoModelForCausalLM

    from flashq.trainer.logprobs import install_logprob_head

    torch.set_num_threads(args.threads)
    out: dict = {"path": args.path, "tokens": args.tokens, "grad_ckpt": args.grad_ckpt, "threads": args.threads}
    t0 = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.train()
    if args.path == "bounded":
        install_logprob_head(model, args.chunk_tokens)
    if args.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    vocab = model.config.vocab_size
    out["params"] = sum(p.numel() for p in model.parameters())
    out["attn_implementation"] = model.config._attn_implementation
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    out["load_s"] = time.monotonic() - t0

    # 1. a full step on a small batch: gradients and Adam state exist from here on
    t0 = time.monotonic()
    _loss(model, args.path, *_micro_batch(64, 64, vocab, seed=1)).backward()
    opt.step()
    opt.zero_grad(set_to_none=False)  # keep the gradient buffers: they belong to the baseline
    out["warmup_step_s"] = time.monotonic() - t0
    out["warmup_peak_rss_gib"] = _hwm() / GIB
    _trim()
    baseline = _rss()
    out["baseline_rss_gib"] = baseline / GIB
    out["hwm_reset_ok"] = _reset_hwm()

    # 2. the measured micro-batch: forward and backward of the RL loss
    ids, attn, mask, adv = _micro_batch(args.tokens, args.row_tokens, vocab, seed=2)
    out["rows"], out["row_tokens"], out["loss_tokens"] = int(ids.shape[0]), int(ids.shape[1]), int(mask.sum())
    t0 = time.monotonic()
    loss = _loss(model, args.path, ids, attn, mask, adv)
    t_fwd = time.monotonic() - t0
    loss.backward()
    dt = time.monotonic() - t0
    peak = _hwm()
    out.update(
        available_gib_after=psutil.virtual_memory().available / GIB, fits=True, forward_s=t_fwd, fwd_bwd_s=dt, tokens_per_s=ids.numel() / dt, peak_rss_gib=peak / GIB,
        peak_extra_gib=(peak - baseline) / GIB, loss=float(loss), grad_finite=bool(all(
            torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)),
    )
    return out


# ----------------------------------------------------------------------------- parent: the sweep


def run_one(args, model: Path, path: str, tokens: int, grad_ckpt: bool) -> dict:
    """One measurement; retried (up to --retries) when a kill was caused by other processes' memory:
    the host is shared, so 'did not fit' must be this run's own footprint."""
    for attempt in range(1, args.retries + 2):
        row = _attempt(args, model, path, tokens, grad_ckpt)
        row["attempts"] = attempt
        if row["fits"] or not row["contended"] or attempt > args.retries:
            return row  # a contended last attempt says so ("contended", "others_gib_at_end")
        print(f"  {path} {tokens} (ckpt {grad_ckpt}): {row['why']}; other processes held "
              f"{row['others_gib_at_end']:.1f} GiB: retrying", flush=True)
    return row


def _wait_for_memory(args) -> float:
    """Wait (up to --wait-s) until the machine has --start-free-gib available; return what it has."""
    import psutil

    deadline = time.monotonic() + args.wait_s
    while (avail := psutil.virtual_memory().available) < args.start_free_gib * GIB and time.monotonic() < deadline:
        time.sleep(5)
    return avail / GIB


def _attempt(args, model: Path, path: str, tokens: int, grad_ckpt: bool) -> dict:
    import psutil

    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--model", str(model), "--path", path,
           "--tokens", str(tokens), "--threads", str(args.threads), "--chunk-tokens", str(args.chunk_tokens),
           "--row-tokens", str(args.row_tokens)] + (["--grad-ckpt"] if grad_ckpt else [])
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS=str(args.threads))
    limit, total = int(args.limit_gib * GIB), psutil.virtual_memory().total
    avail_start = _wait_for_memory(args)
    others_start = total / GIB - avail_start  # memory held by everything else on the host
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    ps, max_rss, killed, rss, avail = psutil.Process(proc.pid), 0, None, 0, avail_start * GIB
    while proc.poll() is None:
        try:
            rss = ps.memory_info().rss
        except psutil.NoSuchProcess:
            break
        max_rss = max(max_rss, rss)
        avail = psutil.virtual_memory().available
        if rss > limit or avail < args.reserve_gib * GIB:  # before the kernel's OOM killer picks a victim
            proc.kill()
            killed = (f"RSS passed the {args.limit_gib:g} GiB limit" if rss > limit else
                      f"the machine's available memory fell below {args.reserve_gib:g} GiB") + \
                     f" (child RSS {rss / GIB:.1f} GiB, available {avail / GIB:.1f} GiB)"
            break
        if time.monotonic() - t0 > args.timeout_s:
            proc.kill()
            killed = f"ran past {args.timeout_s:g} s"
            break
        time.sleep(0.02)
    stdout, stderr = proc.communicate()
    wall = time.monotonic() - t0
    for line in stdout.splitlines():
        if line.startswith(RESULT_TAG):
            row = json.loads(line[len(RESULT_TAG) :])
            row.update(wall_s=wall, watched_max_rss_gib=max_rss / GIB, available_gib_at_start=avail_start)
            return row
    why = (killed or f"exit status {proc.returncode}: " + (stderr.strip().splitlines() or ["(no output)"])[-1][-300:])
    others = (total - avail - rss) / GIB  # everything else on the host when the run ended
    return {"path": path, "tokens": tokens, "grad_ckpt": grad_ckpt, "fits": False, "why": why, "wall_s": wall,
            "watched_max_rss_gib": max_rss / GIB, "available_gib_at_start": avail_start, "others_gib_at_start": others_start,
            "others_gib_at_end": others, "contended": others > args.contention_gib and rss <= limit}


def ensure_model(layers: int | None) -> Path:
    """Built in a subprocess, so the builder's memory is not held by the parent during the sweep."""
    cmd = [sys.executable, "-m", "flashq.models.real_size", "--cache-dir", str(ROOT / ".cache/flashq")]
    cmd += ["--layers", str(layers)] if layers else []
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    return Path(out.stdout.strip().splitlines()[-1])


def figures_from(rows: list[dict]) -> dict:
    fit = {(r["path"], r["tokens"]): r for r in rows if r["fits"] and not r["grad_ckpt"]}
    naive_sizes = sorted(t for p, t in fit if p == "naive")
    figs: dict = {"bound": 0.35}
    if naive_sizes and ("bounded", naive_sizes[-1]) in fit:
        t = naive_sizes[-1]
        ratio = fit[("bounded", t)]["peak_extra_gib"] / fit[("naive", t)]["peak_extra_gib"]
        figs.update(peak_memory_vs_naive=ratio, at_tokens=t, meets_bound=ratio <= 0.35,
                    tokens_per_s_vs_naive=fit[("bounded", t)]["tokens_per_s"] / fit[("naive", t)]["tokens_per_s"])
    for p in PATHS:
        sizes = sorted(t for q, t in fit if q == p)
        figs[f"{p}_largest_fitting_tokens"] = sizes[-1] if sizes else None
    ckpt = {(r["path"], r["tokens"]): r for r in rows if r["fits"] and r["grad_ckpt"]}
    for p in sorted({p for p, _ in ckpt}):
        figs[f"{p}_ckpt_largest_fitting_tokens"] = max(t for q, t in ckpt if q == p)
    for (p, t), r in sorted(ckpt.items()):  # with gradient checkpointing, against the same size's other rows
        for q, other in (("", fit.get((p, t))), ("_vs_naive", fit.get(("naive", t)) if p == "bounded" else None),
                         ("_vs_naive_ckpt", ckpt.get(("naive", t)) if p == "bounded" else None)):
            if other is not None:
                figs[f"{p}_ckpt_peak_extra{q or '_vs_' + p}_at_{t}"] = r["peak_extra_gib"] / other["peak_extra_gib"]
    return figs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    ap.add_argument("--sizes", nargs="*", type=int, default=None,
                    help="micro-batch sizes in tokens (default 256 .. 8192; none: only the checkpointed rows)")
    ap.add_argument("--quick", action="store_true", help="2 layers, 256 and 512 tokens; not written over the real result")
    ap.add_argument("--layers", type=int, default=None, help="override the preset's 24 layers")
    ap.add_argument("--gc-tokens", nargs="*", type=int, default=[2048, 4096],
                    help="extra rows: bounded with gradient checkpointing at these sizes (none: no such rows)")
    ap.add_argument("--gc-paths", nargs="+", choices=PATHS, default=["bounded"], help="paths given the checkpointed rows")
    ap.add_argument("--append", action="store_true",
                    help="keep the result file's rows that this run does not measure again (each row names its command)")
    ap.add_argument("--limit-gib", type=float, default=21.0, help="kill a run whose RSS passes this")
    ap.add_argument("--reserve-gib", type=float, default=2.0,
                    help="kill a run when the machine's available memory falls below this (the host is shared)")
    ap.add_argument("--start-free-gib", type=float, default=20.0, help="wait for this much available memory before a run")
    ap.add_argument("--wait-s", type=float, default=300.0, help="... for at most this long")
    ap.add_argument("--contention-gib", type=float, default=2.0,
                    help="a kill counts as contention (retried) when other processes held more than this at the end")
    ap.add_argument("--retries", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=1200.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk-tokens", type=int, default=1024)
    ap.add_argument("--row-tokens", type=int, default=512)
    ap.add_argument("--out", default=None, help="result name under bench/results (default trainer_scale, quick: none)")
    # child mode
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tokens", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--grad-ckpt", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(RESULT_TAG + json.dumps(child(args)), flush=True)
        return

    from bench.common import RESULTS, command_line

    layers = args.layers or (2 if args.quick else None)
    sizes = sorted(args.sizes if args.sizes is not None else [256, 512] if args.quick else [256, 512, 1024, 2048, 4096, 8192])
    model = ensure_model(layers)
    print(f"model: {model}", flush=True)
    # sizes ascending, the paths interleaved (a run cut short still leaves both paths' small sizes)
    plan = [(p, t, False) for t in sizes for p in args.paths]
    for gc_tokens in sorted(args.gc_tokens or []):
        for gc_path in args.gc_paths:
            at = max((i for i, (_, t, _) in enumerate(plan) if t <= gc_tokens), default=len(plan) - 1)
            plan.insert(at + 1, (gc_path, gc_tokens, True))
    name = args.out or (None if args.quick else "trainer_scale")
    kept: list[dict] = []
    if args.append and name and (RESULTS / f"{name}.json").exists():
        measured = {(p, t, g) for p, t, g in plan}
        old = json.loads((RESULTS / f"{name}.json").read_text())
        kept = [r | {"command": r.get("command", old["command"])} for r in old["results"]
                if (r["path"], r["tokens"], r["grad_ckpt"]) not in measured]
    rows: list[dict] = []
    failed: dict[tuple[str, bool], int] = {}
    for path, tokens, gc in plan:
        if (path, gc) in failed and tokens > failed[(path, gc)]:
            row = {"path": path, "tokens": tokens, "grad_ckpt": gc, "fits": False,
                   "why": f"not run: {failed[(path, gc)]} tokens did not fit"}
        else:
            row = run_one(args, model, path, tokens, gc)
            if not row["fits"]:
                failed[(path, gc)] = tokens
        row["command"] = command_line()
        rows.append(row)
        brief = {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()
                 if k in ("path", "tokens", "grad_ckpt", "fits", "why", "baseline_rss_gib", "peak_extra_gib",
                          "fwd_bwd_s", "tokens_per_s", "wall_s", "hwm_reset_ok")}
        print(brief, flush=True)
        if name:  # after every row, so an interrupted sweep still leaves its measurements
            save(name, _ordered(kept + rows), args, layers)
    rows = _ordered(kept + rows)
    report(rows, args)
    if name:
        print(f"wrote {save(name, rows, args, layers)}")


def _ordered(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["tokens"], r["grad_ckpt"], PATHS.index(r["path"])))


def report(rows: list[dict], args) -> None:
    from bench.common import print_table

    for r in rows:
        r["label"] = r["path"] + (" +ckpt" if r["grad_ckpt"] else "")
        r["fit"] = "yes" if r["fits"] else "did not fit"
    print_table(
        f"trainer forward+backward of one micro-batch, {'quick ' if args.quick else ''}Qwen2.5-0.5B shape, "
        f"float32, {args.threads} threads (peak extra = VmHWM - RSS after a full step)",
        rows,
        [("label", "path", ""), ("tokens", "tokens", "d"), ("fit", "fits", ""), ("baseline_rss_gib", "baseline GiB", ".2f"),
         ("peak_extra_gib", "peak extra GiB", ".2f"), ("fwd_bwd_s", "fwd+bwd s", ".1f"), ("tokens_per_s", "tokens/s", ".1f")],
    )
    print(f"figures: {figures_from(rows)}")


def save(name: str, rows: list[dict], args, layers: int | None) -> Path:
    from bench.common import RESULTS, write_result

    notes = ("Each row a fresh subprocess: Qwen2.5-0.5B architecture with random weights (flashq/models/real_size.py) "
             f"loaded in float32{f' with {layers} layers' if layers else ''}, AdamW, one full step on 64 tokens, "
             "then one forward+backward of policy_loss (ppo, tis_token, token_mean) on the micro-batch. baseline = RSS "
             "after that step (gc + malloc_trim); peak_extra = VmHWM after the micro-batch's backward (VmHWM reset "
             "by /proc/self/clear_refs) minus baseline. Rows of 512 tokens: 128 prompt + 384 response (loss mask). "
             f"The parent kills a child above {args.limit_gib:g} GiB RSS, or when the shared host's available memory "
             f"falls below {args.reserve_gib:g} GiB: 'did not fit'. peak_memory_vs_naive = "
             "bounded / naive peak_extra at the largest micro-batch the naive path survives.")
    # bench/scale_loop.py adds the whole loop's figures and sections (loop, and the loop_* kept beside it by
    # hand) to the same file: keep them, so a rerun of this part (bench/all.py runs both) loses none
    path = RESULTS / f"{name}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    kept = {k: v for k, v in old.get("figures", {}).items() if k.startswith(("steps_at_", "weight_sync_", "step_interval_"))}
    path = write_result(name, rows, {**figures_from(rows), **kept}, notes=notes)
    loops = {k: v for k, v in old.items() if k.startswith("loop")}
    if loops:
        doc = json.loads(path.read_text())
        doc.update(loops)
        path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


if __name__ == "__main__":
    main()
