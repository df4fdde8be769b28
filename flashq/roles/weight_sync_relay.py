"""The coordinator's part in a weight sync: one trainer call in, one reply out.

The trainer speaks to the coordinator only; each of its weight-sync calls (build the transfer
group, push a version) goes on to every rollout worker in the group, and the trainer is answered
once all of them replied, or were lost on the way. This class keeps those books; what a finished
sync means for the run (workers that now serve the weights) is the coordinator's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from flashq.wire.protocol import WeightSyncCall, WeightSyncReply


@dataclass
class PendingSync:
    call: WeightSyncCall
    waiting: set[str]  # recipients that have not replied yet
    recipients: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    @property
    def ok(self) -> bool:
        return not self.errors

    def answer(self) -> WeightSyncReply:
        """The one reply the trainer gets."""
        return WeightSyncReply(self.call.call_id, ok=self.ok, error="; ".join(self.errors), seconds=time.monotonic() - self.started)


class WeightSyncRelay:
    def __init__(self) -> None:
        self.pending: dict[int, PendingSync] = {}

    def open(self, call: WeightSyncCall, recipients: list[str]) -> PendingSync | None:
        """Start waiting on `recipients`; returns the sync when there is no one to wait on."""
        if call.call_id in self.pending:
            raise ValueError(f"weight sync call {call.call_id} is already in flight")
        sync = self.pending[call.call_id] = PendingSync(call, set(recipients), recipients=set(recipients))
        return self._finished(sync)

    def reply(self, peer: str, reply: WeightSyncReply) -> PendingSync | None:
        """A worker's reply; returns the sync when it was the last one awaited."""
        sync = self.pending.get(reply.call_id)
        if sync is None or peer not in sync.waiting:
            raise KeyError(f"weight sync reply {reply.call_id} from {peer} matches no pending call")
        sync.waiting.discard(peer)
        if not reply.ok:
            sync.errors.append(reply.error)
        return self._finished(sync)

    def lose(self, peer: str) -> list[PendingSync]:
        """A worker is gone: every sync waiting on it fails; returns those it was the last one of."""
        finished = []
        for sync in list(self.pending.values()):
            if peer in sync.waiting:
                sync.waiting.discard(peer)
                sync.errors.append(f"{peer} lost during {sync.call.method}")
                if (done := self._finished(sync)) is not None:
                    finished.append(done)
        return finished

    def _finished(self, sync: PendingSync) -> PendingSync | None:
        if sync.waiting:
            return None
        del self.pending[sync.call.call_id]
        return sync
