"""Draft tokens from what sibling responses and earlier epochs already said (Seer, RhymeRL).

The n responses to one prompt share most of their tokens, and a prompt's responses in the last
epoch predict this epoch's. `SuffixIndex` counts every token sequence up to `max_depth` long in a
set of growing sequences (a suffix trie, updated as tokens arrive); `speculate` matches the end of
a context against it and follows the most frequent continuation while its probability stays
above `min_prob`, scoring the draft by the sum of those probabilities (SuffixDecoding's rule).

`GroupedDrafter` keeps one index per group (every sibling's accepted tokens), one per prompt over
its responses in earlier epochs (the last `history_epochs`), and one per request over its own
prompt and output, and proposes the best-scoring draft of the three. Drafts are proposals only:
verification by the target model keeps sampling exact (see `replay` for how acceptance works).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


PROMPT_TAIL = 4  # prompt tokens put before each response in the shared indexes


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


class SuffixIndex:
    def __init__(self, max_depth: int = 24):
        self.max_depth = max_depth
        self.root = _Node()
        self.active: dict[object, list[_Node]] = {}  # per sequence: nodes of its current suffixes

    def extend(self, seq_id: object, tokens) -> None:
        """Append tokens to sequence `seq_id`, counting every new suffix up to max_depth."""
        active = self.active.setdefault(seq_id, [])
        for t in tokens:
            t = int(t)
            grown = []
            for node in [self.root, *active]:
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = _Node()
                child.count += 1
                grown.append(child)
            self.active[seq_id] = active = grown[: self.max_depth - 1]

    def speculate(self, context, max_tokens: int, min_prob: float = 0.1) -> tuple[list[int], float]:
        """Best draft (and its score) continuing the end of `context`."""
        best: tuple[list[int], float] = ([], 0.0)
        ctx = [int(t) for t in context[-(self.max_depth - 1):]]
        for m in range(len(ctx), 0, -1):
            node = self.root
            for t in ctx[-m:]:
                node = node.children.get(t)
                if node is None:
                    break
            if node is None or not node.children:
                continue
            draft, score, prob = [], 0.0, 1.0
            while len(draft) < max_tokens and node.children:
                token, child = max(node.children.items(), key=lambda kv: kv[1].count)
                prob *= child.count / node.count if node.count else 0.0
                if prob < min_prob:
                    break
                draft.append(token)
                score += prob
                node = child
            if score > best[1]:
                best = (draft, score)
        return best


@dataclass
class _Request:
    group_id: str
    prompt_key: object
    own: SuffixIndex
    output: list[int] = field(default_factory=list)


class GroupedDrafter:
    def __init__(self, max_depth: int = 24, history_epochs: int = 2, min_prob: float = 0.1):
        self.max_depth, self.min_prob = max_depth, min_prob
        self.groups: dict[str, SuffixIndex] = {}
        self.finished: dict[str, tuple[object, list[list[int]]]] = {}  # group -> (prompt, its responses)
        self.history: dict[object, deque[list[list[int]]]] = {}  # prompt -> responses of its last epochs
        self.history_index: dict[object, SuffixIndex] = {}
        self.history_epochs = history_epochs
        self.requests: dict[str, _Request] = {}

    def start(self, request_id: str, group_id: str, prompt_ids) -> None:
        prompt = [int(t) for t in prompt_ids]
        own = SuffixIndex(self.max_depth)
        own.extend("prompt", prompt)
        self.requests[request_id] = _Request(group_id, tuple(prompt), own)
        group = self.groups.setdefault(group_id, SuffixIndex(self.max_depth))
        group.extend(request_id, prompt[-PROMPT_TAIL:])  # so a response's first tokens can be drafted too

    def accept(self, request_id: str, tokens) -> None:
        """Tokens the target model emitted for this request (siblings see them from now on)."""
        req = self.requests[request_id]
        tokens = [int(t) for t in tokens]
        req.output += tokens
        req.own.extend("output", tokens)
        self.groups[req.group_id].extend(request_id, tokens)

    def propose(self, request_id: str, max_tokens: int) -> list[int]:
        req = self.requests[request_id]
        context = list(req.prompt_key[-self.max_depth:]) + req.output
        candidates = [req.own.speculate(context, max_tokens, self.min_prob),
                      self.groups[req.group_id].speculate(context, max_tokens, self.min_prob)]
        past = self.history_index.get(req.prompt_key)
        if past is not None:
            candidates.append(past.speculate(context, max_tokens, self.min_prob))
        return max(candidates, key=lambda c: (c[1], len(c[0])))[0]

    def finish(self, request_id: str) -> None:
        req = self.requests.pop(request_id)
        self.finished.setdefault(req.group_id, (req.prompt_key, []))[1].append(req.output)

    def finish_group(self, group_id: str) -> None:
        """The group is complete: its responses become its prompt's history (the last
        `history_epochs` epochs of it), for the next time the prompt comes round."""
        self.groups.pop(group_id, None)
        prompt_key, responses = self.finished.pop(group_id, (None, []))
        if not responses:
            return
        epochs = self.history.setdefault(prompt_key, deque(maxlen=self.history_epochs))
        epochs.append(responses)
        index = self.history_index[prompt_key] = SuffixIndex(self.max_depth)
        for e, epoch in enumerate(epochs):
            for k, response in enumerate(epoch):
                index.extend((e, k), list(prompt_key[-PROMPT_TAIL:]) + response)


def replay(drafter: GroupedDrafter, groups: list[tuple[list[int], list[list[int]]]], max_draft: int) -> dict:
    """Decode recorded responses again with drafts, siblings in lock step, each sibling's tokens
    revealed only as they are generated (no future leak). A draft token is accepted while it
    equals the token the target actually sampled there: for drafts that are point masses this is
    exactly speculative sampling's acceptance (sample-then-match), so replaying real samples
    gives unbiased acceptance. `groups`: (prompt ids, the group's responses)."""
    forwards = drafted_forwards = drafted_tokens = tokens = 0
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
    }
