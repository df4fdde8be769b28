"""Torn resumes, for bench/chaos.py: a run killed whole (launcher, roles and engines at once, as
when the machine loses power) again and again, each time left damaged before it is resumed with
`flashq launch --resume`: a torn last line in metrics.jsonl or trained.jsonl (a write cut short),
or its newest checkpoint emptied (every file cut to nothing: `checkpoint.latest` must fall back to
the one before, and the run must later write that step again over the torn one). And a full
disk: the run directory is a small tmpfs of its own, filled while the run goes on; the run must
stop by itself naming the disk, and, space freed, resume. After the last resume the run finishes,
and the books must show every admitted group trained whole exactly once or listed untrained.
"""

from __future__ import annotations

import errno
import random
import signal
import subprocess
import time
from pathlib import Path

import psutil

DAMAGES = ("torn metrics.jsonl", "torn trained.jsonl", "empty newest checkpoint", "full disk")


def checkpoints(run_dir: Path) -> list[int]:
    root = run_dir / "checkpoints"
    if not root.exists():
        return []
    return sorted(int(p.name.removeprefix("step-")) for p in root.iterdir() if p.name.startswith("step-") and not p.name.endswith(".tmp"))


def kill_whole(pid: int) -> None:
    """SIGKILL a launcher and everything under it at once: all stopped first (nothing forks or
    restarts in between), listed again, then killed."""
    try:
        top = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs: dict[int, psutil.Process] = {}
    for _ in range(2):
        for p in [top, *top.children(recursive=True)]:
            if p.pid not in procs:
                procs[p.pid] = p
                try:
                    p.send_signal(signal.SIGSTOP)
                except psutil.NoSuchProcess:
                    pass
    for p in procs.values():
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(list(procs.values()), timeout=30)


def mount_small_disk(run_dir: Path, size: str = "1g") -> bool:
    """The run directory as a tmpfs of its own (root only); False where it cannot be mounted."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(run_dir)], capture_output=True).returncode == 0


def fill(path: Path) -> None:
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise


def damage(run_dir: Path, kind: str, rng: random.Random) -> str:
    """Leave the stopped run as a crash mid-write would; says what was done."""
    if kind == "empty newest checkpoint":
        steps = checkpoints(run_dir)
        if len(steps) < 2:  # nothing to fall back to: tear a line instead
            return damage(run_dir, "torn trained.jsonl", rng)
        newest = run_dir / "checkpoints" / f"step-{steps[-1]:06d}"
        for f in newest.rglob("*"):
            if f.is_file():
                f.write_bytes(b"")
        return f"emptied {newest.name}"
    name = kind.split()[1]
    path = run_dir / name
    lines = [x for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    if not lines:
        return f"{name} empty: nothing torn"
    tail = lines[-1][: rng.randint(1, max(1, len(lines[-1]) - 1))]
    with path.open("a") as f:
        f.write(tail)  # a partial copy of a record, no newline: the write that was cut short
    return f"tore {name} ({len(tail)} bytes)"


def torn_resumes(launch, run_dir: Path, resumes: int, seed: int, full_disk: bool) -> list[dict]:
    """`launch(resume: bool)` starts the run (or resumes it) and returns its Popen. Each time a
    new checkpoint is down: kill it whole and damage it, or (`full_disk`, every fourth) fill its
    disk and wait for it to stop; then resume. `resumes` times."""
    rng = random.Random(seed)
    kinds = [k for k in DAMAGES if full_disk or k != "full disk"]
    done = []
    proc = launch(False)
    for i in range(resumes):
        after = max(checkpoints(run_dir), default=0)
        while proc.poll() is None and max(checkpoints(run_dir), default=0) <= after:
            time.sleep(0.2)
        if proc.poll() is not None:
            raise SystemExit(f"the run ended (status {proc.returncode}) before resume {i + 1} of {resumes}: raise its steps")
        time.sleep(rng.uniform(0, 2))  # somewhere between checkpoints: steps past the newest are redone
        kind = kinds[i % len(kinds)]
        if kind == "full disk":
            filler = run_dir / "filler.bin"
            fill(filler)
            try:
                status = proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                raise SystemExit("the run went on for 10 minutes on a full disk without stopping") from None
            filler.unlink()
            what = f"filled the disk: the run stopped by itself (status {status})"
        else:
            kill_whole(proc.pid)
            what = damage(run_dir, kind, rng)
        done.append({"resume": i + 1, "checkpoints": checkpoints(run_dir), "damage": kind, "done": what})
        print(f"  {what}; resuming", flush=True)
        proc = launch(True)
    if proc.wait() != 0:
        raise SystemExit(f"the run failed after its last resume (status {proc.returncode})")
    return done
