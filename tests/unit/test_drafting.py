"""The grouped drafter: suffix matching, siblings and history as draft sources, and a replay that
never shows a sibling's future tokens."""

import random
from collections import Counter

import pytest

from flashq.drafting.budget import AcceptanceRates
from flashq.drafting.drafter import GroupedDrafter, MatchIndex, replay
from flashq.drafting.match_index import MAX_MATCHES


def test_match_index_follows_the_most_frequent_continuation():
    index = MatchIndex(orders=(2,))
    index.extend("a", [1, 2, 3, 4, 5])
    index.extend("b", [9, 2, 3, 4, 6])
    index.extend("c", [2, 3, 4, 6, 7])
    draft, score = index.speculate([0, 2, 3], max_tokens=4, min_prob=0.1)[:2]
    assert draft == [4, 6, 7]  # 4 always follows 2 3; then 6 twice out of three; then 7 (c's)
    # shares 3/3, 2/3, 1/3, each discounted by m / (m + 1) for the m matches it rests on (3, 3, 1)
    assert score == pytest.approx(1 * 3 / 4 + 2 / 3 * (3 / 4) ** 2 + 1 / 3 * (3 / 4) ** 2 * 1 / 2)
    assert index.speculate([0, 2, 3], max_tokens=4, min_prob=0.1).probs.tolist() == pytest.approx([1, 2 / 3, 1 / 3])
    assert index.speculate([42], max_tokens=4)[:2] == ([], 0.0)  # nothing to match


def test_a_continuation_seen_once_loses_to_one_seen_in_many_responses():
    """Job B of bench/vs_trl.py ("q 7" -> "qqqqqqq"): the answer's first letter also occurs in the
    prompt, followed by the rest of the prompt, once. Scored as certain, those tokens beat the
    answers to other prompts for the same letter and were drafted (and rejected) at every step
    until the answer had 6 letters of its own: 1% of draft tokens were accepted."""
    drafter = GroupedDrafter()
    q, prompt = 17, [2, 30, 31, 14, 17, 36, 59, 3, 14, 2, 40, 41, 14]
    for k, n in enumerate([3, 5, 4, 8, 3, 6]):  # finished answers to other prompts for the same letter
        drafter.start(f"old/{k}", f"old{k}", [2, 30, 31, 14, 17, 36, 50 + n, 3, 14, 2, 40, 41, 14])
        drafter.accept(f"old/{k}", [q] * n + [0])
        drafter.finish(f"old/{k}")
        drafter.finish_group(f"old{k}")
    drafter.start("new/0", "new", prompt)
    drafter.accept("new/0", [q])
    assert drafter.propose("new/0", 8)[:2] == [q, q]


def test_siblings_and_history_supply_drafts_a_fresh_request_cannot_make_itself():
    drafter = GroupedDrafter()
    drafter.start("g0/0", "g0", [7, 7])
    drafter.start("g0/1", "g0", [7, 7])
    drafter.accept("g0/0", [1, 2, 3, 4, 5])
    drafter.accept("g0/1", [1, 2])
    assert drafter.propose("g0/1", 3) == [3, 4, 5]  # from the sibling
    drafter.accept("g0/1", [3, 4, 5])
    for rid in ("g0/0", "g0/1"):
        drafter.finish(rid)
    drafter.finish_group("g0")
    drafter.start("g1/0", "g1", [7, 7])  # the same prompt, a later epoch
    drafter.accept("g1/0", [1])
    assert drafter.propose("g1/0", 4) == [2, 3, 4, 5]  # from history


def test_replay_counts_acceptance_without_leaking_the_future():
    same = [5, 6, 7, 8, 9, 10, 11, 12]
    groups = [([1, 2], [same, same, same])]  # identical siblings in lock step
    plain = replay(GroupedDrafter(), groups, max_draft=0)
    grouped = replay(GroupedDrafter(), groups, max_draft=4)
    assert plain["tokens_per_forward"] == 1.0 and plain["tokens"] == grouped["tokens"] == 24
    # in lock step no sibling is ahead: the first epoch can draft only from its own prompt and output
    assert grouped["tokens_per_forward"] == 1.0
    again = GroupedDrafter()
    replay(again, groups, max_draft=4)
    second = replay(again, groups, max_draft=4)  # the next epoch has history
    assert second["mean_acceptance_length"] > 3 and second["tokens_per_forward"] > 3


def test_history_keeps_the_most_recent_prompts_only():
    drafter = GroupedDrafter(max_history_prompts=2)
    for p in range(3):
        drafter.start(f"g{p}/0", f"g{p}", [p, p])
        drafter.accept(f"g{p}/0", [9, 9, 9])
        drafter.finish(f"g{p}/0")
        drafter.finish_group(f"g{p}")
    assert list(drafter.history) == [(1, 1), (2, 2)]


def test_an_accepted_draft_goes_on_from_its_matches_without_a_new_search():
    drafter = GroupedDrafter(recent_responses=0)
    drafter.start("g0/0", "g0", [7, 7])
    drafter.accept("g0/0", list(range(10, 30)))
    drafter.start("g0/1", "g0", [7, 7])
    drafter.accept("g0/1", [10])
    assert drafter.propose("g0/1", 3) == [11, 12, 13]
    drafter.accept("g0/1", [11, 12, 13, 14])  # all three accepted, and the target's own 14
    assert len(drafter.requests["g0/1"].follow)  # carried on
    assert drafter.propose("g0/1", 3) == [15, 16, 17]
    drafter.accept("g0/1", [15, 99])  # a rejection: the next draft searches afresh
    assert not len(drafter.requests["g0/1"].follow)


def test_each_verified_draft_goes_on_the_acceptance_record():
    """What verification accepted of each draft, by the drafter's estimate of each token."""
    record = AcceptanceRates(prior_tokens=0)
    drafter = GroupedDrafter(recent_responses=0, acceptance=record)
    for k, tail in enumerate(([40, 41], [40, 41], [50, 51])):  # siblings ahead: 10 11 always, then 40 41 twice in three
        drafter.start(f"g0/{k}", "g0", [7, 7])
        drafter.accept(f"g0/{k}", [10, 11, *tail])
    drafter.start("g0/3", "g0", [7, 7])
    drafter.accept("g0/3", [9])  # nothing drafted yet: nothing recorded
    assert record.drafted.sum() == 0
    drafter.accept("g0/3", [10])
    assert drafter.propose("g0/3", 3, min_prob=0.5) == [11, 40, 41]  # estimates 1, 2/3, 2/3
    drafter.accept("g0/3", [11, 50])  # 11 accepted, 40 rejected (the target sampled 50)
    assert record.drafted.tolist() == [0, 0, 0, 2, 0, 1] and record.accepted.tolist() == [0, 0, 0, 0, 0, 1]


def _reference_speculate(seqs: list[list[int]], order_of_arrival: list[tuple[int, int]], orders, context, max_tokens, min_prob):
    """The matching rule spelled out on plain lists: for each order, longest first, the latest
    MAX_MATCHES occurrences of the context's last n tokens that have a continuation, followed
    while the most frequent next token keeps its share at least `min_prob` (ties: the oldest);
    scored by the shares, each discounted by m / (m + 1) at every step for its m matches."""
    best = ([], 0.0)
    for n in sorted(orders, reverse=True):
        if len(context) < n:
            continue
        matches = []
        for s, end in reversed(order_of_arrival):  # newest first
            if end >= n and seqs[s][end - n:end] == list(context[-n:]) and end < len(seqs[s]) and len(matches) < MAX_MATCHES:
                matches.append((s, end))
        if not matches:
            continue
        draft, score, total = [], 0.0, len(matches)
        doubt = 1.0
        while matches and len(draft) < max_tokens:
            counts = Counter(seqs[s][p] for s, p in matches)
            top = max(counts.values())
            token = [seqs[s][p] for s, p in matches if counts[seqs[s][p]] == top][-1]
            if top / total < min_prob:
                break
            draft.append(token)
            doubt *= len(matches) / (len(matches) + 1)  # the rule of succession's doubt, for the score only
            score += top / total * doubt
            matches = [(s, p + 1) for s, p in matches if seqs[s][p] == token and p + 1 < len(seqs[s])]
        if score > best[1]:
            best = (draft, score)
        if len(draft) >= max_tokens:
            break
    return best


@pytest.mark.parametrize("orders", [(6, 3, 1), (1,)])  # (1,): more than MAX_MATCHES occurrences to choose from
def test_the_compiled_index_matches_the_rule_spelled_out_on_lists(orders):
    rng = random.Random(0)
    index = MatchIndex(orders, capacity=4)  # tiny: the arrays and the table grow many times
    seqs: list[list[int]] = [[] for _ in range(6)]
    arrival: list[tuple[int, int]] = []  # (sequence, length after the token), in arrival order
    for step in range(300):
        s = rng.randrange(len(seqs))
        chunk = [rng.choice((1, 2, 3, 4, 5)) if rng.random() < 0.3 else (len(seqs[s]) + k) % 7 for k in range(rng.randint(1, 4))]
        index.extend(s, chunk)
        for t in chunk:
            seqs[s].append(t)
            arrival.append((s, len(seqs[s])))
        context = seqs[rng.randrange(len(seqs))][-8:] or [1]
        draft, score = index.speculate(context, max_tokens=5, min_prob=0.2)[:2]
        want = _reference_speculate(seqs, arrival, orders, context, 5, 0.2)
        assert (draft, round(score, 9)) == (want[0], round(want[1], 9)), step
    assert [index.sequence(s) for s in range(len(seqs))] == seqs
    before = index.nbytes
    context = seqs[0][-8:]
    drafted = index.speculate(context, max_tokens=5, min_prob=0.2)[:2]
    index.compact()  # as a finished group's index is kept for history: smaller, drafting the same
    assert index.nbytes < before and index.speculate(context, max_tokens=5, min_prob=0.2)[:2] == drafted
    index.extend(0, [1, 2, 3])  # and it can still grow
    assert index.sequence(0) == seqs[0] + [1, 2, 3]
