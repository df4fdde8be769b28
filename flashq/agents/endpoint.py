"""The OpenAI-compatible endpoint a rollout worker serves its agents on (loopback only).

Each episode gets a base URL with its own unguessable key in the path,
`http://127.0.0.1:PORT/e/KEY/v1`: `POST .../chat/completions` and `GET .../models`. A key
opens with its episode and closes when the episode ends, so a call for another episode, or after
its episode ended, is refused. Errors have the OpenAI API's shape
(`{"error": {"message", "type", "param", "code"}}`) and status, so the `openai` client raises its
usual exceptions with flashq's message.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any, Awaitable, Callable, Protocol

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


StreamWriter = Callable[[dict[str, Any]], Awaitable[None]]


class AgentEndpoint:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self.sessions: dict[str, Session] = {}
        self.runner = None
        self.port = 0
        self.requests = 0
        self.refused = 0

    async def start(self, host: str = "127.0.0.1") -> None:
        from aiohttp import web

        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/e/{key}/v1/chat/completions", self._chat)
        app.router.add_get("/e/{key}/v1/models", self._models)
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
        self.sessions.pop(key, None)

    def _session(self, request) -> Session:
        session = self.sessions.get(request.match_info["key"])
        if session is None:
            raise ApiError(401, "unknown or ended episode: this base URL belongs to an episode that is over, or never existed",
                           code="invalid_api_key")
        return session

    async def _models(self, request):
        from aiohttp import web

        try:
            self._session(request)
        except ApiError as e:
            return web.json_response(e.body(), status=e.status)
        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "flashq"}]})

    async def _chat(self, request):
        from aiohttp import web

        self.requests += 1
        try:
            session = self._session(request)
            try:
                body = json.loads(await request.read())
            except ValueError as e:
                raise ApiError(400, f"the request body is not JSON: {e}") from None
            if not isinstance(body, dict):
                raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}")
            reply = await session.complete(body)
        except ApiError as e:
            self.refused += 1
            return web.json_response(e.body(), status=e.status)
        except Exception as e:  # noqa: BLE001 - a bug or a dead engine: the agent gets a 500 it can read, the worker lives
            log.exception("agent endpoint: chat completion failed")
            return web.json_response(ApiError(500, f"{type(e).__name__}: {e}").body(), status=500)
        if not body.get("stream"):
            return web.json_response(reply)
        return await self._stream(request, reply, body)

    async def _stream(self, request, reply: dict[str, Any], body: dict[str, Any]):
        """Server-sent events as the API sends them: a role chunk, each choice's content and tool
        calls as one delta (the engine returns whole completions), the finish reasons, [DONE]."""
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        base = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

        async def send(choices, usage=None):
            chunk = {**base, "choices": choices}
            if usage is not None:
                chunk["usage"] = usage
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        for c in reply["choices"]:
            await send([{"index": c["index"], "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
            delta: dict[str, Any] = {}
            if c["message"].get("content"):
                delta["content"] = c["message"]["content"]
            if c["message"].get("tool_calls"):
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(c["message"]["tool_calls"])]
            if delta:
                await send([{"index": c["index"], "delta": delta, "finish_reason": None}])
            await send([{"index": c["index"], "delta": {}, "finish_reason": c["finish_reason"]}])
        if (body.get("stream_options") or {}).get("include_usage"):
            await send([], reply["usage"])
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
