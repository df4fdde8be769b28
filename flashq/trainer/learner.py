"""The trainer's model and one GRPO optimizer step on a `TrainBatch`.

A batch arrives as flat arrays (see `protocol.TrainBatch`); here it becomes padded
[sequences, tokens] tensors, logprobs of the sampled tokens under the current policy, group
advantages, and a loss with the off-policy correction from `algos.grpo`.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from flashq.algos.grpo import group_advantages, policy_loss
from flashq.config import FlashqConfig
from flashq.protocol import TrainBatch


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device is 'cuda' but no CUDA device is visible")
    return torch.device(requested)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """logp[i, t] = log pi(input_ids[i, t+1] | input_ids[i, :t+1]), shape [B, T-1]."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


class Learner:
    def __init__(self, cfg: FlashqConfig, model_path: Path | str):
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        tc = cfg.trainer
        self.device = pick_device(tc.device)
        if self.device.type == "cpu":
            torch.set_num_threads(tc.threads)
        torch.manual_seed(tc.seed)
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.model.dtype]
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(self.device)
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
        self.version = 0
        self.temperature = cfg.sampling.temperature or 1.0

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        if batch.batch_index != self.version:
            raise RuntimeError(f"batch {batch.batch_index} arrived at trainer version {self.version}")
        t0 = time.monotonic()
        lc = self.cfg.trainer.loss
        rewards = torch.from_numpy(np.array(batch.rewards))
        groups = torch.from_numpy(np.array(batch.group_index, dtype=np.int64))
        adv = group_advantages(rewards, groups, normalize_std=lc.normalize_std)
        n_seq = len(batch.request_ids)
        resp_lens = np.diff(batch.response_offsets)
        normalizer = float(max(resp_lens.sum(), 1)) if lc.aggregation == "token_mean" else float(max(n_seq, 1))

        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        loss_sum = 0.0
        for chunk in self._micro_batches(batch):
            ids, attn, mask, behav, seq_adv = self._tensors(batch, chunk, adv)
            logp = token_logprobs(self.model, ids, attn, self.temperature)
            loss, stats = policy_loss(
                logp,
                logp.detach(),
                behav,
                seq_adv[:, None].expand_as(logp),
                mask,
                clip_eps=lc.clip_eps,
                is_correction=lc.is_correction,
                is_cap=lc.is_cap,
                aggregation=lc.aggregation,
                normalizer=normalizer,
            )
            loss.backward()
            loss_sum += loss.item()
            weight = float(mask.sum()) / max(float(resp_lens.sum()), 1.0)
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v * weight
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.trainer.grad_clip)
        if not torch.isfinite(grad_norm):
            raise FloatingPointError(f"non-finite gradient norm at step {self.version + 1}; the step was not applied")
        self.optimizer.step()
        self.version += 1

        staleness = (batch.batch_index - np.asarray(batch.versions, dtype=np.int64))
        bound = self.cfg.staleness_bound
        hist = np.bincount(np.clip(staleness, 0, bound + 1), minlength=bound + 2)
        return {
            "loss": loss_sum,
            "grad_norm": float(grad_norm),
            "reward/mean": float(rewards.mean()) if n_seq else 0.0,
            "reward/std": float(rewards.std()) if n_seq > 1 else 0.0,
            "response/mean_tokens": float(resp_lens.mean()) if n_seq else 0.0,
            "response/max_tokens": float(resp_lens.max()) if n_seq else 0.0,
            "response/truncated_frac": float(np.mean([f == "length" for f in batch.finish_reasons])) if n_seq else 0.0,
            "staleness/max": float(staleness.max()) if len(staleness) else 0.0,
            "staleness/mean": float(staleness.mean()) if len(staleness) else 0.0,
            "staleness/violations": float((staleness > bound).sum() + (staleness < 0).sum()),
            "hist/staleness": [int(c) for c in hist[: bound + 1]] + ([int(hist[bound + 1])] if hist[bound + 1] else []),
            "train/seconds": time.monotonic() - t0,
            "train/sequences": float(n_seq),
            "train/tokens": float(resp_lens.sum()),
            **{f"loss/{k}": v for k, v in totals.items()},
        }

    def _micro_batches(self, batch: TrainBatch) -> list[np.ndarray]:
        """Sequence index chunks whose padded size stays under trainer.micro_batch_tokens."""
        lens = np.diff(batch.prompt_offsets) + np.diff(batch.response_offsets)
        budget = self.cfg.trainer.micro_batch_tokens
        order = np.argsort(lens, kind="stable")
        chunks, current, longest = [], [], 0
        for i in order:
            longest_if = max(longest, int(lens[i]))
            if current and longest_if * (len(current) + 1) > budget:
                chunks.append(np.array(current))
                current, longest_if = [], int(lens[i])
            current.append(int(i))
            longest = longest_if
        if current:
            chunks.append(np.array(current))
        return chunks

    def _tensors(self, batch: TrainBatch, idx: np.ndarray, adv: torch.Tensor):
        seqs, masks, behavs = [], [], []
        for i in idx:
            p = batch.prompt_ids[batch.prompt_offsets[i] : batch.prompt_offsets[i + 1]]
            r = batch.response_ids[batch.response_offsets[i] : batch.response_offsets[i + 1]]
            lp = batch.logprobs[batch.response_offsets[i] : batch.response_offsets[i + 1]]
            seqs.append(np.concatenate([p, r]))
            # position t of the [T-1] logprob row predicts token t+1: the response starts at len(p)-1
            m = np.zeros(len(p) + len(r) - 1, np.float32)
            m[len(p) - 1 :] = 1
            masks.append(m)
            b = np.zeros(len(p) + len(r) - 1, np.float32)
            b[len(p) - 1 :] = lp
            behavs.append(b)
        T = max(len(s) for s in seqs)
        ids = np.zeros((len(seqs), T), np.int64)
        attn = np.zeros((len(seqs), T), np.int64)
        mask = np.zeros((len(seqs), T - 1), np.float32)
        behav = np.zeros((len(seqs), T - 1), np.float32)
        for j, s in enumerate(seqs):
            ids[j, : len(s)] = s
            attn[j, : len(s)] = 1
            mask[j, : len(masks[j])] = masks[j]
            behav[j, : len(behavs[j])] = behavs[j]
        dev = self.device
        return (
            torch.from_numpy(ids).to(dev),
            torch.from_numpy(attn).to(dev),
            torch.from_numpy(mask).to(dev),
            torch.from_numpy(behav).to(dev),
            adv[torch.from_numpy(idx)].to(dev),
        )
