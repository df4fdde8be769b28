"""Where samples wait to become batches: scored samples gather into whole groups.

GRPO needs every sample of a prompt in the same batch (advantages are relative to the group),
so a group is trainable only when all n of its samples are generated and scored. `take` packs
chosen groups into one `TrainBatch` of flat arrays: a sequence per sample, or per segment of an
agent episode that was split (`Sample.segments`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from flashq.staleness import Admission
from flashq.wire.protocol import RewardResult, Sample, TrainBatch


@dataclass
class Group:
    task: dict
    prompt_ids: np.ndarray
    size: int
    admission: Admission
    samples: dict[str, Sample] = field(default_factory=dict)
    rewards: dict[str, RewardResult] = field(default_factory=dict)
    failed: str = ""  # why the group will be dropped when complete instead of trained
    failed_kind: str = ""  # what failed: "reward failed" or "poison request" (the ledger counts by it)
    quarantined: set[str] = field(default_factory=set)  # requests given up: they will have no sample

    def fail(self, kind: str, why: str) -> None:
        if not self.failed:
            self.failed, self.failed_kind = why[:200], kind

    @property
    def generated(self) -> bool:
        """Every request answered, or given up."""
        return len(self.samples) + len(self.quarantined) == self.size

    @property
    def complete(self) -> bool:
        return len(self.rewards) + len(self.quarantined) == self.size


class GroupBuffer:
    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.complete: set[str] = set()

    def add_group(self, group: Group) -> None:
        gid = group.admission.group_id
        if gid in self.groups:
            raise ValueError(f"group {gid} already in the buffer")
        self.groups[gid] = group

    def add_sample(self, sample: Sample) -> Group:
        group = self.groups.get(sample.group_id)
        if group is None:
            raise KeyError(f"sample {sample.request_id} for unknown group {sample.group_id}")
        if sample.request_id in group.samples:
            raise KeyError(f"duplicate sample {sample.request_id}")
        group.samples[sample.request_id] = sample
        return group

    def add_reward(self, group_id: str, result: RewardResult) -> Group:
        group = self.groups[group_id]
        if result.request_id not in group.samples:
            raise KeyError(f"reward for {result.request_id}, which has no sample")
        if result.request_id in group.rewards:
            raise KeyError(f"duplicate reward for {result.request_id}")
        group.rewards[result.request_id] = result
        if group.complete:
            self.complete.add(group_id)
        return group

    def drop(self, group_id: str) -> Group:
        self.complete.discard(group_id)
        return self.groups.pop(group_id)

    def take(self, group_ids: list[str], batch_index: int) -> tuple[TrainBatch, list[Group]]:
        groups = [self.groups.pop(g) for g in group_ids]
        self.complete.difference_update(group_ids)
        return pack_batch(groups, batch_index), groups

    def __len__(self) -> int:
        return len(self.groups)


def pack_batch(groups: list[Group], batch_index: int) -> TrainBatch:
    request_ids, group_index, rewards, finish = [], [], [], []
    prompts, responses, logprobs, versions, masks = [], [], [], [], []
    for gi, group in enumerate(groups):
        for rid in sorted(group.samples):
            s = group.samples[rid]
            mask = s.loss_mask if len(s.loss_mask) else np.ones(len(s.token_ids), np.uint8)
            for prompt, response in s.segments():  # a split episode: one sequence per segment, all under its reward
                request_ids.append(rid)
                group_index.append(gi)
                rewards.append(group.rewards[rid].reward)
                finish.append(s.finish_reason)
                prompts.append(s.prompt_ids[prompt] if len(s.prompt_ids) else group.prompt_ids)  # episodes carry their own
                masks.append(mask[response])
                responses.append(s.token_ids[response])
                logprobs.append(s.logprobs[response])
                versions.append(s.versions[response])

    def offsets(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)

    def cat(parts: list[np.ndarray], dtype) -> np.ndarray:
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

    return TrainBatch(
        batch_index=batch_index,
        request_ids=request_ids,
        group_index=np.asarray(group_index, np.int32),
        rewards=np.asarray(rewards, np.float32),
        prompt_ids=cat(prompts, np.int32),
        prompt_offsets=offsets(prompts),
        response_ids=cat(responses, np.int32),
        response_offsets=offsets(responses),
        logprobs=cat(logprobs, np.float32),
        versions=cat(versions, np.int32),
        finish_reasons=finish,
        loss_mask=cat(masks, np.uint8) if any(len(s.loss_mask) for g in groups for s in g.samples.values()) else np.zeros(0, np.uint8),
    )
