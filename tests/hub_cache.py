"""A Hugging Face hub cache filled by hand, as `snapshot_download` leaves it, so a model named by a
hub id resolves offline in tests (nothing can be downloaded from a hub here)."""

from __future__ import annotations

import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def prefill(cache: Path, repo_id: str, folder: Path, commit: str = COMMIT) -> Path:
    """Copy `folder`'s files into `cache` as repo `repo_id` at `commit` (the `main` branch);
    returns the snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if f.is_file():
            shutil.copy2(f, snapshot / f.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
