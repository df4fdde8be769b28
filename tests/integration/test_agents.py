"""Agents over the OpenAI API with real parts: a whole run, every role its own process, vLLM
engines behind each rollout worker's endpoint and the real `openai` client in the agent."""

import os
import subprocess

import pytest

from flashq.agents.audit import audit_tokens
from tests.integration.helpers import ROOT, launch_cmd, read_jsonl, trained_requests
from tests.integration.test_faults import audit

pytestmark = pytest.mark.slow


async def chatty(task, client):
    """Three calls, each continuing the last: what a multi-turn agent's loop does. For odd seeds
    the third call drops the first exchange (as an agent that trims its context does), which
    rewrites the history: env.on_rewrite split starts a second segment there."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"{task['seed']} + 1 = ?"}]
    for turn in range(3):
        if turn == 2 and task["seed"] % 2:
            del messages[2:4]
        reply = await client.chat.completions.create(model="flashq-policy", messages=messages, max_tokens=12, stop=["\n\n"])
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": f"turn {turn}: again"}]
    return 0.25


def test_an_agent_run_trains_every_sampled_token_as_sampled_and_keeps_exact_books(tmp_path):
    """Every role its own process, a three-call agent through each rollout worker's endpoint
    (stop strings, a system message, continuations, a rewritten history split into segments),
    redundant episodes cancelled: every token an engine sampled for a trained episode is trained
    as that id, split episodes as two sequences, nothing is lost or trained twice, staleness
    stays bounded."""
    cmd = launch_cmd(tmp_path, ["sft.warm_start=false", "trainer.steps=6", "env.redundancy=1", "sampling.max_tokens=24",
                                "env.agent=tests.integration.test_agents:chatty", "log.token_audit=true", "env.on_rewrite=split"],
                     config="configs/agent_calculator.yaml")
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ledger = audit(tmp_path, group_size=4)
    assert ledger["trained_steps"] == 6 and ledger["finished"]
    tokens = audit_tokens(tmp_path)
    assert tokens["episodes_checked"] == 6 * 4 * 4 and tokens["tokens_checked"] > 6 * 4 * 4 * 3
    assert tokens["retokenized_tokens"] == 0
    trained = trained_requests(tmp_path)
    assert all(version - vmin <= 2 and vmax <= version for version, _, vmin, vmax in trained)
    steps = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "step"]
    assert len(steps) == 6
    # a group's episodes share a seed: all of an odd-seed group's episodes were split, in two sequences each
    records = read_jsonl(tmp_path / "trained.jsonl")
    split = {rid: n for rec in records for rid, n in rec.get("segments", {}).items()}
    groups = {}
    for _, rid, _, _ in trained:
        groups.setdefault(rid.rsplit("/", 1)[0], []).append(rid in split)
    assert set(split.values()) == {2} and all(all(g) or not any(g) for g in groups.values())
    assert 0 < len(split) < len(trained)
    assert sum(r["train/sequences"] - r["train/samples"] for r in steps) == len(split)
