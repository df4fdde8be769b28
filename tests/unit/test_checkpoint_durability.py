"""Checkpoints a crash cannot leave half-true: written through fsync, read back before they
replace the older ones, skipped by `latest` when torn (falling back to the newest whole one), and
a full disk stopping the run with the path named. Real files: safetensors and torch.save write
them as the trainer does; the full disk is the kernel's /dev/full."""

import errno
import os
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import save_file

from flashq import checkpoint
from flashq.checkpoint import STATE_SCHEMA, DiskFull, OrchestratorState, complete, latest, problem, step_dir
from flashq.roles.trainer import save_checkpoint


def state(version: int) -> OrchestratorState:
    return OrchestratorState(schema=STATE_SCHEMA, version=version, next_task=version, next_group=0, admitted=0, groups=[], ledger={})


def trainer_half(run_dir, version: int):
    """What the trainer writes into step-N.tmp/trainer before the coordinator completes it."""
    trainer = step_dir(run_dir, version, tmp=True) / "trainer"
    (trainer / "optimizer").mkdir(parents=True)
    save_file({"w": torch.arange(64, dtype=torch.float32).reshape(8, 8)}, trainer / "model.safetensors")
    (trainer / "config.json").write_text("{}")
    torch.save({"w": torch.zeros(4)}, trainer / "optimizer" / "__0_0.distcp")
    (trainer / "optimizer" / ".metadata").write_bytes(b"dcp metadata")
    torch.save({"version": version, "torch_rng": torch.get_rng_state()}, trainer / "trainer_state.pt")
    return trainer


def checkpoints(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def test_latest_falls_back_past_torn_checkpoints(tmp_path):
    for v in (2, 4, 6, 8):
        trainer_half(tmp_path, v)
        complete(tmp_path, v, state(v), keep=10)
    assert latest(tmp_path).name == "step-000008"
    weights = step_dir(tmp_path, 8) / "trainer" / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 10)  # a torn write of the weights
    (step_dir(tmp_path, 6) / "coordinator.msgpack").write_bytes(b"")  # an empty state
    (step_dir(tmp_path, 4) / "trainer" / "trainer_state.pt").unlink()
    assert "model.safetensors" in problem(step_dir(tmp_path, 8)) and "coordinator.msgpack" in problem(step_dir(tmp_path, 6))
    assert latest(tmp_path).name == "step-000002"
    (step_dir(tmp_path, 2) / "trainer" / "optimizer" / ".metadata").write_bytes(b"")  # a torn optimizer state
    assert "optimizer/.metadata" in problem(step_dir(tmp_path, 2)) and latest(tmp_path) is None


def test_a_checkpoint_from_before_sharded_optimizer_state_still_counts(tmp_path):
    """Its optimizer state lives in trainer_state.pt: no optimizer/ folder to check."""
    trainer = trainer_half(tmp_path, 2)
    for f in (trainer / "optimizer").iterdir():
        f.unlink()
    (trainer / "optimizer").rmdir()
    complete(tmp_path, 2, state(2), keep=2)
    assert latest(tmp_path).name == "step-000002"


def test_a_checkpoint_that_does_not_read_back_never_replaces_the_older_ones(tmp_path):
    trainer_half(tmp_path, 2)
    complete(tmp_path, 2, state(2), keep=1)
    trainer = trainer_half(tmp_path, 4)
    (trainer / "model.safetensors").write_bytes((trainer / "model.safetensors").read_bytes()[:100])
    with pytest.raises(RuntimeError, match="does not read back: trainer/model.safetensors"):
        complete(tmp_path, 4, state(4), keep=1)
    assert checkpoints(tmp_path) == ["step-000002", "step-000004.tmp"] and latest(tmp_path).name == "step-000002"
    trainer_half(tmp_path, 6)
    complete(tmp_path, 6, state(6), keep=1)  # a good one: now the older ones go
    assert checkpoints(tmp_path) == ["step-000006"]


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs: a real filesystem that fills up (needs root, as CI and this host have)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def fill(directory):
    with open(directory / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC


def test_a_full_disk_under_the_coordinators_half_names_the_path(small_disk):
    trainer_half(small_disk, 2)
    fill(small_disk)
    with pytest.raises(DiskFull, match=r"no space left to write checkpoint .*step-000002.tmp") as err:
        complete(small_disk, 2, state(2), keep=2)
    assert err.value.errno == errno.ENOSPC and checkpoint.is_disk_full(err.value)
    assert checkpoints(small_disk) == [] and latest(small_disk) is None  # the half-written one is gone


class Learner:
    """Only what save_checkpoint uses of the trainer's Learner: its model, and save."""

    def __init__(self):
        self.model = torch.nn.Linear(4, 4)
        self.saved = []

    def save(self, directory, base_model):
        self.saved.append(directory)
        directory.mkdir(parents=True)
        torch.save({"version": 1}, directory / "trainer_state.pt")


def test_the_trainer_refuses_a_checkpoint_the_disk_cannot_hold(tmp_path, monkeypatch):
    import flashq.roles.trainer as trainer_role

    learner = Learner()
    save_checkpoint(learner, step_dir(tmp_path, 1, tmp=True), "base")
    assert learner.saved == [step_dir(tmp_path, 1, tmp=True) / "trainer"]
    free = shutil.disk_usage(tmp_path).free
    monkeypatch.setattr(trainer_role, "checkpoint_bytes", lambda model: free * 2)  # a model twice the free space
    with pytest.raises(DiskFull, match=r"no space for checkpoint .*step-000002.tmp: it needs about"):
        save_checkpoint(learner, step_dir(tmp_path, 2, tmp=True), "base")
    assert len(learner.saved) == 1  # nothing was written


def test_a_role_that_hits_a_full_disk_exits_so_the_launcher_stops(small_disk):
    from flashq.roles.common import run_role

    async def fails():
        fill(small_disk)
        (small_disk / "more").write_bytes(b"checkpoint bytes" * 1024)

    assert run_role("trainer", fails, lambda: None) == checkpoint.EXIT_DISK_FULL

    async def other():
        raise ValueError("anything else")

    assert run_role("trainer", other, lambda: None) == 1


def test_a_step_written_again_replaces_the_torn_checkpoint_resume_fell_back_past(tmp_path):
    """Resumed from step 2 past a torn step 4, the run comes back to step 4: its new checkpoint
    takes the torn one's place (a rename onto the old directory would fail, and every resume
    after it with it)."""
    for v in (2, 4):
        trainer_half(tmp_path, v)
        complete(tmp_path, v, state(v), keep=10)
    for f in step_dir(tmp_path, 4).rglob("*"):
        if f.is_file():
            f.write_bytes(b"")  # a crash emptied it
    assert latest(tmp_path).name == "step-000002"
    trainer_half(tmp_path, 4)
    complete(tmp_path, 4, state(4), keep=10)
    assert latest(tmp_path).name == "step-000004" and problem(step_dir(tmp_path, 4)) is None
