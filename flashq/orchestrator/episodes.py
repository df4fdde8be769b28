"""Environment episodes in the orchestrator (`env` configs): the environment writes each prompt
and gives each reward in the rollout worker, so a group's episodes skip the reward workers;
`RedundantGroups` decides which to keep, discard, replace or cancel.

A part of `Orchestrator` (flashq.orchestrator.core), kept apart because plain generation never
takes this path.
"""

from __future__ import annotations

import logging

import numpy as np

from flashq.buffer import Group
from flashq.wire.protocol import Cancel, EpisodeRequest, RewardResult, Sample

log = logging.getLogger("flashq.orchestrator")


def episode_failed(sample: Sample) -> bool:
    """An episode that raised, was cut off, or ended without the environment's reward."""
    return sample.finish_reason in ("error", "abort") or sample.env_reward is None


class EpisodeEvents:
    def _admit_episodes(self, task: dict) -> None:
        gid = f"g{self.next_group}"
        self.next_group += 1
        task = {**task, "seed": task.get("seed", (self.cfg.task.seed * 1_000_003 + self.next_task - 1) % 2**31)}
        admission = self.gate.admit(gid, self.engine_version)
        n = self.cfg.sampling.group_size
        self.buffer.add_group(Group(task=task, prompt_ids=np.zeros(0, np.int32), size=n, admission=admission))
        self.ledger.groups_admitted += 1
        for rid in self.episodes.start(gid, n):
            self.gen_queue.submit(self._episode_request(gid, rid, task))

    def _episode_request(self, gid: str, rid: str, task: dict) -> EpisodeRequest:
        s = self.cfg.sampling
        return EpisodeRequest(request_id=rid, group_id=gid, task=task, seed=int(task["seed"]), max_tokens=s.max_tokens,
                              temperature=s.temperature, top_p=s.top_p)

    def _on_episode(self, worker: str, sample: Sample) -> None:
        """An episode's sample: keep it (the environment scored it), or discard it (its group is
        full), or replace it (it failed); once the group is full, cancel its other episodes."""
        gid, rid = sample.group_id, sample.request_id
        cancelled = rid in self.cancelled
        self.cancelled.discard(rid)
        failed = not cancelled and episode_failed(sample)
        verdict = self.episodes.on_result(gid, rid, failed)
        if verdict == "failed":
            self.ledger.episodes_failed += 1
            log.warning("episode %s on %s failed: %s", rid, worker, sample.error or sample.finish_reason)
            if self.cfg.env.on_failure == "fail":
                raise RuntimeError(f"episode {rid} failed ({sample.error or sample.finish_reason}) and env.on_failure is 'fail'")
            for new in self.episodes.replacements(gid):
                self.gen_queue.submit(self._episode_request(gid, new, self.buffer.groups[gid].task))
        elif verdict == "discard":
            self.ledger.episodes_discarded += 1
        else:
            group = self.buffer.add_sample(sample)
            self.ledger.samples_received += 1
            self.ledger.tokens_received += len(sample.token_ids)
            self.finished_requests.append({
                "request_id": rid, "admitted_version": group.admission.version, "worker": worker,
                "sent": self.request_sent_at.pop(rid, None), "finished": self.clock(), "tokens": len(sample.token_ids),
                "turns": sample.turns, "env_s": sample.env_seconds,
            })
            group = self.buffer.add_reward(gid, RewardResult(rid, float(sample.env_reward)))
            self.ledger.rewards_received += 1
            self.ledger.reward_sum += float(sample.env_reward)
            if self.episodes.is_full(gid):
                for withdrawn in self.gen_queue.withdraw(gid):
                    self.episodes.on_result(gid, withdrawn.request_id, failed=False)
                    self.ledger.episodes_withdrawn += 1
                by_worker: dict[str, list[str]] = {}
                for other in self.episodes.to_cancel(gid):
                    by_worker.setdefault(self.request_worker[other], []).append(other)
                for w, ids in by_worker.items():
                    self.cancelled.update(ids)
                    self.outbox.append((w, Cancel(ids, reason=f"group {gid} is full")))
            if group.complete:
                self._on_group_complete(group)
        self.request_sent_at.pop(rid, None)
        if self.episodes.finished(gid):
            self.gen_queue.forget(gid)

    def _on_eval_episode(self, sample: Sample) -> None:
        """A held-out episode: its environment's reward is its score (no reward worker); one that
        failed is lost to its round rather than scored 0."""
        rid, gid = sample.request_id, sample.group_id
        self.ledger.eval_samples_received += 1
        self.request_sent_at.pop(rid, None)
        if episode_failed(sample):
            log.warning("evaluation episode %s failed: %s", rid, sample.error or sample.finish_reason)
            record, prompt_done = self.evaluator.on_lost(rid)
        else:
            _, prompt_done = self.evaluator.on_sample(sample)
            self.ledger.eval_rewards_received += 1
            record = self.evaluator.on_reward(RewardResult(rid, float(sample.env_reward)))
        if prompt_done:
            self._generation_done(gid)
        self._file_eval(record)
