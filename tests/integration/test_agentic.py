"""Multi-turn environment episodes through the launcher: real processes, real vLLM engine, real
torch. The environment is written outside the package, as a user's would be, and named in
config alone; it fails now and then, and its groups are completed by redundant episodes."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.integration.helpers import ROOT, SMALL, read_jsonl, trained_requests

pytestmark = pytest.mark.slow

USER_ENV = textwrap.dedent('''
    """A user's environment: count up, one number a turn; every 7th episode crashes on turn 3."""
    import asyncio
    import itertools

    from flashq.envs.base import StepResult

    EPISODES = itertools.count(1)


    class CountUp:
        def __init__(self, target=3):
            self.target = target
            self.doomed = next(EPISODES) % 7 == 0

        def reset(self, task, seed):
            self.seed, self.turn = seed, 0
            return [{"role": "user", "content": "count from 1"}]

        async def step(self, assistant):
            self.turn += 1
            await asyncio.sleep(0.01 * (self.seed % 3))  # a slow tool, not blocking the worker
            if self.turn == 3 and self.doomed:
                raise RuntimeError("the counting service is down")
            said = assistant["content"].strip()
            reward = 1.0 if said == str(self.turn) else 0.0
            if self.turn >= self.target:
                return StepResult([], reward=reward, terminated=True)
            return StepResult([{"role": "user", "content": "next"}], reward=reward)
''')


def test_a_user_environment_plugs_in_by_config_and_trains_every_kept_episode_once(tmp_path):
    (tmp_path / "my_envs.py").write_text(USER_ENV)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "flashq.cli", "launch", str(ROOT / "configs/quickstart.yaml"), "--no-progress",
           f"log.run_dir={run_dir}", *SMALL, "env={name: 'my_envs:CountUp', redundancy: 2, max_turns: 4}",
           "sampling.max_tokens=4", "rollout.max_model_len=256", "rollout.num_workers=1", "async_ratio=1", "trainer.steps=4",
           "eval={every: 2, prompts: 3, samples: 2, k: [1, 2]}"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=f"{ROOT}")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    ledger = json.loads((run_dir / "ledger.json").read_text())
    trained = trained_requests(run_dir)
    ids = [rid for _, rid, _, _ in trained]
    assert len(ids) == len(set(ids)) == 4 * 4 * 4 == ledger["samples_trained"]  # steps x groups x group_size
    assert ledger["requests_in_flight"] == 0 and ledger["samples_in_buffer"] == 0
    assert ledger["episodes_failed"] > 0  # the crashing seeds ran, were counted and replaced
    # every episode is accounted for: kept, failed, discarded after its group filled, or withdrawn
    assert ledger["requests_sent"] == ledger["samples_received"] + ledger["episodes_failed"] + ledger["episodes_discarded"]
    assert ledger["groups_admitted"] * (4 + 2) + ledger["episodes_failed"] >= ledger["requests_sent"] + ledger["episodes_withdrawn"]
    steps = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    # episodes were multi-turn: each trained sequence holds three assistant turns and the env's replies
    assert all(r["response/mean_tokens"] >= 3 for r in steps)
    assert steps[-1]["episodes/failed_total"] == ledger["episodes_failed"] and steps[-1]["episodes/per_s"] > 0
    # held-out episodes were evaluated at the start, every 2 versions and the end, scored by the environment
    rounds = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["version"] for r in rounds] == [0, 2, 4] and all(r["prompts"] == 3 for r in rounds)
    assert ledger["eval_requests_sent"] == ledger["eval_samples_received"] == 3 * 3 * 3
    assert ledger["eval_rewards_received"] + sum(r["requests_lost"] for r in rounds) == 27
    assert all(0 <= r["greedy_accuracy"] <= 1 for r in rounds)
    # episodes ran across weight updates: every trained token within the staleness bound (alpha 1)
    assert all(version - vmin <= 1 and vmax <= version for version, _, vmin, vmax in trained)
