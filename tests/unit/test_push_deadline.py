"""The deadline of an NCCL weight push (flashq.engine.push_deadline), on CPU: the collective is a
stand-in that blocks until its communicator is aborted, as NCCL's do (no GPU here; the abort path
is the logic under test). A push past its deadline must abort the group and fail, whether the
woken collective raises or returns as a disabled vLLM communicator does, so that nothing it
carried is labelled as delivered."""

import threading

import pytest

from flashq.engine.push_deadline import PushDeadline, PushDeadlineExceeded, abort_nccl_group, under_nccl_deadline


class StandInCommunicator:
    """Blocks a broadcast until `destroy` (vLLM's PyNcclCommunicator.destroy: ncclCommAbort, then
    disabled); after the abort the blocked call raises (`raises`) or returns nothing."""

    def __init__(self, raises: bool):
        self.raises = raises
        self.aborted = threading.Event()
        self.entered = threading.Event()
        self.destroyed = 0

    def broadcast(self) -> str:
        self.entered.set()
        self.aborted.wait()
        if self.raises:
            raise RuntimeError("NCCL error: remote process exited or there was a network error")
        return "returned as if sent"

    def destroy(self) -> None:
        self.destroyed += 1
        self.aborted.set()


class Engine:
    def __init__(self, group):
        self.model_update_group = group


@pytest.mark.parametrize("raises", [True, False], ids=["woken-collective-raises", "disabled-collective-returns"])
def test_a_push_blocked_past_its_deadline_aborts_the_group_and_fails(raises):
    group = StandInCommunicator(raises)
    engine = Engine(group)
    with pytest.raises(PushDeadlineExceeded, match=r"weight push 7 passed its deadline of 0.2 s \(weight_sync.timeout_s\)"):
        under_nccl_deadline(engine, 0.2, "weight push 7", group.broadcast)
    assert group.entered.is_set() and group.destroyed == 1
    assert engine.model_update_group is None  # forgotten: the rebuilt group starts clean


def test_a_push_in_time_is_left_alone():
    group = StandInCommunicator(raises=False)
    group.aborted.set()  # a collective that completes at once
    engine = Engine(group)
    assert under_nccl_deadline(engine, 60, "weight push 1", group.broadcast) == "returned as if sent"
    assert group.destroyed == 0 and engine.model_update_group is group


def test_a_failure_before_the_deadline_is_the_push_own_error():
    def broken():
        raise ValueError("WeightSource metadata() disagrees with iteration")

    aborts = []
    with pytest.raises(ValueError, match="disagrees"):
        PushDeadline(60, lambda: aborts.append(1), "weight push 2").run(broken)
    assert aborts == []


def test_gloo_engines_have_no_nccl_group_and_run_as_they_are():
    """gloo's collectives carry their own timeout; an engine without `model_update_group`
    (flashq's gloo engines) gets no watcher."""
    class GlooEngine:
        group = object()

    assert under_nccl_deadline(GlooEngine(), 0.01, "weight push 3", lambda: "sent") == "sent"
    assert under_nccl_deadline(Engine(None), 0.01, "weight push 3", lambda: "sent") == "sent"


def test_aborting_a_group_twice_destroys_it_once():
    group = StandInCommunicator(raises=False)
    engine = Engine(group)
    abort_nccl_group(engine)
    abort_nccl_group(engine)
    assert group.destroyed == 1
