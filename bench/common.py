"""Shared by the benchmarks: machine description, result files, tables."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

# imported here, not where a table is printed: a benchmark started outside flashq's environment
# then stops at once instead of after its runs, with their figures unwritten
from rich.console import Console
from rich.table import Table

# bench/all.py --quick points this at bench/results/quick, so a reduced-size run never replaces a reported file
RESULTS = Path(os.environ.get("FLASHQ_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")
DOCS = Path(__file__).resolve().parents[1] / "docs"


def machine() -> dict:
    info = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
    }
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    for mod in ("torch", "vllm", "zmq", "msgspec", "msgpack"):
        try:
            m = __import__(mod)
            info[f"{mod}_version"] = getattr(m, "__version__", None) or getattr(m, "pyzmq_version", lambda: "?")()
        except Exception:  # noqa: BLE001 - optional: record what is there
            pass
    try:
        import torch

        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        # hosts that all report "AMD EPYC" ran the calculator up to 3.5x apart: the vector ISA torch runs on
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - a failed capability query keeps the GPU's name
        info.setdefault("gpu", None)
    return info


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def command_line() -> str:
    return "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0]), *sys.argv[1:]])


def git_commit() -> str | None:
    """HEAD, or FLASHQ_GIT_COMMIT where it is set: a tree copied to a GPU machine may carry a
    stale .git (one such copy reported the session's first commit)."""
    if os.environ.get("FLASHQ_GIT_COMMIT"):
        return os.environ["FLASHQ_GIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


ROOT = Path(__file__).resolve().parents[1]
# Where runs longer than a session keep what they finished: committed beside the results, since a
# session's machine is new each time (its .cache with it) and the next one goes on from the commit.
KEPT = RESULTS / "kept"


def code_fingerprint(*bench_files: str) -> str:
    """What a benchmark run's figures depend on: flashq, the configs and the benchmark's own files
    as committed (a commit that changes only docs, tests or other benchmarks keeps it)."""
    paths = ["flashq", "configs", "bench/common.py", *bench_files]
    out = subprocess.run(["git", "rev-parse", *(f"HEAD:{p}" for p in paths)], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *paths], cwd=ROOT, capture_output=True, text=True).stdout
    if out.returncode != 0 or dirty.strip():
        raise SystemExit("runs that are kept run on committed code: commit or stash the changes to " + ", ".join(paths))
    return ",".join(out.stdout.split())


def file_digest(*files: Path) -> str:
    """Files by content, in the order given (16 hex digits of their SHA-256)."""
    import hashlib

    digest = hashlib.sha256()
    for f in files:
        with Path(f).open("rb") as fh:
            while chunk := fh.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def weights_digest(folder: Path) -> str:
    """A model folder's weights by content: a checkpoint trained again in a later session (same
    path, other weights) is another model to the runs kept from it."""
    return file_digest(*sorted(Path(folder).glob("*.safetensors")))


def kept_runs(key: dict, path: Path) -> list[dict]:
    """The records in `path` whose fields match `key`."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if all(r.get(k) == v for k, v in key.items())]


def keep_run(record: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


class KeptRuns:
    """A benchmark's runs (each a dict of figures) kept as each ends, in a JSONL file, so a rerun
    cut off (most take longer than a session on a CPU) goes on where it stopped: a run is taken
    as it was only when `identity` (committed code, CPU model, sizes) matches. Each run keeps the
    commit and date it ran at."""

    def __init__(self, path: Path, identity: dict):
        self.path, self.identity = path, identity
        self.kept = {self._key(r["run_key"]): r["run"] for r in kept_runs(identity, path)}
        if self.kept:
            print(f"{len(self.kept)} run(s) kept from before in {path.name} (same code, CPU and sizes)")

    @staticmethod
    def _key(run_key: dict) -> str:
        return json.dumps(run_key, sort_keys=True)

    def run(self, run_key: dict, go) -> dict:
        """`go()`'s figures for `run_key` (mode, seed, ...) with "git_commit" and "date", or the kept ones."""
        key = self._key(run_key)
        if key not in self.kept:
            run = {**go(), "git_commit": git_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            keep_run({**self.identity, "run_key": run_key, "run": run}, self.path)
            self.kept[key] = run
        return self.kept[key]


def run_timed(cmd: list[str], what: str, logs: Path) -> float:
    """Run a whole user command from the repository root, as a user does; its wall seconds. A
    failure stops the benchmark, pointing at the run's logs."""
    print("running:", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], env=dict(os.environ, COLUMNS="120"))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (exit {proc.returncode}); its logs are in {logs}")
    return wall


def plot_path(name: str) -> Path:
    """Where a benchmark's plot goes: docs/<name>, or beside the results when FLASHQ_BENCH_RESULTS
    redirects them (a quick sweep), so a reduced-size run never replaces a published plot."""
    folder = RESULTS if os.environ.get("FLASHQ_BENCH_RESULTS") else DOCS
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


def write_result(name: str, results: list[dict] | dict, figures: dict, notes: str = "") -> Path:
    """Write bench/results/<name>.json; the figures it replaces go to `figures.earlier` (keep_earlier)
    unless the benchmark archived them itself (it passes `earlier`)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    if "earlier" not in figures:
        figures = keep_earlier(name, figures)
    doc = {
        "benchmark": name,
        "command": command_line(),
        "git_commit": git_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "figures": figures,
        "results": results,
        "notes": notes,
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def keep_earlier(name: str, figures: dict) -> dict:
    """`figures` with the figures of the result file it replaces appended to `figures["earlier"]`
    (each with its commit, date, command and CPU), so a rerun never erases what was reported before;
    this host's results differ with its CPU (two kinds here differ 2x in speed and in SFT numerics)."""
    path = RESULTS / f"{name}.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    earlier = (old.get("figures") or {}).pop("earlier", [])
    earlier = [earlier] if isinstance(earlier, dict) else list(earlier)
    if old.get("figures"):
        earlier.append({**old["figures"], "git_commit": old.get("git_commit"), "date": old.get("date"), "command": old.get("command"),
                        "cpu_model": (old.get("machine") or {}).get("cpu_model")})
    return {**figures, "earlier": earlier}


def print_table(title: str, rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """columns: (key, header, format spec)."""
    table = Table(title=title)
    for _, header, _ in columns:
        table.add_column(header, justify="right")
    for row in rows:
        table.add_row(*[format(row[k], fmt) if isinstance(row.get(k), (int, float)) else str(row.get(k, "")) for k, _, fmt in columns])
    Console().print(table)
