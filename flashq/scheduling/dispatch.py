"""Queue scheduling: send each request, as soon as there is room, to the least-loaded worker.

Used twice by the coordinator: generation requests over rollout workers and score requests over
reward workers. Each worker has a cap on requests in flight; a request waits until a worker has
room (per-request dispatch, not per-batch), in the order `flashq.scheduling.order` keeps (FIFO unless
configured). Replicas of one prompt are independent requests, so they spread over workers when
that is where the room is, unless `affinity` names a key (the group id) whose requests should
stay on one worker while it has room: siblings then share that engine's prefix cache and drafts,
as in systems that hand each engine a contiguous slice of the batch (veRL). `prefer` names the one
worker an item would rather run on (a divided response's next chunk: where its tokens so far are
in the prefix cache); it goes there when no worker is less loaded, so the cache breaks ties but
never keeps work from a worker with more room (moving it there is what divided rollout is for).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, TypeVar

from flashq.reporting.metrics import BusyClock
from flashq.scheduling.order import FifoOrder, WaitingOrder

T = TypeVar("T")


class LeastLoadedQueue(Generic[T]):
    def __init__(self, workers: list[str], cap_per_worker: int, order: WaitingOrder | None = None,
                 affinity: Callable[[T], str] | None = None, max_homes: int = 1 << 16,
                 prefer: Callable[[T], str | None] | None = None):
        """`max_homes`: affinity keys remembered at once; the least recently used is forgotten
        first (a key that outlives its groups, such as a prompt, must not grow without bound)."""
        if not workers:
            raise ValueError("need at least one worker")
        self.cap = cap_per_worker
        self.affinity = affinity
        self.prefer = prefer
        self.max_homes = max_homes
        self.home: OrderedDict[str, str] = OrderedDict()  # affinity key -> the worker its first item went to
        self.load: dict[str, int] = {w: 0 for w in workers}
        self.clocks: dict[str, BusyClock] = {w: BusyClock() for w in workers}  # utilisation as dispatched
        self.waiting = order if order is not None else FifoOrder()

    def submit(self, item: T) -> None:
        self.waiting.push(item)

    def submit_front(self, item: T) -> None:
        """Re-queue ahead of everything else (e.g. work taken back from a failed worker)."""
        self.waiting.push_front(item)

    def assignments(self) -> list[tuple[str, T]]:
        """Pop as many waiting items as fit, each to the least-loaded worker (ties: first)."""
        out = []
        while len(self.waiting) and self.load:
            worker = min(self.load, key=self.load.__getitem__)
            if self.load[worker] >= self.cap:
                break
            item = self.waiting.pop()
            worker = self._worker_for(item, worker)
            self.load[worker] += 1
            self.clocks[worker].begin()
            out.append((worker, item))
        return out

    def _worker_for(self, item: T, least_loaded: str) -> str:
        preferred = self.prefer(item) if self.prefer is not None else None
        if preferred is not None and self.load.get(preferred, self.cap) <= self.load[least_loaded]:
            return preferred
        return self._home(self.affinity(item), least_loaded) if self.affinity is not None else least_loaded

    def _home(self, key: str, least_loaded: str) -> str:
        home = self.home.setdefault(key, least_loaded)
        self.home.move_to_end(key)
        while len(self.home) > self.max_homes:
            self.home.popitem(last=False)
        return home if self.load[home] < self.cap else least_loaded  # spill when home is full

    def withdraw(self, group_id: str) -> list[T]:
        """Take a group's waiting items out of the queue (they will not be dispatched)."""
        return self.waiting.withdraw(group_id)

    def forget(self, key: str) -> None:
        """The key's items are all done: forget its home and tell the waiting order."""
        self.home.pop(key, None)
        self.waiting.forget_group(key)

    def done(self, worker: str) -> None:
        if self.load.get(worker, 0) <= 0:
            raise ValueError(f"done() for {worker} with nothing in flight")
        self.load[worker] -= 1
        self.clocks[worker].end()

    def remove_worker(self, worker: str) -> None:
        """The worker is gone: send it nothing more. The caller re-queues what it held."""
        self.load.pop(worker, None)
        if worker in self.clocks:
            self.clocks[worker].clear()
        self.home = OrderedDict((key, w) for key, w in self.home.items() if w != worker)

    def add_worker(self, worker: str) -> None:
        """A (restarted) worker takes requests again, starting with nothing in flight."""
        self.load[worker] = 0
        self.clocks.setdefault(worker, BusyClock())

    def free_slots(self) -> int:
        return sum(self.cap - n for n in self.load.values()) - len(self.waiting)

    @property
    def in_flight(self) -> int:
        return sum(self.load.values())
