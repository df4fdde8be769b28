"""LoRA end to end with real vLLM engines: the adapter pushed in memory, served (merged into the
engine's weights, or by vLLM's LoRA layers) with the policy's version, and a LoRA run that survives a killed rollout worker and a
killed trainer with every sample trained exactly once."""

import asyncio
import os
import signal

import numpy as np
import pytest
import torch

from flashq.config import load_config
from flashq.roles.common import free_port
from flashq.wire.protocol import GenerateRequest
from tests.integration.helpers import read_jsonl, trained_requests
from tests.integration.test_faults import Run, audit, stop_runs_left_running  # noqa: F401 - the fixture
from tests.integration.test_weight_transfer import direct_rpc

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("serve", ["merged", "adapter"])
def test_the_engine_serves_the_pushed_adapter_exactly_and_in_flight_requests_span_versions(tiny_model, serve):
    from flashq.engine.vllm_engine import RolloutEngine
    from flashq.engine.weights import WeightPusher
    from flashq.trainer.learner import Learner
    from flashq.trainer.logprobs import token_logprobs
    from tests.unit.test_learner import make_batch

    cfg = load_config(None, ["trainer.lora.rank=4", "trainer.lora.alpha=8", "trainer.lr=0.05", "rollout.max_model_len=1024",
                              f"trainer.lora.serve={serve}",
                              # k and up left out: merged serving must still reload their packed layers whole
                              "trainer.lora.target_modules=[q_proj,v_proj,o_proj,gate_proj,down_proj]"])
    prompt = np.array([2, 53, 47, 54, 65], np.int32)
    pushed = []

    async def main():
        engine = RolloutEngine(cfg, tiny_model, 0, "cpu")
        await engine.start()
        loop = asyncio.get_running_loop()
        rpc = direct_rpc(engine, loop)

        def counting_rpc(method, payload, version):
            if method == "push_weights":
                pushed.append(list(payload["names"]))
            rpc(method, payload, version)

        try:
            learner = Learner(cfg, tiny_model)
            pusher = await loop.run_in_executor(
                None, lambda: WeightPusher(cfg.weight_sync, learner.model, counting_rpc, 1, free_port(), learner.device, adapter=True))
            await loop.run_in_executor(None, pusher.push, 0)  # the run's first push: the fresh adapter
            first = await engine.generate(GenerateRequest("first", "g", prompt, 40, 0, 1.0, 1.0, 1))
            for b in range(3):
                await loop.run_in_executor(None, learner.train_step, make_batch(learner, [1, 0, 0, 1], batch_index=b))
                if b == 0:  # a trained adapter replaced by the next: merged serving starts again from the base
                    await loop.run_in_executor(None, pusher.push, 1)
            long = asyncio.create_task(engine.generate(GenerateRequest("long", "g", prompt, 600, 600, 1.0, 1.0, 3)))
            while engine.llm.output_processor.get_num_unfinished_requests() == 0:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)  # as in test_weight_transfer: its first tokens sampled before the push
            await loop.run_in_executor(None, pusher.push, 3)
            after = await engine.generate(GenerateRequest("after", "g", prompt, 40, 0, 1.0, 1.0, 2))
            spanning = await long
            pusher.close()
            return learner, first, after, spanning
        finally:
            await engine.shutdown()

    learner, first, after, spanning = asyncio.run(main())
    # only the adapter crosses: 5 target modules x 2 layers x (A, B)
    assert len(pushed) == 3 and all(len(p) == 20 and all(".lora_" in n for n in p) for p in pushed)
    assert set(first.versions.tolist()) == {0} and set(after.versions.tolist()) == {3}
    v = spanning.versions
    assert v[0] == 1 and v[-1] == 3 and np.all(np.diff(v) >= 0)  # frozen across the push, not aborted
    ids = torch.tensor(np.concatenate([prompt, after.token_ids])[None].astype(np.int64))
    with torch.no_grad():
        lp = token_logprobs(learner.model, ids, torch.ones_like(ids), 1.0)[0][0, len(prompt) - 1 :].numpy()
        with learner.model.disable_adapter():
            base = token_logprobs(learner.model, ids, torch.ones_like(ids), 1.0)[0][0, len(prompt) - 1 :].numpy()
    assert np.max(np.abs(lp - after.logprobs)) < 1e-3  # the engine samples from base + the trained adapter
    assert np.max(np.abs(base - after.logprobs)) > 1e-2  # which is not the base


def test_a_lora_run_resumes_after_a_trainer_kill_with_every_sample_trained_once(tmp_path):
    """The trainer killed mid-run: every role restarts from the checkpoint (its adapter and
    optimizer state), the fresh engines get the base model and, before any request, the
    checkpoint's adapter; nothing is lost or trained twice."""
    run = Run(tmp_path, ["async_ratio=2", "trainer.steps=60", "trainer.checkpoint_every=10", "trainer.lora.rank=8",
                         "trainer.lr=0.003", "rollout.num_workers=1"])
    run.wait_steps(25)
    os.kill(run.pid("trainer"), signal.SIGKILL)
    run.wait_for("resuming from")
    rc = run.proc.wait(timeout=600)
    assert rc == 0, "".join(run.lines[-80:])
    ledger = audit(tmp_path, group_size=4)
    assert ledger["trained_steps"] == 60 and ledger["finished"]
    trained = trained_requests(tmp_path)
    assert all(version - vmin <= 2 and vmax <= version for version, _, vmin, vmax in trained)
    assert min(vmin for version, _, vmin, _ in trained if version >= 30) >= 20  # resumed engines served the checkpoint's adapter on
    steps = [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "step"]
    assert steps == list(range(1, 61))
    final = tmp_path / "checkpoints" / "step-000060" / "trainer"
    assert (final / "adapter" / "adapter_model.safetensors").exists() and (final / "model.safetensors.index.json").exists()
