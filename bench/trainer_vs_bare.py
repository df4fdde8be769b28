"""flashq's trainer step on the real model against a bare transformers step of the same batch.

The real-model example (configs/smollm2_arithmetic.yaml) is trainer-bound once its cold start is
over, so how close `Learner.train_step` comes to what the hardware does for a plain policy-gradient
step is the question. Both take the same batch on the same core(s) in one process, turn about:
  flashq  `Learner.train_step` with the example's trainer settings (float32 masters, bf16 compute,
          its logprob head, micro-batches split by length, shared prompt passes where they pay);
  bare    AutoModelForCausalLM in float32 under bf16 autocast, the whole batch padded into one
          forward, log-softmax over the whole vocabulary, the same token-level loss shape, backward,
          gradient clipping and AdamW: what a user writes in twenty lines.
The batch is 4 prompts x 8 responses of the example's task (its chat template and prompts),
response lengths drawn once (seeded, log-normal, median 20, capped at the example's 48 new
tokens: the early steps of the calibration runs averaged 20-30 tokens), random response tokens.
Two bare steps: logits at every position, and logits kept only for the response positions
(left padding and `logits_to_keep`, as TRL does). Figure `trainer_tokens_per_s_vs_bare_hf`: the
faster bare step's median seconds over flashq's (same tokens, so the ratio of tokens per second). flashq's step is split by phase (planning the
micro-batches, forward through the logprob head, optimizer, the rest: backward, loss, books).

    python bench/trainer_vs_bare.py                  # writes bench/results/trainer_vs_bare.json
    python bench/trainer_vs_bare.py --threads 2      # the trainer given both cores
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import print_table, write_result  # noqa: E402

CONFIG = ROOT / "configs" / "smollm2_arithmetic.yaml"


def make_batch(cfg, encode_prompt, vocab: int):
    """4 groups x 8 of the example's prompts, seeded lengths and tokens, rewards 0/1 in each group."""
    from flashq.buffer import Group, pack_batch
    from flashq.data import training_tasks
    from flashq.staleness import Admission
    from flashq.wire.protocol import RewardResult, Sample

    rng = np.random.default_rng(0)
    tasks = training_tasks(cfg)
    groups = []
    for g in range(cfg.trainer.batch_groups):
        prompt = np.asarray(encode_prompt(tasks.task(g)), np.int32)
        group = Group(task={}, prompt_ids=prompt, size=cfg.sampling.group_size, admission=Admission(f"g{g}", 0, 0))
        for k in range(cfg.sampling.group_size):
            n = int(min(cfg.sampling.max_tokens, max(2, round(20 * np.exp(0.5 * rng.standard_normal())))))
            rid = f"g{g}/{k}"
            tokens = rng.integers(100, vocab, size=n).astype(np.int32)
            group.samples[rid] = Sample(rid, f"g{g}", 0, tokens, np.full(n, -2.0, np.float32), np.zeros(n, np.int32), "stop")
            group.rewards[rid] = RewardResult(rid, float(k % 2))
        groups.append(group)
    return pack_batch(groups, 0)


class Phases:
    """Seconds spent inside wrapped callables, by name."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

        return timed


def bare_step(model, optimizer, batch, grad_clip: float, keep_tail: bool = False) -> None:
    """A plain policy-gradient step: one padded forward over every sequence, full-vocabulary
    log-softmax under bf16 autocast, -(advantage x logprob) averaged over response tokens.
    `keep_tail`: sequences padded on the left and logits kept only for the last positions, as
    many as the longest response (transformers' `logits_to_keep`, as TRL's GRPOTrainer does)."""
    n = len(batch.request_ids)
    seqs, masks = [], []
    for i in range(n):
        p = batch.prompt_ids[batch.prompt_offsets[i]:batch.prompt_offsets[i + 1]]
        r = batch.response_ids[batch.response_offsets[i]:batch.response_offsets[i + 1]]
        seqs.append(np.concatenate([p, r]))
        masks.append(np.concatenate([np.zeros(len(p)), np.ones(len(r))]))
    width = max(len(s) for s in seqs)
    ids = torch.zeros(n, width, dtype=torch.long)
    attn = torch.zeros(n, width, dtype=torch.long)
    loss_mask = torch.zeros(n, width)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        where = slice(width - len(s), width) if keep_tail else slice(0, len(s))
        ids[i, where] = torch.from_numpy(s.astype(np.int64))
        attn[i, where] = 1
        loss_mask[i, where] = torch.from_numpy(m)
    rewards = torch.from_numpy(np.asarray(batch.rewards, np.float32))
    adv = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    optimizer.zero_grad(set_to_none=True)
    keep = int(np.diff(batch.response_offsets).max()) if keep_tail else 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if keep_tail:  # the logits of the last `keep` positions predict the last `keep` tokens
            positions = (attn.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=ids, attention_mask=attn, position_ids=positions, logits_to_keep=keep + 1).logits[:, :-1]
        else:
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    targets = ids[:, -logits.shape[1]:]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    mask = loss_mask[:, -logits.shape[1]:]
    loss = -(adv[:, None] * logp * mask).sum() / mask.sum()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=6, help="timed steps of each, taking turns (after one warm-up each)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both (the example's trainer.threads is 1)")
    ap.add_argument("--name", default="trainer_vs_bare")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM

    from flashq.config import load_config
    from flashq.data import chat_messages
    from flashq.data.chat_encoder import ChatEncoder
    from flashq.models.sources import model_path
    from flashq.trainer.learner import Learner

    cfg = load_config(CONFIG, [f"trainer.threads={args.threads}", "trainer.steps=1000"])
    path = model_path(cfg.model, fetch=True)
    encoder = ChatEncoder(path, cfg.model.cache_dir)
    learner = Learner(cfg, path)
    vocab = learner.model.config.vocab_size
    batch = make_batch(cfg, lambda task: encoder.encode(chat_messages(task, cfg.task.system_prompt)), vocab)
    tokens = int(len(batch.prompt_ids) + len(batch.response_ids))
    bare = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    bare.train()
    bare_opt = torch.optim.AdamW(bare.parameters(), lr=cfg.trainer.lr)

    phases = Phases()
    learner.logprobs = phases.wrap("forward (logprob head)", learner.logprobs)
    learner._rank_micro_batches = phases.wrap("plan micro-batches", learner._rank_micro_batches)
    learner.optimizer.step = phases.wrap("optimizer", learner.optimizer.step)

    def flashq_step() -> float:
        t0 = time.perf_counter()
        learner.version = 0  # the same batch every time: batch 0 at version 0
        learner.train_step(batch)
        return time.perf_counter() - t0

    def bare_time(keep_tail: bool) -> float:
        t0 = time.perf_counter()
        bare_step(bare, bare_opt, batch, cfg.trainer.grad_clip, keep_tail)
        return time.perf_counter() - t0

    flashq_step(), bare_time(False), bare_time(True)  # warm-up: allocations, oneDNN kernels
    phases.seconds.clear()
    flashq_s, full_s, tail_s = [], [], []
    for _ in range(args.reps):
        flashq_s.append(flashq_step())
        full_s.append(bare_time(False))
        tail_s.append(bare_time(True))
    f_med, full_med, tail_med = (statistics.median(x) for x in (flashq_s, full_s, tail_s))
    total = sum(flashq_s)
    split = {k: v / total for k, v in phases.seconds.items()}
    split["backward, loss, books (the rest)"] = 1.0 - sum(split.values())
    rows = [{"system": "flashq Learner.train_step", "median_s": f_med, "tokens_per_s": tokens / f_med, "steps_s": flashq_s},
            {"system": "bare transformers step, logits everywhere", "median_s": full_med, "tokens_per_s": tokens / full_med,
             "steps_s": full_s},
            {"system": "bare transformers step, logits_to_keep", "median_s": tail_med, "tokens_per_s": tokens / tail_med,
             "steps_s": tail_s}]
    b_med = min(full_med, tail_med)  # the faster bare step is the one to beat
    print_table(f"one real-model trainer step: {len(batch.request_ids)} sequences, {tokens} tokens, {args.threads} thread(s)",
                rows, [("system", "system", "s"), ("median_s", "median s", ".2f"), ("tokens_per_s", "tokens/s", ",.0f")])
    for k, v in split.items():
        print(f"  flashq {k}: {v:.1%}")
    figures = {
        "trainer_tokens_per_s_vs_bare_hf": b_med / f_med,
        "trainer_tokens_per_s_vs_bare_hf_logits_everywhere": full_med / f_med,
        "trainer_tokens_per_s_vs_bare_hf_logits_to_keep": tail_med / f_med,
        "trainer_tokens_per_s_vs_bare_hf_bound": 1.0,  # at least
        "threads": args.threads,
        "tokens_per_step": tokens,
        "response_tokens_per_step": int(len(batch.response_ids)),
        "flashq_phase_share": split,
    }
    path_out = write_result(args.name, rows, figures,
                            notes="Same batch, same process, same torch threads, taking turns; medians of the timed steps "
                                  "after one warm-up each. The ratio is the faster bare step's seconds over flashq's.")
    print(f"figures: trainer_tokens_per_s_vs_bare_hf {figures['trainer_tokens_per_s_vs_bare_hf']:.3f}\nwrote {path_out}")


if __name__ == "__main__":
    main()
