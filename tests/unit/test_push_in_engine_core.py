"""flashq's one-call weight push inside vLLM's engine core (`push_weights_in_engine_core`),
against a stand-in for the engine core: only the order of its calls is under test here (the
real engine runs it in tests/integration/test_weight_transfer.py, where the pause usually
completes at once and the late path below seldom runs)."""

import queue
from concurrent.futures import Future

import pytest

from flashq.engine.vllm_plugin import push_weights_in_engine_core


class FakeEngineCore:
    """vLLM's EngineCoreProc as the push sees it: a pause that completes at once when idle or
    later (at the next idle point) when a step is in flight, the worker's receive, the weight
    label, the resume, and the input queue its idle loop blocks on."""

    def __init__(self, busy: bool, receive_fails: bool = False):
        self.calls: list[tuple] = []
        self.input_queue: queue.Queue = queue.Queue()
        self.pause = Future() if busy else None
        self.receive_fails = receive_fails

    def pause_scheduler(self, mode, clear_cache):
        self.calls.append(("pause", mode, clear_cache))
        return self.pause

    def collective_rpc(self, method, kwargs):
        if self.receive_fails:
            raise RuntimeError("the broadcast broke off")
        self.calls.append(("receive", method, kwargs))

    def set_weight_version(self, version):
        self.calls.append(("label", version))

    def resume_scheduler(self):
        self.calls.append(("resume",))


UPDATE = {"names": ["w"]}
IN_ORDER = [("pause", "keep", False), ("receive", "flashq_push_weights", {"update_info": UPDATE}), ("label", "7"), ("resume",)]


def test_an_idle_engine_is_updated_within_the_call():
    core = FakeEngineCore(busy=False)
    done = push_weights_in_engine_core(core, "flashq_push_weights", {"update_info": UPDATE}, "7", False)
    assert done.done() and done.result() is None
    assert core.calls == IN_ORDER


def test_a_busy_engine_is_updated_when_its_step_ends_and_its_idle_loop_is_woken():
    """The pause completes inside the engine core's idle loop, which then blocks on its input
    queue; the push leaves a wake-up there, or the resumed requests would wait for the next
    message (a run hung at step 2498 of 2500 so)."""
    from vllm.v1.engine import EngineCoreRequestType

    core = FakeEngineCore(busy=True)
    done = push_weights_in_engine_core(core, "flashq_push_weights", {"update_info": UPDATE}, "7", False)
    assert not done.done() and core.calls == IN_ORDER[:1]  # nothing received before the step ends
    core.pause.set_result(None)
    assert done.result(timeout=0) is None and core.calls == IN_ORDER
    assert core.input_queue.get_nowait() == (EngineCoreRequestType.WAKEUP, None)


def test_a_failed_receive_reaches_the_caller_and_leaves_the_engine_paused():
    core = FakeEngineCore(busy=True, receive_fails=True)
    done = push_weights_in_engine_core(core, "flashq_push_weights", {"update_info": UPDATE}, "7", False)
    core.pause.set_result(None)
    with pytest.raises(RuntimeError, match="broke off"):
        done.result(timeout=0)
    assert core.calls == IN_ORDER[:1]  # not labelled, not resumed: the next push or the abandon call decides
