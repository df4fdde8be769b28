"""One multi-turn episode, token-exact: the path of an agentic sample inside a rollout worker.

The episode is one growing token sequence: the rendered opening messages (the prompt), then for
each turn the sampled tokens (trained: loss mask 1, with their behaviour logprobs and policy
versions) followed by the environment's reply rendered by the chat template (loss mask 0).
Sampled tokens are never decoded and re-encoded into the sequence; only the environment's new
messages are rendered, by diffing the template's output with and without them, so what the
trainer scores is exactly what the engine saw (`ChatRenderer`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np

from flashq.envs.base import AsyncEnv, EnvError


@dataclass
class Turn:
    """What the engine returned for one assistant turn."""

    token_ids: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    finish_reason: str  # "stop" | "length" | "abort" | "error"


# generate(prompt_ids, max_tokens, turn) -> Turn
Generate = Callable[[list[int], int, int], Awaitable[Turn]]


@dataclass
class EpisodeLimits:
    max_turns: int = 8
    max_tokens_per_turn: int = 64
    max_model_len: int = 512
    step_timeout_s: float = 30.0
    regenerate_on_update: bool = False  # a turn sampled across a weight update is sampled again
    max_regenerations: int = 2


@dataclass
class EpisodeResult:
    prompt_ids: np.ndarray
    token_ids: np.ndarray  # everything after the prompt: sampled and environment tokens
    logprobs: np.ndarray
    versions: np.ndarray
    loss_mask: np.ndarray  # 1 on sampled tokens
    reward: float
    finish_reason: str  # "stop": terminated; "length": truncated anywhere (turns, tokens, a cut-off turn, env); "error"
    turns: int
    error: str = ""
    env_s: float = 0.0  # time spent inside the environment
    messages: list[dict] = field(default_factory=list)


class ChatRenderer:
    """Token ids for chat messages through the tokenizer's chat template, rendering only what is
    new. Fails loudly if the template rewrites earlier turns (then splicing would be wrong)."""

    def __init__(self, tokenizer, tools: list[dict] | None = None):
        self.tok, self.tools = tokenizer, tools or None

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        kwargs = {"tools": self.tools} if self.tools else {}
        return self.tok.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False, **kwargs)

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"] if text else []

    def prompt(self, messages: list[dict]) -> list[int]:
        return self.encode(self._render(messages, True))

    def assistant_content(self, token_ids: np.ndarray) -> str:
        return self.tok.decode(token_ids.tolist(), skip_special_tokens=True)

    def closing(self) -> str:
        """What the template writes after an assistant message's content (e.g. "<|im_end|>\n")."""
        if not hasattr(self, "_closing"):
            probe = [{"role": "user", "content": "u"}]
            opened = self._render(probe, True)
            closed = self._render(probe + [{"role": "assistant", "content": "\x00"}], False)
            if not closed.startswith(opened + "\x00"):
                raise EnvError("the chat template does not write an assistant message's content verbatim; cannot splice turns")
            self._closing = closed[len(opened) + 1 :]
        return self._closing

    def continuation(self, history: list[dict], sampled: np.ndarray, new: list[dict]) -> list[int]:
        """Tokens that follow a turn's sampled ids: what is left of the template's closing of an
        assistant turn (a newline after a sampled end-of-turn token, or the whole closing when
        the turn was cut off), then the new messages and the next generation prompt. `history`
        ends with the assistant message of this turn; `new` is not empty."""
        closing = self.closing()
        sampled_text = self.tok.decode(sampled[-8:].tolist(), skip_special_tokens=False)
        done = next((k for k in range(min(len(closing), len(sampled_text)), 0, -1) if sampled_text.endswith(closing[:k])), 0)
        closed = self._render(history, False)
        extended = self._render(history + new, True)
        if not extended.startswith(closed):
            raise EnvError("the chat template rewrites earlier turns when messages are added; cannot splice")
        return self.encode(closing[done:] + extended[len(closed):])


async def run_episode(env: AsyncEnv, renderer: ChatRenderer, generate: Generate, task: dict, seed: int,
                      limits: EpisodeLimits, version: Callable[[], int] = lambda: 0) -> EpisodeResult:
    """Play one episode to its end. An environment that raises, returns something invalid or
    exceeds its step timeout ends the episode with finish_reason "error" (its tokens are kept
    for accounting, not for training)."""
    env_s = 0.0
    ids: list[np.ndarray] = []
    logprobs: list[np.ndarray] = []
    versions: list[np.ndarray] = []
    mask: list[np.ndarray] = []
    reward, turns, finish, error, cut = 0.0, 0, "length", "", False
    prompt = np.zeros(0, np.int32)
    messages: list[dict] = []

    def append(tokens, lps, vers, trained: bool) -> None:
        ids.append(np.asarray(tokens, np.int32))
        logprobs.append(np.asarray(lps, np.float32))
        versions.append(np.asarray(vers, np.int32))
        mask.append(np.full(len(tokens), 1 if trained else 0, np.uint8))

    async def env_call(coro):
        nonlocal env_s
        t0 = time.monotonic()
        try:
            return await asyncio.wait_for(coro, limits.step_timeout_s)
        except TimeoutError:
            raise EnvError(f"environment step exceeded its timeout of {limits.step_timeout_s:g}s") from None
        finally:
            env_s += time.monotonic() - t0

    try:
        messages = list(await env_call(env.reset(task, seed)))
        prompt = np.asarray(renderer.prompt(messages), np.int32)
        if len(prompt) >= limits.max_model_len:
            raise EnvError(f"the opening messages render to {len(prompt)} tokens; rollout.max_model_len is {limits.max_model_len}")
        while turns < limits.max_turns:
            used = len(prompt) + sum(len(x) for x in ids)
            budget = min(limits.max_tokens_per_turn, limits.max_model_len - used)
            if budget < 1:
                break  # the sequence is full: truncated
            context = np.concatenate([prompt, *ids]).tolist()
            turn = await generate(context, budget, turns)
            for _ in range(limits.max_regenerations if limits.regenerate_on_update else 0):
                if len(set(turn.versions.tolist())) <= 1:
                    break
                turn = await generate(context, budget, turns)  # sampled across an update: again, on the new weights
            if turn.finish_reason in ("abort", "error"):
                finish, error = turn.finish_reason, f"engine ended turn {turns} with {turn.finish_reason}"
                break
            turns += 1
            cut = cut or turn.finish_reason == "length"
            append(turn.token_ids, turn.logprobs, turn.versions, trained=True)
            messages.append({"role": "assistant", "content": renderer.assistant_content(turn.token_ids)})
            result = await env_call(env.step(messages[-1]))
            reward += result.reward
            messages += result.messages
            if result.terminated or result.truncated:
                finish = "stop" if result.terminated else "length"
                break  # the sequence ends with the last sampled token
            tail = renderer.continuation(messages[: len(messages) - len(result.messages)], turn.token_ids, result.messages)
            last_version = int(turn.versions[-1]) if len(turn.versions) else version()
            append(tail, np.zeros(len(tail)), np.full(len(tail), last_version), trained=False)
    except EnvError as e:
        finish, error = "error", str(e)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - a user's environment may raise anything; the episode fails, the worker lives
        finish, error = "error", f"episode failed: {type(e).__name__}: {e}"
    finally:
        try:
            await asyncio.wait_for(env.close(), limits.step_timeout_s)
        except Exception:  # noqa: BLE001 - a failing close must not hide the episode's own result
            pass

    if finish == "stop" and cut:
        finish = "length"  # a turn was cut off at max_tokens_per_turn: the trajectory is truncated

    def cat(parts, dtype):
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

    return EpisodeResult(
        prompt_ids=prompt, token_ids=cat(ids, np.int32), logprobs=cat(logprobs, np.float32),
        versions=cat(versions, np.int32), loss_mask=cat(mask, np.uint8), reward=reward, finish_reason=finish,
        turns=turns, error=error, env_s=env_s, messages=messages,
    )
