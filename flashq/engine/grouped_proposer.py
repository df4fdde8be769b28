"""flashq's grouped drafter as vLLM's speculative proposer, inside the engine.

vLLM builds a `SuffixDecodingProposer` for `speculative_config={"method": "suffix"}` and hands it
the input batch every step: request ids, prompts and the tokens each request just emitted. The
flashq plugin (`vllm_plugin.register`, when `FLASHQ_SPECULATION=grouped`) puts this class in its
place, so the drafts come from `flashq.drafting.drafter.GroupedDrafter`: siblings of the same prompt (one
group per distinct prompt, as prompt replication makes them), the prompt's responses in earlier
epochs, and the request's own prompt and output. How far each draft goes is `DraftBudget`'s
call, from the batch size, the step cost measured here between calls and how often drafts were
accepted (flashq's settings arrive as FLASHQ_DRAFT_* variables, set by `RolloutEngine`); a step
where no draft would pay drafts nothing. Verification stays vLLM's.
"""

from __future__ import annotations

import gc
import os
import time
from collections import Counter

import numpy as np

from flashq.drafting.budget import AcceptanceRates, DraftBudget

# in the file FLASHQ_DRAFT_STATS names; off_steps: steps where no draft would have paid
STATS = ("calls", "drafting_s", "step_fixed_s", "step_per_token_s", "off_steps")


def read_stats(path: str) -> dict[str, float] | None:
    """The proposer's counters as they stand (it rewrites them in place every step)."""
    try:
        values = np.fromfile(path, dtype=np.float64, count=len(STATS))
    except OSError:
        return None
    return dict(zip(STATS, values.tolist())) if len(values) == len(STATS) else None


class GroupedSuffixProposer:
    def __init__(self, vllm_config):
        # Imported here, not at the top: the plugin loads this module before vLLM's worker scans
        # every loaded module for Triton kernels, and that scan trips over llvmlite's objects
        # (numba's, which the drafter's index is compiled with).
        from flashq.drafting.drafter import GroupedDrafter

        config = vllm_config.speculative_config
        self.num_speculative_tokens = config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.adaptive = os.environ.get("FLASHQ_DRAFT_ADAPTIVE", "1") == "1"
        self.acceptance = AcceptanceRates() if self.adaptive else None
        self.drafter = GroupedDrafter(history_epochs=int(os.environ.get("FLASHQ_DRAFT_HISTORY_EPOCHS", "2")),
                                      min_prob=config.suffix_decoding_min_token_prob, acceptance=self.acceptance)
        self.budget = DraftBudget(floor=config.suffix_decoding_min_token_prob, acceptance=self.acceptance)
        self.off_steps = 0
        self.group_of: dict[str, str] = {}  # request id -> group key
        self.members: Counter = Counter()  # group key -> requests still running
        self.last_call: float | None = None
        self.last_positions = 0  # positions the step after the last call verifies
        self.drafting_s = 0.0  # time spent here: the drafting cost per step
        self.calls = 0
        # drafting cost and the fitted step model, for the rollout worker's metrics and benchmarks:
        # a memory-mapped file, so publishing them every step costs a few stores, not a file write
        path = os.environ.get("FLASHQ_DRAFT_STATS")
        self.stats = np.memmap(path, dtype=np.float64, mode="w+", shape=(len(STATS),)) if path else None

    def propose(self, num_speculative_tokens, input_batch, sampled_token_ids, slot_mappings=None) -> list[list[int]]:
        started = time.perf_counter()
        if self.calls == 0:
            # The worker's objects from start-up live as long as it does; freezing them keeps the
            # collections that the drafter's indexes trigger from scanning them (they took about a
            # quarter of the worker's time at a full batch here: bench/specdec.py, 8.8k -> 12.1k tok/s).
            gc.freeze()
        if self.last_call is not None:
            self.budget.observe(self.last_positions, started - self.last_call)
        if self.acceptance is not None:
            self.acceptance.step()
        # finished or aborted requests first: a group that just ended becomes history before the
        # same prompt's next requests (a later epoch) start a new group
        for req_id in set(self.group_of) - input_batch.req_id_to_index.keys():
            key = self.group_of.pop(req_id)
            self.drafter.finish(req_id)
            self.members[key] -= 1
            if self.members[key] == 0:
                del self.members[key]
                self.drafter.finish_group(key)
        min_prob = self.budget.min_prob(len(sampled_token_ids)) if self.adaptive else None
        drafting = min_prob is None or min_prob <= 1.0
        self.off_steps += not drafting
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            req_id = input_batch.req_ids[i]
            num_tokens = int(input_batch.num_tokens_no_spec[i])
            if not sampled or num_tokens >= self.max_model_len:
                drafts.append([])
                continue
            if req_id not in self.group_of:
                index = input_batch.req_id_to_index[req_id]
                prompt = input_batch.token_ids_cpu[index, : input_batch.num_prompt_tokens[index]]
                key = str(hash(prompt.tobytes()))
                self.group_of[req_id] = key
                self.members[key] += 1
                self.drafter.start(req_id, key, prompt)
            self.drafter.accept(req_id, sampled)
            budget = min(num_speculative_tokens, self.max_model_len - num_tokens - 1)
            drafts.append(self.drafter.propose(req_id, budget, min_prob) if budget > 0 and drafting else [])
        self.last_positions = len(drafts) + sum(len(d) for d in drafts)
        self.last_call = time.perf_counter()
        self.drafting_s += self.last_call - started
        self.calls += 1
        if self.stats is not None:
            self.stats[:] = (self.calls, self.drafting_s, *self.budget.fit(), self.off_steps)
        return drafts

    def load_model(self, *args, **kwargs) -> None:
        pass  # nothing to load: drafts come from text already generated
