"""The order in which waiting generation requests reach the rollout workers.

`LeastLoadedQueue` decides *where* a request goes; these decide *which* goes next when a worker
has room. The engine runs what it is given (the queue caps each worker at what its engine batches),
so this admission order is the priority the engine sees.

- `FifoOrder`: arrival order (ROLL Flash's queue scheduling).
- `ContextAwareOrder` (Seer): one probe request per group goes first, shortest-generated-first, so
  short groups finish and long groups reveal themselves early; the other requests follow
  longest-estimated-group-first (`LengthEstimates`); anything that waited longer than the
  starvation guard goes next. A prompt seen in an earlier epoch is estimated from its history
  (RhymeRL) and needs no probe; in async mode the queue holds the next steps' groups too, so
  long groups start first and short ones fill in around them (HistoPipe's overlap).
- `OracleOrder`: longest request first, knowing every length (the benchmark's lower bound).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from typing import Callable, Protocol

from flashq.scheduling.lengths import LengthEstimates
from flashq.wire.protocol import GenerateRequest


class WaitingOrder(Protocol):
    def push(self, req: GenerateRequest) -> None: ...
    def push_front(self, req: GenerateRequest) -> None: ...
    def pop(self) -> GenerateRequest: ...
    def forget_group(self, group_id: str) -> None: ...  # the group is complete
    def __len__(self) -> int: ...


class FifoOrder:
    def __init__(self) -> None:
        self.items: deque[GenerateRequest] = deque()

    def push(self, req: GenerateRequest) -> None:
        self.items.append(req)

    def push_front(self, req: GenerateRequest) -> None:
        self.items.appendleft(req)

    def pop(self) -> GenerateRequest:
        return self.items.popleft()

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def forget_group(self, group_id: str) -> None:
        pass

    def withdraw(self, group_id: str) -> list[GenerateRequest]:
        taken = [r for r in self.items if r.group_id == group_id]
        if taken:
            self.items = deque(r for r in self.items if r.group_id != group_id)
        return taken


class ContextAwareOrder:
    def __init__(self, estimates: LengthEstimates, budget: int, starvation_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.estimates = estimates
        self.budget = budget
        self.starvation_s = starvation_s
        self.clock = clock
        self.probe_of: dict[str, str] = {}  # group id -> the request id probing it
        self.probes: list[tuple[int, int, float, GenerateRequest]] = []  # heap: (generated, seq, t, req)
        self.by_group: dict[str, deque[tuple[float, GenerateRequest]]] = {}
        self.seq = itertools.count()
        self.count = 0

    def push(self, req: GenerateRequest, front: bool = False) -> None:
        self.count += 1
        now = self.clock()
        if req.group_id not in self.probe_of:  # a group its history already describes needs no probe
            self.probe_of[req.group_id] = "" if self.estimates.known(req.group_id) else req.request_id
        if self.probe_of[req.group_id] == req.request_id:
            heapq.heappush(self.probes, (req.generated, -next(self.seq) if front else next(self.seq), now, req))
            return
        queue = self.by_group.setdefault(req.group_id, deque())
        (queue.appendleft if front else queue.append)((now - self.starvation_s if front else now, req))

    def push_front(self, req: GenerateRequest) -> None:
        self.push(req, front=True)

    def pop(self) -> GenerateRequest:
        if not self.count:
            raise IndexError("pop from an empty queue")
        self.count -= 1
        starved = self._starved()
        if starved is not None:
            return self._pop_from_group(starved)
        if self.probes:
            return heapq.heappop(self.probes)[3]
        gid = max(self.by_group, key=lambda g: (self.estimates.estimate(g, self.budget), -self.by_group[g][0][0]))
        return self._pop_from_group(gid)

    def _pop_from_group(self, gid: str) -> GenerateRequest:
        queue = self.by_group[gid]
        _, req = queue.popleft()
        if not queue:
            del self.by_group[gid]
        return req

    def _starved(self) -> str | None:
        if not self.by_group:
            return None
        gid = min(self.by_group, key=lambda g: self.by_group[g][0][0])
        return gid if self.clock() - self.by_group[gid][0][0] > self.starvation_s else None

    def forget_group(self, group_id: str) -> None:
        self.probe_of.pop(group_id, None)

    def __len__(self) -> int:
        return self.count


class OracleOrder:
    """Longest first by the true remaining length `length_of(req)` (known only in benchmarks)."""

    def __init__(self, length_of: Callable[[GenerateRequest], int]):
        self.length_of = length_of
        self.heap: list[tuple[int, int, GenerateRequest]] = []
        self.seq = itertools.count()

    def push(self, req: GenerateRequest) -> None:
        heapq.heappush(self.heap, (-self.length_of(req), next(self.seq), req))

    def push_front(self, req: GenerateRequest) -> None:
        heapq.heappush(self.heap, (-(1 << 40), -next(self.seq), req))

    def pop(self) -> GenerateRequest:
        return heapq.heappop(self.heap)[2]

    def forget_group(self, group_id: str) -> None:
        pass

    def __len__(self) -> int:
        return len(self.heap)
