"""How the engine core starts (flashq/engine/engine_process.py): forked from the rollout worker
only while its torch runs one thread, or from the forkserver, seeing the worker's environment as
it is when the engine starts. Each in a child interpreter, since a process has one forkserver
for life and the choice is the process's."""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os

    from flashq.engine import engine_process


    def report(queue):
        engine_process.apply_launch_environment()  # what flashq's engine-core target does first
        queue.put((os.environ.get("FLASHQ_TEST_LATE"), os.environ.get("FLASHQ_TEST_GONE")))


    if __name__ == "__main__":
        engine_process.PRELOAD = []  # vLLM's import is not what this checks
        os.environ["FLASHQ_TEST_GONE"] = "set before the forkserver started"
        engine_process.start_forkserver()
        os.environ["FLASHQ_TEST_LATE"] = "set after"
        del os.environ["FLASHQ_TEST_GONE"]
        with engine_process.launching_engine_core():
            from vllm.v1.engine import utils

            context = utils.get_mp_context()  # what vLLM's launch_core_engines asks for
            queue = context.Queue()
            child = context.Process(target=report, args=(queue,))
            child.start()
            print(context.get_start_method(), *queue.get(timeout=120))
            child.join()
""")


def test_engine_core_from_the_forkserver_sees_the_environment_at_launch(tmp_path):
    script = tmp_path / "launch.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["forkserver", "set", "after", "None"]


FORK_SCRIPT = textwrap.dedent("""
    import multiprocessing
    import os

    import torch

    from flashq.engine import engine_process


    def report(queue):
        import gc

        frozen = gc.get_freeze_count() > 0  # the worker's heap, left alone by the child's collections
        queue.put((multiprocessing.current_process()._start_method, os.environ.get("FLASHQ_TEST_LATE"), frozen))


    if __name__ == "__main__":
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"  # what vLLM's CPU platform sets while it builds an engine
        torch.set_num_threads(1)
        engine_process.use_fork()
        os.environ["FLASHQ_TEST_LATE"] = "set after"
        with engine_process.launching_engine_core():
            from vllm.v1.engine import utils

            context = utils.get_mp_context()
            queue = context.Queue()
            child = context.Process(target=report, args=(queue,))
            child.start()
            print(*queue.get(timeout=120))
            child.join()
            import gc

            print("parent-frozen", gc.get_freeze_count())
            torch.set_num_threads(2)  # OpenMP may now run a pool of threads: no fork
            print(utils.get_mp_context().get_start_method())
""")


def test_engine_core_forked_from_the_worker_only_while_torch_runs_one_thread(tmp_path):
    script = tmp_path / "launch.py"
    script.write_text(FORK_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["fork", "set", "after", "True", "parent-frozen", "0", "spawn"]
    assert "not forking the engine core from a process whose torch runs 2 threads" in out.stderr


def test_auto_forks_an_engine_of_one_openmp_thread():
    from flashq.engine.engine_process import engine_start

    assert engine_start("auto", 1) == "fork"
    assert engine_start("auto", 4) == "forkserver"
    assert engine_start("vllm", 1) == "vllm"


PREPARE_SCRIPT = textwrap.dedent("""
    import os

    from flashq.config import load_config
    from flashq.engine import engine_process
    from flashq.engine.vllm_engine import prepare_engine_process

    engine_process.PRELOAD = []  # vLLM's import is not what this checks
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "4"  # whole GiB, and vLLM would let it override the config
    prepare_engine_process(load_config(None, ["rollout.kv_cache_gib=0.25"]), "cpu")
    print(os.environ.get("VLLM_CPU_KVCACHE_SPACE"), os.environ["OMP_NUM_THREADS"], engine_process._fork,
          engine_process._server_env is not None)
""")


def test_the_worker_forks_only_what_its_own_openmp_runs_in_one_thread(tmp_path):
    """auto reads the worker's effective threads: the config's one, or a user's OMP_NUM_THREADS
    (then the forkserver). A user's VLLM_CPU_KVCACHE_SPACE gives way to rollout.kv_cache_gib, named."""
    script = tmp_path / "prepare.py"
    script.write_text(PREPARE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["None", "1", "True", "False"]
    assert "VLLM_CPU_KVCACHE_SPACE=4 ignored" in out.stderr
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env={**env, "OMP_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["None", "2", "False", "True"]


PARALLEL_THEN_FORK = textwrap.dedent("""
    import multiprocessing

    import torch


    def child(queue):
        b = torch.randn(1000, 1000)
        queue.put(float((b @ b).sum() * 0) + torch.get_num_threads())


    if __name__ == "__main__":
        a = torch.randn(1000, 1000)
        (a @ a).sum()  # an OpenMP parallel region in the parent, before the fork
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        forked = context.Process(target=child, args=(queue,))
        forked.start()
        print(queue.get(timeout=60))
        forked.join()
""")


def test_a_one_thread_process_forks_safely_after_a_parallel_region(tmp_path):
    """What `use_fork` relies on: with one OpenMP thread the runtime keeps no pool for a fork to lose
    (with two, the same script's child hangs)."""
    script = tmp_path / "fork.py"
    script.write_text(PARALLEL_THEN_FORK)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["1.0"]


def test_engines_run_the_v1_model_runner_unless_v2_is_asked_for_by_name(monkeypatch, caplog):
    """On CUDA vLLM 0.32 would pick Model Runner V2, on which none of flashq's engine hooks ran."""
    from flashq.engine.vllm_engine import pin_v1_model_runner

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    pin_v1_model_runner()
    import os

    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    pin_v1_model_runner()
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1" and "tested on vLLM's V1 model runner only" in caplog.text
