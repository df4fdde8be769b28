"""vLLM plugin entry point (`vllm.general_plugins`), run in every vLLM process.

Keep this import-light: vLLM loads it before building each worker.
"""

import logging
import sys
import threading
import time
from concurrent.futures import Future


class _BenignReloadWarnings(logging.Filter):
    """vLLM's layerwise reload warns for layers that receive no weights. Rotary embeddings have
    none, and a tied LM head shares the embedding's (flashq repacks it, see gloo_transfer), so
    on every weight update these two lines are noise; so is the notice that flashq's CPU
    `expand_kernel` (cpu_kernels) replaces vLLM's. Anything else still gets through."""

    BENIGN = ("RotaryEmbedding: Failed to load weights", "ParallelLMHead: Failed to load weights",
              "Kernel vllm.v1.sample.rejection_sampler.expand_kernel is already registered. Overwriting.")

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.BENIGN


class _NarrowingToServingDtype(logging.Filter):
    """vLLM warns once per tensor (270 lines for SmolLM2-135M) when a float32 checkpoint is loaded
    into the half-precision parameters that `model.dtype` asks for: flashq's converted GGUF models
    are float32 on disk, so the trainer keeps every dequantized value. Say it once; other dtype
    mismatches still warn per tensor."""

    NOTICE = "Attempted to load weight %s with dtype %s into parameter with dtype %s"

    def __init__(self) -> None:
        super().__init__()
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.NOTICE or len(record.args) != 3:
            return True
        _, stored, served = (str(a) for a in record.args)
        if stored != "torch.float32" or served not in ("torch.bfloat16", "torch.float16"):
            return True
        if self.said:
            return False
        self.said = True
        record.msg, record.args = "Loading %s weights into %s parameters (model.dtype); one notice for all tensors", (stored, served)
        return True


def register() -> None:
    import os

    from flashq.engine.gloo_transfer import register as register_gloo

    register_gloo()
    if "vllm.v1.engine.core" in sys.modules:  # the engine core's process (it loads plugins as it starts)
        from flashq.engine import final_logprobs

        install_push_in_one_call()
        final_logprobs.install()
    if _cpu_platform():
        from flashq.engine.cpu_kernels import install

        install()
    if os.environ.get("FLASHQ_ENGINE_WAIT", "spin") == "nap":
        nap_while_waiting_for_queue()
    if os.environ.get("FLASHQ_SPECULATION") == "grouped":
        use_grouped_proposer()
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_BenignReloadWarnings())
    logging.getLogger("vllm.model_executor.models.utils").addFilter(_NarrowingToServingDtype())
    logging.getLogger("vllm.triton_utils.dispatcher").addFilter(_BenignReloadWarnings())


def _cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def install_push_in_one_call() -> None:
    """Give vLLM's engine core `flashq_pause_push_resume` (`push_weights_in_engine_core` below)
    and `flashq_receive_while_generating` (`receive_in_engine_core`), called by name as
    utilities; the worker methods they run are FlashqWorkerExtension's."""
    from vllm.v1.engine.core import EngineCore

    EngineCore.flashq_pause_push_resume = push_weights_in_engine_core
    EngineCore.flashq_receive_while_generating = receive_in_engine_core


def push_weights_in_engine_core(core, worker_method: str, kwargs: dict, version: str, clear_cache: bool,
                                resume: bool = True) -> Future:
    """A whole weight update inside the engine core: pause with "keep" (running requests
    frozen, not aborted), run the worker's `worker_method` (FlashqWorkerExtension's: receive and
    load, or load what was received while generating), label the weights `version` and resume.
    Driven from the front end these are four calls, each a round trip between its process and
    the engine core's while the engine stands paused; here the load starts the moment the pause
    completes. Nothing is generated between the pause and the resume, so every token vLLM labels
    `version` was sampled from the new weights. If the load fails (a push broken off by a
    death), generation stays paused until the next push succeeds. `resume` False: leave the
    scheduler paused (a sleeping engine resumes once it is fully awake). The future's result:
    the seconds generation stood paused."""
    from vllm.v1.engine import EngineCoreRequestType

    done: Future = Future()

    def push(paused: Future | None = None) -> None:
        stopped = time.monotonic()
        try:
            if paused is not None:
                paused.result()
            core.collective_rpc(worker_method, kwargs=kwargs)
            core.set_weight_version(version)
            if resume:
                core.resume_scheduler()
        except Exception as e:  # noqa: BLE001 - handed to the caller through the future
            done.set_exception(e)
        else:
            done.set_result(time.monotonic() - stopped)
        if paused is not None:
            # this ran in the engine core's idle loop, which next blocks on its input queue:
            # without a message it would sit there with requests to run (a run whose staleness
            # gate held new requests back until this push's batch trained hung so)
            core.input_queue.put_nowait((EngineCoreRequestType.WAKEUP, None))

    paused = core.pause_scheduler(mode="keep", clear_cache=clear_cache)
    if paused is None:  # the engine was idle: paused already
        push()
    else:  # a step in flight: the pause completes at the engine core's next idle point
        paused.add_done_callback(push)
    return done


def receive_in_engine_core(core, kwargs: dict) -> Future:
    """Receive a push while the engine goes on generating: the worker's `flashq_stage_weights`
    runs on a thread of the engine core's process, holding what arrives beside the served
    model (which it never touches), and the future resolves once every byte is in; the front
    end then loads it with `flashq_pause_push_resume`. Only where the worker lives in this
    process (vLLM's one-process executor: one GPU or the CPU); elsewhere the worker is behind
    vLLM's message queue, which one thread at a time may use."""
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    executor = core.model_executor
    if not isinstance(executor, UniProcExecutor):
        raise RuntimeError(f"receiving while generating needs vLLM's one-process executor, not {type(executor).__name__}: "
                           "set weight_sync.receive_while_generating=false")
    worker = executor.driver_worker.worker
    done: Future = Future()

    def receive() -> None:
        try:
            worker.flashq_stage_weights(**kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
            done.set_exception(e)
        else:
            done.set_result(None)

    threading.Thread(target=receive, name="flashq-weight-receive", daemon=True).start()
    return done


def end_engine_core_without_teardown() -> None:
    """Make the engine-core processes this process starts end with `run_engine_core_then_exit`.
    vLLM names `EngineCoreProc.run_engine_core` as the process's target when it starts one, so
    the swap is made here, in the front end, before the engine is built."""
    from vllm.v1.engine.core import EngineCoreProc

    if "flashq_run_engine_core" not in EngineCoreProc.__dict__:
        EngineCoreProc.flashq_run_engine_core = EngineCoreProc.__dict__["run_engine_core"]
        EngineCoreProc.run_engine_core = staticmethod(run_engine_core_then_exit)


def run_engine_core_then_exit(*args, **kwargs) -> None:
    """vLLM's engine-core process, ended without the interpreter's teardown once vLLM has shut
    the engine down cleanly: collecting a heap that holds torch and vLLM took 2-3 s of CPU at
    every engine's exit here, and the rollout worker's shutdown waits on it (vLLM skips the same
    collection on ROCm with gc.freeze). A failure exits as vLLM's own target does. A forked
    engine core (vLLM's default off the CPU) already skips the teardown, and must not run the
    atexit handlers it inherited from the front end, so it ends as vLLM's does."""
    import multiprocessing

    from vllm.v1.engine.core import EngineCoreProc

    from flashq.engine.engine_process import apply_launch_environment
    from flashq.roles.common import exit_without_teardown

    apply_launch_environment()  # before vLLM loads plugins (flashq's reads its settings from the environment)
    run = getattr(EngineCoreProc, "flashq_run_engine_core", EngineCoreProc.run_engine_core)
    relay_signals_to_main_thread()
    if getattr(multiprocessing.current_process(), "_start_method", None) == "fork":
        return run(*args, **kwargs)
    try:
        run(*args, **kwargs)
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    exit_without_teardown(0)


def relay_signals_to_main_thread() -> None:
    """Make sure a SIGTERM reaches the engine core's handler. vLLM stops its engine core with
    SIGTERM, whose Python handler runs only on the main thread, and only once that thread runs
    Python again; idle, it waits on the engine's input queue. When the signal is caught on one
    of the process's other threads (gloo's, zmq's), or just as the main thread starts to wait,
    nothing wakes it: the front end waits out its 10 s timeout and kills the engine (at least 4
    of 13 engine shutdowns timed here on a loaded host). Every caught signal is written to a
    wake-up socket (the interpreter does this wherever it catches one); a thread reading it
    interrupts the main thread's wait with SIGUSR2, whose handler does nothing, so the pending
    handlers run. (So a SIGUSR2 no longer stops an engine core, as some schedulers' pre-emption
    notices would: they reach the rollout worker, whose exit stops its engine.)"""
    import signal
    import socket

    receive, send = socket.socketpair()
    send.setblocking(False)
    signal.set_wakeup_fd(send.fileno(), warn_on_full_buffer=False)
    signal.signal(signal.SIGUSR2, lambda *_: None)
    main = threading.main_thread().ident

    def relay(receive: socket.socket, send: socket.socket) -> None:  # holds both: the interpreter keeps only the fd
        while caught := receive.recv(64):
            if any(s != signal.SIGUSR2 for s in caught):
                for _ in range(3):  # again, in case the first lands just before the thread waits
                    signal.pthread_kill(main, signal.SIGUSR2)
                    time.sleep(0.05)

    threading.Thread(target=relay, args=(receive, send), daemon=True, name="flashq-signal-relay").start()


def nap_while_waiting_for_queue() -> None:
    """vLLM's engine core and its worker pass every step over a shared-memory queue whose reader
    spins (sched_yield) for a second after each message. On a GPU that buys latency with a spare
    core; on the CPU backend the cores are the compute, and the engine core spins while its
    worker runs the forward pass. Here the reader naps instead, 10 us at first and twice as long
    each time up to 200 us, so a wait costs its core almost nothing and ends at most about 200 us
    late. (Blocking on the queue's notify socket instead loses wake-ups: vLLM only relies on it
    after a second idle.)"""
    from vllm.distributed.device_communicators import shm_broadcast

    cls = shm_broadcast.SpinCondition
    if getattr(cls, "flashq_naps", False):
        return
    spin_wait, spin_record_read = cls.wait, cls.record_read

    def record_read(self):
        spin_record_read(self)
        self.nap_s = 1e-5

    def wait(self, timeout_ms=None):
        if time.monotonic() > self.last_read + self.busy_loop_s:
            return spin_wait(self, timeout_ms)  # idle: vLLM's own wait on the notify socket
        nap = getattr(self, "nap_s", 1e-5)
        time.sleep(nap)
        self.nap_s = min(2 * nap, 2e-4)

    cls.wait, cls.record_read, cls.flashq_naps = wait, record_read, True


def use_grouped_proposer() -> None:
    """vLLM's "suffix" method, with flashq's grouped drafter as its proposer. vLLM checks that
    arctic-inference (its own suffix implementation) is installed; flashq's replaces it, so
    that check is answered for it."""
    import vllm.config.speculative as speculative
    import vllm.v1.worker.gpu_model_runner as runner

    from flashq.engine.grouped_proposer import GroupedSuffixProposer

    speculative.has_arctic_inference = lambda: True
    runner.SuffixDecodingProposer = GroupedSuffixProposer
