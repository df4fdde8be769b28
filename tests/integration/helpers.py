"""Run `flashq launch` as a user would, in a subprocess, and read what the run left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SMALL = [
    "sampling.group_size=4",
    "sampling.max_tokens=8",
    "trainer.batch_groups=4",
    "rollout.num_workers=2",
    "rollout.max_inflight_per_worker=64",
    "sft.warm_start=false",
    "placement={}",
    "transport.startup_timeout_s=300",
    "eval=null",  # the quickstart evaluates; tests that evaluate say so
]


def launch_cmd(run_dir: Path, overrides: list[str], config: str = "configs/quickstart.yaml") -> list[str]:
    return [sys.executable, "-m", "flashq.cli", "launch", config, "--no-progress", f"log.run_dir={run_dir}", *SMALL, *overrides]


def launch(run_dir: Path, overrides: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run(launch_cmd(run_dir, overrides), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trained_requests(run_dir: Path) -> list[tuple[int, str, int, int]]:
    """(trainer_version, request_id, min token version, max token version) for every trained sample."""
    out = []
    for rec in read_jsonl(run_dir / "trained.jsonl"):
        for rid, vmin, vmax, *_ in rec["requests"]:
            out.append((rec["trainer_version"], rid, vmin, vmax))
    return out
