"""Bounded staleness by pacing: admit prompts so no trained token is older than ceil(alpha).

Two rules, one ledger of deadlines.

Admission (AReaL's capacity rule, ROLL Flash's async ratio): with the engines serving policy
version u, at most floor((alpha + u + 1) * B) groups may ever have been admitted. A group
admitted at version u gets the deadline u + ceil(alpha): the last batch index it may be trained
in. Its tokens are all sampled at versions >= u, and batch b is trained by the trainer at
version b, so training it by its deadline keeps every token within ceil(alpha) versions.

Batch selection (earliest deadline first): batch b takes the B complete groups with the earliest
deadlines, but only if what stays behind can still meet its deadlines: for every later batch
index w, the pending groups due by w must fit in the (w - b) batches that remain. If not, the
trainer waits for the urgent groups to finish instead of running ahead of them. Nothing is
discarded: a long response delays a batch, it is never dropped (discarding would bias training
toward short responses).

With alpha = 0 this is synchronous training: B groups are admitted, all B are batch 0, and the
next B are admitted only when version 1 reaches the engines.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Admission:
    group_id: str
    version: int  # engine policy version when admitted
    deadline: int  # last batch index this group may be trained in


class StalenessGate:
    def __init__(self, async_ratio: float, batch_groups: int, total_groups: int | None = None):
        if async_ratio < 0:
            raise ValueError("async_ratio must be >= 0")
        self.alpha = async_ratio
        self.lag = math.ceil(async_ratio)
        self.batch_groups = batch_groups
        self.total_groups = total_groups
        self.admitted = 0
        self.next_batch = 0
        self.pending: dict[str, int] = {}  # group id -> deadline, admitted but not yet batched

    def capacity(self, engine_version: int) -> int:
        """How many more groups may be admitted now."""
        cap = math.floor((self.alpha + engine_version + 1) * self.batch_groups + 1e-9)
        if self.total_groups is not None:
            cap = min(cap, self.total_groups)
        return max(0, cap - self.admitted)

    def admit(self, group_id: str, engine_version: int) -> Admission:
        if self.capacity(engine_version) <= 0:
            raise RuntimeError("admit() without capacity: the caller must check capacity() first")
        if group_id in self.pending:
            raise ValueError(f"group {group_id} admitted twice")
        deadline = engine_version + self.lag
        if deadline < self.next_batch:  # impossible under the capacity rule; a bug if seen
            raise RuntimeError(f"deadline {deadline} already passed (next batch {self.next_batch})")
        self.pending[group_id] = deadline
        self.admitted += 1
        return Admission(group_id, engine_version, deadline)

    def withdraw(self, group_id: str) -> None:
        """A pending group that will never be trained (dynamic sampling dropped it): it gives
        back its admission, so another group may take its place. The rule above still holds:
        `admitted` counts the groups that need a batch, and only they take batch slots."""
        del self.pending[group_id]
        self.admitted -= 1

    def select_batch(self, complete: set[str]) -> list[str] | None:
        """Group ids for batch `next_batch`, or None if it must wait; marks them batched."""
        B = self.batch_groups
        ready = sorted((self.pending[g], g) for g in complete if g in self.pending)
        if len(ready) < B:
            return None
        chosen = [g for _, g in ready[:B]]
        if not self._feasible_after(set(chosen)):
            return None
        for g in chosen:
            del self.pending[g]
        self.next_batch += 1
        return chosen

    def _feasible_after(self, chosen: set[str]) -> bool:
        b, B = self.next_batch, self.batch_groups
        due = Counter(d for g, d in self.pending.items() if g not in chosen)
        if not due:
            return True
        if min(due) <= b:
            return False  # a group due now is not complete yet
        running = 0
        for w in range(b + 1, max(due) + 1):
            running += due.get(w, 0)
            if running > (w - b) * B:
                return False
        return True
