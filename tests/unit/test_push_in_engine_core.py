"""flashq's one-call weight push inside vLLM's engine core (`push_weights_in_engine_core`),
against a stand-in for the engine core: the order of its calls, and vLLM's own idle loop
(`EngineCoreProc._process_input_queue`, run on the stand-in) leaving once a late push has
resumed. On the CPU backend the real engine pauses at once unless a request finished in the
step before, so tests/integration/test_weight_transfer.py seldom takes the late path."""

import queue
import threading
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
    assert done.done() and done.result() >= 0
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
    assert done.result(timeout=0) >= 0 and core.calls == IN_ORDER
    assert core.input_queue.get_nowait() == (EngineCoreRequestType.WAKEUP, None)


class IdleLoopCore(FakeEngineCore):
    """The stand-in with what vLLM's idle loop reads: it has work (requests to run) once resumed,
    and the pause completes from an idle callback, as vLLM's own `engine_idle_callback` does."""

    def __init__(self):
        super().__init__(busy=True)
        self._idle_state_callbacks = [lambda engine: engine.pause.set_result(None)]
        self.aborts_queue: queue.Queue = queue.Queue()
        self.process_input_queue_block = True

    def has_work(self) -> bool:
        return ("resume",) in self.calls

    def is_running(self) -> bool:
        return True


def test_vllms_idle_loop_moves_on_to_the_resumed_requests_after_a_late_push():
    """The loop notifies its idle callbacks, then blocks on its input queue; a push that resumed
    in a callback must leave it a message, or the resumed requests wait for the next one (a
    run hung at step 2498 of 2500 so, its staleness gate holding new requests back)."""
    from vllm.v1.engine.core import EngineCoreProc

    core = IdleLoopCore()
    core._notify_idle_state_callbacks = EngineCoreProc._notify_idle_state_callbacks.__get__(core)
    core._handle_client_request = EngineCoreProc._handle_client_request.__get__(core)
    done = push_weights_in_engine_core(core, "flashq_push_weights", {"update_info": UPDATE}, "7", False)
    loop = threading.Thread(target=EngineCoreProc._process_input_queue, args=(core,), daemon=True)
    loop.start()
    loop.join(timeout=60)  # returns at once when woken; the timeout only bounds a hang
    hung = loop.is_alive()
    if hung:  # let the stuck loop go before failing
        from vllm.v1.engine import EngineCoreRequestType

        core.input_queue.put_nowait((EngineCoreRequestType.WAKEUP, None))
    assert not hung, "the idle loop blocked on its input queue with requests to run"
    assert done.result(timeout=0) >= 0 and core.calls == IN_ORDER


def test_a_failed_receive_reaches_the_caller_and_leaves_the_engine_paused():
    core = FakeEngineCore(busy=True, receive_fails=True)
    done = push_weights_in_engine_core(core, "flashq_push_weights", {"update_info": UPDATE}, "7", False)
    core.pause.set_result(None)
    with pytest.raises(RuntimeError, match="broke off"):
        done.result(timeout=0)
    assert core.calls == IN_ORDER[:1]  # not labelled, not resumed: only the next push that succeeds resumes


class StagingWorker:
    """The worker's `flashq_stage_weights` as the engine core's thread sees it: blocks until the
    trainer's bytes are in (`arrive`), on whichever thread runs it."""

    def __init__(self, fails: bool = False):
        self.arrive, self.fails = threading.Event(), fails
        self.thread: threading.Thread | None = None

    def flashq_stage_weights(self, update_info, deadline_s=None):
        self.thread = threading.current_thread()
        assert self.arrive.wait(10)
        if self.fails:
            raise RuntimeError("the broadcast broke off")


def staging_core(worker):
    """An engine core whose executor is vLLM's one-process one (built without starting a worker)."""
    from types import SimpleNamespace

    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    executor = UniProcExecutor.__new__(UniProcExecutor)
    executor.driver_worker = SimpleNamespace(worker=worker)
    return SimpleNamespace(model_executor=executor)


@pytest.mark.parametrize("fails", [False, True])
def test_a_push_is_received_beside_the_engine_core_loop(fails):
    """`flashq_receive_while_generating` returns at once (the engine core's loop goes on with
    its steps) and its future resolves, or fails, when the receive on its own thread does."""
    from flashq.engine.vllm_plugin import receive_in_engine_core

    worker = StagingWorker(fails)
    done = receive_in_engine_core(staging_core(worker), {"update_info": UPDATE})
    assert not done.done()
    worker.arrive.set()
    if fails:
        with pytest.raises(RuntimeError, match="broke off"):
            done.result(timeout=10)
    else:
        assert done.result(timeout=10) is None
    assert worker.thread is not threading.current_thread()


def test_receiving_while_generating_is_refused_where_the_worker_is_another_process():
    from types import SimpleNamespace

    from flashq.engine.vllm_plugin import receive_in_engine_core

    with pytest.raises(RuntimeError, match="receive_while_generating=false"):
        receive_in_engine_core(SimpleNamespace(model_executor=object()), {"update_info": UPDATE})
