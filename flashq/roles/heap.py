"""The garbage collector in a long-lived role process: what it built at start-up is frozen out
of every later collection, and the time collections take is counted.

A rollout worker holds torch, vLLM's front end and a tokenizer: about 680,000 tracked objects
once started. Python's full collections walk all of them, and an agent run's rollout worker
creates enough short-lived objects (requests, the OpenAI client's, asyncio's) to set one off
about once a second: collections took two fifths of its busy thread (py-spy, the calculator
agent), one sixth once the start-up heap was frozen. vLLM's own server freezes its heap after
start-up the same way (`vllm.utils.gc_utils.freeze_gc_heap`).
"""

from __future__ import annotations

import gc
import time


def freeze_startup_heap() -> int:
    """Collect, then move every object alive now into the collector's permanent generation,
    which later collections skip. Returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class CollectorClock:
    """Seconds this process's collections have taken (on the thread that ran them), by
    generation, from Python's own collection callbacks."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._started = 0.0
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.thread_time()
            return
        generation = info["generation"]
        self.seconds[generation] += time.thread_time() - self._started
        self.collections[generation] += 1

    @property
    def total_s(self) -> float:
        return sum(self.seconds)

    def close(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)
