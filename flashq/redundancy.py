"""Redundant episodes (ROLL Flash): start more episodes per group than it needs, keep the first
`size` to finish, cancel the rest, and replace the ones that fail.

Plain bookkeeping for the coordinator, one entry per group of episodes: which request ids were
started, which are still running, how many were kept. Every started episode is answered by
exactly one sample, so each id ends up kept, discarded (late or cancelled) or failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Verdict = Literal["keep", "discard", "failed"]


@dataclass
class EpisodeGroup:
    size: int
    started: int = 0
    running: set[str] = field(default_factory=set)
    kept: int = 0
    failures: int = 0


class RedundantGroups:
    def __init__(self, redundancy: int, max_failures: int):
        self.redundancy, self.max_failures = redundancy, max_failures
        self.groups: dict[str, EpisodeGroup] = {}

    def start(self, group_id: str, size: int) -> list[str]:
        """Request ids of the group's first episodes: size + redundancy of them."""
        self.groups[group_id] = EpisodeGroup(size)
        return self._more(group_id, size + self.redundancy)

    def resume(self, group_id: str, size: int, kept_ids: list[str]) -> None:
        """After a restart from a checkpoint: the group holds `kept_ids`; nothing is running."""
        last = max((int(rid.rsplit("/", 1)[1]) for rid in kept_ids), default=-1)
        self.groups[group_id] = EpisodeGroup(size, started=last + 1, kept=len(kept_ids))

    def _more(self, group_id: str, n: int) -> list[str]:
        g = self.groups[group_id]
        ids = [f"{group_id}/{g.started + i}" for i in range(n)]
        g.started += n
        g.running.update(ids)
        return ids

    def on_result(self, group_id: str, request_id: str, failed: bool) -> Verdict:
        g = self.groups.get(group_id)
        if g is None or request_id not in g.running:
            raise KeyError(f"episode {request_id} was not started (or answered twice)")
        g.running.discard(request_id)
        if failed:
            g.failures += 1
            return "failed"
        if g.kept >= g.size:
            return "discard"
        g.kept += 1
        return "keep"

    def is_full(self, group_id: str) -> bool:
        g = self.groups[group_id]
        return g.kept >= g.size

    def to_cancel(self, group_id: str) -> list[str]:
        """Once a group has all it needs: the episodes still running (they will answer "abort")."""
        return sorted(self.groups[group_id].running) if self.is_full(group_id) else []

    def replacements(self, group_id: str) -> list[str]:
        """After failures: new episodes so that running + kept can still fill the group. Raises
        when the group failed more often than allowed."""
        g = self.groups[group_id]
        if g.failures > self.max_failures:
            raise RuntimeError(f"group {group_id}: {g.failures} episodes failed (limit env.max_failures_per_group={self.max_failures})")
        missing = g.size - g.kept - len(g.running)
        return self._more(group_id, missing) if missing > 0 else []

    def finished(self, group_id: str) -> bool:
        """Full, with nothing running: forget it."""
        g = self.groups[group_id]
        if g.kept >= g.size and not g.running:
            del self.groups[group_id]
            return True
        return False
