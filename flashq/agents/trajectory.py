"""One agent episode's tokens, assembled call by call without re-tokenising what was sampled.

An OpenAI-client agent sends its whole conversation with every call. When the conversation is the
one this trajectory holds (every earlier message as it was, the last assistant message as the
endpoint returned it) plus new messages, only the new messages are rendered by the chat template
and appended (loss mask 0), and the next completion is sampled from the trajectory's own tokens:
the engine sees exactly what the trainer will score. When the agent rewrote its history (summarised
its context, edited a message), the call cannot extend the trajectory: it starts a new segment
(rendered from scratch) or fails the episode, as `env.on_rewrite` says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flashq.episode import ChatRenderer


class HistoryRewritten(Exception):
    """The agent's messages do not extend the conversation this episode has sampled so far."""


@dataclass
class Segment:
    """A prompt and what followed it: sampled tokens (mask 1) and rendered messages (mask 0)."""

    prompt_ids: np.ndarray
    ids: list[np.ndarray] = field(default_factory=list)
    logprobs: list[np.ndarray] = field(default_factory=list)
    versions: list[np.ndarray] = field(default_factory=list)
    mask: list[np.ndarray] = field(default_factory=list)
    turns: int = 0

    def append(self, tokens, logprobs, versions, trained: bool) -> None:
        self.ids.append(np.asarray(tokens, np.int32))
        self.logprobs.append(np.asarray(logprobs, np.float32))
        self.versions.append(np.asarray(versions, np.int32))
        self.mask.append(np.full(len(tokens), 1 if trained else 0, np.uint8))

    def context(self) -> list[int]:
        return np.concatenate([self.prompt_ids, *self.ids]).tolist()

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """token_ids, logprobs, versions, loss_mask after the prompt."""
        def cat(parts, dtype):
            return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

        return cat(self.ids, np.int32), cat(self.logprobs, np.float32), cat(self.versions, np.int32), cat(self.mask, np.uint8)


def same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal as a chat template sees them: role, content (None and "" alike), tool calls (id,
    name, arguments as JSON values), tool_call_id and name. Extra fields the client library adds
    (refusal, audio, annotations set to None) do not count."""
    def norm(m):
        calls = [(c.get("id"), c.get("function", {}).get("name"), _json_value(c.get("function", {}).get("arguments")))
                 for c in m.get("tool_calls") or []]
        return m.get("role"), m.get("content") or "", calls, m.get("tool_call_id"), m.get("name")

    return norm(a) == norm(b)


def _json_value(arguments):
    if isinstance(arguments, str):
        try:
            return json.dumps(json.loads(arguments), sort_keys=True)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True)


class Trajectory:
    """The segments of one episode and the conversation the last of them holds.

    A call's completions (n of them) stay pending until the next call shows which one the agent
    kept (its messages continue from it); the episode's end keeps the first."""

    def __init__(self, renderer: ChatRenderer, max_model_len: int):
        self.renderer = renderer
        self.max_model_len = max_model_len
        self.segments: list[Segment] = []
        self.history: list[dict] = []  # the messages of the last call: the current segment's tokens render them
        self.pending: list[tuple[dict, Any]] = []  # (reply message, sample) of the last call's completions
        self.last_reply: dict | None = None  # the newest completion kept
        self.cut = False  # a kept completion ran out of tokens: the trajectory is truncated

    def begin_call(self, messages: list[dict], rewrite: str, tools: list[dict] | None) -> list[int]:
        """The token context to sample the next completion from, after taking in `messages`.
        `rewrite`: "split" starts a new segment when the history was rewritten, "fail" raises
        `HistoryRewritten` naming the first message that differs."""
        self.renderer.tools = tools or None
        kept = self._kept(messages)
        if kept is not None:
            reply, sample = self.pending[kept]
            self._commit(reply, sample)
            history = [*self.history, {**reply, "content": reply.get("content") or ""}]  # templates want a string
            new = messages[len(history):]
            tail = self.renderer.continuation(history, sample.token_ids, new)
            last = int(sample.versions[-1]) if len(sample.versions) else 0
            self.segments[-1].append(tail, np.zeros(len(tail)), np.full(len(tail), last), trained=False)
        else:
            if self.pending and rewrite == "fail":
                raise HistoryRewritten(self._difference(messages))
            self.finish()
            self.segments.append(Segment(np.asarray(self.renderer.prompt(messages), np.int32)))
        self.pending = []
        self.history = list(messages)
        context = self.segments[-1].context()
        if len(context) >= self.max_model_len:
            raise ValueError(f"the conversation is {len(context)} tokens; rollout.max_model_len is {self.max_model_len}")
        return context

    def end_call(self, messages: list[dict], completions: list[tuple[dict, Any]]) -> None:
        """The completions returned for `messages` (sampled from `begin_call`'s context), each as
        (the reply message the agent got, the engine's sample)."""
        self.pending = list(completions)

    def finish(self) -> None:
        """The episode (or segment) ended: its last call's first completion is kept."""
        if self.pending:
            self._commit(*self.pending[0])
            self.pending = []

    def _commit(self, reply: dict, sample) -> None:
        self.last_reply = reply
        self.cut = self.cut or sample.finish_reason == "length"
        segment = self.segments[-1]
        segment.append(sample.token_ids, sample.logprobs, sample.versions, trained=True)
        segment.turns += 1

    def _kept(self, messages: list[dict]) -> int | None:
        """Which pending completion `messages` continue from, if they extend the conversation."""
        n = len(self.history)
        if not self.pending or len(messages) <= n + 1 or not all(same_message(a, b) for a, b in zip(messages[:n], self.history)):
            return None
        return next((k for k, (reply, _) in enumerate(self.pending) if same_message(messages[n], reply)), None)

    def _difference(self, messages: list[dict]) -> str:
        expected = [*self.history, self.pending[0][0]] if self.pending else self.history
        for i, (a, b) in enumerate(zip(messages, expected)):
            if not same_message(a, b):
                return (f"message {i} ({a.get('role')}) differs from the conversation sampled so far: "
                        f"{str(a.get('content'))[:80]!r} vs {str(b.get('content'))[:80]!r}")
        return (f"the call sends {len(messages)} messages; the conversation so far has {len(expected)}, "
                "so nothing new follows the last reply")

    @property
    def turns(self) -> int:
        return sum(s.turns for s in self.segments)

    def trained_segments(self) -> list[Segment]:
        """The segments that hold sampled tokens (a call the engine failed, or one refused past
        env.max_turns, can leave a segment with a prompt alone); the first if none does."""
        return [s for s in self.segments if s.ids] or self.segments[:1]

    def sample_arrays(self) -> dict[str, np.ndarray]:
        """`Sample` fields of the trained segments: each array concatenated over the segments,
        with segment_ends and prompt_ends (cumulative) when there are several."""
        segments = self.trained_segments()
        parts = [s.arrays() for s in segments]
        out = {name: np.concatenate([p[k] for p in parts]) for k, name in enumerate(("token_ids", "logprobs", "versions", "loss_mask"))}
        out["prompt_ids"] = np.concatenate([s.prompt_ids for s in segments])
        if len(segments) > 1:
            out["segment_ends"] = np.cumsum([len(p[0]) for p in parts]).astype(np.int32)
            out["prompt_ends"] = np.cumsum([len(s.prompt_ids) for s in segments]).astype(np.int32)
        return out
