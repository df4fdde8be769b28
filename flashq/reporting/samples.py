"""What the model writes, where a person can read it: one scored response in every
`log.samples_every`, with its prompt, reward and the policy versions that sampled it, appended to
`samples-<reward worker>.jsonl` in the run directory; `flashq samples RUN_DIR` prints the latest.

A reward that stays at 0 reads as a flat line in the metrics; the responses say why (job R's
first reward paid nothing because SmolLM2 never answered inside the tags: one look at them).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from flashq.jsonl import cut_torn_tail, read_records
from flashq.wire.protocol import RewardResult, ScoreRequest


class SampleLog:
    """Keeps the 1st, (every+1)th, ... response a reward worker scores."""

    def __init__(self, path: Path, every: int):
        if every < 1:
            raise ValueError(f"samples_every must be at least 1 (got {every})")
        cut_torn_tail(path)  # a worker killed mid-line left a fragment
        self.path, self.every, self.seen = path, every, 0
        self.file = path.open("a", buffering=1)

    def due(self) -> bool:
        """Whether the next response is one to keep (counts it)."""
        self.seen += 1
        return (self.seen - 1) % self.every == 0

    def write(self, req: ScoreRequest, text: str | None, result: RewardResult) -> None:
        versions = req.sample.versions
        record = {
            "time": time.time(),
            "request_id": req.sample.request_id,
            "task_id": req.task.get("id"),
            "prompt": req.task.get("prompt") if isinstance(req.task.get("prompt"), str) else None,
            "response": text,
            "reward": result.reward,
            "error": result.error,
            "tokens": int(len(req.sample.token_ids)),
            "versions": [int(versions.min()), int(versions.max())] if len(versions) else [],
        }
        self.file.write(json.dumps(record, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self.file.close()


def latest_samples(run_dir: Path, count: int) -> list[dict]:
    """The `count` most recent samples over every reward worker's file, oldest first."""
    records = [r for path in sorted(Path(run_dir).glob("samples-*.jsonl")) for r in read_records(path)]
    return sorted(records, key=lambda r: r["time"])[-count:] if count > 0 else []


def print_samples(run_dir: Path, count: int) -> int:
    """`flashq samples`: the latest responses with their rewards, on the terminal (the model's text
    printed as text, never read as rich markup)."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.text import Text

    records = latest_samples(run_dir, count)
    console = Console()
    if not records:
        console.print(f"no samples in {run_dir} (log.samples_every is 0, or nothing was scored yet)", markup=False)
        return 1
    for r in records:
        title = f"reward {r['reward']:.3f}  versions {r['versions']}  {r['tokens']} tokens  {r['request_id']}"
        body = Text()
        if r["prompt"]:
            body.append(r["prompt"] + "\n\n", style="dim")
        body.append(r["response"] if r["response"] is not None else "(not decoded)")
        if r["error"]:
            body.append(f"\nreward error: {r['error']}", style="red")
        console.print(Panel(body, title=Text(title), title_align="left"))
    return 0
