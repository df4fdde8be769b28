"""flashq's weight broadcast into a real vLLM engine (CPU backend, gloo), in one test process:
the trainer side is `WeightPusher`, the engine side `RolloutEngine`, and the calls between them
go straight through instead of over sockets."""

import asyncio
import threading
import time

import numpy as np
import pytest
import torch

from flashq.config import load_config
from flashq.roles.common import free_port
from flashq.trainer.logprobs import naive_token_logprobs
from flashq.wire.protocol import GenerateRequest

pytestmark = pytest.mark.slow


def direct_rpc(engine, loop):
    """The coordinator's part of a push, called straight into the engine (the trainer is rank 0)."""
    def rpc(method, payload, version):
        payload = {**payload, "rank_offset": 1} if method == "init_weight_transfer_engine" else payload
        asyncio.run_coroutine_threadsafe(engine.weight_sync(method, payload, version), loop).result(60)

    return rpc


async def tokens_received(engine, request_id: str, at_least: int, timeout: float = 120.0) -> int:
    """Wait until vLLM's front end holds `at_least` output tokens of `request_id` (its output
    processor's count, updated as each engine step's outputs arrive): an event, not a sleep."""
    proc = engine.llm.output_processor
    deadline = time.monotonic() + timeout
    while True:
        states = [proc.request_states[i] for i in proc.external_req_ids.get(request_id, []) if i in proc.request_states]
        n = states[0].detokenizer.num_output_tokens() if states else 0
        if n >= at_least:
            return n
        assert time.monotonic() < deadline, f"{request_id}: {n} tokens after {timeout:.0f}s (wanted {at_least})"
        await asyncio.sleep(0.01)


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
            rpc = direct_rpc(engine, loop)
            model = AutoModelForCausalLM.from_pretrained(tiny_model).to(device)
            pusher = await loop.run_in_executor(None, lambda: WeightPusher(cfg.weight_sync, model, rpc, 1, free_port(), torch.device(device)))
            prompt = np.array([2, 53, 47, 54, 65], np.int32)
            long = asyncio.create_task(engine.generate(GenerateRequest("long", "g", prompt, 600, 600, 1.0, 1.0, 1)))
            await tokens_received(engine, "long", 8)  # generating at version 0 when the push comes
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.05 * torch.randn_like(p))
            await loop.run_in_executor(None, pusher.push, 1)
            # nothing else reaches the engine until the frozen request finishes: the push alone
            # must set it going again (the late path, a push resumed from vLLM's idle loop, is
            # tested in tests/unit/test_push_in_engine_core.py: here the pause completes at once)
            spanning = await asyncio.wait_for(long, timeout=120)
            # no min_tokens here: it masks EOS, and the engine reports logprobs after its processing
            after = await engine.generate(GenerateRequest("after", "g", prompt, 40, 0, 1.0, 1.0, 2))
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
    # the text the reward reads comes with the sample, decoded as the reward worker would
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    assert after.text == tokenizer.decode(after.token_ids.tolist(), skip_special_tokens=True)


def test_the_engine_generates_while_it_receives_a_push_and_pauses_only_to_load(tiny_model):
    """weight_sync.receive_while_generating (on with gloo): while the trainer holds back a push's
    bytes the engine goes on generating, so a request sent after the receive began runs to its
    end, all of it at the old version (with the receive inside the pause it would wait for the
    bytes). Once they are in, the push pauses only to load: a request in flight across it spans
    both versions in order, and what is sampled after is the new version's."""
    from transformers import AutoModelForCausalLM

    from flashq.engine.vllm_engine import RolloutEngine
    from flashq.engine.weights import WeightPusher
    cfg = load_config(None, ["rollout.max_model_len=1024", "sampling.max_tokens=600"])

    async def main():
        engine = RolloutEngine(cfg, tiny_model, 0, "cpu")
        await engine.start()
        loop = asyncio.get_running_loop()
        try:
            model = AutoModelForCausalLM.from_pretrained(tiny_model)
            pusher = await loop.run_in_executor(None, lambda: WeightPusher(cfg.weight_sync, model, direct_rpc(engine, loop), 1,
                                                                           free_port(), torch.device("cpu")))
            receiving, release = asyncio.Event(), threading.Event()
            core, broadcast = engine.llm.engine_core, pusher.engine._broadcast
            call = core.call_utility_async

            async def watched(method, *args):  # the receive's call is on its way once this runs
                if method == "flashq_receive_while_generating":
                    receiving.set()
                return await call(method, *args)

            def held_back(meta):
                assert release.wait(120), "never released"
                broadcast(meta)

            core.call_utility_async, pusher.engine._broadcast = watched, held_back
            prompt = np.array([2, 53, 47, 54, 65], np.int32)
            long = asyncio.create_task(engine.generate(GenerateRequest("long", "g", prompt, 600, 600, 1.0, 1.0, 1)))
            await tokens_received(engine, "long", 8)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.05 * torch.randn_like(p))
            push = loop.run_in_executor(None, pusher.push, 1)
            await asyncio.wait_for(receiving.wait(), 60)
            during = await asyncio.wait_for(engine.generate(GenerateRequest("during", "g", prompt, 40, 40, 1.0, 1.0, 2)), 120)
            release.set()
            await push
            spanning = await asyncio.wait_for(long, timeout=120)
            after = await engine.generate(GenerateRequest("after", "g", prompt, 40, 40, 1.0, 1.0, 3))
            pusher.close()
            return during, spanning, after, engine.paused_s
        finally:
            await engine.shutdown()

    during, spanning, after, paused_s = asyncio.run(main())
    assert len(during.token_ids) == 40 and set(during.versions.tolist()) == {0}
    v = spanning.versions
    assert len(v) == 600 and v[0] == 0 and v[-1] == 1 and np.all(np.diff(v) >= 0)
    assert set(after.versions.tolist()) == {1}
    assert paused_s > 0  # the load's pause, measured in the engine core


STOP_BOOST = 20.0  # the stop token's embedding row (tied: its logit) scaled, p(stop) a few %


def test_bf16_engines_serve_the_cast_of_float32_masters_and_agree_with_bf16_trainer_logprobs(tiny_model):
    """The GPU configs' precision on the CPU twin: vLLM serves bfloat16, the trainer keeps float32
    masters and computes in bfloat16. An lr 1e-6 step reaches the served weights (the push sends
    the masters' bf16 cast, bit for bit), and the trainer's logprobs of what the engine sampled
    agree with the engine's own, with and without min_tokens masking the stop token."""
    from flashq.engine.vllm_engine import RolloutEngine
    from flashq.engine.weights import WeightPusher
    from flashq.trainer.learner import Learner, stop_token_ids
    from flashq.trainer.logprobs import token_logprobs
    from tests.unit.test_learner import make_batch

    cfg = load_config(None, ["model.dtype=bfloat16", "trainer.compute_dtype=bfloat16", "trainer.lr=1e-6"])
    name = "model.embed_tokens.weight"  # (vLLM's CPU linears repack theirs; the embedding is kept as loaded)
    prompt = np.array([2, 53, 47, 54, 65], np.int32)
    banned = torch.tensor(stop_token_ids(tiny_model))

    async def main():
        engine = RolloutEngine(cfg, tiny_model, 0, "cpu")
        await engine.start()
        loop = asyncio.get_running_loop()
        try:
            rpc = direct_rpc(engine, loop)
            learner = Learner(cfg, tiny_model)
            with torch.no_grad():  # make the stop token likely, so min_tokens' masking matters
                learner.model.model.embed_tokens.weight[int(banned[0])] *= STOP_BOOST
            pusher = await loop.run_in_executor(
                None, lambda: WeightPusher(cfg.weight_sync, learner.model, rpc, 1, free_port(), learner.device, wire_dtype=torch.bfloat16))
            served_before = (await engine.llm.collective_rpc("flashq_parameter", args=(name,)))[0]
            await loop.run_in_executor(None, learner.train_step, make_batch(learner, [1, 0, 0, 1]))
            await loop.run_in_executor(None, pusher.push, 1)
            served_after = (await engine.llm.collective_rpc("flashq_parameter", args=(name,)))[0]
            free = await engine.generate(GenerateRequest("free", "g", prompt, 40, 0, 1.0, 1.0, 1))
            forced = await engine.generate(GenerateRequest("forced", "g", prompt, 40, 40, 1.0, 1.0, 2))
            pusher.close()
            return learner, served_before, served_after, free, forced
        finally:
            await engine.shutdown()

    learner, (dtype, before), (_, after), free, forced = asyncio.run(main())
    master = dict(learner.model.named_parameters())[name].detach()
    assert dtype == "torch.bfloat16" and master.dtype == torch.float32
    after = torch.tensor(after).view_as(master)
    assert torch.equal(after, master.bfloat16().float())  # exactly the masters' cast
    assert int((after != torch.tensor(before).view_as(master)).sum()) > 0  # and a 1e-6 step moved it

    for sample, mask_stop in ((free, None), (forced, banned)):
        assert set(sample.versions.tolist()) == {1}
        ids = torch.tensor(np.concatenate([prompt, sample.token_ids])[None].astype(np.int64))
        with torch.no_grad(), learner._autocast():
            lp = token_logprobs(learner.model, ids, torch.ones_like(ids), 1.0, banned=mask_stop)[0][0, len(prompt) - 1 :].numpy()
        gap = np.abs(lp - sample.logprobs)
        print(f"bf16 logprob gap ({'min_tokens' if mask_stop is not None else 'free'}): max {gap.max():.4f} mean {gap.mean():.4f}")
        # measured on this CPU: max 0.0023 / 0.0039, mean 0.0008 / 0.0011 (free / min_tokens);
        # the min_tokens sample scored without the stop-token mask: mean 0.011
        assert gap.max() < 0.02 and gap.mean() < 0.004
