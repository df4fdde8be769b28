"""Where each short n-gram occurred in a set of growing token sequences, and the draft that
continues a context from there: the grouped drafter's index, compiled with numba.

A draft is proposed for every running request at every engine step, so the index sits on the
decode loop's critical path: in Python it took about a tenth of the engine's time at 16
requests and more at a full batch (bench/specdec.py). Here the sequences live in flat arrays
(tokens in arrival order, interleaved across sequences, linked to the next and previous token of
their own sequence) and each n-gram (n in `orders`) is a 64-bit hash in an open-addressing table
whose slot holds the latest position it ended at; every position links to the previous
occurrence of the same n-gram. Appending a token costs one probe per order; a search walks the
latest `max_matches` occurrences, newest first. A hash collision can only cost a rejected draft,
never a wrong output (verification by the target model decides).

`speculate` follows the matches' continuations one token at a time, taking the most frequent
next token (ties: the oldest match's) while the share of matches that agree on the whole path
(its probability) stays at least `min_prob`; the draft's score is the sum of those
probabilities (SuffixDecoding's rule).
The longest order comes first and a full-length draft ends the search.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

MAX_MATCHES = 16  # most recent occurrences followed per draft
EVIDENCE_PRIOR = 1.0  # see `follow`: how little one occurrence proves when drafts are compared
_EMPTY = np.empty(0, np.int32)


class Draft(NamedTuple):
    tokens: list[int]
    score: float  # what drafts from different orders and sources are compared by (see `follow`)
    matches: np.ndarray  # the positions after it of the matches that agree with all of it: `follow` goes on from there
    probs: np.ndarray  # each token's path probability: the share of matches that agree up to it


NO_DRAFT = Draft([], 0.0, _EMPTY, np.empty(0, np.float64))
_PRIME = np.uint64(0x100000001B3)
_SEED = np.uint64(0xCBF29CE484222325)


@numba.njit(cache=True, inline="always")
def _finish(h, n):
    """The table key of an n-gram hash: mixed with its order (splitmix64's finaliser), never 0."""
    z = h ^ (np.uint64(n) * np.uint64(0x9E3779B97F4A7C15))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(z) if z != 0 else np.int64(1)


@numba.njit(cache=True)
def _slot(keys, key):
    mask = keys.shape[0] - 1
    s = key & mask
    while keys[s] != 0 and keys[s] != key:
        s = (s + 1) & mask
    return s


@numba.njit(cache=True)
def _extend(tok, nxt, prv, chain, keys, heads, orders, tails, seq, tokens, size, filled):
    """Append `tokens` to sequence `seq` and record every n-gram ending at each; returns the new
    (positions used, table slots used). The caller has made room for them."""
    top = orders[0]
    for t in tokens:
        p = size
        tok[p] = t
        prv[p] = tails[seq]
        nxt[p] = -1
        if tails[seq] >= 0:
            nxt[tails[seq]] = p
        tails[seq] = p
        size += 1
        h = _SEED
        q = p
        j = 0
        k = orders.shape[0] - 1  # orders are longest first: the shortest is met first going back
        while q >= 0 and j < top and k >= 0:
            h = (h ^ np.uint64(tok[q])) * _PRIME
            j += 1
            if j == orders[k]:
                key = _finish(h, j)
                s = _slot(keys, key)
                if keys[s] == 0:
                    keys[s] = key
                    chain[k, p] = -1
                    filled += 1
                else:
                    chain[k, p] = heads[s]
                heads[s] = p
                k -= 1
            q = prv[q]
    return size, filled


@numba.njit(cache=True)
def _rehash(keys, heads, new_keys, new_heads):
    for s in range(keys.shape[0]):
        if keys[s] != 0:
            t = _slot(new_keys, keys[s])
            new_keys[t] = keys[s]
            new_heads[t] = heads[s]


@numba.njit(cache=True)
def _tail(tok, prv, last, n):
    """The last `n` tokens (or fewer) of the sequence ending at position `last`, in order."""
    out = np.empty(n, np.int32)
    i = n
    q = last
    while q >= 0 and i > 0:
        i -= 1
        out[i] = tok[q]
        q = prv[q]
    return out[i:].copy()


@numba.njit(cache=True)
def follow(tok, nxt, matches, max_tokens, min_prob, prior):
    """Walk the continuations at positions `matches`: the most frequent next token while the
    share of matches agreeing on the whole path stays at least `min_prob`. Returns the draft,
    its score, the positions after it of the matches that agree with all of it, and each draft
    token's share (its path probability, which `AcceptanceRates` checks against what verification
    accepted).

    The score, by which drafts from different orders and sources are compared, sums each
    token's share discounted by m / (m + prior) at every step for the m matches it rests on
    (the rule of succession's doubt): one occurrence followed for k tokens scores 1/2 + 1/4 + ...
    at prior 1, not k, so the rest of the prompt after a letter the answer repeats no longer
    beats the answer's own pattern seen in many responses. How far a draft goes is still the
    undiscounted share against `min_prob`. Calibrated on recorded rollouts (job B of
    bench/vs_trl.py, the calculator's tool calls): tokens per forward 1.62 -> 2.64 and 6.82 -> 6.78."""
    draft = np.empty(max_tokens, np.int32)
    probs = np.empty(max_tokens, np.float64)
    cur = matches.copy()
    m = cur.shape[0]
    total = m
    doubt = 1.0
    score = 0.0
    d = 0
    while m > 0 and d < max_tokens:
        best, best_count = tok[cur[0]], 0
        for i in range(m):  # at most max_matches: counting by pairs beats a dict
            t = tok[cur[i]]
            count = 0
            for j in range(m):
                if tok[cur[j]] == t:
                    count += 1
            if count >= best_count:  # ties: the oldest match's token (the sibling furthest ahead)
                best, best_count = t, count
            if 2 * best_count > m:
                break
        prob = best_count / total
        if prob < min_prob:
            break
        draft[d] = best
        probs[d] = prob
        d += 1
        doubt *= m / (m + prior)
        score += prob * doubt
        kept = 0
        for i in range(m):
            c = cur[i]
            if tok[c] == best and nxt[c] >= 0:
                cur[kept] = nxt[c]
                kept += 1
        m = kept
    return draft[:d].copy(), score, cur[:m].copy(), probs[:d].copy()


@numba.njit(cache=True)
def advance(tok, nxt, matches, token):
    """The matches whose next token is `token`, moved past it (those that go on)."""
    out = np.empty(matches.shape[0], np.int32)
    m = 0
    for c in matches:
        if tok[c] == token and nxt[c] >= 0:
            out[m] = nxt[c]
            m += 1
    return out[:m].copy()


@numba.njit(cache=True)
def _speculate(tok, nxt, chain, keys, heads, orders, context, max_tokens, min_prob, max_matches, prior):
    best = np.empty(0, np.int32)
    best_score = 0.0
    best_follow = np.empty(0, np.int32)
    best_probs = np.empty(0, np.float64)
    n_orders = orders.shape[0]
    wanted = np.zeros(n_orders, np.int64)  # the key of each order's n-gram at the context's end
    h = _SEED
    j = 0
    k = n_orders - 1
    i = context.shape[0] - 1
    while i >= 0 and k >= 0:
        h = (h ^ np.uint64(context[i])) * _PRIME
        j += 1
        if j == orders[k]:
            wanted[k] = _finish(h, j)
            k -= 1
        i -= 1
    found = np.empty(max_matches, np.int32)
    for k in range(n_orders):
        if wanted[k] == 0:
            continue  # the context is shorter than this order
        s = _slot(keys, wanted[k])
        if keys[s] == 0:
            continue
        m = 0
        p = heads[s]
        while p >= 0 and m < max_matches:
            if nxt[p] >= 0:
                found[m] = nxt[p]
                m += 1
            p = chain[k, p]
        if m == 0:
            continue
        draft, score, agreeing, probs = follow(tok, nxt, found[:m], max_tokens, min_prob, prior)
        if score > best_score:
            best, best_score, best_follow, best_probs = draft, score, agreeing, probs
        if draft.shape[0] >= max_tokens:
            break
    return best, best_score, best_follow, best_probs


class MatchIndex:
    """Growing sequences (keyed by any hashable id) and where their n-grams occurred."""

    def __init__(self, orders: tuple[int, ...] = (8, 4, 2, 1), capacity: int = 256):
        self.orders = np.array(sorted(set(orders), reverse=True), dtype=np.int64)
        self.ids: dict[object, int] = {}
        self.tails = np.full(16, -1, np.int32)  # each sequence's last position
        self.lengths: list[int] = []
        self.tok = np.empty(capacity, np.int32)
        self.nxt = np.empty(capacity, np.int32)
        self.prv = np.empty(capacity, np.int32)
        self.chain = np.empty((len(self.orders), capacity), np.int32)
        self.keys = np.zeros(2 * capacity * len(self.orders), np.int64)
        self.heads = np.empty_like(self.keys, dtype=np.int32)
        self.size = self.filled = 0

    @property
    def num_sequences(self) -> int:
        return len(self.ids)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.tok, self.nxt, self.prv, self.chain, self.keys, self.heads, self.tails))

    def _id(self, seq_id: object) -> int:
        i = self.ids.get(seq_id)
        if i is None:
            i = self.ids[seq_id] = len(self.ids)
            self.lengths.append(0)
            if i >= len(self.tails):
                self.tails = np.concatenate([self.tails, np.full(len(self.tails), -1, np.int32)])
        return i

    def _reserve(self, count: int) -> None:
        need = self.size + count
        if need > len(self.tok):
            cap = max(need, 2 * len(self.tok), 16)
            grow = cap - len(self.tok)
            self.tok, self.nxt, self.prv = (np.concatenate([a, np.empty(grow, np.int32)]) for a in (self.tok, self.nxt, self.prv))
            self.chain = np.concatenate([self.chain, np.empty((len(self.orders), grow), np.int32)], axis=1)
        slots = self.filled + count * len(self.orders)
        if 2 * slots > len(self.keys):  # keep the table at most half full: short probes
            size = len(self.keys)
            while 2 * slots > size:
                size *= 2
            self._rehash_into(size)

    def _rehash_into(self, size: int) -> None:
        keys, heads = np.zeros(size, np.int64), np.empty(size, np.int32)
        _rehash(self.keys, self.heads, keys, heads)
        self.keys, self.heads = keys, heads

    def compact(self) -> None:
        """Give back the room kept for growth: an index that is done growing (a finished group's,
        kept as its prompt's history) holds only what it indexed."""
        n = self.size
        self.tok, self.nxt, self.prv = self.tok[:n].copy(), self.nxt[:n].copy(), self.prv[:n].copy()
        self.chain = self.chain[:, :n].copy()
        size = 16
        while size < 2 * self.filled:
            size *= 2
        self._rehash_into(size)

    def extend(self, seq_id: object, tokens) -> None:
        """Append tokens to sequence `seq_id`, recording every n-gram that now ends at its tail."""
        tokens = np.asarray(tokens, dtype=np.int32)
        if tokens.size == 0:
            return
        i = self._id(seq_id)
        self._reserve(tokens.size)
        self.size, self.filled = _extend(self.tok, self.nxt, self.prv, self.chain, self.keys, self.heads, self.orders,
                                         self.tails, i, tokens, self.size, self.filled)
        self.lengths[i] += tokens.size

    def length(self, seq_id: object) -> int:
        i = self.ids.get(seq_id)
        return 0 if i is None else self.lengths[i]

    def tail(self, seq_id: object, n: int) -> np.ndarray:
        """The last `n` tokens of a sequence (fewer if it is shorter)."""
        i = self.ids.get(seq_id)
        return _EMPTY if i is None else _tail(self.tok, self.prv, self.tails[i], n)

    def sequence(self, seq_id: object) -> list[int]:
        return self.tail(seq_id, self.length(seq_id)).tolist()

    def speculate(self, context, max_tokens: int, min_prob: float = 0.1) -> Draft:
        """Best draft continuing the end of `context`."""
        if self.size == 0 or max_tokens <= 0:
            return NO_DRAFT
        context = np.asarray(context, dtype=np.int32)
        draft, score, agreeing, probs = _speculate(self.tok, self.nxt, self.chain, self.keys, self.heads, self.orders,
                                                   context, max_tokens, min_prob, MAX_MATCHES, EVIDENCE_PRIOR)
        return Draft(draft.tolist(), score, agreeing, probs)

    def follow(self, matches: np.ndarray, max_tokens: int, min_prob: float) -> Draft:
        """Go on from the matches a previous draft left (see `speculate`)."""
        draft, score, agreeing, probs = follow(self.tok, self.nxt, matches, max_tokens, min_prob, EVIDENCE_PRIOR)
        return Draft(draft.tolist(), score, agreeing, probs)

    def advance(self, matches: np.ndarray, token: int) -> np.ndarray:
        return advance(self.tok, self.nxt, matches, token)
