"""Episodes, token-exact. The engine here is a scripted stand-in (it returns fixed assistant
turns) so that the bookkeeping can be checked exactly; the real engine plays episodes in
tests/integration/test_agentic.py."""

import asyncio

import numpy as np
import pytest

from flashq.envs.base import AsyncEnv, StepResult
from flashq.envs.guess import GuessNumberEnv
from flashq.episode import ChatRenderer, EpisodeLimits, Turn, run_episode
from flashq.models.tiny import build_tokenizer

TOK = build_tokenizer()
EOT = TOK.convert_tokens_to_ids("<|im_end|>")


def scripted(replies, finish="stop", versions=None):
    """An engine that answers its k-th call with replies[k] (then end-of-turn), recording prompts."""
    prompts = []

    async def generate(prompt_ids, max_tokens, turn):
        prompts.append(list(prompt_ids))
        call = len(prompts) - 1
        ids = TOK(replies[call], add_special_tokens=False)["input_ids"][:max_tokens]
        cut = len(ids) == max_tokens and finish == "stop"
        if not cut:
            ids = ids + [EOT]
        v = versions[call] if versions else [call] * len(ids)
        return Turn(np.asarray(ids, np.int32), np.full(len(ids), -0.5, np.float32), np.asarray(v, np.int32),
                    "length" if cut else finish)

    return generate, prompts


def play(env, replies, limits=EpisodeLimits(max_turns=4, max_tokens_per_turn=8), seed=3, **kw):
    generate, prompts = scripted(replies, **kw)
    env = AsyncEnv(env)
    result = asyncio.run(run_episode(env, ChatRenderer(TOK, env.tools()), generate, {}, seed, limits))
    return result, prompts


def test_sequence_is_the_chat_template_of_the_conversation_and_only_sampled_tokens_are_trained():
    env = GuessNumberEnv(high=8, max_turns=4)
    secret = __import__("random").Random(3).randint(1, 8)
    guesses = [str(g) for g in range(1, 9) if g != secret][:2] + [str(secret)]
    result, prompts = play(env, guesses)
    assert result.finish_reason == "stop" and result.reward == 1.0 and result.turns == 3
    full = np.concatenate([result.prompt_ids, result.token_ids]).tolist()
    text = TOK.apply_chat_template(result.messages, tokenize=False)
    assert full == TOK(text.rstrip("\n"), add_special_tokens=False)["input_ids"]  # what a fresh render gives
    # each turn's prompt was exactly the sequence so far: the engine saw what the trainer scores
    for k, p in enumerate(prompts[1:], 1):
        assert full[: len(p)] == p and TOK.decode(p).endswith("<|assistant|>")
    sampled = TOK.decode(result.token_ids[result.loss_mask == 1].tolist())
    assert sampled == "".join(g + "<|im_end|>" for g in guesses)
    assert np.all(result.logprobs[result.loss_mask == 0] == 0) and np.all(result.logprobs[result.loss_mask == 1] == -0.5)


def test_truncation_by_turn_limit_and_by_a_cut_off_turn_carries_to_the_episode():
    secret = __import__("random").Random(3).randint(1, 8)
    wrong = str(secret % 8 + 1)
    result, _ = play(GuessNumberEnv(high=8, max_turns=2), [wrong, wrong])
    assert result.finish_reason == "length" and result.reward == 0.0 and result.turns == 2
    # a turn cut off at max_tokens_per_turn: closed by the template's end-of-turn token, not trained
    result, _ = play(GuessNumberEnv(high=8, max_turns=3), ["1234567890", str(secret), str(secret)],
                     limits=EpisodeLimits(max_turns=3, max_tokens_per_turn=4))
    first_turn_end = 4
    assert result.token_ids[first_turn_end] == EOT and result.loss_mask[first_turn_end] == 0
    assert result.finish_reason == "length" and result.reward == 1.0


def test_versions_follow_the_weights_and_a_turn_spanning_an_update_can_be_regenerated():
    secret = __import__("random").Random(3).randint(1, 8)
    result, prompts = play(GuessNumberEnv(), [str(secret)], versions=[[4, 5]])
    assert result.versions[result.loss_mask == 1].tolist() == [4, 5] and len(prompts) == 1
    result, prompts = play(GuessNumberEnv(), [str(secret), str(secret)], versions=[[4, 5], [5, 5]],
                           limits=EpisodeLimits(regenerate_on_update=True))
    assert len(prompts) == 2 and prompts[0] == prompts[1]  # the same turn, sampled again
    assert result.versions[result.loss_mask == 1].tolist() == [5, 5] and result.turns == 1


class Exploding:
    def reset(self, task, seed):
        return [{"role": "user", "content": "go"}]

    def step(self, assistant):
        raise ZeroDivisionError("the tool fell over")


class Slow:
    def reset(self, task, seed):
        return [{"role": "user", "content": "go"}]

    async def step(self, assistant):
        await asyncio.sleep(5)


class Liar:
    def reset(self, task, seed):
        return [{"role": "user", "content": "go"}]

    def step(self, assistant):
        return StepResult([{"role": "assistant", "content": "I speak for the model"}])


@pytest.mark.parametrize("env, message", [
    (Exploding(), "ZeroDivisionError: the tool fell over"),
    (Slow(), "exceeded its timeout of 0.2s"),
    (Liar(), "role system|user|tool"),
])
def test_a_failing_environment_ends_its_episode_with_a_reason(env, message):
    result, _ = play(env, ["1", "2"], limits=EpisodeLimits(max_turns=2, step_timeout_s=0.2))
    assert result.finish_reason == "error" and message in result.error


def test_an_opening_longer_than_the_model_fails_the_episode():
    class Verbose(Exploding):
        def reset(self, task, seed):
            return [{"role": "user", "content": "x" * 600}]

    result, prompts = play(Verbose(), ["1"], limits=EpisodeLimits(max_model_len=512))
    assert result.finish_reason == "error" and "rollout.max_model_len is 512" in result.error and prompts == []


def test_a_blocking_environment_does_not_block_the_other_episodes():
    inside, most = [0], [0]

    class Blocking(Exploding):
        def step(self, assistant):
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            __import__("time").sleep(0.3)
            inside[0] -= 1
            return StepResult([], reward=1.0, terminated=True)

    async def many():
        generate, _ = scripted(["x"] * 4)
        return await asyncio.gather(*[
            run_episode(AsyncEnv(Blocking()), ChatRenderer(TOK), generate, {}, i, EpisodeLimits()) for i in range(4)])

    results = asyncio.run(many())
    assert all(r.reward == 1.0 for r in results)
    assert most[0] == 4  # all four blocking steps were in progress at once, each in its own thread


def test_special_tokens_sampled_mid_turn_do_not_break_the_splice():
    secret = __import__("random").Random(3).randint(1, 8)
    wrong = str(secret % 8 + 1)
    result, prompts = play(GuessNumberEnv(high=8, max_turns=4), [wrong + "<|im_start|>", str(secret)])
    assert result.finish_reason == "stop" and result.reward == 1.0 and result.turns == 2
    full = np.concatenate([result.prompt_ids, result.token_ids]).tolist()
    assert full[: len(prompts[1])] == prompts[1]  # the second turn saw the first turn's ids as sampled
    assert TOK.convert_tokens_to_ids("<|im_start|>") in result.token_ids[result.loss_mask == 1].tolist()
