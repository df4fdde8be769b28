"""The run's append-only JSON-lines records (`metrics.jsonl`, `trained.jsonl`), read and cut
back safely after a crash.

A process killed mid-write (or a full disk) leaves a torn last line: part of a record and no
newline. Readers skip it; a role that appends again first cuts it off, or its next record would
be glued onto the fragment. A bad line anywhere else is not a torn write, and is an error naming
the file and line. Rewrites (dropping the records a resume redoes) go to a temporary file that
replaces the old one in one rename, so a crash mid-rewrite leaves one or the other, whole.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


class CorruptRecord(ValueError):
    """A line that is not JSON and not a torn tail."""


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every whole record in `path`, skipping blank lines and a torn last line."""
    return _parse(Path(path), Path(path).read_bytes())[0]


def cut_torn_tail(path: Path) -> int:
    """Cut a torn last line off `path` in place (a truncate, so what stays is never rewritten),
    so that appending can go on; returns the bytes removed."""
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    whole = _parse(path, data)[1]
    if whole < len(data):
        with path.open("r+b") as f:
            f.truncate(whole)
            f.flush()
            os.fsync(f.fileno())
    elif data and not data.endswith(b"\n"):  # a whole record torn off just before its newline
        with path.open("ab") as f:
            f.write(b"\n")
    return len(data) - whole


def keep_records(path: Path, keep: Callable[[dict[str, Any]], bool]) -> int:
    """Rewrite `path` with the whole records `keep` accepts, atomically; returns how many stayed."""
    path = Path(path)
    if not path.exists():
        return 0
    kept = [rec for rec in read_records(path) if keep(rec)]
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.writelines(json.dumps(rec) + "\n" for rec in kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)
    return len(kept)


def fsync_path(path: Path) -> None:
    """Make a file's bytes, or a rename or new file in a directory, survive a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _parse(path: Path, data: bytes) -> tuple[list[dict[str, Any]], int]:
    """(records, byte length of the whole lines). The last line is torn when it has no newline
    and does not parse; a last line without its newline that does parse is whole."""
    records, offset = [], 0
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        last = number == len(lines)
        end = offset + len(line) + (0 if last else 1)
        if line.strip():
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError("not an object")
            except ValueError as e:
                if last:
                    return records, offset
                raise CorruptRecord(f"{path}:{number}: not a JSON record ({e}); only a torn last line is skipped") from None
            records.append(rec)
        offset = end
    return records, offset
