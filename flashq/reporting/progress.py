"""The launcher's live terminal view, drawn from the run's `metrics.jsonl` as it grows; tokens/s
and idle shares averaged over the last steps (`flashq.reporting.step_window`), as the coordinator's log line."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Group
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from flashq.reporting.step_window import StepWindow


class ProgressView:
    def __init__(self, metrics_path: Path, total_steps: int, title: str):
        self.path = metrics_path
        self.offset = 0
        self.latest: dict = {}
        self.rewards: list[float] = []
        self.window = StepWindow()
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        self.task = self.bar.add_task(title, total=total_steps)
        self.started = time.monotonic()

    def poll(self) -> None:
        if not self.path.exists():
            return
        with self.path.open() as f:
            f.seek(self.offset)
            for line in f:
                if not line.endswith("\n"):
                    break
                self.offset += len(line.encode())
                rec = json.loads(line)
                if rec.get("kind") == "step":
                    self.latest = rec
                    self.window.add(rec)
                    self.rewards.append(rec.get("reward/mean", 0.0))
                    self.bar.update(self.task, completed=rec["step"])

    def __rich__(self):
        self.poll()
        r = self.latest
        if not r:
            return Panel(self.bar, title="flashq", subtitle="waiting for the first step")
        table = Table.grid(padding=(0, 2))
        table.add_column(style="cyan")
        table.add_column()
        table.add_row("reward", f"{r.get('reward/mean', 0):.3f} (first {self.rewards[0]:.3f}, best {max(self.rewards):.3f})")
        hist = [int(r[k]) for k in sorted(r, key=_hist_order) if k.startswith("hist/staleness/")]
        table.add_row("staleness", _histogram(hist))
        w = self.window
        table.add_row("tokens/s", f"{w.mean('rollout/tokens_per_s'):,.0f} ({w.label()})")
        idle = "  ".join(f"{k}: {100 * w.mean(f'{k}/idle_share'):.0f}%" for k in ("rollout", "reward", "trainer") if f"{k}/idle_share" in r)
        table.add_row("idle", f"{idle} ({w.label()})")
        table.add_row(
            "queues",
            f"generate {r.get('queue/generate_in_flight', 0):.0f} running / {r.get('queue/generate_waiting', 0):.0f} waiting, "
            f"score {r.get('queue/score_in_flight', 0):.0f}, groups buffered {r.get('queue/groups_in_buffer', 0):.0f}",
        )
        table.add_row("weights", f"v{r.get('engine_version', 0):.0f} served, last sync {r.get('trainer/weight_sync_s', 0):.2f}s")
        if "spec/acceptance_length" in r:
            table.add_row("acceptance", f"{r['spec/acceptance_length']:.2f} tokens/step")
        return Panel(Group(self.bar, table), title="flashq")


def _hist_order(key: str) -> tuple:
    tail = key.rsplit("/", 1)[-1]
    return (0, int(tail)) if tail.isdigit() else (1, tail)


def _histogram(counts: list[int]) -> str:
    total = sum(counts) or 1
    return "  ".join(f"{i}:{'█' * max(1, round(10 * c / total)) if c else '·'} {100 * c / total:.0f}%" for i, c in enumerate(counts))
