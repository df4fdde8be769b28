"""Run metrics: one JSON line per record in `metrics.jsonl`, mirrored to TensorBoard.

TensorBoard events are written with tensorboard's own event writer, so the coordinator does not
need torch. Keys are flat strings ("rollout/tokens_per_s"); values are numbers. Keys that start
with "hist/" hold a list of counts and are written as TensorBoard histograms.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from flashq.jsonl import cut_torn_tail, read_records

log = logging.getLogger(__name__)


class MetricsLog:
    def __init__(self, run_dir: Path, tensorboard: bool = True, trackers: list | None = None):
        """`trackers`: from `trackers.make_trackers`, each given every record."""
        run_dir.mkdir(parents=True, exist_ok=True)
        self.trackers = trackers or []
        self.path = run_dir / "metrics.jsonl"
        cut_torn_tail(self.path)  # a coordinator killed mid-write: append after the last whole record
        self._file = self.path.open("a", buffering=1)
        self._tb = None
        if tensorboard:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self._tb = EventFileWriter(str(run_dir / "tensorboard"))

    def write(self, step: int, record: dict[str, Any], kind: str = "step") -> None:
        now = time.time()
        self._file.write(json.dumps({"kind": kind, "step": step, "time": now, **record}) + "\n")
        if self._tb is not None:
            self._tb.add_event(_event(step, now, record, prefix="" if kind == "step" else f"{kind}/"))
            self._tb.flush()
        for tracker in list(self.trackers):
            try:
                tracker.log(step, record, kind)
            except Exception as e:  # noqa: BLE001 - a tracker's failure must not stop training; JSONL and TensorBoard go on
                log.warning("%s failed and is dropped for the rest of the run: %s: %s", type(tracker).__name__, type(e).__name__, e)
                self.trackers.remove(tracker)

    def close(self, ok: bool = True) -> None:
        """`ok`: whether the run finished (the trackers mark a failed run as failed)."""
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        for tracker in self.trackers:
            try:
                tracker.close(ok)
            except Exception as e:  # noqa: BLE001
                log.warning("%s failed to close: %s: %s", type(tracker).__name__, type(e).__name__, e)


def _event(step: int, wall_time: float, record: dict[str, Any], prefix: str):
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary

    values = []
    for key, value in record.items():
        if key.startswith("hist/") and isinstance(value, list) and value:
            counts = [float(c) for c in value]
            total = sum(counts)
            histo = HistogramProto(
                min=0.0,
                max=float(len(counts) - 1),
                num=total,
                sum=sum(i * c for i, c in enumerate(counts)),
                sum_squares=sum(i * i * c for i, c in enumerate(counts)),
                bucket_limit=[i + 0.5 for i in range(len(counts))],
                bucket=counts,
            )
            values.append(Summary.Value(tag=prefix + key, histo=histo))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            values.append(Summary.Value(tag=prefix + key, simple_value=float(value)))
    return Event(wall_time=wall_time, step=step, summary=Summary(value=values))


def read_metrics(path: Path, kind: str | None = "step") -> list[dict[str, Any]]:
    """The records of one kind (None: all); a torn last line (a run killed mid-write) is skipped."""
    return [rec for rec in read_records(path) if kind is None or rec.get("kind") == kind]


class BusyClock:
    """Seconds with at least one request in flight vs none (idle share), and the time integral
    of the number in flight (its mean over a span is the worker's average batch)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.reset()

    def reset(self) -> None:
        """Start counting now (e.g. once the workers exist, not while they boot)."""
        self.busy_s = 0.0
        self.idle_s = 0.0
        self.load_s = 0.0
        self._since = time.monotonic()

    def _tick(self) -> None:
        now = time.monotonic()
        span = now - self._since
        if self.in_flight:
            self.busy_s += span
            self.load_s += span * self.in_flight
        else:
            self.idle_s += span
        self._since = now

    def begin(self) -> None:
        self._tick()
        self.in_flight += 1

    def end(self) -> None:
        self._tick()
        self.in_flight -= 1

    def clear(self) -> None:
        """Nothing in flight any more (the worker died): from now on its time counts as idle."""
        self._tick()
        self.in_flight = 0

    def snapshot(self) -> tuple[float, float]:
        self._tick()
        return self.busy_s, self.idle_s
