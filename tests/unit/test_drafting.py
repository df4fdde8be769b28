"""The grouped drafter: suffix matching, siblings and history as draft sources, and a replay that
never shows a sibling's future tokens."""

from flashq.drafting import GroupedDrafter, MatchIndex, replay


def test_match_index_follows_the_most_frequent_continuation():
    index = MatchIndex(orders=(2,))
    index.extend("a", [1, 2, 3, 4, 5])
    index.extend("b", [9, 2, 3, 4, 6])
    index.extend("c", [2, 3, 4, 6, 7])
    draft, score, _ = index.speculate([0, 2, 3], max_tokens=4, min_prob=0.1)
    assert draft[:2] == [4, 6] and score > 1.5  # 4 always follows 2 3; then 6 twice out of three
    assert index.speculate([42], max_tokens=4)[:2] == ([], 0.0)  # nothing to match


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
    assert drafter.requests["g0/1"].follow  # carried on
    assert drafter.propose("g0/1", 3) == [15, 16, 17]
    drafter.accept("g0/1", [15, 99])  # a rejection: the next draft searches afresh
    assert not drafter.requests["g0/1"].follow
