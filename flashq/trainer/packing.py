"""Padding-free micro-batches: sequences packed one after another into rows.

A padded micro-batch computes every layer on pad tokens: with response lengths from 5 to 500
tokens, most of it can be padding. Packed, a row holds several sequences, each with position ids
that restart at 0; transformers' attention then keeps each sequence to itself (its masks split a
row where the position ids restart; flash-attention, sdpa and eager all honour it), so only the
model's forward sees rows. Everything after it (the loss, the corrections, the per-sequence
reductions) keeps one row per sequence: `unpack` maps the logprobs back.

Rows are as long as the longest sequence of the minibatch (first-fit decreasing), so no attention
span grows beyond what the padded layout had; but where the attention kernel is not varlen
(sdpa, eager: it computes a whole row and masks it) a row of short sequences costs attention over
the row's length, which is why packing is not on by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def first_fit_rows(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Positions into `lengths`, grouped into rows of at most `capacity` tokens (longest first,
    each into the first row it fits)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for j in np.argsort(-np.asarray(lengths), kind="stable"):
        size = int(lengths[j])
        if size > capacity:
            raise ValueError(f"a sequence of {size} tokens does not fit rows of {capacity}")
        for r, free in enumerate(room):
            if free >= size:
                rows[r].append(int(j))
                room[r] -= size
                break
        else:
            rows.append([int(j)])
            room.append(capacity - size)
    return rows


@dataclass
class PackedRows:
    ids: torch.Tensor  # [R, C] the sequences one after another, 0 after the last
    positions: torch.Tensor  # [R, C] restarting at 0 for each sequence (and for the tail)
    select: torch.Tensor  # [R, C-1] bool: positions whose next token the loss reads
    index: torch.Tensor  # [S, T-1] flat index into [R, C-1] of each sequence position, -1 for none

    @property
    def computed_tokens(self) -> int:
        return int(self.ids.numel())


def pack(seqs: list[np.ndarray], mask: np.ndarray, device: torch.device, capacity: int = 0) -> PackedRows:
    """`seqs`: each sequence's token ids; `mask`: [S, T-1] (T the longest), nonzero where the
    loss reads the logprob of position t+1; rows of `capacity` tokens (default: the longest)."""
    lengths = np.array([len(s) for s in seqs])
    capacity = max(capacity, int(lengths.max()))
    rows = first_fit_rows(lengths, capacity)
    ids = np.zeros((len(rows), capacity), np.int64)
    positions = np.zeros((len(rows), capacity), np.int64)
    select = np.zeros((len(rows), capacity - 1), bool)
    index = np.full(mask.shape, -1, np.int64)
    for r, row in enumerate(rows):
        offset = 0
        for j in row:
            n = int(lengths[j])
            ids[r, offset : offset + n] = seqs[j]
            positions[r, offset : offset + n] = np.arange(n)
            # position t of sequence j predicts its token t+1: packed position offset + t
            index[j, : n - 1] = r * (capacity - 1) + offset + np.arange(n - 1)
            select[r, offset : offset + n - 1] = mask[j, : n - 1] > 0
            offset += n
        positions[r, offset:] = np.arange(capacity - offset)  # the tail: a sequence of its own
    as_tensor = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    return PackedRows(as_tensor(ids), as_tensor(positions), as_tensor(select), as_tensor(index))


def unpack(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[R, C-1] packed values -> [S, T-1] one row per sequence (0 where `index` is -1)."""
    flat = values.reshape(-1)[index.clamp(min=0)]
    return torch.where(index >= 0, flat, torch.zeros_like(flat))


def check_isolation(model: torch.nn.Module, logprobs, vocab: int, device: torch.device) -> float:
    """The largest gap between two sequences' logprobs computed packed in one row and computed
    apart: a model whose attention ignores packed position ids lets them see each other."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randint(1, vocab, (n,), generator=g).numpy() for n in (6, 9))
    mask = np.ones((2, 8), np.float32)
    mask[0, 5:] = 0
    packed = pack([a, b], mask, device, capacity=len(a) + len(b))  # one row: b after a
    with torch.no_grad():
        together = unpack(logprobs(packed.ids, None, packed.select, packed.positions), packed.index)
        apart = [logprobs(torch.tensor(s[None]).to(device), torch.ones(1, len(s), dtype=torch.long, device=device), None, None)[0]
                 for s in (a, b)]
    return max(float((together[0, :5] - apart[0][:5]).abs().max()), float((together[1] - apart[1]).abs().max()))
