"""Poison requests against a real vLLM engine: a request that vLLM refuses, and one that runs past
its deadline, are each answered as failed (the overdue one aborted in the engine), and the same
engine goes on serving the others."""

import asyncio

import numpy as np
import pytest

from flashq.config import load_config
from flashq.engine.vllm_engine import RolloutEngine
from flashq.models.tiny import padded_vocab_size
from flashq.roles.common import resolve_model
from flashq.roles.rollout import answer
from flashq.wire.protocol import GenerateRequest

pytestmark = pytest.mark.slow


def test_a_refused_and_an_overdue_request_fail_alone_and_the_engine_keeps_serving():
    cfg = load_config(None, ["rollout.max_model_len=512"])

    async def main():
        engine = RolloutEngine(cfg, resolve_model(cfg), 0, "cpu")
        await engine.start()
        try:
            prompt = np.array([5, 6, 7], np.int32)
            refused = GenerateRequest("g0/0", "g0", np.array([5, padded_vocab_size() + 7], np.int32), 8)
            endless = GenerateRequest("g1/0", "g1", prompt, 400, min_tokens=400)  # far longer than its deadline
            fine = GenerateRequest("g2/0", "g2", prompt, 8, min_tokens=8)
            bad, overdue, good = await asyncio.gather(answer(engine, refused, 600), answer(engine, endless, 0.2),
                                                      answer(engine, fine, 600))
            assert bad.finish_reason == "error" and "vocab" in bad.error.lower() and len(bad.token_ids) == 0
            assert overdue.finish_reason == "error" and "overdue" in overdue.error
            assert good.finish_reason == "length" and len(good.token_ids) == 8
            assert engine.llm.output_processor.get_num_unfinished_requests() == 0  # the overdue one was aborted
            again = await answer(engine, GenerateRequest("g3/0", "g3", prompt, 8, min_tokens=8), 600)
            assert again.finish_reason == "length" and len(again.token_ids) == 8
        finally:
            await engine.shutdown()

    asyncio.run(main())
