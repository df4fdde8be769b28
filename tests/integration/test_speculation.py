"""flashq's grouped drafter as vLLM's proposer, in a real engine: speculation changes nothing
about what is sampled. Greedy output and its logprobs are exactly those of decoding without
speculation; at temperature 1 the distribution of responses is the same (a chi-square test)."""

import asyncio
import os
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from vllm.v1.engine.core import EngineCoreProc

from flashq.config import load_config
from flashq.drafting.acceptance import emitted_acceptance
from flashq.engine.vllm_engine import RolloutEngine
from flashq.engine.vllm_plugin import run_engine_core_then_exit
from flashq.roles.common import resolve_model
from flashq.wire.protocol import GenerateRequest

pytestmark = pytest.mark.slow


async def generate_all(speculation: str, prompts: list[np.ndarray]):
    cfg = load_config(None, [f"rollout.speculation={speculation}", "rollout.max_model_len=256"])
    engine = RolloutEngine(cfg, resolve_model(cfg), 0, "cpu")
    await engine.start()
    cores = engine.llm.engine_core.resources.engine_manager.processes
    assert EngineCoreProc.run_engine_core is run_engine_core_then_exit  # the target the engine core started with
    try:
        return await asyncio.gather(*[
            engine.generate(GenerateRequest(f"g{i}/{k}", f"g{i}", p, 48, temperature=0.0))
            for i, p in enumerate(prompts) for k in range(4)])  # four siblings per prompt: a group to draft from
    finally:
        await engine.shutdown()
        # and it ended cleanly, its proposer's counters file removed
        assert [c.exitcode for c in cores] == [0] * len(cores) and cores
        if speculation == "grouped":
            assert engine.draft_stats_path and not os.path.exists(engine.draft_stats_path)


def test_grouped_speculation_is_lossless_under_greedy_decoding():
    rng = np.random.default_rng(0)
    prompts = [rng.integers(5, 250, size=12).astype(np.int32) for _ in range(4)]
    plain = asyncio.run(generate_all("none", prompts))
    grouped = asyncio.run(generate_all("grouped", prompts))
    for a, b in zip(plain, grouped):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


@pytest.fixture(scope="module")
def peaked_model(tiny_model, tmp_path_factory):
    """The tiny model with its final norm scaled up: next-token distributions from near-certain to
    broad, so at temperature 1 sibling drafts are often but not always accepted."""
    out = tmp_path_factory.mktemp("peaked")
    for f in tiny_model.iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    weights = load_file(out / "model.safetensors")
    weights["model.norm.weight"] = torch.full_like(weights["model.norm.weight"], 8.0)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


async def sample_rounds(model, speculation: str, prompts, samples: int, rounds: int, horizon: int):
    cfg = load_config(None, [f"model.name={model}", f"rollout.speculation={speculation}", "rollout.max_model_len=64",
                             "rollout.num_speculative_tokens=3", "rollout.max_num_seqs=512"])
    engine = RolloutEngine(cfg, model, 0, "cpu")
    await engine.start()
    try:
        out, emitted = [], 0
        for r in range(rounds):  # round 2 drafts from round 1's responses too (the prompt's history)
            out = await asyncio.gather(*[
                engine.generate(GenerateRequest(f"r{r}-g{i}/{k}", f"g{i}", p, horizon, temperature=1.0))
                for i, p in enumerate(prompts) for k in range(samples)])
            emitted += sum(len(s.token_ids) for s in out)
        from vllm.v1.metrics.loggers import PrometheusStatLogger

        manager = engine.llm.logger_manager
        prometheus = [type(lg).__name__ for lg in manager.stat_loggers if isinstance(lg, PrometheusStatLogger)] if manager else []
        return out, {**engine.speculation_counters(), "prometheus_loggers": prometheus, "responses_tokens": emitted}
    finally:
        await engine.shutdown()


def chi_square_homogeneity(a: list, b: list) -> float:
    """p-value that two samples of categories come from one distribution (rare categories pooled)."""
    cats = sorted(set(a) | set(b))
    table = np.array([[a.count(c) for c in cats], [b.count(c) for c in cats]], dtype=float)
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    rare = expected.min(0) < 5
    if rare.any():
        table = np.concatenate([table[:, ~rare], table[:, rare].sum(1, keepdims=True)], axis=1)
        expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    dof = table.shape[1] - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))


def test_grouped_speculation_keeps_the_sampling_distribution_at_temperature_1(peaked_model):
    rng = np.random.default_rng(1)
    prompts = [rng.integers(5, 250, size=10).astype(np.int32) for _ in range(3)]
    plain, plain_counters = asyncio.run(sample_rounds(peaked_model, "none", prompts, samples=400, rounds=1, horizon=4))
    grouped, counters = asyncio.run(sample_rounds(peaked_model, "grouped", prompts, samples=400, rounds=2, horizon=4))
    plain_counters.pop("responses_tokens")
    assert plain_counters == {"prometheus_loggers": []}  # without speculation vLLM keeps no statistics
    # with it, flashq's counters take the place of vLLM's Prometheus logger: no registry to feed per request
    assert counters["prometheus_loggers"] == ["EngineCounters"]
    assert counters["spec_accepted_tokens"] > 0.2 * counters["spec_draft_tokens"] > 0  # drafts were verified and often accepted
    # the counters hold what the responses hold, every token of both rounds; drafts of 3 run past
    # the 4-token limit, and vLLM counts those it accepted there, so its count of accepted tokens is
    # above what the responses kept
    assert counters["emitted_tokens"] == counters["responses_tokens"]
    kept = counters["emitted_tokens"] - counters["request_steps"]
    assert counters["request_steps"] >= 2 * 3 * 400 and 0 < kept < counters["spec_accepted_tokens"]
    assert 1 < emitted_acceptance(counters)["acceptance_length"] < 4
    # the proposer's own counters reach the frontend: its calls (one per engine step) and drafting time
    assert counters["spec_proposer_calls"] > 0 and counters["engine_steps"] > 0 and counters["spec_drafting_s"] > 0
    for g in range(len(prompts)):
        a = [tuple(s.token_ids.tolist()) for s in plain if s.group_id == f"g{g}"]
        b = [tuple(s.token_ids.tolist()) for s in grouped if s.group_id == f"g{g}"]
        assert chi_square_homogeneity(a, b) > 1e-3, f"prompt {g}: speculation changed the response distribution"
        # the mean log-likelihood of a response, compared with its standard error: a response's
        # summed logprob has a standard deviation of about 3.5 here, so a fixed bound of 0.5 (two
        # standard errors) failed about one run in twenty with nothing wrong
        lp_a = np.array([s.logprobs.sum() for s in plain if s.group_id == f"g{g}"])
        lp_b = np.array([s.logprobs.sum() for s in grouped if s.group_id == f"g{g}"])
        se = np.sqrt(lp_a.var() / len(lp_a) + lp_b.var() / len(lp_b))
        assert np.isfinite(lp_b).all() and abs(lp_a.mean() - lp_b.mean()) < 4 * se, f"prompt {g}: logprobs shifted"
    # the logprobs returned with drafted tokens (for the off-policy correction) are the target model's own
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(peaked_model), torch_dtype=torch.float32).eval()
    for s in grouped[::40]:
        prompt = prompts[int(s.group_id[1:])]
        ids = torch.tensor([[*prompt.tolist(), *s.token_ids.tolist()]])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1]
        target = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(s.token_ids, dtype=torch.long)[:, None])[:, 0]
        np.testing.assert_allclose(s.logprobs, target.numpy(), atol=2e-3)
