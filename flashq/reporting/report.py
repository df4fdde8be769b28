"""End-of-run report: a PNG of reward and staleness over steps, and a one-screen summary.

`flashq launch` writes it when a run finishes; `flashq report RUN_DIR` writes it for any run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from flashq.reporting.metrics import read_metrics


def smooth(values: list[float], window: int) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    if len(v) == 0 or window <= 1:
        return v
    kernel = np.ones(min(window, len(v)))
    return np.convolve(v, kernel, "full")[: len(v)] / np.convolve(np.ones(len(v)), kernel, "full")[: len(v)]


def summarize(run_dir: Path) -> dict:
    steps = read_metrics(run_dir / "metrics.jsonl")
    if not steps:
        raise ValueError(f"{run_dir} has no step metrics yet")
    rewards = [r["reward/mean"] for r in steps]
    window = max(1, len(rewards) // 10)
    sm = smooth(rewards, window)
    last = float(np.mean(rewards[-window:]))
    sft = json.loads((run_dir / "sft.json").read_text()) if (run_dir / "sft.json").exists() else None
    # the policy RL starts from: the SFT model's own sampled reward on fresh prompts when there
    # was a warm start, else the first batch (generated entirely by the starting weights)
    evaluated = sft is not None and "sampled_accuracy" in sft  # an environment's SFT is judged by playing it
    start = sft["sampled_accuracy"] if evaluated else rewards[0]
    out = {
        "steps": steps[-1]["step"],
        "wall_minutes": steps[-1]["time/elapsed_s"] / 60,
        "reward_start": float(start),
        "reward_start_source": "SFT eval, sampled at T=1" if evaluated else "first batch",
        "reward_first_steps": float(np.mean(rewards[:window])),
        "reward_final": last,
        "reward_gain": last - float(start),
        "reward_best_smoothed": float(sm.max()),
        "smoothing_window_steps": window,
        "staleness_max": max(r["staleness/max"] for r in steps),
        "staleness_mean": float(np.mean([r["staleness/mean"] for r in steps])),
        "staleness_violations": sum(r["staleness/violations"] for r in steps),
        "tokens_per_s": float(np.mean([r.get("rollout/tokens_per_s", 0.0) for r in steps[1:]] or [0.0])),
        "rollout_idle_share": float(np.mean([r.get("rollout/idle_share", 0.0) for r in steps[1:]] or [0.0])),
        "trainer_idle_share": float(np.mean([r.get("trainer/idle_share", 0.0) for r in steps[1:]] or [0.0])),
        "weight_sync_s": float(np.mean([r["trainer/weight_sync_s"] for r in steps])),
    }
    sized = [r for r in steps if "response/mean_tokens" in r]
    if sized:  # a policy that stops answering and runs to the limit shows here first
        out["response_tokens_first_steps"] = float(np.mean([r["response/mean_tokens"] for r in sized[:window]]))
        out["response_tokens_final"] = float(np.mean([r["response/mean_tokens"] for r in sized[-window:]]))
        out["truncated_share_final"] = float(np.mean([r.get("response/truncated_frac", 0.0) for r in sized[-window:]]))
    ledger = run_dir / "ledger.json"
    if ledger.exists():
        books = json.loads(ledger.read_text())
        out["samples_trained"] = books.get("samples_trained")
        out["rejected_frames"] = sum(books.get("rejected_frames", {}).values())
    if sft:
        out["sft"] = sft
    evals = read_metrics(run_dir / "metrics.jsonl", kind="eval")
    if evals:  # held-out evaluation: the first round (the starting policy) and the last (the final one)
        first, last = evals[0], evals[-1]
        keep = lambda r: {k: v for k, v in r.items() if k not in ("kind", "time")}  # noqa: E731
        out["eval_first"], out["eval_last"] = keep(first), keep(last)
        for key in ("greedy_accuracy", "mean_reward"):
            if key in first and key in last:
                out[f"eval_{key}_gain"] = last[key] - first[key]
    return out


def plot(run_dir: Path, path: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = read_metrics(run_dir / "metrics.jsonl")
    x = [r["step"] for r in steps]
    rewards = [r["reward/mean"] for r in steps]
    bound = max(int(k.rsplit("/", 1)[1]) for r in steps for k in r if k.startswith("hist/staleness/"))
    hist = np.array([[r.get(f"hist/staleness/{i}", 0.0) for i in range(bound + 1)] for r in steps])
    shares = hist / np.maximum(hist.sum(1, keepdims=True), 1)

    fig, (ax1, ax3, ax2) = plt.subplots(3, 1, figsize=(8, 8), sharex=True, height_ratios=[3, 2, 2])
    ax1.plot(x, rewards, color="tab:blue", alpha=0.3, label="batch mean reward")
    ax1.plot(x, smooth(rewards, max(1, len(x) // 10)), color="tab:blue", label="smoothed")
    evals = read_metrics(run_dir / "metrics.jsonl", kind="eval")
    if evals:
        ex = [r["step"] for r in evals]
        for key, style in (("greedy_accuracy", "s-"), ("mean_reward", "o--")):
            if key in evals[0]:
                ax1.plot(ex, [r.get(key, np.nan) for r in evals], style, color="tab:red" if key == "greedy_accuracy" else "tab:orange",
                         ms=4, lw=1, label=f"held-out {key.replace('_', ' ')}")
    ax1.set_ylabel("reward")
    ax1.set_ylim(-0.02, 1.02)
    ax1.legend(loc="upper left")
    ax1.grid(alpha=0.3)
    lengths = [(r["step"], r["response/mean_tokens"], r.get("response/truncated_frac", 0.0)) for r in steps if "response/mean_tokens" in r]
    if lengths:
        lx, mean_tokens, truncated = zip(*lengths)
        ax3.plot(lx, mean_tokens, color="tab:green", label="mean response tokens")
        ax3.set_ylabel("tokens")
        ax3.set_ylim(bottom=0)
        ax3.grid(alpha=0.3)
        share = ax3.twinx()
        share.plot(lx, truncated, color="tab:gray", ls="--", label="share cut at max_tokens")
        share.set_ylim(-0.02, 1.02)
        share.set_ylabel("truncated")
        handles = ax3.get_legend_handles_labels()[0] + share.get_legend_handles_labels()[0]
        ax3.legend(handles=handles, loc="upper left", fontsize=8)
    bottom = np.zeros(len(x))
    colors = plt.cm.viridis(np.linspace(0.1, 0.9, bound + 1))
    for i in range(bound + 1):
        ax2.bar(x, shares[:, i], bottom=bottom, width=1.0, color=colors[i], label=f"{i} version{'s' if i != 1 else ''} old")
        bottom += shares[:, i]
    ax2.set_ylabel("share of trained tokens")
    ax2.set_xlabel("trainer step")
    ax2.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{run_dir.name}: reward, response length and token staleness")
    fig.tight_layout()
    out = path or run_dir / "report.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def summary_text(s: dict) -> str:
    lines = [
        f"steps {s['steps']} in {s['wall_minutes']:.1f} min",
        f"reward {s['reward_start']:.3f} ({s['reward_start_source']}) -> {s['reward_final']:.3f} (last {s['smoothing_window_steps']} steps): gain {s['reward_gain']:+.3f}",
        f"staleness max {s['staleness_max']:.0f}, mean {s['staleness_mean']:.2f}, violations {s['staleness_violations']:.0f}",
        f"rollout {s['tokens_per_s']:,.0f} tokens/s, idle {100 * s['rollout_idle_share']:.0f}%; trainer idle {100 * s['trainer_idle_share']:.0f}%; weight sync {s['weight_sync_s']:.2f}s",
    ]
    if "response_tokens_final" in s:
        lines.append(f"responses {s['response_tokens_first_steps']:.1f} -> {s['response_tokens_final']:.1f} tokens (mean), "
                     f"{100 * s['truncated_share_final']:.0f}% cut at max_tokens at the end")
    if "samples_trained" in s:
        lines.append(f"samples trained {s['samples_trained']}, rejected frames {s.get('rejected_frames', 0)}")
    if "eval_first" in s:
        first, last = s["eval_first"], s["eval_last"]
        shown = [k for k in ("greedy_accuracy", "mean_reward") + tuple(k for k in last if k.startswith("pass@")) if k in first and k in last]
        lines.append(f"held-out eval (version {first['step']} -> {last['step']}): "
                     + ", ".join(f"{k} {first[k]:.3f} -> {last[k]:.3f}" for k in shown))
    if "sampled_accuracy" in s.get("sft", {}):
        lines.append(f"SFT warm start: sampled accuracy {s['sft']['sampled_accuracy']:.3f}, greedy {s['sft']['greedy_accuracy']:.3f}")
    return "\n".join(lines)


def write_report(run_dir: Path) -> tuple[Path, str]:
    s = summarize(run_dir)
    (run_dir / "summary.json").write_text(json.dumps(s, indent=2))
    return plot(run_dir), summary_text(s)
