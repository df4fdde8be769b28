"""A deadline for the collectives of one weight push, on NCCL.

vLLM's NCCL weight-transfer engine has no timeout: if a rank dies mid-push, the trainer blocks
in its broadcast (or in the stream synchronize after it) and every surviving engine in its
receive, inside the engine core, for ever; heartbeats keep flowing, so nothing notices. Torch's
NCCL watchdog answers the same fault by aborting the communicator, which makes every operation
pending on it return; `PushDeadline` does that for one push: past `seconds` it calls `abort`
(vLLM's `PyNcclCommunicator.destroy`, an `ncclCommAbort`), and the push raises
`PushDeadlineExceeded` however the blocked call came back. An aborted communicator is disabled
(vLLM's collectives then return without moving a byte), so a push whose deadline fired never
counts as delivered: the engine keeps its old version label and stays paused, and the trainer
rebuilds the group and pushes again.

gloo needs none of this: each of its collectives already times out after `weight_sync.timeout_s`
(and aborting a gloo group does not wake a blocked broadcast).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class PushDeadlineExceeded(RuntimeError):
    """A push outlived `weight_sync.timeout_s`; its transfer group was aborted and must be rebuilt."""


class PushDeadline:
    """Run one push under a deadline; past it, `abort` the transfer group it blocks on."""

    def __init__(self, seconds: float, abort: Callable[[], None], what: str):
        self.seconds = seconds
        self.abort = abort
        self.what = what

    def run(self, push: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        finished = threading.Event()
        fired = threading.Event()

        def watch() -> None:
            if finished.wait(self.seconds):
                return
            fired.set()
            log.error("%s passed its deadline of %g s: aborting its transfer group", self.what, self.seconds)
            try:
                self.abort()
            except Exception:  # noqa: BLE001 - the push still fails below, with the deadline named
                log.exception("aborting the transfer group of %s failed", self.what)

        watcher = threading.Thread(target=watch, name="push-deadline", daemon=True)
        watcher.start()
        try:
            result = push(*args, **kwargs)
        except BaseException as e:
            finished.set()
            watcher.join()
            if fired.is_set():
                raise self._exceeded() from e
            raise
        finished.set()
        watcher.join()
        if fired.is_set():  # came back only because the group was aborted, or raced the abort
            raise self._exceeded()
        return result

    def _exceeded(self) -> PushDeadlineExceeded:
        return PushDeadlineExceeded(
            f"{self.what} passed its deadline of {self.seconds:g} s (weight_sync.timeout_s): a peer stopped "
            "taking part; the transfer group was aborted and nothing it carried counts as delivered")


def abort_nccl_group(engine) -> None:
    """Abort the NCCL communicator of a vLLM weight-transfer engine (trainer or worker side):
    vLLM's own `destroy`, an `ncclCommAbort` that wakes the pending operations, after which the
    communicator is disabled. The engine forgets it, so a rebuilt group starts clean."""
    group = getattr(engine, "model_update_group", None)
    if group is not None:
        group.destroy()
        engine.model_update_group = None


def under_nccl_deadline(engine, seconds: float | None, what: str, push: Callable[..., T], *args: Any) -> T:
    """`push` under a deadline when `engine` moves weights over NCCL (it holds a communicator in
    `model_update_group`); on gloo, or without a deadline, as it is."""
    if seconds is None or getattr(engine, "model_update_group", None) is None:
        return push(*args)
    return PushDeadline(seconds, lambda: abort_nccl_group(engine), what).run(push, *args)
