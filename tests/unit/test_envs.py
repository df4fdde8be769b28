"""The built-in environments, the adapters to existing libraries, and loading a user's class."""

import asyncio
import math

import pytest

from flashq.envs.adapters import FiveTupleEnv, GymnasiumTextEnv, TextArenaEnv
from flashq.envs.base import AsyncEnv, EnvError, StepResult, load_env_class
from flashq.envs.calculator import CalculatorMathEnv
from flashq.envs.guess import GuessNumberEnv


def say(text):
    return {"role": "assistant", "content": text}


def test_guess_number_answers_higher_or_lower_and_pays_for_the_secret():
    env = GuessNumberEnv(high=8, max_turns=3)
    assert env.reset({}, seed=11) == [{"role": "user", "content": "guess 1-8"}]
    secret = env.secret
    low = env.step(say(str(secret - 1) if secret > 1 else "0"))
    assert low.messages == [{"role": "user", "content": "higher"}] and not low.terminated
    assert env.step(say("no idea")).messages[0]["content"] == "?"
    assert env.step(say(f"it is {secret}")).reward == 1.0
    demo = env.demonstration({}, seed=11)
    assert demo[0]["role"] == "user" and demo[-1]["role"] == "assistant" and len(demo) <= 2 * 3


def test_calculator_runs_tool_calls_and_scores_the_answer():
    env = CalculatorMathEnv(max_value=20, latency_s=0.01)
    question = env.reset({}, seed=4)[0]["content"]
    expression = question.removesuffix("=?")
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>' % expression
    result = asyncio.run(env.step(say(call)))
    assert result.messages[0]["role"] == "tool" and result.messages[0]["content"] == str(env.answer)
    bad = asyncio.run(env.step(say('<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(1)"}}</tool_call>')))
    assert bad.messages[0]["content"].startswith("error: ValueError")
    assert asyncio.run(env.step(say(str(env.answer)))).reward == 1.0
    assert env.tools()[0]["function"]["name"] == "calculator"


def test_gymnasium_frozen_lake_through_the_text_adapter():
    env = GymnasiumTextEnv("FrozenLake-v1", ["left", "down", "right", "up"], {"is_slippery": False}, max_turns=10)
    board = env.reset({}, seed=0)[0]["content"]
    assert "SFFF" in board and "\x1b" not in board
    path = ["right", "right", "down", "down", "down", "right"]  # around the holes of the 4x4 map
    for move in path[:-1]:
        assert not env.step(say(f"I go {move}")).terminated
    last = env.step(say(path[-1]))
    assert last.terminated and last.reward == 1.0
    env.reset({}, seed=0)
    assert env.step(say("jump")).messages[0]["content"] == "? (left, down, right, up)"  # no such action: asked again


class CoinFlip:
    """A GEM-style five-tuple environment, written as a user would."""

    def reset(self, seed=None):
        self.side = "heads" if seed % 2 else "tails"
        return "heads or tails?", {}

    def step(self, action):
        return "", float(action.strip() == self.side), True, False, {"side": self.side}


def test_five_tuple_adapter_loads_a_class_by_name():
    env = FiveTupleEnv(env=f"{__name__}:CoinFlip")
    assert env.reset({}, seed=3)[0]["content"] == "heads or tails?"
    result = env.step(say("heads"))
    assert result.reward == 1.0 and result.terminated and result.info == {"side": "heads"}


def test_textarena_guess_the_number_through_its_adapter():
    pytest.importorskip("textarena")
    env = TextArenaEnv("GuessTheNumber-v0")
    opening = env.reset({}, seed=3)[0]["content"]
    assert "guess" in opening.lower()
    reply = env.step(say("[10]"))
    assert not reply.terminated and ("higher" in reply.messages[0]["content"] or "lower" in reply.messages[0]["content"])
    assert "[10]" not in opening and reply.messages[0]["content"] != opening  # only what is new


def test_loading_names_what_is_wrong():
    assert load_env_class("flashq.envs.guess:GuessNumberEnv") is GuessNumberEnv
    with pytest.raises(ValueError, match="cannot import no_such_module"):
        load_env_class("no_such_module:Env")
    with pytest.raises(ValueError, match="has no attribute 'Nope'"):
        load_env_class("flashq.envs.guess:Nope")
    with pytest.raises(ValueError, match="no 'flashq.envs' entry point"):
        load_env_class("not-registered")


def test_an_entry_point_in_the_flashq_envs_group_names_an_environment(monkeypatch):
    from importlib.metadata import EntryPoint

    from flashq.envs import base

    ep = EntryPoint(name="coin-flip", value=f"{__name__}:CoinFlip", group="flashq.envs")
    monkeypatch.setattr(base, "entry_points", lambda group: [ep] if group == "flashq.envs" else [])
    assert load_env_class("coin-flip") is CoinFlip


def test_async_view_checks_what_an_environment_returns():
    class Bad:
        def reset(self, task, seed):
            return "hello"

        def step(self, assistant):
            return StepResult([], reward="lots")

    env = AsyncEnv(Bad())
    with pytest.raises(EnvError, match="list of chat-message dicts"):
        asyncio.run(env.reset({}, 0))
    with pytest.raises(EnvError, match="not a number"):
        asyncio.run(env.step(say("x")))
    assert env.tools() == []


def test_latency_wrapper_delays_steps_and_keeps_the_rest(monkeypatch):
    from flashq.envs import latency

    slept = []
    real_sleep = asyncio.sleep

    async def sleep(seconds):
        slept.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(latency.asyncio, "sleep", sleep)
    env = latency.WithLatency("flashq.envs.guess:GuessNumberEnv", {"high": 4}, latency_s=0.05, sigma=0.5)

    async def play():
        opening = await env.reset({}, seed=2)
        return opening, await env.step(say(str(env.inner.secret)))

    opening, result = asyncio.run(play())
    assert opening[0]["content"] == "guess 1-4" and result.reward == 1.0
    assert len(slept) == 1 and 0.05 * math.exp(-5 * 0.5) < slept[0] < 0.05 * math.exp(5 * 0.5)  # one lognormal wait
    assert env.demonstration({}, seed=2)[0]["content"] == "guess 1-4"
