"""Queue scheduling: send each request, as soon as there is room, to the least-loaded worker.

Used twice by the coordinator: generation requests over rollout workers and score requests over
reward workers. Each worker has a cap on requests in flight; a request waits until a worker has
room (per-request dispatch, not per-batch), in the order `flashq.scheduling` keeps (FIFO unless
configured). Replicas of one prompt are independent requests, so they spread over workers when
that is where the room is.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from flashq.metrics import BusyClock
from flashq.scheduling import FifoOrder, WaitingOrder

T = TypeVar("T")


class LeastLoadedQueue(Generic[T]):
    def __init__(self, workers: list[str], cap_per_worker: int, order: WaitingOrder | None = None):
        if not workers:
            raise ValueError("need at least one worker")
        self.cap = cap_per_worker
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
        while len(self.waiting):
            worker = min(self.load, key=self.load.__getitem__)
            if self.load[worker] >= self.cap:
                break
            self.load[worker] += 1
            self.clocks[worker].begin()
            out.append((worker, self.waiting.pop()))
        return out

    def done(self, worker: str) -> None:
        if self.load.get(worker, 0) <= 0:
            raise ValueError(f"done() for {worker} with nothing in flight")
        self.load[worker] -= 1
        self.clocks[worker].end()

    def free_slots(self) -> int:
        return sum(self.cap - n for n in self.load.values()) - len(self.waiting)

    @property
    def in_flight(self) -> int:
        return sum(self.load.values())
