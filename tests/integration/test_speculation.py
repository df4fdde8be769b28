"""flashq's grouped drafter as vLLM's proposer, in a real engine: greedy output and its logprobs
are exactly those of decoding without speculation."""

import asyncio

import numpy as np
import pytest

from flashq.config import load_config
from flashq.engine.vllm_engine import RolloutEngine
from flashq.protocol import GenerateRequest
from flashq.roles.common import resolve_model

pytestmark = pytest.mark.slow


async def generate_all(speculation: str, prompts: list[np.ndarray]):
    cfg = load_config(None, [f"rollout.speculation={speculation}", "rollout.max_model_len=256"])
    engine = RolloutEngine(cfg, resolve_model(cfg), 0, "cpu")
    await engine.start()
    try:
        return await asyncio.gather(*[
            engine.generate(GenerateRequest(f"g{i}/{k}", f"g{i}", p, 48, temperature=0.0))
            for i, p in enumerate(prompts) for k in range(4)])  # four siblings per prompt: a group to draft from
    finally:
        await engine.shutdown()


def test_grouped_speculation_is_lossless_under_greedy_decoding():
    rng = np.random.default_rng(0)
    prompts = [rng.integers(5, 250, size=12).astype(np.int32) for _ in range(4)]
    plain = asyncio.run(generate_all("none", prompts))
    grouped = asyncio.run(generate_all("grouped", prompts))
    for a, b in zip(plain, grouped):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
