"""flashq's weight broadcast into a real vLLM engine (CPU backend, gloo), in one test process:
the trainer side is `WeightPusher`, the engine side `RolloutEngine`, and the calls between them
go straight through instead of over sockets."""

import asyncio

import numpy as np
import pytest
import torch

from flashq.config import load_config
from flashq.protocol import GenerateRequest
from flashq.roles.common import free_port
from flashq.trainer.logprobs import naive_token_logprobs

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_new_weights_reach_the_engine_exactly_and_in_flight_requests_span_versions(tiny_model, device):
    """gloo on CPU; on a GPU machine the same path runs vLLM's own NCCL engines."""
    from transformers import AutoModelForCausalLM

    from flashq.engine.vllm_engine import RolloutEngine
    from flashq.engine.weights import WeightPusher
    cfg = load_config(None, ["rollout.max_model_len=1024", "sampling.max_tokens=600"])

    async def main():
        engine = RolloutEngine(cfg, tiny_model, 0, device)
        await engine.start()
        loop = asyncio.get_running_loop()
        try:
            def rpc(method, payload, version):
                payload = {**payload, "rank_offset": 1} if method == "init_weight_transfer_engine" else payload
                asyncio.run_coroutine_threadsafe(engine.weight_sync(method, payload, version), loop).result(60)

            model = AutoModelForCausalLM.from_pretrained(tiny_model).to(device)
            pusher = await loop.run_in_executor(None, lambda: WeightPusher(cfg.weight_sync, model, rpc, 1, free_port(), torch.device(device)))
            prompt = np.array([2, 53, 47, 54, 65], np.int32)
            long = asyncio.create_task(engine.generate(GenerateRequest("long", "g", prompt, 600, 600, 1.0, 1.0, 1)))
            await asyncio.sleep(0.5)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.05 * torch.randn_like(p))
            await loop.run_in_executor(None, pusher.push, 1)
            # no min_tokens here: it masks EOS, and the engine reports logprobs after its processing
            after = await engine.generate(GenerateRequest("after", "g", prompt, 40, 0, 1.0, 1.0, 2))
            spanning = await long
            pusher.close()
            return after, spanning, model
        finally:
            await engine.shutdown()

    after, spanning, model = asyncio.run(main())
    assert set(after.versions.tolist()) == {1}
    # the long request was frozen, not aborted: early tokens at version 0, later ones at 1
    v = spanning.versions
    assert len(v) == 600 and v[0] == 0 and v[-1] == 1 and np.all(np.diff(v) >= 0)
    # the engine's logprobs are the new weights' logprobs, token for token
    prompt = [2, 53, 47, 54, 65]
    ids = torch.tensor(np.concatenate([prompt, after.token_ids])[None].astype(np.int64), device=device)
    with torch.no_grad():
        trainer_lp = naive_token_logprobs(model, ids, torch.ones_like(ids), 1.0)[0][0, len(prompt) - 1 :].cpu().numpy()
    assert np.max(np.abs(trainer_lp - after.logprobs)) < 1e-3
