"""flashq's grouped drafter as vLLM's speculative proposer, inside the engine.

vLLM builds a `SuffixDecodingProposer` for `speculative_config={"method": "suffix"}` and hands it
the input batch every step: request ids, prompts and the tokens each request just emitted. The
flashq plugin (`vllm_plugin.register`, when `FLASHQ_SPECULATION=grouped`) puts this class in its
place, so the drafts come from `flashq.drafting.GroupedDrafter`: siblings of the same prompt (one
group per distinct prompt, as prompt replication makes them), the prompt's responses in earlier
epochs, and the request's own prompt and output. Verification stays vLLM's, so output is exact.
"""

from __future__ import annotations

from collections import Counter

from flashq.drafting import GroupedDrafter


class GroupedSuffixProposer:
    def __init__(self, vllm_config):
        config = vllm_config.speculative_config
        self.num_speculative_tokens = config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.drafter = GroupedDrafter(max_depth=config.suffix_decoding_max_tree_depth,
                                      min_prob=config.suffix_decoding_min_token_prob)
        self.group_of: dict[str, str] = {}  # request id -> group key
        self.members: Counter = Counter()  # group key -> requests still running

    def propose(self, num_speculative_tokens, input_batch, sampled_token_ids, slot_mappings=None) -> list[list[int]]:
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
            drafts.append(self.drafter.propose(req_id, budget) if budget > 0 else [])
        for req_id in set(self.group_of) - input_batch.req_id_to_index.keys():  # finished or aborted
            key = self.group_of.pop(req_id)
            self.drafter.finish(req_id)
            self.members[key] -= 1
            if self.members[key] == 0:
                del self.members[key]
                self.drafter.finish_group(key)
        return drafts

    def load_model(self, *args, **kwargs) -> None:
        pass  # nothing to load: drafts come from text already generated
