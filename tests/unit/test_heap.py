"""The start-up heap freeze and the collector clock (flashq/roles/heap.py), and the engine
fork keeping a role's frozen heap frozen (flashq/engine/engine_process.py)."""

import gc

import pytest

from flashq.engine.engine_process import _FrozenHeapForkContext
from flashq.roles.heap import CollectorClock, freeze_startup_heap


@pytest.fixture
def unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_the_start_up_heap_is_frozen_out_of_later_collections(unfrozen):
    frozen = freeze_startup_heap()
    assert frozen == gc.get_freeze_count() > 10_000  # this test process's imports (pytest, flashq, numpy)
    later = [[i] for i in range(100)]  # made after the freeze: still collected
    assert all(gc.is_tracked(x) for x in later)
    assert gc.get_freeze_count() == frozen


def test_the_collector_clock_counts_each_generations_collections_until_closed():
    clock = CollectorClock()
    try:
        gc.collect(2)
        gc.collect(0)
        assert clock.collections[2] == 1 and clock.collections[0] >= 1
        assert clock.total_s > 0 and all(s >= 0 for s in clock.seconds)
    finally:
        clock.close()
    counted = list(clock.collections)
    gc.collect()
    assert clock.collections == counted  # closed: no longer called
    clock.close()  # twice is harmless


def _nothing():
    pass


@pytest.mark.parametrize("frozen_by_the_role", [True, False])
def test_forking_an_engine_keeps_the_roles_frozen_heap_frozen(unfrozen, frozen_by_the_role):
    if frozen_by_the_role:
        freeze_startup_heap()
    process = _FrozenHeapForkContext().Process(target=_nothing)
    process.start()
    process.join(60)
    assert process.exitcode == 0
    assert (gc.get_freeze_count() > 0) == frozen_by_the_role  # the fork unfreezes only what it froze
