import asyncio
import time

import numpy as np
import pytest

from flashq.rewards import load_reward_fn
from flashq.rewards.builtin import exact_match
from flashq.rewards.runner import RewardRunner
from flashq.roles.reward import RewardScorer
from flashq.wire.protocol import Sample, ScoreRequest

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


def test_auto_runs_quick_functions_in_threads_and_the_rest_in_processes():
    assert RewardRunner("flashq.rewards.builtin:exact_match").kind == "thread"
    assert RewardRunner("flashq.rewards.math:math_verify").kind == "process"
    assert RewardRunner(f"{HERE}:match").kind == "process"
    assert RewardRunner("flashq.rewards.builtin:exact_match", "process").kind == "process"


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


def seven():
    r = request()
    r.sample.token_ids = np.array([57], np.int32)  # decodes to "7": hang_on_7 hangs on it
    return r


@pytest.mark.parametrize("executor", ["process", "thread"])
def test_a_hanging_reward_times_out_and_the_next_call_is_served(executor):
    async def main():
        runner = RewardRunner(f"{HERE}:hang_on_7", executor, 1, 1.0)
        scorer = RewardScorer(runner, decode)
        try:
            out = await scorer.score(seven())
            assert out.reward == 0.0 and "timed out" in out.error
            assert (await scorer.score(request())).reward == 1.0  # a fresh process (or thread) serves it
            assert runner.restarts == (1 if executor == "process" else 0)
        finally:
            runner.close()

    asyncio.run(main())


def test_a_timeout_counts_only_the_calls_own_run_time():
    """One process; a call hangs and two slow ones queue behind it. Each gets its own full
    timeout once its process takes it, however long it waited (the old pool's clock started
    at submission, so the second slow call ran out of time after the hang was killed)."""

    async def main():
        runner = RewardRunner(f"{HERE}:hang_on_7_or_slow_match", "process", 1, 3.0)
        await runner.start()
        scorer = RewardScorer(runner, decode)
        try:
            results = await asyncio.gather(scorer.score(seven()), scorer.score(request()), scorer.score(request()))
            assert "timed out" in results[0].error
            assert [(r.reward, r.error) for r in results[1:]] == [(1.0, ""), (1.0, "")]
            assert runner.restarts == 1
        finally:
            runner.close()

    asyncio.run(main())


def test_a_timeout_kills_only_its_own_process(tmp_path):
    """Two processes: one call hangs; a call running beside it in the other process when the
    hang is killed finishes there, run once (the old pool was killed whole and ran it again)."""

    async def main():
        runner = RewardRunner(f"{HERE}:hang_on_7_or_log_slowly", "process", 2, 3.0)
        await runner.start()
        scorer = RewardScorer(runner, decode)
        beside = request()
        beside.task["log"] = str(tmp_path / "runs")
        try:
            async def later():
                await asyncio.sleep(1.5)  # starts mid-hang; runs 2 s, across the hang's kill at 3 s
                return await scorer.score(beside)

            hung, ok = await asyncio.gather(scorer.score(seven()), later())
            assert "timed out" in hung.error and (ok.reward, ok.error) == (1.0, "")
            assert (tmp_path / "runs").read_text() == "run\n" and runner.restarts == 1
        finally:
            runner.close()

    asyncio.run(main())


def test_a_crashed_reward_process_fails_its_call_and_is_replaced():
    async def main():
        runner = RewardRunner(f"{HERE}:exit_on_7", "process", 1, 10.0)
        scorer = RewardScorer(runner, decode)
        try:
            out = await scorer.score(seven())
            assert out.reward == 0.0 and "died (exit code 3)" in out.error
            assert (await scorer.score(request())).reward == 1.0 and runner.restarts == 1
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


def test_a_sample_carrying_its_text_is_scored_from_it_without_decoding():
    """The rollout worker decodes with the tokenizer vLLM loaded anyway; the reward worker
    then needs no tokenizer of its own (it decodes only samples that come without text)."""

    def no_decode(ids):
        raise AssertionError("decoded a sample that carried its text")

    async def main():
        runner = RewardRunner("flashq.rewards.builtin:exact_match", "thread", 1, 5.0)
        try:
            req = request()
            req.sample.text = "12"
            right = await RewardScorer(runner, no_decode).score(req)
            req.sample.text = "13"  # the text is what is scored, not a fresh decode of the ids
            wrong = await RewardScorer(runner, no_decode).score(req)
            return right, wrong
        finally:
            runner.close()

    right, wrong = asyncio.run(main())
    assert (right.reward, right.error, wrong.reward) == (1.0, "", 0.0)
