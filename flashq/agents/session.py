"""One agent episode's side of the endpoint: OpenAI chat-completion requests in, the worker's
engine sampling from the episode's own tokens, OpenAI responses out.

What flashq honours: `messages`, `model` (the served name), `n`, `max_tokens` /
`max_completion_tokens` (capped by `sampling.max_tokens` and the context left), `temperature`
(the behaviour policy's logprobs are taken at it, so importance weighting corrects for it),
`top_p` 1, `stop`, `seed`, `tools` with `tool_choice` "auto" or "none" (calls parsed by vLLM's
tool parser `env.tool_parser`), `stream` (with `stream_options.include_usage`), `user` and
`metadata` (ignored). Anything else that would change what is sampled is refused with a 400
naming the parameter, not silently dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any, Awaitable, Callable

import numpy as np

from flashq.agents.endpoint import ApiError
from flashq.agents.trajectory import HistoryRewritten, Trajectory
from flashq.wire.protocol import GenerateRequest, Sample

IGNORED = {"user", "metadata", "store", "stream", "stream_options", "parallel_tool_calls", "service_tier"}
HONOURED = {"messages", "model", "n", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed",
            "tools", "tool_choice"} | IGNORED
NEUTRAL = {"frequency_penalty": 0, "presence_penalty": 0, "logprobs": False, "logit_bias": None, "top_logprobs": None,
           "response_format": None, "reasoning_effort": None, "prediction": None, "audio": None, "modalities": None,
           "web_search_options": None, "functions": None, "function_call": None}
ROLES = {"system", "developer", "user", "assistant", "tool"}

Generate = Callable[[GenerateRequest], Awaitable[Sample]]


class EpisodeSession:
    def __init__(self, request_id: str, group_id: str, model_name: str, renderer, trajectory: Trajectory, generate: Generate,
                 max_tokens: int, tool_parser, rewrite: str, stop_ids: set[int], max_turns: int):
        self.request_id, self.group_id, self.model_name = request_id, group_id, model_name
        self.renderer, self.trajectory, self.generate = renderer, trajectory, generate
        self.max_tokens, self.tool_parser, self.rewrite, self.stop_ids = max_tokens, tool_parser, rewrite, stop_ids
        self.calls = itertools.count()
        self.max_turns = max_turns
        self.failure: str = ""  # why the episode cannot be trained (set by a call the agent may not surface)
        self.truncated = False  # a call past env.max_turns was refused
        self.lock = asyncio.Lock()  # one call at a time: each extends the conversation the last one left

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        params = self._check(body)
        async with self.lock:
            try:
                context = self.trajectory.begin_call(params["messages"], self.rewrite, params["tools"])
            except HistoryRewritten as e:
                self.failure = f"the agent rewrote its history (env.on_rewrite fail): {e}"
                raise ApiError(400, self.failure, param="messages", code="history_rewritten") from None
            except ValueError as e:
                raise ApiError(400, str(e), param="messages", code="context_length_exceeded") from None
            budget = min(params["max_tokens"], self.trajectory.max_model_len - len(context))
            call = next(self.calls)
            if call >= self.max_turns:
                self.truncated = True
                raise ApiError(400, f"this episode has had its env.max_turns ({self.max_turns}) completions", code="max_turns_reached")
            samples = await asyncio.gather(*(self.generate(GenerateRequest(
                request_id=f"{self.request_id}@{call}.{i}", group_id=self.group_id, prompt_ids=np.asarray(context, np.int32),
                max_tokens=budget, temperature=params["temperature"], top_p=1.0, seed=params["seed"], stop=params["stop"],
            )) for i in range(params["n"])))
            bad = next((s for s in samples if s.finish_reason in ("error", "abort")), None)
            if bad is not None:
                raise ApiError(500, f"the engine failed this completion: {bad.error or bad.finish_reason}", code="engine_error")
            choices = [self._choice(i, s, params["tools"]) for i, s in enumerate(samples)]
            self.trajectory.end_call(params["messages"], [(c["message"], s) for c, s in zip(choices, samples)])
        prompt_tokens = len(context)
        completion = sum(len(s.token_ids) for s in samples)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "system_fingerprint": None,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}}

    def _choice(self, index: int, sample: Sample, tools: list[dict] | None) -> dict[str, Any]:
        ids = sample.token_ids.tolist()
        while ids and ids[-1] in self.stop_ids:  # the end-of-turn token is not part of the message
            ids.pop()
        text = self.renderer.tok.decode(ids, skip_special_tokens=not tools)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish = "length" if sample.finish_reason == "length" else "stop"
        if tools and self.tool_parser is not None:
            parsed = self.tool_parser.extract_tool_calls(text, None)
            if parsed.tools_called:
                message["content"] = parsed.content
                message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                                          "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                         for c in parsed.tool_calls]
                finish = "tool_calls" if finish == "stop" else finish
        return {"index": index, "message": message, "finish_reason": finish, "logprobs": None}

    def _check(self, body: dict[str, Any]) -> dict[str, Any]:
        for key, value in body.items():
            if key in HONOURED:
                continue
            if key in NEUTRAL:
                if value not in (NEUTRAL[key], None):
                    raise ApiError(400, f"{key}={value!r} is not supported by flashq's endpoint (it would change what is sampled "
                                        "from the policy being trained)", param=key, code="unsupported_parameter")
                continue
            raise ApiError(400, f"unknown parameter {key!r}", param=key, code="unknown_parameter")
        model = body.get("model")
        if model != self.model_name:
            raise ApiError(404, f"the model {model!r} does not exist: this endpoint serves {self.model_name!r}, the policy being "
                                "trained", param="model", code="model_not_found")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list of chat messages", param="messages")
        messages = [self._message(i, m) for i, m in enumerate(messages)]
        n = body.get("n", 1)
        n = 1 if n is None else n
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 16:
            raise ApiError(400, f"n must be an integer in [1, 16], got {n!r}", param="n")
        cap = body.get("max_completion_tokens", body.get("max_tokens"))
        if cap is not None and (not isinstance(cap, int) or cap < 1):
            raise ApiError(400, f"max_tokens must be a positive integer, got {cap!r}", param="max_tokens")
        temperature = body.get("temperature", 1.0)
        if temperature is None:
            temperature = 1.0
        if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
            raise ApiError(400, f"temperature must be a number in [0, 2], got {temperature!r}", param="temperature")
        top_p = body.get("top_p", 1.0)
        if top_p not in (None, 1, 1.0):
            raise ApiError(400, f"top_p={top_p!r}: flashq samples from the whole distribution (the trainer's logprobs have no "
                                "top-p truncation); send top_p 1 or leave it out", param="top_p", code="unsupported_parameter")
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
            raise ApiError(400, "stop must be a string or a list of up to 4 non-empty strings", param="stop")
        seed = body.get("seed")
        if seed is not None and not isinstance(seed, int):
            raise ApiError(400, f"seed must be an integer, got {seed!r}", param="seed")
        tools = body.get("tools") or None
        if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function" for t in tools)):
            raise ApiError(400, "tools must be a list of {\"type\": \"function\", \"function\": {...}} objects", param="tools")
        choice = body.get("tool_choice")
        if choice not in (None, "auto", "none"):
            raise ApiError(400, f"tool_choice={choice!r} is not supported: flashq samples freely (\"auto\") or without tools "
                                "(\"none\")", param="tool_choice", code="unsupported_parameter")
        if choice == "none":
            tools = None
        return {"messages": messages, "n": n, "max_tokens": min(cap or self.max_tokens, self.max_tokens),
                "temperature": float(temperature), "stop": stop, "seed": seed, "tools": tools}

    @staticmethod
    def _message(i: int, m: Any) -> dict[str, Any]:
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ApiError(400, f"messages[{i}] must be an object with role one of {sorted(ROLES)}", param=f"messages[{i}]")
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                raise ApiError(400, f"messages[{i}].content: only text parts are supported", param=f"messages[{i}].content")
            content = "".join(p["text"] for p in content)
        if content is not None and not isinstance(content, str):
            raise ApiError(400, f"messages[{i}].content must be a string, a list of text parts or null", param=f"messages[{i}].content")
        out = {k: v for k, v in m.items() if v is not None}
        out["content"] = content if content is not None else ""
        if out["role"] == "developer":
            out["role"] = "system"
        return out
