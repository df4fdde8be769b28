"""The OpenAI-compatible endpoint a rollout worker serves its agents on (loopback only).

Each episode gets a base URL with its own unguessable key in the path,
`http://127.0.0.1:PORT/e/KEY/v1`: `POST .../chat/completions` and `GET .../models`. A key
opens with its episode and closes when the episode ends, so a call for another episode, or after
its episode ended, is refused. Errors have the OpenAI API's shape
(`{"error": {"message", "type", "param", "code"}}`) and status, so the `openai` client raises its
usual exceptions with flashq's message.

The URL answers over TCP for any client an agent builds itself. The client flashq hands the agent
reaches the same handler in process (`transport`, an httpx transport): same requests, same
replies, no socket. Over TCP each episode's connection, aiohttp's parsing and the loop's socket
work took about a quarter of the rollout worker's CPU (py-spy, bench/openai_agent.py's agent),
on the core its engine runs on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
from concurrent.futures import CancelledError
from typing import Any, Protocol

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An OpenAI-style error reply: HTTP status, message, and the parameter at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = {401: "authentication_error", 404: "invalid_request_error", 408: "timeout"}.get(self.status, "invalid_request_error")
        if self.status >= 500:
            kind = "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class Session(Protocol):
    """What the endpoint calls for one episode (`flashq.agents.session.EpisodeSession`)."""

    async def complete(self, body: dict[str, Any]) -> dict[str, Any]: ...


Reply = tuple[int, dict[str, str], bytes]  # HTTP status, headers, body
ROUTE = re.compile(r"^/e/([^/]+)/v1/(chat/completions|models)$")
JSON = {"Content-Type": "application/json"}


class AgentEndpoint:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self.sessions: dict[str, Session] = {}
        self.runner = None
        self.port = 0
        self.requests = 0
        self.refused = 0
        self.in_flight: dict[str, set[asyncio.Task]] = {}  # key -> its calls being answered

    async def start(self, host: str = "127.0.0.1") -> None:
        from aiohttp import web

        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{path:.*}", self._http)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, 0, backlog=4096)  # hundreds of episodes may connect at once
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    def open(self, session: Session) -> tuple[str, str]:
        """A fresh key for `session`: (base_url, key)."""
        key = secrets.token_urlsafe(24)
        self.sessions[key] = session
        return f"http://127.0.0.1:{self.port}/e/{key}/v1", key

    def close(self, key: str) -> None:
        """End the episode's key; its calls still in flight are cancelled (their agent gets an
        error), so no engine keeps generating for an episode that is over."""
        self.sessions.pop(key, None)
        for call in self.in_flight.pop(key, set()):
            call.cancel()

    def transport(self, loop: asyncio.AbstractEventLoop | None = None):
        """An httpx transport to this endpoint without a socket: async (for `openai.AsyncOpenAI`),
        or, given the endpoint's loop, sync (for `openai.OpenAI` in an agent's thread)."""
        import httpx

        endpoint = self

        class InProcess(httpx.AsyncBaseTransport):
            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                body = await request.aread()
                try:  # the client's read timeout, as a socket would enforce it
                    reply = await asyncio.wait_for(endpoint.answer(request.method, request.url.path, body), _read_timeout(request))
                except TimeoutError:
                    raise httpx.ReadTimeout("no reply within the client's timeout", request=request) from None
                return httpx.Response(reply[0], headers=reply[1], content=reply[2], request=request)

        class FromThread(httpx.BaseTransport):
            def handle_request(self, request: httpx.Request) -> httpx.Response:
                call = asyncio.run_coroutine_threadsafe(endpoint.answer(request.method, request.url.path, request.read()), loop)
                try:
                    reply = call.result(_read_timeout(request))
                except TimeoutError:
                    call.cancel()
                    raise httpx.ReadTimeout("no reply within the client's timeout", request=request) from None
                except CancelledError:
                    raise httpx.ReadError("the episode ended while this call was in flight", request=request) from None
                return httpx.Response(reply[0], headers=reply[1], content=reply[2], request=request)

        return InProcess() if loop is None else FromThread()

    async def answer(self, method: str, path: str, body: bytes) -> Reply:
        """`handle`, as a task the episode's key holds while it runs: `close` cancels it."""
        route = ROUTE.match(path)
        task = asyncio.ensure_future(self.handle(method, path, body))
        calls = self.in_flight.setdefault(route.group(1), set()) if route and route.group(1) in self.sessions else None
        if calls is not None:
            calls.add(task)
            task.add_done_callback(calls.discard)
        return await task

    async def handle(self, method: str, path: str, body: bytes) -> Reply:
        """One request, from aiohttp or an in-process transport: the reply as bytes."""
        route = ROUTE.match(path)
        if route is None:
            return _error(ApiError(404, f"no such endpoint: {method} {path} (flashq serves chat/completions and models)"))
        key, what = route.groups()
        if (method, what) not in (("POST", "chat/completions"), ("GET", "models")):
            return _error(ApiError(405, f"{what} does not take {method}"))
        session = self.sessions.get(key)
        if session is None:
            self.refused += 1
            return _error(ApiError(401, "unknown or ended episode: this base URL belongs to an episode that is over, or never existed",
                                   code="invalid_api_key"))
        if what == "models":
            return _json({"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "flashq"}]})
        self.requests += 1
        try:
            try:
                request = json.loads(body)
            except ValueError as e:
                raise ApiError(400, f"the request body is not JSON: {e}") from None
            if not isinstance(request, dict):
                raise ApiError(400, f"the request body must be a JSON object, got {type(request).__name__}")
            reply = await session.complete(request)
            if not request.get("stream"):
                return _json(reply)
            return 200, {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}, _events(reply, request)
        except ApiError as e:
            self.refused += 1
            return _error(e)
        except Exception as e:  # noqa: BLE001 - a bug or a dead engine: the agent gets a 500 it can read, the worker lives
            log.exception("agent endpoint: chat completion failed")
            return _error(ApiError(500, f"{type(e).__name__}: {e}"))

    async def _http(self, request):
        from aiohttp import web

        status, headers, content = await self.answer(request.method, request.path, await request.read())
        return web.Response(status=status, headers=headers, body=content)


def _read_timeout(request) -> float | None:
    return (request.extensions.get("timeout") or {}).get("read")


def _json(payload: dict[str, Any], status: int = 200) -> Reply:
    return status, JSON, json.dumps(payload).encode()


def _error(e: ApiError) -> Reply:
    return _json(e.body(), e.status)


def _events(reply: dict[str, Any], request: dict[str, Any]) -> bytes:
    """Server-sent events as the API sends them: a role chunk, each choice's content and tool
    calls as one delta (the engine returns whole completions), the finish reasons, [DONE]."""
    base = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    chunks = []

    def send(choices, usage=None):
        chunk = {**base, "choices": choices}
        if usage is not None:
            chunk["usage"] = usage
        chunks.append(f"data: {json.dumps(chunk)}\n\n")

    for c in reply["choices"]:
        send([{"index": c["index"], "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        delta: dict[str, Any] = {}
        if c["message"].get("content"):
            delta["content"] = c["message"]["content"]
        if c["message"].get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(c["message"]["tool_calls"])]
        if delta:
            send([{"index": c["index"], "delta": delta, "finish_reason": None}])
        send([{"index": c["index"], "delta": {}, "finish_reason": c["finish_reason"]}])
    if (request.get("stream_options") or {}).get("include_usage"):
        send([], reply["usage"])
    chunks.append("data: [DONE]\n\n")
    return "".join(chunks).encode()
