"""Whole runs through the launcher: real processes, real vLLM engines, real ZeroMQ, real torch."""

import json
import math
import os
import re
import signal
import subprocess
import threading
import time

import psutil
import pytest
import zmq

from flashq.wire.fuzz import raw_peer
from tests.integration.helpers import ROOT, launch, launch_cmd, read_jsonl, trained_requests

pytestmark = pytest.mark.slow


def send_garbage(port: int, run_dir, stop: threading.Event, sent: list):
    """A peer holding reward-0's token (leaked) that keeps sending junk frames to the coordinator
    during the run, under a name it never proves."""
    from flashq.credentials import RunCredentials

    while not (run_dir / "credentials.key").exists() and not stop.is_set():
        time.sleep(0.05)
    if stop.is_set():
        return
    sock = raw_peer(f"tcp://127.0.0.1:{port}", user="reward-0", token=RunCredentials.load(run_dir).token("reward-0"), blocking=True)
    while not stop.is_set():
        try:
            sock.send_multipart([b"\x92\x01\xc1not msgpack"], flags=zmq.NOBLOCK)
            sent.append(1)
        except zmq.Again:  # not connected yet
            pass
        time.sleep(0.2)
    sock.close()


def check_books(run_dir, alpha, steps, group_size=4, batch_groups=4):
    ledger = json.loads((run_dir / "ledger.json").read_text())
    trained = trained_requests(run_dir)
    ids = [rid for _, rid, _, _ in trained]
    # exactly once: every admitted prompt's samples were trained, none twice, none in flight
    assert len(ids) == len(set(ids)) == steps * batch_groups * group_size
    assert (ledger["groups_admitted"] - ledger["groups_dropped"]) * group_size == len(ids) == ledger["samples_trained"]
    assert ledger["requests_in_flight"] == 0 and ledger["samples_in_buffer"] == 0 and ledger["finished"]
    # the staleness invariant, over every trained token (its sample's oldest token bounds them all)
    bound = math.ceil(alpha)
    assert all(version - vmin <= bound for version, _, vmin, _ in trained)
    assert all(vmax <= version for version, _, _, vmax in trained)  # nothing from the future
    # a staleness histogram was logged at every step
    steps_logged = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "step"]
    assert [r["step"] for r in steps_logged] == list(range(1, steps + 1))
    assert all(any(k.startswith("hist/staleness/") for k in r) for r in steps_logged)
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    return ledger, trained


def test_async_run_keeps_staleness_bounded_and_trains_every_sample_once(tmp_path):
    from flashq.roles.common import free_port

    port = free_port()
    stop, sent = threading.Event(), []
    rogue = threading.Thread(target=send_garbage, args=(port, tmp_path, stop, sent), daemon=True)
    rogue.start()
    try:
        proc = launch(tmp_path, ["async_ratio=2", "trainer.steps=8", f"transport.port={port}"])
    finally:
        stop.set()
        rogue.join()
    assert proc.returncode == 0, proc.stdout[-4000:]
    ledger, trained = check_books(tmp_path, alpha=2, steps=8)
    assert max(vmax for _, _, _, vmax in trained) > 0  # the engines served new weight versions
    assert max(version - vmin for version, _, vmin, _ in trained) >= 1  # and generation ran ahead
    assert sent and sum(ledger["rejected_frames"].values()) > 0  # garbage was refused and counted
    # one scored response in every log.samples_every (16) kept as text, with its reward
    kept = [r for path in tmp_path.glob("samples-reward-*.jsonl") for r in read_jsonl(path)]
    assert len(kept) >= 8 * 4 * 4 // 16  # (the untrained tiny model writes bytes, or nothing before its end token)
    assert all(isinstance(r["response"], str) and r["prompt"] and r["tokens"] >= 1 and len(r["versions"]) == 2 for r in kept)
    assert max(r["versions"][1] for r in kept) > 0  # kept all through the run, not only at its start
    assert {r["reward"] for r in kept} <= {0.0, 1.0}  # the quickstart's exact match
    for role in ("rollout-0", "trainer"):  # each froze what it built at start-up out of garbage collection
        frozen = re.search(r"([\d,]+) start-up objects frozen", (tmp_path / "logs" / f"{role}.log").read_text())
        assert frozen and int(frozen.group(1).replace(",", "")) > 100_000, role


def test_sync_run_is_on_policy_and_evaluates_and_samples_dynamically(tmp_path):
    """Also the trainer's path that waits for each push before the next step (the async run
    above overlaps them), held-out evaluation rounds, and dynamic sampling (a reward with
    variance from an untrained model: the parity of the answer's length)."""
    proc = launch(tmp_path, ["async_ratio=0", "trainer.steps=4", "rollout.num_workers=1", "weight_sync.overlap=false",
                             "eval.every=2", "eval.prompts=4", "eval.samples=2", "eval.k=[1,2]", "trainer.dynamic_sampling=true",
                             "reward.function=tests.unit.reward_fixtures:length_parity"])
    assert proc.returncode == 0, proc.stdout[-4000:]
    ledger, trained = check_books(tmp_path, alpha=0, steps=4)
    assert all(version == vmin == vmax for version, _, vmin, vmax in trained)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2, 4]  # the start, every 2 versions, the end
    assert all(0 <= r["pass@1"] <= r["pass@2"] <= 1 and 0 <= r["greedy_accuracy"] <= 1 for r in evals)
    assert all(r["token_version_min"] >= r["version"] for r in evals)
    assert ledger["eval_requests_sent"] == ledger["eval_rewards_received"] == 3 * 4 * (2 + 1)
    assert all(r["train/zero_variance_groups"] == 0 for r in records if r["kind"] == "step")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["eval_last"]["step"] == 4
    assert (tmp_path / "report.png").stat().st_size > 0 and "summary" in proc.stdout  # plotted while the roles ended


def test_colocated_turns_release_the_engine_for_every_training_step(tmp_path):
    """placement.colocate on a CPU: before each step the engine is released (its scheduler
    paused) and the step's push brings it back, so it stood released at least as long as the
    trainer computed; every sample is still trained once, on policy."""
    proc = launch(tmp_path, ["async_ratio=0", "trainer.steps=4", "rollout.num_workers=1", "placement.colocate=true"])
    assert proc.returncode == 0, proc.stdout[-4000:]
    _, trained = check_books(tmp_path, alpha=0, steps=4)
    assert all(version == vmin == vmax for version, _, vmin, vmax in trained)
    steps = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "step"]
    assert all(r["trainer/turn_s"] > 0 for r in steps)
    # step k's push ended the release that began before its compute, and its counters reached the
    # coordinator before step k + 1's batch could: the last row covers every step but the last
    computed = sum(r["train/seconds"] for r in steps[:-1])
    assert steps[-1]["rollout/released_s/rollout-0"] >= computed > 0


def _flashq_processes(run_dir):
    marker = str(run_dir)
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


def assert_no_processes_outlive(run_dir, timeout: float = 30):
    """The launcher has exited; the processes it stopped may take a moment to be reaped."""
    deadline = time.time() + timeout
    while (left := _flashq_processes(run_dir)) and time.time() < deadline:
        psutil.wait_procs(left, timeout=1)
    assert not left, f"roles or engines outlived the run: {[p.pid for p in left]}"


def test_a_killed_role_stops_the_run_and_is_named(tmp_path):
    """With restarts off (fault.restart_workers=false), a dead worker ends the run, named."""
    proc = subprocess.Popen(
        launch_cmd(tmp_path, ["trainer.steps=100000", "fault.restart_workers=false", "rollout.num_workers=1"]), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    out = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.time() + 300
    victim = None
    while time.time() < deadline and victim is None:
        time.sleep(1)
        for line in list(out):
            if "rollout-0 connected (pid" in line and (tmp_path / "metrics.jsonl").exists():
                victim = int(line.split("(pid ")[1].split()[0])
    assert victim, "run never got going:\n" + "".join(out[-50:])
    time.sleep(2)
    os.kill(victim, signal.SIGKILL)
    rc = proc.wait(timeout=120)
    reader.join(5)
    text = "".join(out)
    assert rc == 1
    assert "role rollout-0 was killed by signal 9" in text
    assert_no_processes_outlive(tmp_path)


def test_a_role_that_fails_at_startup_is_reported_with_its_log(tmp_path):
    t0 = time.time()
    proc = launch(tmp_path, ["reward.function=no_such_package.rewards:score", "trainer.steps=2"], timeout=300)
    assert proc.returncode == 1
    assert "role reward-0 exited with status 1" in proc.stdout
    assert "cannot import 'no_such_package.rewards'" in proc.stdout
    assert time.time() - t0 < 120
    assert_no_processes_outlive(tmp_path)


def test_sharded_trainer_on_two_ranks_runs_and_checkpoints(tmp_path):
    """The CPU twin of multi-GPU training: torchrun starts two FSDP2 ranks on gloo; rank 0 feeds
    the other and sends the gathered weights to the engine."""
    proc = launch(tmp_path, ["async_ratio=1", "trainer.steps=4", "trainer.world_size=2", "trainer.checkpoint_every=2",
                             "rollout.num_workers=1"])
    assert proc.returncode == 0, proc.stdout[-4000:]
    _, trained = check_books(tmp_path, alpha=1, steps=4)
    assert max(vmax for _, _, _, vmax in trained) > 0  # the engine served weights the ranks trained
    assert "(2 rank(s))" in proc.stdout and "rank 1: done at version 4" in proc.stdout
    from flashq import checkpoint

    latest = checkpoint.latest(tmp_path)
    assert checkpoint.version_of(latest) == 4 and (latest / "trainer" / "trainer_state.pt").exists()


def test_context_aware_divided_rollout_on_real_engines_keeps_the_books(tmp_path):
    """Responses generated in chunks of 5 tokens, continued on either worker, joined into one
    sample each: every sample trained once, with exactly its replayed length."""
    proc = launch(tmp_path, ["async_ratio=1", "trainer.steps=4", "rollout.scheduler=context_aware", "rollout.chunk_tokens=5",
                             "sampling.max_tokens=24", "sampling.forced_lengths={median: 8, sigma: 0.8, min: 2, max: 24, group_share: 0.8}",
                             "log.request_trace=true"])
    assert proc.returncode == 0, proc.stdout[-4000:]
    check_books(tmp_path, alpha=1, steps=4)
    from flashq.config import load_config
    from flashq.scheduling.lengths import forced_length

    fl = load_config(tmp_path / "config.yaml").sampling.forced_lengths
    trace = read_jsonl(tmp_path / "requests.jsonl")
    for r in trace:
        gid, k = r["request_id"].rsplit("/", 1)
        assert r["tokens"] == forced_length(fl, int(gid[1:]) * 4 + int(k), 4)
    assert any(r["tokens"] > 5 for r in trace)  # some responses really were divided
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert metrics[-1]["queue/chunks_sent"] > 0
