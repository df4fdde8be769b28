"""The coordinator's books: how many samples (and requests, scores, groups) reached each stage.

`summary` is what `ledger.json` holds; with the trained and dropped group ids it lets anyone
check that every admitted group was trained whole exactly once, or listed as not trained.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from flashq.buffer import GroupBuffer


@dataclass
class Ledger:
    """Counts of samples at each stage; `check` says whether the books balance."""

    groups_admitted: int = 0
    requests_sent: int = 0
    samples_received: int = 0
    tokens_received: int = 0
    rewards_received: int = 0
    reward_errors: int = 0
    reward_sum: float = 0.0  # of every reward received, trained or dropped
    samples_batched: int = 0
    samples_trained: int = 0  # consumed by the trainer (a skipped batch's too: see batches_skipped)
    batches_sent: int = 0
    groups_dropped: int = 0  # dynamic sampling: complete groups with equal rewards, not trained
    samples_dropped: int = 0
    dropped_groups: list = field(default_factory=list)  # their ids, for the exactly-once audit
    groups_dropped_by_reason: Counter = field(default_factory=Counter)
    scores_retried: int = 0  # failed rewards scored again (reward.on_error drop)
    batches_skipped: Counter = field(default_factory=Counter)  # by reason: consumed, not learned from
    eval_requests_sent: int = 0  # evaluation: apart from training's, never trained
    eval_samples_received: int = 0
    eval_rewards_received: int = 0
    episodes_failed: int = 0  # env episodes that raised or timed out (each replaced or fatal)
    episodes_discarded: int = 0  # answered but not kept: finished after their group was full, or cancelled
    episodes_withdrawn: int = 0  # redundant episodes whose group filled before they were dispatched
    requests_requeued: int = 0  # in flight on a rollout worker that died; sent again to another
    requests_failed: int = 0  # answered with an error (generation raised, or overdue and aborted)
    requests_retried: int = 0  # failed ones sent again
    requests_quarantined: int = 0  # failed rollout.max_request_failures times: given up, their group dropped
    eval_requests_quarantined: int = 0
    quarantined: list = field(default_factory=list)  # {request_id, group_id, reasons} of each; a group's: {group_id, request_ids, reasons}
    groups_quarantined: int = 0  # held groups in trainer.max_batch_failures batches that crashed the trainer
    scores_requeued: int = 0  # in flight on a reward worker that died; scored again
    workers_lost: Counter = field(default_factory=Counter)  # by worker
    tasks_skipped: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)  # message-level rejections, by reason

    def summary(self, buffer: GroupBuffer) -> dict:
        waiting = sum(len(g.samples) for g in buffer.groups.values())
        return {
            "groups_admitted": self.groups_admitted,
            "requests_sent": self.requests_sent,
            "samples_received": self.samples_received,
            "tokens_received": self.tokens_received,
            "rewards_received": self.rewards_received,
            "reward_errors": self.reward_errors,
            "reward_sum": self.reward_sum,
            "samples_batched": self.samples_batched,
            "samples_trained": self.samples_trained,
            "batches_sent": self.batches_sent,
            "groups_dropped": self.groups_dropped,
            "samples_dropped": self.samples_dropped,
            "groups_dropped_ids": list(self.dropped_groups),
            "groups_dropped_by_reason": dict(self.groups_dropped_by_reason),
            "scores_retried": self.scores_retried,
            "batches_skipped": dict(self.batches_skipped),
            "eval_requests_sent": self.eval_requests_sent,
            "eval_samples_received": self.eval_samples_received,
            "eval_rewards_received": self.eval_rewards_received,
            "episodes_failed": self.episodes_failed,
            "episodes_discarded": self.episodes_discarded,
            "episodes_withdrawn": self.episodes_withdrawn,
            "samples_in_buffer": waiting,
            "requests_in_flight": self.requests_sent - self.samples_received - self.episodes_discarded - self.episodes_failed
            - self.requests_quarantined,
            "requests_requeued": self.requests_requeued,
            "requests_failed": self.requests_failed,
            "requests_retried": self.requests_retried,
            "requests_quarantined": self.requests_quarantined,
            "eval_requests_quarantined": self.eval_requests_quarantined,
            "quarantined": list(self.quarantined),
            "scores_requeued": self.scores_requeued,
            "workers_lost": dict(self.workers_lost),
            "tasks_skipped": dict(self.tasks_skipped),
            "rejected": dict(self.rejected),
        }
