"""The engine core's forkserver (flashq/engine/engine_process.py): an engine core forked from it
sees the rollout worker's environment as it is when the engine starts, not as it was when the
forkserver started. Run in a child interpreter, since a process has one forkserver for life."""

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
