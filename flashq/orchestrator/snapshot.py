"""The coordinator's half of a checkpoint (flashq.checkpoint): what the orchestrator saves at a
step boundary and how it resumes from it.

A part of `Orchestrator` (flashq.orchestrator.core).
"""

from __future__ import annotations

from collections import Counter

from flashq.buffer import Group
from flashq.checkpoint import STATE_SCHEMA, GroupState, OrchestratorState
from flashq.staleness import Admission
from flashq.wire.protocol import ScoreRequest


class Snapshots:
    def snapshot(self, version: int) -> OrchestratorState:
        """State at the moment the trainer reached `version`: groups batched for later steps
        (possibly already at the trainer) count as not trained."""
        groups = list(self.buffer.groups.values())
        for index in sorted(self.batch_groups):
            if index >= version:
                groups += self.batch_groups[index]
        return OrchestratorState(
            schema=STATE_SCHEMA,
            version=version,
            next_task=self.next_task,
            next_group=self.next_group,
            admitted=self.gate.admitted,
            groups=[
                GroupState(
                    group_id=g.admission.group_id,
                    task=g.task,
                    prompt_ids=g.prompt_ids,
                    size=g.size,
                    admitted_version=g.admission.version,
                    deadline=g.admission.deadline,
                    samples=list(g.samples.values()),
                    rewards=list(g.rewards.values()),
                )
                for g in groups
            ],
            # not dataclasses.asdict: it rebuilds a Counter from its items, turning (key, count) into keys
            ledger={k: dict(v) if isinstance(v, Counter) else v for k, v in vars(self.ledger).items()},
        )

    def restore(self, state: OrchestratorState) -> None:
        """Continue from a snapshot: reuse every sample and score it holds, generate again what
        was in flight, score again what was not scored. Generation waits for the engines to
        be given the checkpoint's weights (`on_weights_served(state.version)`)."""
        self.next_task, self.next_group = state.next_task, state.next_group
        self.engine_version = self.trained_version = state.version
        self.generation_paused = True
        self.gate.admitted = state.admitted
        self.gate.next_batch = state.version
        for key, value in state.ledger.items():
            setattr(self.ledger, key, Counter(value) if isinstance(value, dict) else value)
        self.ledger.samples_batched = self.ledger.samples_trained
        self.ledger.batches_sent = state.version
        self.ledger.requests_sent = self.ledger.samples_received + self.ledger.episodes_discarded + self.ledger.episodes_failed
        for gs in state.groups:
            admission = Admission(gs.group_id, gs.admitted_version, gs.deadline)
            group = Group(task=gs.task, prompt_ids=gs.prompt_ids, size=gs.size, admission=admission)
            group.samples = {s.request_id: s for s in gs.samples}
            group.rewards = {r.request_id: r for r in gs.rewards}
            self.buffer.add_group(group)
            self.gate.pending[gs.group_id] = gs.deadline
            if group.complete:
                self.buffer.complete.add(gs.group_id)
            if self.episodes is not None:  # episodes: start afresh what the group still needs
                self.episodes.resume(gs.group_id, gs.size, [s.request_id for s in gs.samples])
                for rid in self.episodes.replacements(gs.group_id):
                    self.gen_queue.submit(self._episode_request(gs.group_id, rid, gs.task))
                continue
            self.lengths.add_group(gs.group_id, gs.prompt_ids)
            for sample in gs.samples:
                self.lengths.observe(gs.group_id, len(sample.token_ids), finished=True)
            for k in range(gs.size):
                rid = f"{gs.group_id}/{k}"
                if rid not in group.samples:
                    self.gen_queue.submit(self._request(gs.group_id, k, gs.prompt_ids))
                elif rid not in group.rewards:
                    self.score_queue.submit(ScoreRequest(sample=group.samples[rid], task=group.task))
