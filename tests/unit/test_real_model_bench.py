"""bench/real_model.py keeps each seed's run as it ends, so a command a session's end cut off goes on
from the next seed. The real run (`bash launch/real_model.sh`, 15-30 minutes a seed) is replaced
here by a function that returns a summary: what is tested is the bookkeeping, not the run."""

import json
import sys

import pytest

from bench import common
from bench import real_model


def _summary(seed: int) -> dict:
    ev = lambda acc: {"prompts": 64, "greedy_accuracy": acc, "mean_reward": acc, "pass@4": acc}  # noqa: E731
    return {"wall_minutes": 10.0, "steps": 55, "reward_start": 0.0, "reward_final": 0.5, "tokens_per_s": 70.0,
            "staleness_max": 2, "eval_first": ev(0.0), "eval_last": ev(0.1 * (seed + 1))}


def test_a_rerun_goes_on_from_the_seed_after_the_last_kept_one(tmp_path, monkeypatch):
    ran: list[int] = []

    def run_once(work, overrides):
        seed = int(next(o for o in overrides if o.startswith("seed=")).split("=")[1])
        ran.append(seed)
        if seed == 1 and ran.count(1) == 1:
            raise SystemExit("the session ended")  # cut off during the second seed
        return 600.0, _summary(seed)

    monkeypatch.setattr(real_model, "run_once", run_once)
    monkeypatch.setattr(real_model, "KEPT", tmp_path / "kept")
    monkeypatch.setattr(real_model, "code_fingerprint", lambda *files: "code")
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["real_model.py", "--seeds", "0", "1", "--name", "rm_test"])
    with pytest.raises(SystemExit):
        real_model.main()
    real_model.main()
    assert ran == [0, 1, 1]  # seed 0 was kept, not run again
    figures = json.loads((tmp_path / "rm_test.json").read_text())["figures"]
    assert figures["eval_greedy_gain_per_seed"] == pytest.approx([0.1, 0.2])
