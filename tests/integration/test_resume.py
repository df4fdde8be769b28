"""Kill the trainer mid-run, resume from the last checkpoint, and audit every trained sample."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from flashq import checkpoint
from tests.integration.helpers import ROOT, launch_cmd, read_jsonl, trained_requests

pytestmark = pytest.mark.slow

STEPS, EVERY, B, N = 12, 3, 4, 4


def run_until_killed(run_dir, victim_role: str, after_step: int) -> str:
    """The run stops when `victim_role` is killed (automatic resume off: this tests `--resume`),
    at a moment when training has gone past the newest checkpoint. Once `after_step` is trained
    the rollout workers are stopped (SIGSTOP), so the run cannot end before the kill (with
    async_ratio 2 the trainer has a few batches left at most: a run of the tiny model used to
    finish between two looks); the victim is stopped at each look, and killed once it has trained
    a step the newest checkpoint it has begun lacks, else let go on. If it stands still with nothing
    left to train (its last step was a checkpoint's), the rollout workers run for a moment more
    while it stays stopped, so it cannot run through the next checkpoint's window unseen."""
    proc = subprocess.Popen(
        launch_cmd(run_dir, ["async_ratio=2", f"trainer.steps={STEPS}", f"trainer.checkpoint_every={EVERY}",
                             "fault.resume_run=false", "fault.restart_workers=false"]),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    out: list[str] = []
    threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()

    def pids(role_prefix: str) -> list[int]:
        return [int(line.split("(pid ")[1].split()[0]) for line in list(out) if f" {role_prefix}" in line and "connected (pid" in line]

    deadline = time.time() + 300
    victim, rollouts, last, moved = None, [], None, time.time()
    while time.time() < deadline and victim is None:
        time.sleep(0.05 if rollouts else 0.2)  # once near the kill point, look often: a window is 3 steps of the trainer's
        metrics = run_dir / "metrics.jsonl"
        steps = [r["step"] for r in read_jsonl(metrics) if r["kind"] == "step"] if metrics.exists() else []
        if not steps or max(steps) < after_step:
            continue
        if not rollouts:
            rollouts = pids("rollout-")
            for pid in rollouts:
                os.kill(pid, signal.SIGSTOP)
        pid = pids(victim_role)[0]
        os.kill(pid, signal.SIGSTOP)
        begun = newest_checkpoint_begun(run_dir)
        if begun is not None and max(v for v, *_ in trained_requests(run_dir)) >= begun:
            victim = pid
            break
        if max(steps) != last:
            last, moved = max(steps), time.time()
        elif time.time() - moved > 0.5:  # standing still: the rollout workers generate for a moment, the victim held
            for sig in (signal.SIGCONT, signal.SIGSTOP):
                for rollout in rollouts:
                    os.kill(rollout, sig)
                time.sleep(0.2)
            moved = time.time()
        os.kill(pid, signal.SIGCONT)
    assert victim, "run never reached the kill point:\n" + "".join(out[-40:])
    os.kill(victim, signal.SIGKILL)
    for pid in rollouts:
        os.kill(pid, signal.SIGCONT)  # the run then stops, reporting the trainer's death
    assert proc.wait(timeout=120) == 1
    return "".join(out)


def newest_checkpoint_begun(run_dir) -> int | None:
    """The newest checkpoint version the trainer has begun, complete or not: a trainer half
    written before the trainer was stopped is still completed by the coordinator, which runs on,
    so a look at the newest complete checkpoint alone can be overtaken before the kill (a kill
    chosen after step 8 against checkpoint 6 once found checkpoint 9 complete behind it)."""
    root = run_dir / "checkpoints"
    versions = [checkpoint.version_of(p) for p in root.iterdir() if p.name.startswith("step-")] if root.exists() else []
    return max(versions, default=None)


def test_killed_trainer_resumes_and_trains_every_sample_exactly_once(tmp_path):
    run_until_killed(tmp_path, "trainer", after_step=EVERY * 2 + 1)
    ckpt = checkpoint.latest(tmp_path)
    assert ckpt is not None and checkpoint.version_of(ckpt) >= EVERY * 2
    before = trained_requests(tmp_path)
    assert max(v for v, *_ in before) >= checkpoint.version_of(ckpt)  # work after the checkpoint was lost
    state = checkpoint.decode_state((ckpt / "coordinator.msgpack").read_bytes())
    held = {s.request_id: (int(s.versions.min()), int(s.versions.max())) for g in state.groups for s in g.samples}
    assert held, "the checkpoint should hold generated samples that are not trained yet"

    resumed = subprocess.run(
        [sys.executable, "-m", "flashq.cli", "launch", "configs/quickstart.yaml", "--no-progress", "--resume", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert f"resuming from {ckpt}" in resumed.stdout

    trained = trained_requests(tmp_path)
    ids = [rid for _, rid, _, _ in trained]
    # samples held in the checkpoint were trained as they were, not generated again
    reused = {rid: (vmin, vmax) for _, rid, vmin, vmax in trained if rid in held}
    assert reused == held
    assert len(ids) == len(set(ids)) == STEPS * B * N  # none twice, none skipped
    assert sorted({v for v, *_ in trained}) == list(range(STEPS))
    assert all(v - vmin <= 2 for v, _, vmin, _ in trained)  # the staleness bound holds across the resume
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    assert ledger["finished"] and ledger["samples_trained"] == STEPS * B * N
    assert ledger["groups_admitted"] * N == STEPS * B * N
    steps = [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "step"]
    assert steps == list(range(1, STEPS + 1))  # the lost steps' records were replaced, not duplicated
