"""Batches that crashed the trainer, so the one that crashes it every time is set aside.

A batch whose step raises (an out-of-range token id, a deterministic out-of-memory) ends the
trainer; the launcher resumes from the newest checkpoint, whose held groups make much the same
batch again, and it crashes again, for ever. So before it goes down the trainer appends the
batch's request ids and the error to `<run_dir>/failed_batches.jsonl`, and a resuming coordinator
quarantines every held group named by `trainer.max_batch_failures` such records (its samples
listed in the ledger's `quarantined`, the group dropped and another prompt admitted), as poison
requests are (`rollout.max_request_failures`).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from flashq.jsonl import cut_torn_tail, read_records

FILE = "failed_batches.jsonl"


def record_failure(run_dir: Path, version: int, batch_index: int, request_ids: list[str], error: BaseException) -> None:
    path = Path(run_dir) / FILE
    cut_torn_tail(path)
    line = json.dumps({"time": time.time(), "version": version, "batch_index": batch_index, "request_ids": list(request_ids),
                       "error": f"{type(error).__name__}: {error}"[:500]})
    with path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def suspects(run_dir: Path, groups: dict[str, list[str]], failures: int) -> dict[str, list[str]]:
    """Group id -> the errors of the failed batches that held one of its `groups[gid]` request
    ids, for the groups named by at least `failures` of them."""
    path = Path(run_dir) / FILE
    if not path.exists():
        return {}
    records = read_records(path)
    out = {}
    for gid, request_ids in groups.items():
        ids = set(request_ids)
        errors = [r["error"] for r in records if ids.intersection(r["request_ids"])]
        if len(errors) >= failures:
            out[gid] = errors
    return out
