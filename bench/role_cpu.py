"""Where the CPU goes: seconds of CPU per training step of each flashq process in one run of
`bench/vs_trl.py`'s job A (the quickstart job without evaluation), read from /proc.

On two cores flashq's roles share the machine with the engine: when their CPU a step reaches the
core-seconds a step offers (step time x cores), the run is CPU-bound and every role's cost is a
cost of the step. TRL, one process, pays no front end, coordinator or reward worker; this says
what flashq pays for them on the host it runs on.

    python bench/role_cpu.py --steps 600      # bench/results/role_cpu.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import vs_trl  # noqa: E402
from bench.common import print_table, write_result  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def role_of(pid: str) -> str | None:
    """The flashq process `pid` is, by its command line: a role, the engine core, the launcher."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    if "EngineCore" in comm or "EngineCore" in cmdline:
        return "engine_core"
    if " role " in cmdline:
        return cmdline.split(" role ")[1].split()[0]
    if "flashq.cli launch" in cmdline:
        return "launcher"
    return None


def cpu_seconds(pid: str) -> float | None:
    """utime + stime of `pid` (fields 14 and 15 of /proc/pid/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def run(work: Path, steps: int, seed: int) -> dict:
    sft = vs_trl.make_sft("a", work)
    run_dir = work / f"run-{seed}"
    cmd = vs_trl.flashq_command("a", "flashq", work, run_dir, sft, steps, seed)
    # pid -> (its role, its CPU seconds) at the latest reading: a process's last reading before it ends, under
    # the role it ended as (a role forked from the launcher reads as the launcher until it execs)
    seen: dict[str, tuple[str, float]] = {}
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=vs_trl.ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if (role := role_of(pid)) is not None and (s := cpu_seconds(pid)) is not None:
                seen[pid] = (role, s)
        time.sleep(0.25)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"flashq run failed:\n{proc.stderr.read()[-4000:]}")
    step_s = vs_trl.breakdown(vs_trl.step_rows(run_dir))["step_s"]
    per_role: dict[str, float] = {}
    for role, s in seen.values():
        per_role[role] = per_role.get(role, 0.0) + s / steps
    return {"seed": seed, "steps": steps, "wall_s": wall, "step_s": step_s, "cpu_s_per_step": per_role,
            "cpu_s_per_step_total": sum(per_role.values()), "core_s_per_step": step_s * os.cpu_count()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="flashq-role-cpu-") as tmp:
        r = run(Path(tmp), args.steps, args.seed)
    total = r["cpu_s_per_step_total"]
    table = [{"role": k, "cpu_s": v, "share": v / total} for k, v in sorted(r["cpu_s_per_step"].items(), key=lambda kv: -kv[1])]
    print_table(f"CPU seconds per step, job A, {args.steps} steps (start-up included)", table,
                [("role", "process", ""), ("cpu_s", "CPU s / step", ".4f"), ("share", "share", ".0%")])
    print(f"all processes {total:.3f} CPU s a step; the cores offer {r['core_s_per_step']:.3f} (step {r['step_s']:.3f} s after warm-up)")
    around = sum(v for k, v in r["cpu_s_per_step"].items() if k not in ("engine_core", "trainer"))
    figures = {"cpu_s_per_step": r["cpu_s_per_step"], "cpu_s_per_step_total": total, "core_s_per_step": r["core_s_per_step"],
               "busy_share_of_cores": total / r["core_s_per_step"], "share_outside_engine_and_trainer": around / total}
    write_result("role_cpu", r, figures,
                 notes="CPU seconds of each process over the whole run (start-up included) divided by its steps; "
                       "core_s_per_step: the step time after the first 10% of steps times the cores.")


if __name__ == "__main__":
    main()
