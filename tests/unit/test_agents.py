"""Agents over the OpenAI API: the real endpoint (aiohttp on loopback) and the real `openai`
client, with the engine faked by a script of completions (this tests the endpoint's and the
trajectory's logic; tests/integration/test_agents.py runs a real vLLM engine)."""

import asyncio
import threading

import numpy as np
import pytest

from flashq.agents.player import AgentPlayer
from flashq.config import load_config
from flashq.wire.protocol import EpisodeRequest, Sample

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "3*4+5"}}</tool_call>'
SEED = 7  # CalculatorMathEnv(max_value=9).reset(seed 7) asks a*b+c


class ScriptedEngine:
    """Answers each generate with the next scripted text (encoded + end of turn) and records what
    it was asked and what it returned, as a real engine's samples would be."""

    def __init__(self, tokenizer, texts, version=3):
        self.tok, self.texts, self.version = tokenizer, list(texts), version
        self.calls: list[tuple[list[int], np.ndarray]] = []
        self.cancelled = asyncio.Event()

    async def generate(self, req):
        text = self.texts.pop(0)
        if text == "HANG":  # a call the engine never answers, until it is cancelled
            try:
                await asyncio.Event().wait()
            finally:
                self.cancelled.set()
        ids = np.asarray(self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id], np.int32)
        self.calls.append((req.prompt_ids.tolist(), ids))
        return Sample(req.request_id, req.group_id, 0, ids, np.full(len(ids), -0.5, np.float32),
                      np.full(len(ids), self.version, np.int32), "stop")


def player(tiny_model, agent, texts, overrides=()):
    cfg = load_config("configs/agent_calculator.yaml", ["model.name=" + str(tiny_model), f"env.agent=tests.unit.test_agents:{agent}",
                                                        *overrides])
    from transformers import AutoTokenizer

    engine = ScriptedEngine(AutoTokenizer.from_pretrained(str(tiny_model)), texts)
    return AgentPlayer(cfg, tiny_model, engine), engine


def play(p, seed=SEED):
    async def main():
        await p.start()
        try:
            return await p.play(EpisodeRequest("g0/0", "g0", {}, seed, 96), 0)
        finally:
            await p.stop()

    return asyncio.run(main())


async def calculator(task, client):
    from examples.calculator_agent import agent

    return await agent(task, client)


def test_the_trained_tokens_are_the_sampled_ones_and_each_call_samples_from_the_trajectory(tiny_model):
    from flashq.envs.calculator import CalculatorMathEnv

    env = CalculatorMathEnv(max_value=9)
    question = env.reset({}, SEED)
    p, engine = player(tiny_model, "calculator", [CALL, str(env.answer)])
    sample = play(p)
    assert sample.finish_reason == "stop" and sample.env_reward == 1.0 and sample.turns == 2
    full = np.concatenate([sample.prompt_ids, sample.token_ids]).tolist()
    sampled = [ids for _, ids in engine.calls]
    trained = sample.token_ids[sample.loss_mask == 1]
    assert trained.tolist() == np.concatenate(sampled).tolist()  # every sampled id, as sampled
    assert set(sample.versions[sample.loss_mask == 1].tolist()) == {3}
    for context, ids in engine.calls:  # each call's context is the trajectory so far, then its completion follows
        assert full[: len(context) + len(ids)] == context + ids.tolist()
    # and the trajectory is the conversation as the chat template renders it
    tok = p.tokenizer
    conversation = [*question, {"role": "assistant", "content": CALL}, {"role": "tool", "content": "17"},
                    {"role": "assistant", "content": str(env.answer)}]
    assert tok.decode(full) == tok.apply_chat_template(conversation, tokenize=False).rstrip("\n")


errors = []


async def bad_requests(task, client):
    import openai

    messages = [{"role": "user", "content": "hi"}]
    for kwargs in ({"model": "gpt-4o"}, {"logit_bias": {"5": 10}}, {"top_p": 0.5}, {"n": 0}, {"tool_choice": "required"},
                   {"temperature": "hot"}, {"extra_body": {"frobnicate": 1}}):
        try:
            await client.chat.completions.create(**{"model": "flashq-policy", "messages": messages, **kwargs})
        except openai.APIStatusError as e:
            errors.append((e.status_code, e.body.get("param"), e.body.get("code")))
    import httpx

    async with httpx.AsyncClient() as http:
        r = await http.post(f"{client.base_url}chat/completions", content=b"{not json")
        errors.append((r.status_code, "json", r.json()["error"]["message"][:28]))
    return "not a number"


def test_malformed_requests_get_openai_errors_naming_what_was_wrong(tiny_model):
    p, engine = player(tiny_model, "bad_requests", [])
    sample = play(p)
    assert sample.finish_reason == "error" and "not a reward" in sample.error  # it returned a string
    assert not engine.calls  # nothing reached the engine
    assert p.endpoint.refused == 8
    assert errors == [
        (404, "model", "model_not_found"), (400, "logit_bias", "unsupported_parameter"), (400, "top_p", "unsupported_parameter"),
        (400, "n", None), (400, "tool_choice", "unsupported_parameter"), (400, "temperature", None),
        (400, "frobnicate", "unknown_parameter"), (400, "json", "the request body is not JSON")]


stolen = {}


async def keeps_its_url(task, client):
    stolen["url"], stolen["key"] = str(client.base_url), client.api_key
    reply = await client.chat.completions.create(model="flashq-policy", messages=[{"role": "user", "content": "2+2=?"}])
    return float(reply.choices[0].message.content == "4")


def test_an_episode_url_is_refused_after_its_episode_and_for_other_episodes(tiny_model):
    import openai

    p, engine = player(tiny_model, "keeps_its_url", ["4", "5"])

    async def main():
        await p.start()
        try:
            first = await p.play(EpisodeRequest("g0/0", "g0", {}, 1, 96), 0)
            async with openai.AsyncOpenAI(base_url=stolen["url"], api_key=stolen["key"], max_retries=0) as late:
                with pytest.raises(openai.AuthenticationError, match="ended"):
                    await late.models.list()
            guessed = stolen["url"].replace(stolen["url"].split("/e/")[1].split("/")[0], "x" * 32)
            async with openai.AsyncOpenAI(base_url=guessed, api_key="x", max_retries=0) as other:
                with pytest.raises(openai.AuthenticationError):
                    await other.chat.completions.create(model="flashq-policy", messages=[{"role": "user", "content": "hi"}])
            return first
        finally:
            await p.stop()

    assert asyncio.run(main()).env_reward == 1.0


async def rewrites_history(task, client):
    messages = [{"role": "user", "content": "2+2=?"}]
    reply = await client.chat.completions.create(model="flashq-policy", messages=messages)
    summary = [{"role": "user", "content": "summary: asked 2+2"}, {"role": "user", "content": "again?"}]
    await client.chat.completions.create(model="flashq-policy", messages=summary)
    return 1.0 if reply else 0.0


def test_a_rewritten_history_fails_the_episode_naming_the_message(tiny_model):
    p, engine = player(tiny_model, "rewrites_history", ["4"])
    sample = play(p)
    assert sample.finish_reason == "error" and "rewrote its history" in sample.error and "message 0 (user)" in sample.error
    assert len(engine.calls) == 1


async def summarises(task, client):
    """Two calls that continue each other, then a third on a summary of them."""
    messages = [{"role": "user", "content": "2+2=?"}]
    for question in ("and 3+3?", None):
        reply = await client.chat.completions.create(model="flashq-policy", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True)]
        if question:
            messages += [{"role": "user", "content": question}]
    summary = [{"role": "user", "content": "summary: 4 and 6"}, {"role": "user", "content": "sum them"}]
    await client.chat.completions.create(model="flashq-policy", messages=summary)
    return 0.5


def test_a_rewritten_history_splits_the_episode_into_segments_of_exact_tokens(tiny_model):
    p, engine = player(tiny_model, "summarises", ["4", "6", "10"], ["env.on_rewrite=split"])
    sample = play(p)
    sample.validate()
    assert sample.finish_reason == "stop" and sample.env_reward == 0.5 and sample.turns == 3
    (c1, ids1), (c2, ids2), (c3, ids3) = engine.calls
    def rendered(messages):
        text = p.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return p.tokenizer(text, add_special_tokens=False)["input_ids"]

    prompt0 = rendered([{"role": "user", "content": "2+2=?"}])
    prompt1 = rendered([{"role": "user", "content": "summary: 4 and 6"}, {"role": "user", "content": "sum them"}])
    tail = c2[len(c1) + len(ids1):]  # the rendered "and 3+3?" turn between the first two completions
    assert c1 == prompt0 and c3 == prompt1 and tail  # the third call starts afresh from its own messages
    assert sample.prompt_ids.tolist() == prompt0 + prompt1 and sample.prompt_ends.tolist() == [len(prompt0), len(prompt0 + prompt1)]
    segment0 = [*ids1.tolist(), *tail, *ids2.tolist()]
    assert sample.token_ids.tolist() == segment0 + ids3.tolist()
    assert sample.segment_ends.tolist() == [len(segment0), len(segment0) + len(ids3)]
    assert sample.loss_mask.tolist() == [1] * len(ids1) + [0] * len(tail) + [1] * len(ids2) + [1] * len(ids3)
    assert sample.logprobs.tolist() == [-0.5] * len(ids1) + [0] * len(tail) + [-0.5] * (len(ids2) + len(ids3))
    assert set(sample.versions.tolist()) == {3}
    assert [(len(sample.prompt_ids[p]), len(sample.token_ids[r])) for p, r in sample.segments()] == [
        (len(prompt0), len(segment0)), (len(prompt1), len(ids3))]


async def picks_the_second(task, client):
    messages = [{"role": "user", "content": "pick"}]
    reply = await client.chat.completions.create(model="flashq-policy", messages=messages, n=2)
    messages += [reply.choices[1].message.model_dump(exclude_none=True), {"role": "user", "content": "and?"}]
    await client.chat.completions.create(model="flashq-policy", messages=messages)
    return 0.5


def test_n_choices_the_trajectory_follows_the_one_the_agent_kept(tiny_model):
    p, engine = player(tiny_model, "picks_the_second", ["first", "second", "done"])
    sample = play(p)
    trained = sample.token_ids[sample.loss_mask == 1].tolist()
    assert trained == engine.calls[1][1].tolist() + engine.calls[2][1].tolist()
    assert engine.calls[2][0][-len("second") - 30:] != []  # the third call's context holds the second choice
    assert p.tokenizer.decode(engine.calls[2][0]).count("second") == 1 and "first" not in p.tokenizer.decode(engine.calls[2][0])


async def streams(task, client):
    stream = await client.chat.completions.create(model="flashq-policy", messages=[{"role": "user", "content": "s"}], stream=True,
                                                  stream_options={"include_usage": True})
    text, usage = "", None
    async for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        usage = chunk.usage or usage
    return float(text == "streamed" and usage.completion_tokens == len("streamed") + 1)


def test_streaming_as_the_api_sends_it(tiny_model):
    p, _ = player(tiny_model, "streams", ["streamed"])
    assert play(p).env_reward == 1.0


def plain(task, client):
    reply = client.chat.completions.create(model="flashq-policy", messages=[{"role": "user", "content": "p"}])
    return None if reply.choices[0].message.content == "7" else 0.0


def test_a_plain_function_runs_in_a_thread_and_none_is_scored_by_the_reward_function(tiny_model):
    p, _ = player(tiny_model, "plain", ["7"], ["reward.function=tests.unit.test_agents:seven"])
    assert play(p).env_reward == 1.0


def seven(task, response):
    return float(response == "7")


async def hangs(task, client):
    await asyncio.sleep(3600)


async def raises(task, client):
    raise KeyError("tool missing")


async def too_many_turns(task, client):
    messages = [{"role": "user", "content": "q"}]
    for _ in range(5):
        reply = await client.chat.completions.create(model="flashq-policy", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    return 1.0


@pytest.mark.parametrize("agent, finish, why", [("hangs", "error", "agent_timeout_s"), ("raises", "error", "KeyError"),
                                               ("too_many_turns", "error", "BadRequestError")])
def test_agents_that_hang_raise_or_overrun_fail_their_episode(tiny_model, agent, finish, why):
    p, _ = player(tiny_model, agent, ["a"] * 5, ["env.agent_timeout_s=0.5"])
    sample = play(p)
    assert sample.finish_reason == finish and why in sample.error


def test_configs_name_an_environment_or_an_agent():
    from flashq.config import ConfigError

    with pytest.raises(ConfigError, match="exactly one of name"):
        load_config("configs/agent_calculator.yaml", ["env.name=flashq.envs.calculator:CalculatorMathEnv"])
    assert load_config("configs/agent_calculator.yaml", ["env.on_rewrite=split"]).env.on_rewrite == "split"


def test_the_token_audit_counts_every_trained_id_that_is_not_the_sampled_one(tmp_path):
    import json

    from flashq.agents.audit import audit_tokens

    (tmp_path / "sampled-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"request_id": "g0/0@1.0", "ids": [7, 8]}, {"request_id": "g0/0@0.0", "ids": [5, 6]}, {"request_id": "g0/1@0.0", "ids": [9]}]))
    trained = {"trainer_version": 0, "requests": [["g0/0", 0, 0, 6, [5, 6, 7, 8]], ["g0/1", 0, 0, 2, [9, 4]]]}
    (tmp_path / "trained.jsonl").write_text(json.dumps(trained) + "\n")
    assert audit_tokens(tmp_path) == {"episodes_checked": 2, "tokens_checked": 6, "retokenized_tokens": 1}
    trained["requests"][0][4] = [5, 6, 8, 7]
    (tmp_path / "trained.jsonl").write_text(json.dumps(trained) + "\n")
    assert audit_tokens(tmp_path)["retokenized_tokens"] == 3


call_ended = threading.Event()


def stuck_in_a_call(task, client):
    """A plain function (its own thread) whose call never gets an answer."""
    try:
        client.chat.completions.create(model="flashq-policy", messages=[{"role": "user", "content": "hi"}], timeout=3600)
    finally:
        call_ended.set()


def test_an_episode_that_times_out_cancels_its_call_in_flight_and_frees_the_agent_thread(tiny_model):
    """The engine stops generating for an episode that is over, and the agent's thread, blocked in
    its call, gets an error instead of waiting for ever."""
    p, engine = player(tiny_model, "stuck_in_a_call", ["HANG"], ["env.agent_timeout_s=0.5"])

    async def main():
        await p.start()
        try:
            sample = await p.play(EpisodeRequest("g0/0", "g0", {}, SEED, 96), 0)
            await asyncio.wait_for(engine.cancelled.wait(), 60)  # cancelled by the episode's end, not by the loop's
            return sample
        finally:
            await p.stop()

    sample = asyncio.run(main())
    assert sample.finish_reason == "error" and "agent_timeout_s" in sample.error
    assert call_ended.wait(60) and not p.endpoint.in_flight
