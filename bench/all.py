"""Every benchmark in its reporting mode, one after the other, so that every file in bench/results/
is measured at one commit; or each at reduced size (--quick), to see what drifted since last time.

The plan is bench/sweep_plan.py: per result file, its reporting commands, its reduced ones and the
figures compared. Each command runs from the repository root with this interpreter, its output
shown and kept under runs/sweep/; a failure is recorded and the sweep goes on. At the end: a table
(status, minutes, the commit the file names, each bound the file states met or not, the figures
that moved), bench/results/sweep.json, and the docs' tables regenerated (bench/figures.py). The
exit status is 1 when a benchmark failed or wrote nothing; moved figures and unmet bounds are
reported, not failures. A calibration is never re-run (sweep_plan.SKIPPED says why), nor a
benchmark whose needs are missing (a CUDA device, TRL): it is listed as skipped.

--quick runs the reduced commands with FLASHQ_BENCH_RESULTS=bench/results/quick (bench/common.py),
so they write bench/results/quick/<name>.json and their plots there, never a reported file. A
figure moved when it changed by more than its recorded spread: the range of the per-seed or
per-round values listed beside it (`<figure>_per_seed`, `_by_round`, `_spread`), the widest in the
previous file, the new one and (quick) the reported one; with none recorded, by more than the
entry's relative tolerance of the old value (15% unless the plan says otherwise; from 0, any
change). Quick compares against the previous quick run (the baseline); a first quick run becomes
the baseline and reports "no baseline". Baselines are per host: compare runs on one machine.

    python bench/all.py                      # every benchmark (a day): bench/results/*.json, sweep.json
    python bench/all.py --dry-run            # the plan and its estimated minutes; runs nothing
    python bench/all.py --only fuzz queue    # some of them; --skip NAME... leaves some out
    python bench/all.py --quick              # reduced size: bench/results/quick/, drift since the last quick run
    python bench/all.py --resume             # go on with a sweep a session's end cut off, at the same code

A full sweep outlasts a session here, and a session's end kills what runs. Each benchmark that
ends well is written to bench/results/kept/sweep_done.jsonl (name, commit, commands, date);
`--resume` leaves out those done with the commands the plan gives them now, at this commit or at
one with the same code for them (`bench_code`: flashq/, configs/, launch/, pyproject.toml and
bench/ less the scripts the benchmark never reaches, this runner and bench/figures.py; results,
docs and tests are never code), whose file still names that commit, and lists them in the report
as "done earlier" with their bounds judged. So a fix to one benchmark's harness mid-sweep sends
only that benchmark back. A benchmark cut off mid-way runs again (vs_trl, specdec, colocate and
real_model take up the runs they kept).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402
from bench.figures import BOUNDS as SIDES, meets, parse_bound, write as write_docs_tables  # noqa: E402
from bench.sweep_plan import BENCHES, SKIPPED, Bench  # noqa: E402

RESULTS = ROOT / "bench" / "results"
QUICK = RESULTS / "quick"
DONE = common.KEPT / "sweep_done.jsonl"  # the full sweep's finished benchmarks, for --resume
SPREAD_SUFFIXES = ("_per_seed", "_by_round", "_spread")
INSTALL = {"trl": "pip install trl==1.16.0 accelerate"}  # benchmark-only dependencies, as the scripts pin them


# --- bounds -------------------------------------------------------------------------------------

def is_number(v: object) -> bool:
    """Ints, floats and bools (a flip of `fits` is a change like any other), finite."""
    return isinstance(v, (int, float)) and math.isfinite(v)


def stated_bounds(figs: dict) -> dict[str, tuple[str, float]]:
    """figure -> (side, limit) for each bound a file states: its `bounds` dict ('>= 0.25'), or a
    number under the key bench/figures.py's BOUNDS names, whose side it records (the benchmarks
    write the number alone: `lora_reward_gain_bound: 0.2`)."""
    out = {fig: parse_bound(text) for fig, text in (figs.get("bounds") or {}).items()}
    for fig, (key, op) in SIDES.items():
        if op and fig not in out and fig in figs and is_number(figs.get(key)):
            out[fig] = (op, float(figs[key]))
    return out


def judge_bounds(figs: dict) -> list[dict]:
    """Each stated bound with its figure's value and whether it is met (None: the figure is missing)."""
    rows = []
    for fig, (op, limit) in stated_bounds(figs).items():
        value = figs.get(fig)
        rows.append({"figure": fig, "value": value, "bound": f"{op} {limit:g}",
                     "met": meets(value, op, limit) if is_number(value) else None})
    return rows


# --- comparing figures --------------------------------------------------------------------------

def flatten(figs: dict, prefix: str = "") -> dict:
    """Nested figures as 'outer.inner' keys (`recovery_s_by_role.trainer.detected_s`), lists and
    scalars as they are; `earlier`, the archive of replaced runs, left out."""
    out = {}
    for key, value in figs.items():
        if not prefix and key == "earlier":
            continue
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def spread(figure: str, flat: dict) -> float | None:
    """The range of the values a file lists beside `figure`: `<figure>_per_seed`, `_by_round`, or
    `_spread` ([min, max]); a list may name the figure's tail (`eval_greedy_gain_per_seed` serves
    `real_model_eval_greedy_gain`). None without a list of two values or more."""
    ranges = []
    for key, values in flat.items():
        stem = next((key[: -len(s)] for s in SPREAD_SUFFIXES if key.endswith(s)), None)
        if stem and isinstance(values, list) and (figure == stem or figure.endswith("_" + stem)):
            xs = [x for x in values if is_number(x)]
            if len(xs) >= 2:
                ranges.append(max(xs) - min(xs))
    return max(ranges) if ranges else None


def widest_spreads(names: Sequence[str], *docs: dict | None) -> dict[str, float]:
    """figure -> the widest spread any of `docs` (result files; None where there is none) records."""
    out: dict[str, float] = {}
    for doc in filter(None, docs):
        flat = flatten(doc.get("figures") or {})
        for fig in names:
            if (s := spread(fig, flat)) is not None:
                out[fig] = max(s, out.get(fig, 0.0))
    return out


def compare(before: dict, after: dict, names: Sequence[str], spreads: dict[str, float], tolerance: float) -> list[dict]:
    """Each named figure (every number both hold, when `names` is empty) before and after, and
    whether it moved: by more than its spread where one is recorded, else by more than `tolerance`
    of its old value. A figure on one side only: moved None."""
    b, a = flatten(before), flatten(after)
    names = list(names) or [k for k in b if is_number(b[k]) and is_number(a.get(k))]
    rows = []
    for fig in names:
        old, new = b.get(fig), a.get(fig)
        if old is None and new is None:
            continue
        if not (is_number(old) and is_number(new)):
            rows.append({"figure": fig, "before": old, "after": new, "moved": None})
            continue
        allowed, basis = (spreads[fig], "spread") if fig in spreads else (tolerance * abs(old), f"{tolerance:.0%}")
        rows.append({"figure": fig, "before": old, "after": new, "change": new - old, "allowed": allowed,
                     "basis": basis, "moved": abs(new - old) > allowed})
    return rows


# --- the plan -----------------------------------------------------------------------------------

def select(benches: Sequence[Bench], only: Sequence[str], skip: Sequence[str]) -> list[Bench]:
    """The benches `--only` and `--skip` leave, in the plan's order; a name the plan lacks stops the sweep."""
    known = {b.name for b in benches}
    for name in [*only, *skip]:
        if name in SKIPPED:
            raise SystemExit(f"{name}: not run by a sweep: {SKIPPED[name]}")
        if name not in known:
            raise SystemExit(f"{name}: no such benchmark; the plan has {', '.join(sorted(known))}")
    return [b for b in benches if (not only or b.name in only) and b.name not in skip]


def estimates(benches: Sequence[Bench], quick: bool, last_sweep: dict | None) -> dict[str, float]:
    """Minutes each is expected to take: what the last sweep of this mode measured, else the plan's guess."""
    measured = {r["name"]: r["minutes"] for r in (last_sweep or {}).get("results") or []
                if r.get("status") == "ok" and is_number(r.get("minutes"))}
    return {b.name: measured.get(b.name, b.quick_minutes if quick else b.minutes) for b in benches}


def missing_need(needs: Sequence[str]) -> str | None:
    """Why a benchmark cannot run here (a CUDA device, a module, a calibration's result file), or None."""
    for need in needs:
        if need.startswith("result:"):  # a choice made on calibration runs, which a sweep never redoes
            name = need.removeprefix("result:")
            if not (RESULTS / f"{name}.json").exists():
                return f"bench/results/{name}.json is missing: {SKIPPED.get(name, 'its calibration has not run')}"
        elif need == "cuda":
            try:
                listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
            except (OSError, subprocess.SubprocessError):
                listed = ""
            if "GPU" not in listed:
                return "no CUDA device here (nvidia-smi lists none)"
        elif importlib.util.find_spec(need) is None:
            return f"{need} is not installed (a benchmark-only dependency: {INSTALL.get(need, 'pip install ' + need)})"
    return None


def shown(argv: Sequence[str]) -> str:
    return shlex.join(["python", *argv])


def rel(path: Path) -> str:
    """`path` from the repository root where it lies under it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# --- running ------------------------------------------------------------------------------------

def run_logged(argv: list[str], env: dict, log: Path) -> tuple[int, list[str]]:
    """One command from the repository root, its output shown and appended to `log`: (exit status, last lines)."""
    tail: deque[str] = deque(maxlen=12)
    with log.open("a") as out, subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                text=True, errors="replace", bufsize=1) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            out.write(line)
            tail.append(line.rstrip())
    return proc.returncode, list(tail)


def run_bench(bench: Bench, quick: bool, logs: Path) -> dict:
    """Run one benchmark's commands; its status, minutes, the commit its file names, bounds and moves.
    The file as it was is read first: the comparison is against it."""
    path = (QUICK if quick else RESULTS) / f"{bench.name}.json"
    before, reported = load(path), load(RESULTS / f"{bench.name}.json")
    env = {k: v for k, v in os.environ.items() if k != "FLASHQ_BENCH_RESULTS"} | {"COLUMNS": "120"}
    if quick:
        env["FLASHQ_BENCH_RESULTS"] = str(QUICK)
    log = logs / f"{bench.name}.log"
    status, reason, t0 = "ok", "", time.monotonic()
    for argv in bench.quick if quick else bench.full:
        print(f"\n=== {bench.name}: {shown(argv)}", flush=True)
        rc, tail = run_logged([sys.executable, *argv], env, log)
        if rc != 0:
            status, reason = "failed", f"exit {rc} from {shown(argv)}: {tail[-1] if tail else ''}"
            break
    after = load(path)
    if status == "ok" and (after is None or after == before):
        status, reason = "not written", f"{rel(path)} unchanged"
    out = {"name": bench.name, "status": status, "reason": reason, "minutes": (time.monotonic() - t0) / 60,
           "commit": (after or {}).get("git_commit"), "log": rel(log), "bounds": [], "compared": None}
    if after and after != before:
        figs = after.get("figures") or {}
        out["bounds"] = judge_bounds(figs)
        if before:
            spreads = widest_spreads(bench.figures, before, after, reported)
            out["compared"] = compare(before.get("figures") or {}, figs, bench.figures, spreads, bench.tolerance)
        else:
            out["reason"] = out["reason"] or ("no baseline" if quick else "no earlier file")
    return out


def record_done(outcome: dict, path: Path, bench: Bench) -> None:
    """Note a full-sweep benchmark that ended well, at the commit its file names, with the commands
    that made it, for `--resume`."""
    if outcome["status"] == "ok" and outcome["commit"]:
        common.keep_run({"name": outcome["name"], "commit": outcome["commit"], "commands": [list(a) for a in bench.full],
                         "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, path)


# What a sweep measures; a commit changing none of it (results, docs, tests) leaves a sweep's figures true.
# This runner and bench/figures.py (which writes the docs' tables) measure nothing.
SWEEP_CODE = ("flashq", "configs", "launch", "pyproject.toml", "bench", ":(exclude)bench/results",
              ":(exclude)bench/all.py", ":(exclude)bench/figures.py")
SCRIPT_PATH = re.compile(r"\bbench/(\w+)\.py\b")


def scripts_used(source: str) -> set[str]:
    """The bench/ scripts a script uses: imported (bench.x, from bench import x), or named as
    bench/x.py in a string that is not a docstring (the argv of a process it starts)."""
    tree, used = ast.parse(source), set()
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "bench":
            used |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bench."):
            used.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            used |= {a.name.split(".")[1] for a in node.names if a.name.startswith("bench.")}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            used |= set(SCRIPT_PATH.findall(node.value))
    return used


def bench_code(bench: Bench, root: Path | None = None) -> tuple[str, ...]:
    """What one benchmark's figures depend on: `SWEEP_CODE` less the scripts under bench/ its
    commands never reach (`scripts_used`), followed from script to script. Fixing one benchmark's harness then sends only that one back to run in a
    sweep spanning sessions. A script whose imports change is itself reached, so the head's tree
    is enough to follow."""
    folder = (root or ROOT) / "bench"
    scripts = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    reached: set[str] = set()
    todo = [Path(argv[0]).stem for argv in bench.full if argv and argv[0].startswith("bench/")]
    while todo:
        name = todo.pop()
        if name in reached or name not in scripts:
            continue
        reached.add(name)
        todo += scripts_used((folder / f"{name}.py").read_text())
    return SWEEP_CODE + tuple(f":(exclude)bench/{name}.py" for name in sorted(scripts - reached - {"all", "figures"}))


def same_code(commit: str, head: str, paths: Sequence[str] = SWEEP_CODE) -> bool:
    """Whether `commit` holds `head`'s code (`paths` unchanged between them): a sweep spanning
    sessions goes on after a session commits the files it measured."""
    if commit == head:
        return True
    diff = subprocess.run(["git", "diff", "--quiet", commit, head, "--", *paths], cwd=ROOT, capture_output=True)
    return diff.returncode == 0  # 1: they differ; 128: a commit this clone lacks


def done_earlier(benches: Sequence[Bench], head: str | None, path: Path, folder: Path) -> dict[str, dict]:
    """name -> the outcome of each benchmark a sweep finished before (noted in `path`) at `head` or
    at a commit holding its code (`bench_code`), with the commands it runs now, whose file in
    `folder` still names that commit: a file rewritten since, a benchmark whose code or commands
    changed, runs again. A note without its commands (written before they were noted) counts the
    plan (bench/sweep_plan.py) as part of the code."""
    out: dict[str, dict] = {}
    if not head:
        return out
    notes = common.kept_runs({}, path)
    for b in benches:
        mine = [r for r in notes if r["name"] == b.name]
        note = mine[-1] if mine else None  # the last note wins
        code = bench_code(b)
        if note and "commands" in note:
            fits = note["commands"] == [list(a) for a in b.full] and same_code(note["commit"], head, code)
        else:
            fits = bool(note) and same_code(note["commit"], head, tuple(p for p in code if p != ":(exclude)bench/sweep_plan.py"))
        doc = load(folder / f"{b.name}.json") if fits else None
        if doc and doc.get("git_commit") == note["commit"]:
            where = "this commit" if note["commit"] == head else f"{note['commit'][:7]}, whose code is this commit's"
            out[b.name] = {"name": b.name, "status": "done earlier", "reason": f"done at {where} by an earlier sweep ({note['date']})",
                           "minutes": 0.0, "commit": note["commit"], "bounds": judge_bounds(doc.get("figures") or {}), "compared": None}
    return out


def skipped(name: str, reason: str) -> dict:
    return {"name": name, "status": "skipped", "reason": reason, "minutes": 0.0, "commit": None, "bounds": [], "compared": None}


# --- reporting ----------------------------------------------------------------------------------

def bounds_text(rows: list[dict]) -> str:
    return "; ".join(f"{r['figure']} {r['value']:.3g} {r['bound']}: {'met' if r['met'] else 'NOT MET'}" if r["met"] is not None
                     else f"{r['figure']} {r['bound']}: missing" for r in rows)


def moved_text(outcome: dict) -> str:
    """The moved figures' names, 'none', or why nothing was compared (a failure's reason is printed below the table)."""
    if outcome["compared"] is None:
        return "" if outcome["status"] in ("failed", "not written") else outcome["reason"]
    moved = [r["figure"] for r in outcome["compared"] if r["moved"]]
    return ", ".join(moved) or "none"


def code_changes(commits: dict[str, str | None], head: str | None) -> dict[str, list[str]]:
    """For each result file measured at another commit than `head`: the files under flashq/ and
    configs/ changed since, which its figures may no longer describe (none: the same code)."""
    out: dict[str, list[str]] = {}
    for name, commit in commits.items():
        if not (commit and head) or head.startswith(commit[:7]):
            continue
        diff = subprocess.run(["git", "diff", "--name-only", commit, head, "--", "flashq", "configs"], cwd=ROOT,
                              capture_output=True, text=True)
        out[name] = diff.stdout.split() if diff.returncode == 0 else [f"(commit {commit[:7]} is not in this clone)"]
    return out


def summary(outcomes: list[dict], commits: dict[str, str | None], head: str | None, quick: bool) -> dict:
    """sweep.json's figures: who ran how, the commit every result file names, the code changed under
    each one measured at another commit, what moved, which bounds fail."""
    by = lambda status: [o["name"] for o in outcomes if o["status"] == status]  # noqa: E731
    return {"mode": "quick" if quick else "full", "commit": head, "ok": by("ok"), "failed": by("failed"),
            "not_written": by("not written"), "done_earlier": by("done earlier"), "skipped": {o["name"]: o["reason"] for o in outcomes if o["status"] == "skipped"},
            "commits": commits, "at_other_commits": sorted(n for n, c in commits.items() if not (c and head and head.startswith(c[:7]))),
            "code_changed_since": code_changes(commits, head),
            "moved": {o["name"]: [r["figure"] for r in o["compared"] if r["moved"]] for o in outcomes
                      if any(r["moved"] for r in o["compared"] or [])},
            "bounds_not_met": {o["name"]: [r["figure"] for r in o["bounds"] if r["met"] is False] for o in outcomes
                               if any(r["met"] is False for r in o["bounds"])}}


def report(outcomes: list[dict], folder: Path, quick: bool) -> Path:
    """Print the table and each moved figure, and write sweep.json beside the results it describes."""
    common.print_table(f"{'quick ' if quick else ''}sweep at {(common.git_commit() or '?')[:7]}", outcomes, [
        ("name", "benchmark", ""), ("status", "status", ""), ("minutes", "minutes", ".1f"), ("commit7", "commit", ""),
        ("bounds_text", "bounds", ""), ("moved_text", "drift since the last quick run" if quick else "moved", "")])
    for o in outcomes:
        for r in o["compared"] or []:
            if r["moved"]:
                print(f"{o['name']}.{r['figure']}: {r['before']:.4g} -> {r['after']:.4g} "
                      f"(allowed +-{r['allowed']:.3g}, {r['basis']})")
        if o["status"] in ("failed", "not written"):
            print(f"{o['name']}: {o['status']}: {o['reason']} (log: {o.get('log')})")
    commits = {p.stem: (load(p) or {}).get("git_commit") for p in sorted(folder.glob("*.json")) if p.stem != "sweep"}
    rows = [{k: v for k, v in o.items() if k not in ("commit7", "bounds_text", "moved_text")} for o in outcomes]
    common.RESULTS = folder  # write_result writes under common.RESULTS: the quick report goes beside the quick files
    return common.write_result("sweep", rows, summary(outcomes, commits, common.git_commit(), quick), notes=(
        "One sweep of bench/all.py: each benchmark's status and minutes, the commit each result file in this folder names "
        "(figures.commits), the bounds its file states, and each compared figure before and after (moved: by more than "
        "its recorded spread, or the relative tolerance where none is recorded; bench/all.py's docstring)."))


def print_plan(benches: list[Bench], quick: bool, reasons: dict[str, str], minutes: dict[str, float]) -> None:
    runs = [b for b in benches if b.name not in reasons]
    total = sum(minutes[b.name] for b in runs)
    print(f"{'quick' if quick else 'full'} sweep: {len(runs)} benchmarks, about {total / 60:.1f} hours, writing "
          f"{rel(QUICK if quick else RESULTS)}/")
    for b in benches:
        if b.name in reasons:
            print(f"  {b.name:<26} skip: {reasons[b.name]}")
            continue
        commands = b.quick if quick else b.full
        print(f"  {b.name:<26} {f'~{minutes[b.name]:.0f}':>4} min  {shown(commands[0])}")
        for argv in commands[1:]:
            print(f"  {'':<26} {'':>8}  then {shown(argv)}")
    for name, reason in SKIPPED.items():
        print(f"  {name:<26} not in a sweep: {reason}")


def refresh_docs() -> None:
    """Regenerate the docs' tables after every result file written, so that a sweep a session's end
    cuts off leaves docs that match the files it did write (CI's test_figures checks they do)."""
    try:
        print("\n".join(f"rewrote {name}'s benchmark table" for name in write_docs_tables()) or "docs' tables up to date", flush=True)
    except Exception as e:  # noqa: BLE001 - a result a summary cannot read must not lose the sweep's report
        print(f"bench/figures.py could not regenerate the tables ({type(e).__name__}: {e}); run python bench/figures.py", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="reduced size, into bench/results/quick/, drift against the last quick run")
    ap.add_argument("--only", nargs="+", default=[], metavar="NAME", help="run these (result names: queue, fuzz, ...)")
    ap.add_argument("--skip", nargs="+", default=[], metavar="NAME", help="leave these out")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and its estimated minutes; run nothing")
    ap.add_argument("--resume", action="store_true", help="leave out what a full sweep at this commit, or one with its code, finished before")
    args = ap.parse_args(argv)
    if args.resume and args.quick:
        ap.error("--resume goes on with a full sweep; a quick one is short enough to run whole")
    benches = select(BENCHES, args.only, args.skip)
    folder = QUICK if args.quick else RESULTS
    earlier = done_earlier(benches, common.git_commit(), DONE, folder) if args.resume else {}
    reasons = {b.name: why for b in benches if (why := missing_need(b.needs))}
    reasons |= {name: o["reason"] for name, o in earlier.items()}
    print_plan(benches, args.quick, reasons, estimates(benches, args.quick, load(folder / "sweep.json")))
    if args.dry_run:
        return 0
    logs = ROOT / "runs" / "sweep" / time.strftime("%Y%m%d-%H%M%S")
    logs.mkdir(parents=True, exist_ok=True)
    print(f"logs: {rel(logs)}/", flush=True)
    outcomes: list[dict] = []
    interrupted = False
    try:
        for b in benches:
            if b.name in earlier:
                outcomes.append(earlier[b.name])
            elif b.name in reasons:
                outcomes.append(skipped(b.name, reasons[b.name]))
            else:
                outcomes.append(run_bench(b, args.quick, logs))
                if not args.quick:
                    record_done(outcomes[-1], DONE, b)
                    if outcomes[-1]["status"] in ("ok", "failed"):  # a failure may have written rows
                        refresh_docs()
    except KeyboardInterrupt:  # the report still says what ran
        interrupted, done = True, {o["name"] for o in outcomes}
        outcomes += [skipped(b.name, "not run: the sweep was interrupted") for b in benches if b.name not in done]
    outcomes += [skipped(name, reason) for name, reason in SKIPPED.items() if name != "sweep"]
    for o in outcomes:  # a file not written now still names the commit it was measured at
        o["commit"] = o["commit"] or (load(folder / f"{o['name']}.json") or {}).get("git_commit")
        o["commit7"], o["bounds_text"], o["moved_text"] = (o["commit"] or "")[:7], bounds_text(o["bounds"]), moved_text(o)
    print(f"wrote {report(outcomes, folder, args.quick)}")
    if not args.quick:
        refresh_docs()  # sweep.json has a row too
    return 130 if interrupted else 1 if any(o["status"] in ("failed", "not written") for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
