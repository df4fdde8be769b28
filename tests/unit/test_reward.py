import asyncio
import time

import numpy as np
import pytest

from flashq.protocol import Sample, ScoreRequest
from flashq.rewards import load_reward_fn
from flashq.rewards.builtin import exact_match
from flashq.rewards.runner import RewardRunner
from flashq.roles.reward import RewardScorer

HERE = "tests.unit.reward_fixtures"


def request():
    ids = np.array([51, 52], np.int32)
    s = Sample("g0/0", "g0", 0, ids, np.zeros(2, np.float32), np.zeros(2, np.int32), "stop")
    return ScoreRequest(s, {"answer": "12"})


def decode(ids):
    return "".join(chr(i - 2) for i in ids)  # 51 -> '1', 52 -> '2'


def score(name, executor="thread", timeout=5.0):
    async def main():
        runner = RewardRunner(f"{HERE}:{name}", executor, 1, timeout)
        try:
            t0 = time.monotonic()
            out = await RewardScorer(runner, decode).score(request())
            return out, time.monotonic() - t0, runner
        finally:
            runner.close()

    return asyncio.run(main())


def test_exact_match():
    assert exact_match({"answer": "12"}, " 12\n") == 1.0
    assert exact_match({"answer": "12"}, "13") == 0.0


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_sync_reward_in_either_executor(executor):
    out, _, _ = score("match", executor)
    assert out.reward == 1.0 and out.error == ""


def test_async_reward():
    out, _, runner = score("async_half")
    assert out.reward == 0.5 and runner.kind == "async"


@pytest.mark.parametrize(
    "name, error",
    [("divide_by_zero", "ZeroDivisionError"), ("nan", "returned nan"), ("missing_key", "KeyError")],
)
def test_a_broken_reward_scores_zero_with_the_reason(name, error):
    out, _, _ = score(name)
    assert out.reward == 0.0 and error in out.error


def test_a_hanging_reward_is_killed_at_the_timeout_and_the_pool_recovers():
    async def main():
        runner = RewardRunner(f"{HERE}:hang", "process", 1, 1.0)
        scorer = RewardScorer(runner, decode)
        try:
            t0 = time.monotonic()
            out = await scorer.score(request())
            took = time.monotonic() - t0
            assert out.reward == 0.0 and "timed out" in out.error
            assert took < 5 and runner.restarts == 1
            runner.fn = None  # the pool, not this process, runs the function
            runner.spec = f"{HERE}:match"
            again = await scorer.score(request())
            assert again.reward == 1.0  # a fresh pool serves the next call
        finally:
            runner.close()

    asyncio.run(main())


def test_calls_queued_beside_a_hanging_one_are_retried_not_lost():
    """One call hangs and its pool is killed; the calls queued behind it in that pool are
    cancelled by the kill and must be retried on the new pool, not vanish."""

    async def main():
        runner = RewardRunner(f"{HERE}:hang_on_7", "process", 1, 2.0)
        await runner.start()
        scorer = RewardScorer(runner, decode)
        try:
            reqs = [request(), *[request() for _ in range(3)]]
            reqs[0].sample.token_ids = np.array([57], np.int32)  # decodes to "7": hangs
            async def later(r):
                await asyncio.sleep(1.0)  # queued behind the hanging call, well inside their own timeout
                return await scorer.score(r)

            results = await asyncio.gather(scorer.score(reqs[0]), *[later(r) for r in reqs[1:]])
            assert "timed out" in results[0].error
            assert [r.reward for r in results[1:]] == [1.0, 1.0, 1.0] and runner.restarts == 1
        finally:
            runner.close()

    asyncio.run(main())


def test_plugin_loading_errors_are_clear():
    assert load_reward_fn("flashq.rewards.builtin:exact_match") is exact_match
    with pytest.raises(ValueError, match="must look like"):
        load_reward_fn("flashq.rewards.builtin.exact_match")
    with pytest.raises(ValueError, match="cannot import"):
        load_reward_fn("no_such_pkg.mod:fn")
    with pytest.raises(ValueError, match="no callable 'nope'"):
        load_reward_fn("flashq.rewards.builtin:nope")
    with pytest.raises(ValueError, match="reward.executor"):
        RewardRunner("flashq.rewards.builtin:exact_match", "gpu")


@pytest.mark.parametrize(
    "answer, response, expected",
    [
        ("1/2", "so the result is \\boxed{0.5}", 1.0),
        ("\\frac{1}{2}", "The answer is $\\frac{2}{4}$.", 1.0),
        ("Natalia sold 48/2 = 24 clips in May.\n#### 1,072", "In total \\boxed{1072}", 1.0),  # GSM8K reference
        ("so $x = \\boxed{\\sqrt{2}}$", "x = \\boxed{2^{1/2}}", 1.0),  # MATH reference solution
        ("12", "\\boxed{13}", 0.0),
        ("12", "I don't know", 0.0),
    ],
)
def test_math_verify_on_dataset_style_references(answer, response, expected):
    from flashq.rewards.math import math_verify

    assert math_verify({"answer": answer}, response) == expected


def test_math_verify_runs_in_the_process_pool_through_the_runner():
    async def main():
        runner = RewardRunner("flashq.rewards.math:math_verify", "process", 1, 20.0)
        try:
            return await runner({"answer": "#### 7"}, "It is \\boxed{7}")
        finally:
            runner.close()

    assert asyncio.run(main()) == 1.0
