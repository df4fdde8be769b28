"""What every role process shares: logging, model resolution, the hello/start handshake,
heartbeats, and a clean exit that tells the coordinator why a role went down."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Awaitable, Callable, NoReturn

from flashq.checkpoint import EXIT_DISK_FULL, is_disk_full
from flashq.config import FlashqConfig
from flashq.credentials import TOKEN_ENV, own_token
from flashq.wire.protocol import Fatal, Heartbeat, Hello, Start
from flashq.wire.transport import Link, PeerLost

log = logging.getLogger("flashq")


def setup_logging(level: str = "INFO", vllm_level: str = "WARNING") -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stdout,
        force=True,
    )
    logging.getLogger("vllm").setLevel(getattr(logging, vllm_level))
    logging.getLogger("httpx").setLevel(logging.WARNING)  # its INFO is a line per request: every agent call


def role_index(role: str) -> int:
    _, _, idx = role.partition("-")
    return int(idx) if idx.isdigit() else 0


def resolve_model(cfg: FlashqConfig) -> Path:
    """The local folder every role loads, resolved without the network: the process that
    started the run fetched or converted it already (`flashq/models/sources.py`)."""
    from flashq.models.sources import model_path

    return model_path(cfg.model)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def connect(cfg: FlashqConfig, address: str, role: str) -> Link:
    t = cfg.transport
    return Link(address, role, hwm=t.hwm, max_message_bytes=cfg.message_limit_bytes, curve_keys=t.curve_keys,
                token=own_token() if t.authenticate else "")


async def handshake(link: Link, cfg: FlashqConfig, hello: Hello) -> Start:
    await link.handshake(cfg.transport.startup_timeout_s)
    await link.send(hello)
    while True:
        msg = await link.recv_within(cfg.transport.startup_timeout_s, "start message (the coordinator hears a role only "
                                     f"with its credential: was it given one? {TOKEN_ENV}, `flashq token ROLE --run-dir DIR`)")
        if isinstance(msg, Start):
            return msg
        if not isinstance(msg, Heartbeat):
            raise RuntimeError(f"expected the start message, got {type(msg).__name__}")


def hello(role: str, token: str | None = None, **kw) -> Hello:
    """`token`: the role's credential; by default the one this process was given (FLASHQ_ROLE_TOKEN)."""
    return Hello(role=role.split("-")[0], index=role_index(role), pid=os.getpid(), host=socket.gethostname(),
                 token=own_token() if token is None else token, **kw)


async def heartbeat(link: Link, cfg: FlashqConfig) -> None:
    """Send a heartbeat every period; fail if the coordinator has been silent too long."""
    t = cfg.transport
    while True:
        await asyncio.sleep(t.heartbeat_s)
        await link.send(Heartbeat(sent_at=time.time()))
        if link.silent_for() > t.liveness_timeout_s:
            raise PeerLost(f"{link.identity}: coordinator silent for {link.silent_for():.0f}s")


async def serve_until_done(serve: Callable[[asyncio.TaskGroup], Awaitable[None]], *background: Awaitable[None]) -> None:
    """Run `serve` (which may spawn tasks into the group) beside background loops; when `serve`
    returns, stop the background; when anything fails, stop everything and raise."""
    async with asyncio.TaskGroup() as tg:
        loops = [tg.create_task(b) for b in background]
        await serve(tg)
        for task in loops:
            task.cancel()


def exit_without_teardown(code: int) -> NoReturn:
    """End this process now, with `code`, once its work is done and its files are closed. A
    role or engine process holding torch and vLLM spends 2-3 s of CPU at a normal exit
    collecting its heap and tearing down modules, and the run's end waits on it. atexit
    handlers (library cleanups, weakref finalizers) still run, and output is flushed; only the
    interpreter's teardown is skipped."""
    import atexit

    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(code)


def first_error(e: BaseException) -> BaseException:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


def run_role(role: str, main: Callable[[], Awaitable[None]], link_getter: Callable[[], Link | None]) -> int:
    """Run a role's coroutine on uvloop; on failure tell the coordinator why, then exit 1."""
    import uvloop

    async def guarded() -> int:
        try:
            await main()
            return 0
        except (KeyboardInterrupt, asyncio.CancelledError):
            return 130
        except BaseException as e:  # noqa: BLE001 - the role is going down; report whatever it was
            cause = first_error(e)
            if isinstance(cause, (KeyboardInterrupt, asyncio.CancelledError)):
                return 130
            reason = f"{type(cause).__name__}: {cause}"
            log.error("%s failed: %s\n%s", role, reason, traceback.format_exc())
            link = link_getter()
            if link is not None:
                try:
                    await asyncio.wait_for(link.send(Fatal(role=role, reason=reason[:2000])), 2)
                    await asyncio.sleep(0.2)
                except Exception:  # noqa: BLE001 - best effort: the launcher still sees the exit code
                    pass
            return EXIT_DISK_FULL if is_disk_full(cause) else 1

    return uvloop.run(guarded())
