"""Agents over the OpenAI API with real parts: a vLLM engine behind the endpoint and the real
`openai` client; and a whole run of the calculator agent with every role its own process."""

import asyncio

import numpy as np
import pytest

from flashq.config import load_config
from flashq.protocol import EpisodeRequest
from tests.integration.helpers import ROOT, launch_cmd, read_jsonl, trained_requests
from tests.integration.test_faults import audit

pytestmark = pytest.mark.slow


async def chatty(task, client):
    """Three calls, each continuing the last: what a multi-turn agent's loop does."""
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"{task['seed']} + 1 = ?"}]
    for turn in range(3):
        reply = await client.chat.completions.create(model="flashq-policy", messages=messages, max_tokens=12, stop=["\n\n"])
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": f"turn {turn}: again"}]
    return 0.25


def test_every_sampled_token_is_trained_as_the_engine_sampled_it(tiny_model):
    from flashq.agents.player import AgentPlayer
    from flashq.engine.vllm_engine import RolloutEngine

    cfg = load_config("configs/agent_calculator.yaml", [f"model.name={tiny_model}", "env.agent=tests.integration.test_agents:chatty"])
    sampled = []

    async def main():
        engine = RolloutEngine(cfg, tiny_model, 0, "cpu")
        await engine.start()
        generate = engine.generate

        async def recording(req):
            out = await generate(req)
            sampled.append((req.prompt_ids.tolist(), out.token_ids.tolist()))
            return out

        engine.generate = recording
        player = AgentPlayer(cfg, tiny_model, engine)
        await player.start()
        try:
            return await asyncio.gather(*(player.play(EpisodeRequest(f"g{k}/0", f"g{k}", {}, k, 12), 0) for k in range(4)))
        finally:
            await player.stop()
            await engine.shutdown()

    samples = asyncio.run(main())
    assert all(s.finish_reason in ("stop", "length") and s.env_reward == 0.25 and s.turns == 3 for s in samples), samples
    assert len(sampled) == 12
    for s in samples:
        full = np.concatenate([s.prompt_ids, s.token_ids]).tolist()
        mine = [(ctx, ids) for ctx, ids in sampled if full[: len(ctx) + len(ids)] == ctx + ids]
        assert len(mine) == 3  # each of its calls sampled from the trajectory so far and is in it as sampled
        assert s.token_ids[s.loss_mask == 1].tolist() == [t for _, ids in sorted(mine, key=lambda m: len(m[0])) for t in ids]


def test_a_calculator_agent_run_keeps_exact_books(tmp_path):
    """Every role its own process, the agent's episodes through each rollout worker's endpoint,
    redundant episodes cancelled: nothing lost or trained twice, staleness bounded."""
    import os
    import subprocess

    cmd = launch_cmd(tmp_path, ["sft.warm_start=false", "trainer.steps=6", "env.redundancy=1", "sampling.max_tokens=24"],
                     config="configs/agent_calculator.yaml")
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ledger = audit(tmp_path, group_size=4)
    assert ledger["trained_steps"] == 6 and ledger["finished"]
    trained = trained_requests(tmp_path)
    assert all(version - vmin <= 2 and vmax <= version for version, _, vmin, vmax in trained)
    assert len([r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "step"]) == 6
