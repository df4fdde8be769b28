"""How one batch is laid out for the forward passes: minibatches (one optimizer step each),
each rank's share of them, and micro-batches (split by length so that one long response does
not pad every row) that keep the tokens a forward computes under `trainer.micro_batch_tokens`,
as padded rows, packed rows or shared prompt passes.

A part of `Learner` (flashq.trainer.learner).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from flashq.trainer import parallel
from flashq.trainer.packing import PackedRows, first_fit_rows, pack
from flashq.trainer.shared_prompts import SharedPromptRows, distinct_prompts, layout
from flashq.wire.protocol import TrainBatch


@dataclass
class MicroBatch:
    """One row per sequence for the loss; the forward runs on `packed` rows when packing, and
    on `shared` prompt and response passes when prompts are shared (then the loss's rows hold
    the responses alone: [S, R], column t for response token t)."""

    ids: torch.Tensor | None  # [S, T] padded (None when packed or shared)
    attn: torch.Tensor | None
    mask: torch.Tensor  # [S, T-1], 1 on response tokens
    behav: torch.Tensor  # behaviour logprobs, aligned with mask
    adv: torch.Tensor  # [S]
    tokens: int  # real tokens the forward computes (prompts and responses)
    packed: PackedRows | None = None
    prox: torch.Tensor | None = None
    ref: torch.Tensor | None = None
    shared: SharedPromptRows | None = None

    @property
    def computed_tokens(self) -> int:
        if self.shared is not None:
            return self.shared.computed_tokens
        return self.packed.computed_tokens if self.packed is not None else int(self.ids.numel())


DEFAULT_OVERHEAD_TOKENS = {"cpu": 128, "cuda": 2048}  # trainer.micro_batch_overhead_tokens: None


class MicroBatching:
    @property
    def micro_batch_overhead_tokens(self) -> int:
        configured = self.cfg.trainer.micro_batch_overhead_tokens
        return configured if configured is not None else DEFAULT_OVERHEAD_TOKENS.get(self.device.type, 128)

    def _minibatches(self, n_seq: int) -> list[np.ndarray]:
        k = min(self.cfg.trainer.minibatches, max(n_seq, 1))
        return [part for part in np.array_split(np.arange(n_seq), k) if len(part)]

    def _rank_micro_batches(self, batch: TrainBatch, indices: np.ndarray, adv: torch.Tensor) -> list[MicroBatch]:
        """This rank's micro-batches of a minibatch. Every rank runs the same number of forward
        and backward passes (FSDP's collectives pair up), so a rank with fewer pads with a
        micro-batch whose loss mask is empty."""
        lens = np.diff(batch.prompt_offsets) + np.diff(batch.response_offsets)
        if not self.ranks.sharded:
            return [self._micro(batch, chunk, adv, int(lens[indices].max())) for chunk in self._micro_batches(batch, indices)]
        prompt_of = None
        if self.share_prompts:
            _, prompt_of = distinct_prompts([batch.prompt_ids[batch.prompt_offsets[i] : batch.prompt_offsets[i + 1]] for i in indices])
        if prompt_of is not None and prompt_of.max() + 1 >= self.ranks.world_size:
            # a prompt's sequences stay on one rank, which computes the prompt once (with fewer
            # prompts than ranks, sequences are spread instead, so that no rank only pads)
            units = [indices[prompt_of == k] for k in range(prompt_of.max() + 1)]
            r_lens = np.diff(batch.response_offsets)
            cost = np.array([lens[u[0]] + (len(u) - 1) * r_lens[u].max() for u in units])
            per_rank = [np.sort(np.concatenate([units[k] for k in share] or [np.zeros(0, np.int64)]))
                        for share in parallel.shares(np.arange(len(units)), cost, self.ranks.world_size)]
        else:
            per_rank = parallel.shares(indices, lens[indices], self.ranks.world_size)
        chunks = [self._micro_batches(batch, share) if len(share) else [] for share in per_rank]
        mine = per_rank[self.ranks.rank]
        micros = [self._micro(batch, chunk, adv, int(lens[mine].max())) for chunk in chunks[self.ranks.rank]]
        while len(micros) < max(len(c) for c in chunks):
            pad = self._micro(batch, indices[:1], adv)
            pad.mask.zero_()
            micros.append(pad)
        return micros

    def _micro_batches(self, batch: TrainBatch, indices: np.ndarray) -> list[np.ndarray]:
        """Chunks of `indices`, each computing at most trainer.micro_batch_tokens: padded rows
        and shared prompt passes are split by length (`length_chunks`), packed rows fill rows as
        long as the longest of `indices`, first-fit."""
        po, ro = batch.prompt_offsets, batch.response_offsets
        overhead, budget = self.micro_batch_overhead_tokens, self.cfg.trainer.micro_batch_tokens
        if self.share_prompts:
            _, prompt_of = distinct_prompts([batch.prompt_ids[po[i] : po[i + 1]] for i in indices])
            return [indices[c] for c in length_chunks(np.diff(ro)[indices], overhead, budget, np.diff(po)[indices], prompt_of)]
        lens = (np.diff(po) + np.diff(ro))[indices]
        if not self.cfg.trainer.packing:
            return [indices[c] for c in length_chunks(lens, overhead, budget)]
        capacity = int(lens.max())
        rows = first_fit_rows(lens, capacity)
        per = max(budget // capacity, 1)
        return [np.array(sorted(int(indices[j]) for row in rows[k : k + per] for j in row)) for k in range(0, len(rows), per)]

    def _micro(self, batch: TrainBatch, idx: np.ndarray, adv: torch.Tensor, capacity: int = 0) -> MicroBatch:
        """`capacity`: packed rows' length (at least the chunk's longest sequence)."""
        po, ro = batch.prompt_offsets, batch.response_offsets
        if self.share_prompts:
            return self._shared_micro(batch, idx, adv)
        seqs = [np.concatenate([batch.prompt_ids[po[i] : po[i + 1]], batch.response_ids[ro[i] : ro[i + 1]]]) for i in idx]
        T = max(len(s) for s in seqs)
        # row t of the [T-1] logprobs predicts token t+1, so a response starts at its prompt's length - 1
        mask, behav = loss_rows(batch, idx, T - 1, np.diff(po)[idx] - 1)
        dev = self.device
        ids = attn = packed = None
        if self.cfg.trainer.packing:
            packed = pack(seqs, mask, dev, max(capacity, T))
        else:
            ids_np = np.zeros((len(idx), T), np.int64)
            attn_np = np.zeros((len(idx), T), np.int64)
            for j, s in enumerate(seqs):
                ids_np[j, : len(s)] = s
                attn_np[j, : len(s)] = 1
            ids, attn = torch.from_numpy(ids_np).to(dev), torch.from_numpy(attn_np).to(dev)
        return MicroBatch(
            ids=ids,
            attn=attn,
            mask=torch.from_numpy(mask).to(dev),
            behav=torch.from_numpy(behav).to(dev),
            adv=adv[torch.from_numpy(idx)].to(dev),
            tokens=sum(len(s) for s in seqs),
            packed=packed,
        )

    def _shared_micro(self, batch: TrainBatch, idx: np.ndarray, adv: torch.Tensor) -> MicroBatch:
        po, ro = batch.prompt_offsets, batch.response_offsets
        prompts = [batch.prompt_ids[po[i] : po[i + 1]] for i in idx]
        responses = [batch.response_ids[ro[i] : ro[i + 1]] for i in idx]
        rows = layout(prompts, responses, self.device)
        mask, behav = loss_rows(batch, idx, rows.response_ids.shape[1], np.zeros(len(idx), np.int64))
        dev = self.device
        return MicroBatch(
            ids=None,
            attn=None,
            mask=torch.from_numpy(mask).to(dev),
            behav=torch.from_numpy(behav).to(dev),
            adv=adv[torch.from_numpy(idx)].to(dev),
            tokens=int(rows.prompt_attn.sum() + rows.response_attn.sum()),
            shared=rows,
        )


def loss_rows(batch: TrainBatch, idx: np.ndarray, width: int, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[S, width] loss mask and behaviour logprobs of sequences `idx`, the response of row j
    from column starts[j] (0 elsewhere)."""
    ro = batch.response_offsets
    mask = np.zeros((len(idx), width), np.float32)
    behav = np.zeros((len(idx), width), np.float32)
    for j, (i, s) in enumerate(zip(idx, starts)):
        r_len = ro[i + 1] - ro[i]
        mask[j, s : s + r_len] = batch.loss_mask[ro[i] : ro[i + 1]] if len(batch.loss_mask) else 1
        behav[j, s : s + r_len] = batch.logprobs[ro[i] : ro[i + 1]]
    return mask, behav


def length_chunks(lengths: np.ndarray, overhead: int, budget: int, prompt_lengths: np.ndarray | None = None,
                  prompt_of: np.ndarray | None = None) -> list[np.ndarray]:
    """The split of sequences into micro-batches that computes the fewest tokens, counting each
    micro-batch's fixed cost as `overhead` tokens, none over `budget` (unless one sequence is).

    Rows are padded to their micro-batch's longest, so one long response in a batch of short
    ones would make every row as long as it; sorted by length, the cheapest split into
    consecutive runs is found exactly by dynamic programming over where each run starts. A run
    costs overhead + rows x its longest; with shared prompts (`prompt_lengths`, `prompt_of`:
    each sequence's prompt), `lengths` are the responses' and a run also computes its distinct
    prompts once each, padded to its longest prompt. Returns positions into `lengths`.
    """
    order = np.argsort(lengths, kind="stable")  # ties keep batch order: a group's sequences stay neighbours
    r = lengths[order].astype(np.int64)
    n = len(r)
    if prompt_of is not None:
        p, g = prompt_lengths[order].astype(np.int64), prompt_of[order]
        last_of = np.full(int(prompt_of.max()) + 1, -1)
        is_last = np.zeros(n, np.int64)  # 1 where a sequence is the last of its prompt so far
    best, start = np.zeros(n + 1), np.zeros(n + 1, np.int64)
    for j in range(1, n + 1):  # the cheapest split of the first j, whose last run is [i, j)
        i = np.arange(j)
        tokens = (j - i) * r[j - 1]
        if prompt_of is not None:
            if last_of[g[j - 1]] >= 0:
                is_last[last_of[g[j - 1]]] = 0
            last_of[g[j - 1]], is_last[j - 1] = j - 1, 1
            distinct = np.cumsum(is_last[:j][::-1])[::-1]  # prompts whose last sequence before j is at or after i
            tokens = tokens + distinct * np.maximum.accumulate(p[:j][::-1])[::-1]
        cost = best[:j] + overhead + tokens
        cost[(tokens > budget) & (i < j - 1)] = np.inf
        k = int(np.argmin(cost))
        best[j], start[j] = cost[k], k
    chunks, j = [], n
    while j > 0:
        chunks.append(np.sort(order[start[j] : j]))
        j = start[j]
    return chunks[::-1]
