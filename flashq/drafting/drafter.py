"""Draft tokens from what sibling responses and earlier epochs already said (Seer, RhymeRL).

`GroupedDrafter` keeps one `MatchIndex` (flashq.drafting.match_index: where each short n-gram occurred,
and the most probable continuation from there) per group (every sibling's prompt tail and
accepted tokens, the request's own output among them), one per prompt over its responses in
earlier epochs (the last `history_epochs`), one over the latest responses to any prompt (what
prompts share: a tool call's syntax, an answer format; SuffixDecoding's global tree), and one
per group over its prompt, and proposes the best-scoring draft of them. Drafts are proposals
only: verification by the target model keeps sampling exact (see `replay` for how acceptance
works).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from flashq.drafting.budget import AcceptanceRates
from flashq.drafting.match_index import NO_DRAFT, Draft, MatchIndex

PROMPT_TAIL = 4  # prompt tokens put before each response in the shared indexes
_NONE = np.empty(0, np.int32)


@dataclass
class _Request:
    group_id: str
    prompt_key: tuple[int, ...]
    prompt: MatchIndex  # shared by the requests of a group with the same prompt
    tail: int  # prompt tokens at the start of its sequence in the group index
    draft: list[int] = field(default_factory=list)  # the last draft proposed
    probs: np.ndarray = field(default_factory=lambda: NO_DRAFT.probs)  # its tokens' path probabilities
    source: MatchIndex | None = None  # the index it came from
    follow: np.ndarray = field(default_factory=lambda: _NONE)  # there, the matches that agreed with all of it, moved past what was accepted


HISTORY_PROMPTS = 4096  # prompts whose earlier responses one engine's drafter keeps


class GroupedDrafter:
    def __init__(self, history_epochs: int = 2, min_prob: float = 0.1, orders: tuple[int, ...] = (8, 4, 2, 1),
                 max_history_prompts: int = HISTORY_PROMPTS, recent_responses: int = 512,
                 acceptance: AcceptanceRates | None = None):
        """`acceptance`: where each verified draft's outcome is recorded (see `accept`)."""
        self.min_prob, self.orders, self.context_len = min_prob, orders, max(orders)
        self.acceptance = acceptance
        self.groups: dict[str, MatchIndex] = {}
        self.group_prompt: dict[str, tuple[tuple[int, ...], MatchIndex]] = {}  # the prompt and its index
        # a finished group's index is its prompt's history as it stands (nothing is indexed twice);
        # the last `history_epochs` of them per prompt, for the `max_history_prompts` latest prompts
        self.history: OrderedDict[tuple[int, ...], deque[MatchIndex]] = OrderedDict()
        self.history_epochs, self.max_history_prompts = history_epochs, max_history_prompts
        # every prompt's latest responses, for what prompts share (a tool call's syntax, a format):
        # two generations of `recent_responses` each, the older dropped whole when the newer fills
        self.recent = [MatchIndex(orders), MatchIndex(orders)]
        self.recent_responses = recent_responses
        self.requests: dict[str, _Request] = {}

    def start(self, request_id: str, group_id: str, prompt_ids) -> None:
        prompt = tuple(int(t) for t in prompt_ids)
        shared = self.group_prompt.get(group_id)
        if shared is not None and shared[0] == prompt:
            prompt_index = shared[1]  # the siblings' prompt is indexed once
        else:
            prompt_index = MatchIndex(self.orders)
            prompt_index.extend("prompt", prompt)
            self.group_prompt.setdefault(group_id, (prompt, prompt_index))
        tail = min(PROMPT_TAIL, len(prompt))
        self.requests[request_id] = _Request(group_id, prompt, prompt_index, tail)
        group = self.groups.setdefault(group_id, MatchIndex(self.orders))
        group.extend(request_id, prompt[len(prompt) - tail:])  # so a response's first tokens can be drafted too

    def accept(self, request_id: str, tokens) -> None:
        """Tokens the target model emitted for this request (siblings see them from now on): the
        accepted part of the last draft, then the model's own next token. How much of the draft
        was accepted goes on the record (`acceptance`). If it was all of it, the matches behind
        that draft that also predicted the extra token carry on to the next draft, without a new
        search."""
        req = self.requests[request_id]
        tokens = np.asarray(tokens, dtype=np.int32)
        self.groups[req.group_id].extend(request_id, tokens)
        if req.draft and self.acceptance is not None:
            self.acceptance.observe(req.probs, _common_prefix(req.draft, tokens[:-1]))
        follow = _NONE
        if len(req.follow) and len(tokens) == len(req.draft) + 1 and tokens[:-1].tolist() == req.draft:
            follow = req.source.advance(req.follow, int(tokens[-1]))
        req.follow, req.draft, req.probs = follow, [], NO_DRAFT.probs

    def propose(self, request_id: str, max_tokens: int, min_prob: float | None = None) -> list[int]:
        """The best draft of up to `max_tokens` tokens whose path probability stays above `min_prob`."""
        req = self.requests[request_id]
        min_prob = self.min_prob if min_prob is None else min_prob
        best: Draft = NO_DRAFT
        source = req.source
        if len(req.follow):  # the last draft was accepted whole: go on from where its matches are
            best = source.follow(req.follow, max_tokens, min_prob)
        if not best.tokens:
            group = self.groups[req.group_id]
            context = group.tail(request_id, self.context_len)  # the prompt's tail, then the accepted tokens
            if group.length(request_id) < self.context_len:
                context = np.concatenate([np.asarray(req.prompt_key[: len(req.prompt_key) - req.tail], np.int32), context])
            sources = (*reversed(self.history.get(req.prompt_key, ())), group, *self.recent, req.prompt)
            for index in sources:  # the usually best source first
                found = index.speculate(context, max_tokens, min_prob)
                if (found.score, len(found.tokens)) > (best.score, len(best.tokens)):
                    best, source = found, index
                if len(best.tokens) >= max_tokens:  # as long as allowed: later sources are rarely better
                    break
        req.draft, req.probs, req.source, req.follow = best.tokens, best.probs, source, best.matches
        return best.tokens

    def finish(self, request_id: str) -> None:
        req = self.requests.pop(request_id)
        if self.recent_responses:
            response = self.groups[req.group_id].sequence(request_id)[req.tail:]
            if self.recent[0].num_sequences >= self.recent_responses:
                self.recent = [MatchIndex(self.orders), self.recent[0]]
            self.recent[0].extend(request_id, response)

    def finish_group(self, group_id: str) -> None:
        """The group is complete: its index becomes its prompt's history, for the next time the
        prompt comes round (an epoch later)."""
        index = self.groups.pop(group_id, None)
        prompt_key, _ = self.group_prompt.pop(group_id, (None, None))
        if index is None or not index.num_sequences or not self.history_epochs:
            return
        index.compact()
        self.history.setdefault(prompt_key, deque(maxlen=self.history_epochs)).append(index)
        self.history.move_to_end(prompt_key)
        while len(self.history) > self.max_history_prompts:
            self.history.popitem(last=False)


def _common_prefix(draft: list[int], emitted: np.ndarray) -> int:
    n = 0
    for want, got in zip(draft, emitted.tolist()):
        if want != got:
            break
        n += 1
    return n


def replay(drafter: GroupedDrafter, groups: list[tuple[list[int], list[list[int]]]], max_draft: int) -> dict:
    """Decode recorded responses again with drafts, siblings in lock step, each sibling's tokens
    revealed only as they are generated (no future leak). A draft token is accepted while it
    equals the token the target actually sampled there: for drafts that are point masses this is
    exactly speculative sampling's acceptance (sample-then-match), so replaying real samples
    gives unbiased acceptance. `groups`: (prompt ids, the group's responses)."""
    forwards = drafted_forwards = drafted_tokens = tokens = draft_tokens = 0
    for g, (prompt, responses) in enumerate(groups):
        gid = f"r{g}"
        ids = [f"{gid}/{k}" for k in range(len(responses))]
        for rid in ids:
            drafter.start(rid, gid, prompt)
        pos = [0] * len(responses)
        while any(p < len(r) for p, r in zip(pos, responses)):
            step: list[tuple[str, list[int]]] = []
            for k, (rid, response) in enumerate(zip(ids, responses)):
                if pos[k] >= len(response):
                    continue
                draft = drafter.propose(rid, min(max_draft, len(response) - pos[k] - 1)) if max_draft else []
                future = response[pos[k]:]
                accepted = 0
                while accepted < len(draft) and draft[accepted] == future[accepted]:
                    accepted += 1
                emitted = future[: accepted + 1]  # the accepted drafts and the target's own next token
                step.append((rid, emitted))
                pos[k] += len(emitted)
                forwards += 1
                tokens += len(emitted)
                if draft:
                    draft_tokens += len(draft)
                    drafted_forwards += 1
                    drafted_tokens += len(emitted)
            for rid, emitted in step:  # revealed to siblings only after the step
                drafter.accept(rid, emitted)
        for rid in ids:
            drafter.finish(rid)
        drafter.finish_group(gid)
    return {
        "tokens": tokens,
        "forwards": forwards,
        "tokens_per_forward": tokens / max(forwards, 1),
        "mean_acceptance_length": drafted_tokens / max(drafted_forwards, 1),
        "drafted_share": drafted_forwards / max(forwards, 1),
        "positions_per_forward": (forwards + draft_tokens) / max(forwards, 1),  # what verification costs
    }
