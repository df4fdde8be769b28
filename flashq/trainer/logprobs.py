"""Log-probabilities of sampled tokens without holding [tokens x vocab] float32 logits.

The plain way (`model(...).logits.float().log_softmax(-1)`) keeps a micro-batch's logits in float32
for every position, prompt included, two or three times over (the logits, the log-softmax saved for
backward, its gradient): at Qwen2.5's 151,936-token vocabulary and 16k tokens that is 10 GB each.
Here the model's `lm_head` is replaced by a `LogprobHead` holding the same weight (tied embeddings
stay tied, checkpoint names do not change). While a request is bound to it, the head projects only
the positions the loss reads, `chunk_tokens` rows at a time; each chunk runs under activation
checkpointing, so its logits are freed at once and recomputed, one chunk at a time, in backward.
Logits that would take at most `keep_logits_bytes` are kept for backward instead: recomputing
them only costs time (on the quickstart's tiny model the recompute and checkpoint machinery were
8% of the trainer's CPU). The entropy of each token's distribution comes from the same chunk
logits, without a gradient.

The head runs inside the model's own forward, so FSDP's hooks gather and free its weight as usual.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

KEEP_LOGITS_BYTES = 64 << 20  # a request's float32 logits up to this size are kept, not recomputed


@dataclass
class _Request:
    select: torch.Tensor  # [B, T] bool: hidden positions whose next token the loss reads
    targets: torch.Tensor  # [N] the next token at each selected position
    temperature: float
    banned: torch.Tensor | None  # token ids the sampler masked at every selected position
    repeat: torch.Tensor | None = None  # [N] selected row of each target (rows shared by several targets)


def _at_least_float32(logits: torch.Tensor) -> torch.Tensor:
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _chunk(hidden, weight, bias, targets, temperature: float, banned):
    """(log p of each target, entropy) for one chunk of positions, in float32 (or float64)."""
    logits = _at_least_float32(F.linear(hidden, weight, bias))
    if temperature != 1.0:
        logits = logits / temperature
    if banned is not None:
        logits = logits.index_fill(-1, banned, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    with torch.no_grad():
        p = torch.exp(logits - lse[:, None])
        entropy = lse - torch.where(p > 0, p * logits, torch.zeros_like(p)).sum(-1)
    return logp, entropy


class LogprobHead(torch.nn.Module):
    """A causal LM's output projection that, while a request is bound, returns [2, N]: the
    log-probability of each selected position's next token and its distribution's entropy.
    Unbound, it is the ordinary projection (generation, SFT, plain logits)."""

    def __init__(self, lm_head: torch.nn.Linear, chunk_tokens: int):
        super().__init__()
        self.weight = lm_head.weight
        self.bias = lm_head.bias
        self.chunk_tokens = chunk_tokens
        self.keep_logits_bytes = KEEP_LOGITS_BYTES
        self.request: _Request | None = None

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        req = self.request
        if req is None:
            return F.linear(hidden, self.weight, self.bias)
        rows = hidden[req.select]
        if req.repeat is not None:
            rows = rows[req.repeat]
        targets = req.targets
        if not len(rows):  # keep the graph connected (FSDP ranks must all run backward)
            rows, targets = hidden[:1, 0], targets.new_zeros(1)
        if len(rows) * self.out_features * max(4, self.weight.element_size()) <= self.keep_logits_bytes:
            return torch.stack(_chunk(rows, self.weight, self.bias, targets, req.temperature, req.banned))
        parts = [
            checkpoint(
                _chunk, rows[i : i + self.chunk_tokens], self.weight, self.bias, targets[i : i + self.chunk_tokens],
                req.temperature, req.banned, use_reentrant=False,
            )
            for i in range(0, len(rows), self.chunk_tokens)
        ]
        return torch.stack([torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])])

    @contextmanager
    def bound(self, request: _Request):
        self.request = request
        try:
            yield
        finally:
            self.request = None


def install_logprob_head(model: torch.nn.Module, chunk_tokens: int) -> LogprobHead:
    """Replace `model.lm_head` by a `LogprobHead` over the same parameters (before sharding)."""
    if getattr(model.config, "final_logit_softcapping", None):
        raise ValueError(f"{type(model).__name__} caps its logits; flashq's logprob head does not reproduce that")
    old = model.get_output_embeddings()
    if isinstance(old, LogprobHead):
        old.chunk_tokens = chunk_tokens
        return old
    if not isinstance(old, torch.nn.Linear):
        raise ValueError(f"{type(model).__name__}: expected a Linear output projection, got {type(old).__name__}")
    head = LogprobHead(old, chunk_tokens)
    model.set_output_embeddings(head)
    return head


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    select: torch.Tensor | None = None,
    banned: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logp[i, t] = log pi(input_ids[i, t+1] | input_ids[i, :t+1]) and the entropy of that
    distribution, both [B, T-1] float32 (float64 for a float64 model), computed where `select`
    ([B, T-1] bool; default: every real token) is true and 0 elsewhere. Packed rows (several
    sequences one after another) pass `attention_mask=None` and `position_ids` restarting at 0
    for each sequence. `model` must carry a `LogprobHead`."""
    head = model.get_output_embeddings()
    if not isinstance(head, LogprobHead):
        raise TypeError("token_logprobs needs install_logprob_head(model, ...) first")
    if select is None:
        if attention_mask is None:
            raise ValueError("packed rows (no attention mask) need `select`")
        select = attention_mask[:, 1:].bool()
    select = select.bool()
    hidden_select = F.pad(select, (0, 1), value=False)
    request = _Request(hidden_select, input_ids[:, 1:][select], temperature or 1.0, banned)
    with head.bound(request):
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False).logits
    zeros = torch.zeros(select.shape, dtype=out.dtype, device=input_ids.device)
    return zeros.masked_scatter(select, out[0]), zeros.masked_scatter(select, out[1].detach())


def naive_token_logprobs(model, input_ids, attention_mask, temperature: float, banned: torch.Tensor | None = None):
    """The reference: full float32 logits at every position ([B, T-1] logp and entropy)."""
    logits = _at_least_float32(model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1])
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    if banned is not None:
        logits = logits.index_fill(-1, banned, float("-inf"))
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    p = logp_all.exp()
    entropy = -torch.where(p > 0, p * logp_all, torch.zeros_like(p)).sum(-1)
    return logp, entropy.detach()
