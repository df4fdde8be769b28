import pytest

from flashq.scheduling.dispatch import LeastLoadedQueue


def test_least_loaded_worker_gets_each_request_under_a_cap():
    q = LeastLoadedQueue(["a", "b"], cap_per_worker=2)
    for i in range(5):
        q.submit(i)
    got = q.assignments()
    assert got == [("a", 0), ("b", 1), ("a", 2), ("b", 3)]  # replicas spread over both workers
    assert list(q.waiting) == [4] and q.free_slots() == -1
    q.done("b")
    assert q.assignments() == [("b", 4)]
    assert q.assignments() == []


def test_done_without_work_is_an_error():
    q = LeastLoadedQueue(["a"], cap_per_worker=1)
    with pytest.raises(ValueError, match="nothing in flight"):
        q.done("a")


def test_requeued_work_goes_first():
    q = LeastLoadedQueue(["a"], cap_per_worker=1)
    q.submit("x")
    q.submit_front("retry")
    assert q.assignments() == [("a", "retry")]


def test_utilisation_clock_counts_idle_time_only_when_nothing_is_in_flight():
    q = LeastLoadedQueue(["a"], cap_per_worker=4)
    clock = q.clocks["a"]
    busy0, idle0 = clock.snapshot()
    q.submit(1)
    q.assignments()
    assert clock.in_flight == 1
    q.done("a")
    assert clock.in_flight == 0
    busy1, idle1 = clock.snapshot()
    assert busy1 >= busy0 and idle1 >= idle0


def test_affinity_keeps_a_group_on_one_worker_and_spills_when_it_is_full():
    q = LeastLoadedQueue(["a", "b"], cap_per_worker=3, affinity=lambda item: item.split("/")[0])
    for item in ["g0/0", "g0/1", "g1/0", "g0/2", "g0/3", "g1/1"]:
        q.submit(item)
    got = q.assignments()
    assert got == [("a", "g0/0"), ("a", "g0/1"), ("b", "g1/0"), ("a", "g0/2"), ("b", "g0/3"), ("b", "g1/1")]
    q.forget("g0")
    assert "g0" not in q.home and q.home["g1"] == "b"


def test_affinity_homes_are_bounded_and_the_least_recently_used_is_forgotten():
    q = LeastLoadedQueue(["a", "b"], cap_per_worker=100, affinity=lambda item: item.split("/")[0], max_homes=2)
    for item in ["p0/0", "p1/0", "p0/1", "p2/0"]:  # p0 used again after p1, so p1 is the oldest when p2 arrives
        q.submit(item)
    q.assignments()
    assert list(q.home) == ["p0", "p2"]


def test_a_preferred_worker_takes_its_item_on_a_tie_and_a_less_loaded_worker_takes_it_otherwise():
    q = LeastLoadedQueue(["a", "b"], cap_per_worker=4, prefer=lambda item: "b" if item.startswith("cont") else None)
    q.submit("cont-0")
    assert q.assignments() == [("b", "cont-0")]  # a tie: "a" would be first, but "b" holds the prefix
    q.submit("cont-1")
    assert q.assignments() == [("a", "cont-1")]  # "a" has more room: balance wins
    q.submit("cont-2")
    q.submit("fresh")
    assert q.assignments() == [("b", "cont-2"), ("a", "fresh")]
