"""Run a reward function with a hard timeout on its own run time, whatever it does.

Async functions run on the event loop under `asyncio.wait_for`. Sync functions run in
"process" workers or in "thread"s ("auto": threads for functions marked `quick`, else processes):
- a process is the only thing that can stop a stuck pure-Python or C call (by killing it), and
  math-verify's own timeouts use signals, which work only in a process's main thread. Each
  process serves one call at a time over its own pipe, so a call's clock starts when its process
  receives it (time queued behind others never counts), and a timeout kills that one process
  and starts a replacement: calls running beside it are untouched. A pipe read by the event loop
  also costs the parent a fraction of what `ProcessPoolExecutor`'s queues and threads do.
- a thread is lighter, but a call that never returns leaves its thread behind (its slot is
  given to the next call).
`start` starts the processes before the first call, so a slow start never counts against a call.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import queue
import threading
import time
from typing import Any

from flashq.rewards import executor_for, load_reward_fn

log = logging.getLogger("flashq.reward")


class RewardFailed(Exception):
    """The reward function raised, or its process died; the message says which and why."""


def _serve(conn, spec: str) -> None:
    """A reward process: load the function once, then answer one call at a time."""
    fn = load_reward_fn(spec)
    conn.send(("ready", None))
    while True:
        try:
            task, text = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", fn(task, text)))
        except BaseException as e:  # noqa: BLE001 - reported to the caller, the process keeps serving
            conn.send(("error", f"{type(e).__name__}: {e}"))


class _RewardProcess:
    """One reward process and its pipe, read by the event loop whenever an answer arrives."""

    def __init__(self, spec: str):
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, spec), name="flashq-reward-fn", daemon=True)
        self.process.start()
        child.close()
        self.loop = asyncio.get_running_loop()
        self.waiting: asyncio.Future | None = None  # for the next message
        self.dead = False
        self.loop.add_reader(self.conn.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        try:
            message = self.conn.recv()
        except (EOFError, OSError) as e:
            # the pipe closes as the process exits, a moment before it can be reaped: wait for that
            # (on this crash path only) so the error names the exit code
            self.process.join(2.0)
            message = EOFError(f"the reward process died (exit code {self.process.exitcode}): {type(e).__name__}")
            self.dead = True
            self.loop.remove_reader(self.conn.fileno())
        waiting, self.waiting = self.waiting, None
        if waiting is not None and not waiting.done():
            waiting.set_exception(message) if isinstance(message, EOFError) else waiting.set_result(message)

    def receive(self, timeout_s: float | None = None) -> asyncio.Future:
        """A future for the next message: EOFError if the process dies, TimeoutError after `timeout_s`."""
        self.waiting = waiting = self.loop.create_future()
        if self.dead:
            waiting.set_exception(EOFError("the reward process is dead"))
        elif timeout_s is not None:
            timer = self.loop.call_later(timeout_s, lambda: waiting.done() or waiting.set_exception(TimeoutError()))
            waiting.add_done_callback(lambda _: timer.cancel())
        return waiting

    def kill(self) -> None:
        if not self.dead:
            self.dead = True
            self.loop.remove_reader(self.conn.fileno())
        self.process.kill()
        self.process.join(5)
        self.conn.close()


class ProcessWorkers:
    """`size` reward processes; a call waits for an idle one, runs there, and gives it back."""

    def __init__(self, spec: str, size: int, start_timeout_s: float = 300.0):
        self.spec = spec
        self.size = size
        self.start_timeout_s = start_timeout_s
        self.idle: asyncio.Queue[_RewardProcess | None] = asyncio.Queue()
        self.live: set[_RewardProcess] = set()
        self.broken = ""  # why no process could be started: every call fails with it
        self.restarts = 0

    async def start(self) -> None:
        await asyncio.gather(*[self._add() for _ in range(self.size - len(self.live))])

    async def _add(self) -> None:
        proc = _RewardProcess(self.spec)
        self.live.add(proc)
        try:
            kind, _ = await proc.receive(self.start_timeout_s)
            if kind != "ready":
                raise RuntimeError(f"said {kind!r} instead of ready")
        except BaseException as e:
            self._discard(proc)
            if not isinstance(e, asyncio.CancelledError):
                self.broken = f"a reward process failed to start: {type(e).__name__}: {e}"
                log.error("%s", self.broken)
                self.idle.put_nowait(None)  # wakes a waiting call, which reports it
            raise
        self.idle.put_nowait(proc)

    def _discard(self, proc: _RewardProcess) -> None:
        self.live.discard(proc)
        proc.kill()

    def _replace(self, proc: _RewardProcess) -> None:
        self._discard(proc)
        self.restarts += 1
        task = asyncio.get_running_loop().create_task(self._add())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # failures are in self.broken

    async def _idle_process(self) -> _RewardProcess:
        while True:
            proc = await self.idle.get()
            if proc is None:
                self.idle.put_nowait(None)
                raise RewardFailed(self.broken)
            if not proc.dead:
                return proc
            self._replace(proc)  # died while idle

    async def __call__(self, task: dict, text: str, timeout_s: float) -> Any:
        proc = await self._idle_process()
        finished = False
        try:
            answer = proc.receive(timeout_s)
            proc.conn.send((task, text))
            kind, value = await answer
            finished = True
        except TimeoutError:  # an OSError, but not a broken pipe
            raise
        except (EOFError, OSError) as e:
            raise RewardFailed(str(e) if isinstance(e, EOFError) else f"the reward process's pipe failed: {e}") from None
        finally:
            if finished:
                self.idle.put_nowait(proc)
            else:  # timed out, died, or this call was cancelled while the process runs it
                self._replace(proc)
        if kind == "error":
            raise RewardFailed(value)
        return value

    def close(self) -> None:
        for proc in list(self.live):
            self._discard(proc)


def _resolve(answer: asyncio.Future, outcome: tuple) -> None:
    if not answer.done():
        answer.set_result(outcome)


class _ThreadCall:
    __slots__ = ("task", "text", "loop", "answer", "started", "abandoned")

    def __init__(self, task: dict, text: str, loop: asyncio.AbstractEventLoop):
        self.task, self.text, self.loop = task, text, loop
        self.answer = loop.create_future()
        self.started: float | None = None  # when a thread took it: its clock starts there
        self.abandoned = False


class ThreadWorkers:
    """`size` threads taking calls from one queue. A watchdog fails a call that has run (not
    waited) past the timeout; its thread is abandoned (it exits once the call returns, if ever)
    and another takes its place."""

    def __init__(self, fn, size: int, timeout_s: float):
        self.fn = fn
        self.size = size
        self.timeout_s = timeout_s
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.unanswered: set[_ThreadCall] = set()
        self.watchdog: asyncio.Task | None = None
        for _ in range(size):
            self._add()

    def _add(self) -> None:
        threading.Thread(target=self._serve, name="flashq-reward-fn", daemon=True).start()

    def _serve(self) -> None:
        while True:
            call = self.calls.get()
            if call is None:
                return
            call.started = time.monotonic()
            try:
                outcome = ("ok", self.fn(call.task, call.text))
            except BaseException as e:  # noqa: BLE001 - reported to the caller
                outcome = ("error", f"{type(e).__name__}: {e}")
            try:
                call.loop.call_soon_threadsafe(_resolve, call.answer, outcome)
            except RuntimeError:  # the loop is gone: nobody waits for this call any more
                return
            if call.abandoned:  # a new thread took this one's place
                return

    async def _watch(self) -> None:
        tick = min(0.5, self.timeout_s / 20)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for call in [c for c in self.unanswered if c.started is not None and now - c.started > self.timeout_s]:
                call.abandoned = True
                self.unanswered.discard(call)
                call.answer.done() or call.answer.set_exception(TimeoutError())
                self._add()

    async def __call__(self, task: dict, text: str) -> Any:
        if self.watchdog is None:
            self.watchdog = asyncio.get_running_loop().create_task(self._watch())
        call = _ThreadCall(task, text, asyncio.get_running_loop())
        self.unanswered.add(call)
        self.calls.put(call)
        try:
            kind, value = await call.answer
        finally:
            self.unanswered.discard(call)
        if kind == "error":
            raise RewardFailed(value)
        return value

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.cancel()
        for _ in range(self.size):  # one each for the live threads (abandoned ones exit by themselves)
            self.calls.put(None)


class RewardRunner:
    def __init__(self, spec: str, executor: str = "auto", workers: int = 2, timeout_s: float = 10.0):
        self.spec = spec
        self.fn = load_reward_fn(spec)  # fail fast, in this process, on a bad spec
        self.timeout_s = timeout_s
        self.kind = executor_for(self.fn, executor)
        self.workers = workers
        if self.kind not in ("async", "process", "thread"):
            raise ValueError(f"reward.executor must be 'auto', 'process' or 'thread', got {executor!r}")
        self.processes: ProcessWorkers | None = None
        self.threads: ThreadWorkers | None = None

    @property
    def restarts(self) -> int:
        """Reward processes killed (a timeout, a crash) and replaced."""
        return self.processes.restarts if self.processes is not None else 0

    async def start(self) -> None:
        """Start the reward processes (and load the function in them) now."""
        if self.kind == "process":
            if self.processes is None:
                self.processes = ProcessWorkers(self.spec, self.workers)
            await self.processes.start()

    async def __call__(self, task: dict, text: str) -> Any:
        if self.kind == "async":
            return await asyncio.wait_for(self.fn(task, text), self.timeout_s)
        if self.kind == "process":
            if self.processes is None:
                await self.start()
            return await self.processes(task, text, self.timeout_s)
        return await self._in_thread(task, text)

    async def _in_thread(self, task: dict, text: str) -> Any:
        if self.threads is None:
            self.threads = ThreadWorkers(self.fn, self.workers, self.timeout_s)
        return await self.threads(task, text)

    def close(self) -> None:
        """Kill the reward processes (threads cannot be killed; they are daemons)."""
        if self.processes is not None:
            self.processes.close()
        if self.threads is not None:
            self.threads.close()
