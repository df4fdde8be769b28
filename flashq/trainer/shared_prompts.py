"""Each prompt's forward pass once per group, not once per sample.

GRPO samples n responses per prompt, and the plain layout (one [prompt + response] row per
sample) runs every layer n times over the same prompt. Here a micro-batch runs in two passes:
the distinct prompts alone ([prompts, P], keeping their keys and values), then every response
([samples, R]) attending to its prompt's cached keys and values, repeated once per sample (the
gradient of every copy flows back into the one prompt pass). The first response token's logprob
comes from the prompt pass's last position, shared by the group. On the quickstart (24-token
prompts, 3-token answers, 8 samples a prompt) the forward computes 4x fewer tokens.

Prompts are right-padded: a pad position then still attends to the real prompt before it, so no
attention row is fully masked (sdpa turns a fully masked row into NaN, which 0-weight attention
still spreads). Response positions continue from each prompt's own length.

The second pass needs the model's KV cache while training, which transformers drops under
gradient checkpointing; `check_sharing` compares both layouts on the model at start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from flashq.trainer.logprobs import LogprobHead, _Request


@dataclass
class SharedPromptRows:
    prompt_ids: torch.Tensor  # [G, P] the distinct prompts, right-padded
    prompt_attn: torch.Tensor  # [G, P]
    prompt_last: torch.Tensor  # [G, P] bool: each prompt's last real position
    prompt_of: torch.Tensor  # [S] each sequence's row in prompt_ids
    response_ids: torch.Tensor  # [S, R] right-padded (R >= 1)
    response_attn: torch.Tensor  # [S, R]
    positions: torch.Tensor  # [S, R] position ids: the prompt's length + t

    @property
    def computed_tokens(self) -> int:
        return int(self.prompt_ids.numel() + self.response_ids.numel())


def distinct_prompts(prompts: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """The distinct prompts in order of first appearance, and each sequence's index among them."""
    first: dict[bytes, int] = {}
    prompt_of = np.array([first.setdefault(p.astype(np.int64).tobytes(), len(first)) for p in prompts], np.int64)
    unique = [None] * len(first)
    for p, k in zip(prompts, prompt_of):
        unique[k] = p
    return unique, prompt_of


def layout(prompts: list[np.ndarray], responses: list[np.ndarray], device: torch.device) -> SharedPromptRows:
    unique, prompt_of = distinct_prompts(prompts)
    p_len = np.array([len(p) for p in unique])
    r_len = np.array([len(r) for r in responses])
    if p_len.min() < 1:
        raise ValueError("a sequence with an empty prompt cannot share a prompt pass")
    P, R = int(p_len.max()), max(int(r_len.max()), 1)
    prompt_ids = np.zeros((len(unique), P), np.int64)
    prompt_attn = np.zeros((len(unique), P), np.int64)
    prompt_last = np.zeros((len(unique), P), bool)
    for g, p in enumerate(unique):
        prompt_ids[g, : len(p)] = p
        prompt_attn[g, : len(p)] = 1
        prompt_last[g, len(p) - 1] = True
    response_ids = np.zeros((len(responses), R), np.int64)
    response_attn = np.zeros((len(responses), R), np.int64)
    for i, r in enumerate(responses):
        response_ids[i, : len(r)] = r
        response_attn[i, : len(r)] = 1
    positions = p_len[prompt_of][:, None] + np.arange(R)[None]
    t = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    return SharedPromptRows(t(prompt_ids), t(prompt_attn), t(prompt_last), t(prompt_of), t(response_ids), t(response_attn), t(positions))


def shared_token_logprobs(
    model: torch.nn.Module,
    rows: SharedPromptRows,
    select: torch.Tensor,
    temperature: float,
    banned: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logp[i, t] = log pi(response token t of sequence i | its prompt and tokens before t) and
    the entropy there, both [S, R], where `select` ([S, R] bool) is true and 0 elsewhere."""
    head = model.get_output_embeddings()
    if not isinstance(head, LogprobHead):
        raise TypeError("shared_token_logprobs needs install_logprob_head(model, ...) first")
    select = select.bool() & rows.response_attn.bool()
    first = select[:, 0]
    temperature = temperature or 1.0
    # pass 1: the prompts; each prompt's last position predicts the first token of its responses
    opening = _Request(rows.prompt_last, rows.response_ids[first, 0], temperature, banned, repeat=rows.prompt_of[first])
    with head.bound(opening):
        out = model(input_ids=rows.prompt_ids, attention_mask=rows.prompt_attn, use_cache=True)
    cache = out.past_key_values
    if cache is None:
        raise RuntimeError(f"{type(model).__name__} returned no KV cache (gradient checkpointing turns it off)")
    cache.reorder_cache(rows.prompt_of)  # one copy of the prompt's keys and values per sequence
    # pass 2: the responses; position t predicts token t + 1
    rest = select[:, 1:]
    following = _Request(F.pad(rest, (0, 1), value=False), rows.response_ids[:, 1:][rest], temperature, banned)
    attn = torch.cat([rows.prompt_attn[rows.prompt_of], rows.response_attn], dim=1)
    with head.bound(following):
        out2 = model(input_ids=rows.response_ids, attention_mask=attn, position_ids=rows.positions, past_key_values=cache, use_cache=True)
    col = torch.zeros(first.shape, dtype=out.logits.dtype, device=select.device)
    tail = torch.zeros(rest.shape, dtype=out2.logits.dtype, device=select.device)
    logp = torch.cat([col.masked_scatter(first, out.logits[0])[:, None], tail.masked_scatter(rest, out2.logits[0])], dim=1)
    entropy = torch.cat([col.masked_scatter(first, out.logits[1].detach())[:, None], tail.masked_scatter(rest, out2.logits[1].detach())], dim=1)
    return logp, entropy


def unsupported(config) -> str | None:
    """Why a model's attention cannot share prompt passes laid out this way, or None. A sliding
    window measures distance in padded positions and its cache keeps only the window's tail,
    so a shorter prompt's responses would lose part of it; a rope scaled by the sequence length
    sees the two passes' lengths, not the sequence's. Neither shows on the short probe of
    `check_sharing`."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        other = sorted({t for t in layer_types if t != "full_attention"})
        if other:
            return f"its {', '.join(other)} layers measure distance in padded positions"
    elif getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "its sliding-window attention measures distance in padded positions"
    rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None)
    kind = (rope.get("rope_type") or rope.get("type")) if isinstance(rope, dict) else None
    if kind in ("dynamic", "longrope"):
        return f"its rope ({kind}) depends on the sequence length"
    return None


def check_sharing(model: torch.nn.Module, logprobs, vocab: int, device: torch.device) -> float:
    """The largest gap between logprobs computed with shared prompt passes and as whole rows
    (`logprobs(ids, attn)` -> [B, T-1]): a model whose cache or masks do not work this way
    shows it here."""
    g = torch.Generator().manual_seed(0)
    rand = lambda n: torch.randint(1, vocab, (n,), generator=g).numpy()  # noqa: E731
    short, long = rand(4), rand(7)
    prompts = [short, long, short]
    responses = [rand(3), rand(2), rand(5)]
    rows = layout(prompts, responses, device)
    with torch.no_grad():
        shared = shared_token_logprobs(model, rows, rows.response_attn.bool(), 1.0)[0]
        gap = 0.0
        for i, (p, r) in enumerate(zip(prompts, responses)):
            ids = torch.from_numpy(np.concatenate([p, r])[None]).long().to(device)
            whole = logprobs(ids, torch.ones_like(ids))[0, len(p) - 1 :]
            gap = max(gap, float((whole - shared[i, : len(r)]).abs().max()))
    return gap
