"""StalenessGate: admission pacing and earliest-deadline batch selection.

These tests drive the gate with a simulated engine (random heavy-tailed generation times), not
with vLLM: they check the scheduling invariant over many random runs."""

import math
import random

import pytest

from flashq.staleness import StalenessGate


def test_capacity_follows_async_ratio():
    gate = StalenessGate(async_ratio=2, batch_groups=4)
    assert gate.capacity(engine_version=0) == 12  # (2 + 0 + 1) * 4, AReaL's rule
    assert gate.capacity(engine_version=5) == 32
    gate = StalenessGate(async_ratio=0.5, batch_groups=4)
    assert gate.capacity(0) == 6  # floor(1.5 * 4)


def test_sync_mode_admits_one_batch_per_version():
    gate = StalenessGate(async_ratio=0, batch_groups=3)
    for i in range(3):
        gate.admit(f"g{i}", 0)
    assert gate.capacity(0) == 0
    assert gate.select_batch({"g0", "g1"}) is None  # batch 0 needs all of its groups
    assert sorted(gate.select_batch({"g0", "g1", "g2"})) == ["g0", "g1", "g2"]
    assert gate.capacity(0) == 0 and gate.capacity(1) == 3


def test_admit_without_capacity_raises():
    gate = StalenessGate(async_ratio=0, batch_groups=1)
    gate.admit("a", 0)
    with pytest.raises(RuntimeError):
        gate.admit("b", 0)


def test_urgent_incomplete_group_blocks_the_batch():
    # alpha=1, B=1: g0 and g1 admitted at version 0 (deadline 1). Batch 0 may take g1 early only if
    # g0 can still make batch 1; then batch 1 must wait for g0 even though g2 is complete.
    gate = StalenessGate(async_ratio=1, batch_groups=1)
    gate.admit("g0", 0)
    gate.admit("g1", 0)
    assert gate.select_batch({"g1"}) == ["g1"]
    gate.admit("g2", 1)
    assert gate.select_batch({"g2"}) is None
    assert gate.select_batch({"g0", "g2"}) == ["g0"]


def test_batch_that_would_strand_a_deadline_waits():
    # B=2, alpha=1: four groups due by batch 1. Taking the two complete ones now is fine only
    # because the other two still fit in batch 1.
    gate = StalenessGate(async_ratio=1, batch_groups=2)
    for i in range(4):
        gate.admit(f"g{i}", 0)
    assert sorted(gate.select_batch({"g2", "g3"})) == ["g2", "g3"]
    assert gate.select_batch(set()) is None


def simulate(alpha: float, B: int, slots: int, steps: int, seed: int, n_engines_step: int = 1):
    """Engine with `slots` concurrent groups, lognormal lengths; trainer takes 1 tick per step
    and weights reach the engine at once. Returns (trained batches, max staleness seen)."""
    rng = random.Random(seed)
    gate = StalenessGate(alpha, B, total_groups=steps * B)
    version = 0
    running: dict[str, float] = {}
    admitted_at: dict[str, int] = {}
    complete: set[str] = set()
    trained: list[list[str]] = []
    t, n = 0.0, 0
    worst = 0
    for _ in range(100_000):
        while gate.capacity(version) > 0 and len(running) < slots:
            gid = f"g{n}"
            n += 1
            gate.admit(gid, version)
            admitted_at[gid] = version
            running[gid] = t + math.exp(rng.gauss(0, 1.5))
        chosen = gate.select_batch(complete)
        if chosen is not None:
            complete.difference_update(chosen)
            for g in chosen:
                worst = max(worst, len(trained) - admitted_at[g])
            trained.append(chosen)
            version += 1
            if len(trained) == steps:
                return trained, worst
            continue
        t = min(running.values())
        for g in [g for g, end in running.items() if end <= t]:
            del running[g]
            complete.add(g)
    raise AssertionError("simulation did not finish: the gate deadlocked")


@pytest.mark.parametrize("alpha", [0, 0.5, 1, 2, 3.5])
@pytest.mark.parametrize("seed", range(5))
def test_random_runs_keep_the_bound_and_train_everything_once(alpha, seed):
    B, steps = 4, 40
    trained, worst = simulate(alpha, B, slots=3 * B, steps=steps, seed=seed)
    assert worst <= math.ceil(alpha)
    flat = [g for batch in trained for g in batch]
    assert len(flat) == len(set(flat)) == B * steps
    assert all(len(batch) == B for batch in trained)
