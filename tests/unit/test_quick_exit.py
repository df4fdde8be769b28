"""Role and engine-core processes end without the interpreter's teardown once their work is done
(`exit_without_teardown`, `run_engine_core_then_exit`): atexit handlers and buffered output
still go out, the status is kept, and a failing engine core still fails as vLLM's own target
does. The engine-core tests run vLLM's target as a stand-in (a function that raises what the
real one raises at its end); tests/integration/test_speculation.py shuts real engines down
through the wrapper."""

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import atexit, sys
    from flashq.roles.common import exit_without_teardown

    class Loud:
        def __del__(self):
            print("teardown ran", flush=True)

    keep = Loud()  # a module global: the interpreter's teardown deletes it, and says so
    atexit.register(lambda: print("atexit ran", flush=True))
    print("buffered", end="")  # not flushed yet: stdout is a pipe
    {exit}
""")


def run_script(exit_line: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT.format(exit=exit_line)], capture_output=True, text=True, timeout=60)


def test_exit_without_teardown_keeps_status_atexit_handlers_and_output_but_skips_teardown():
    quick = run_script("exit_without_teardown(3)")
    assert quick.returncode == 3, quick.stderr
    assert quick.stdout.startswith("buffered") and "atexit ran" in quick.stdout
    assert "teardown ran" not in quick.stdout
    normal = run_script("sys.exit(3)")  # the control: a normal exit tears the module down
    assert normal.returncode == 3 and "teardown ran" in normal.stdout


class Exited(Exception):
    """Stands for the process ending in exit_without_teardown (with .code)."""


@pytest.fixture
def engine_core(monkeypatch):
    """vLLM's EngineCoreProc with its original target replaced by `target` (set per test), and
    exit_without_teardown raising Exited instead of ending the test process."""
    from vllm.v1.engine.core import EngineCoreProc

    import flashq.engine.vllm_plugin as vllm_plugin
    import flashq.roles.common as common

    def exit_now(code):
        raise Exited(code)

    monkeypatch.setattr(common, "exit_without_teardown", exit_now)
    calls = []
    monkeypatch.setattr(vllm_plugin, "relay_signals_to_main_thread", lambda: calls.append("relay"))

    def set_target(behaviour):
        def target(*args, **kwargs):
            calls.append((args, kwargs))
            behaviour()

        monkeypatch.setattr(EngineCoreProc, "flashq_run_engine_core", staticmethod(target), raising=False)
        return calls

    return set_target


def raise_(e):
    def go():
        raise e

    return go


@pytest.mark.parametrize("end", [lambda: None, raise_(SystemExit(0)), raise_(SystemExit(None))])
def test_engine_core_ends_without_teardown_after_a_clean_shutdown(engine_core, end):
    from flashq.engine.vllm_plugin import run_engine_core_then_exit

    calls = engine_core(end)
    with pytest.raises(Exited) as exited:
        run_engine_core_then_exit("arg", dp_rank=0, vllm_config="cfg")
    assert exited.value.args == (0,)
    assert calls == ["relay", (("arg",), {"dp_rank": 0, "vllm_config": "cfg"})]


@pytest.mark.parametrize("failure", [SystemExit(1), RuntimeError("EngineCore failed to start")])
def test_a_failing_engine_core_fails_as_vllm_target_does(engine_core, failure):
    from flashq.engine.vllm_plugin import run_engine_core_then_exit

    engine_core(raise_(failure))
    with pytest.raises(type(failure)) as raised:
        run_engine_core_then_exit()
    assert raised.value is failure


def test_the_front_end_starts_engine_cores_with_the_wrapper_once(monkeypatch):
    from vllm.v1.engine.core import EngineCoreProc

    from flashq.engine.vllm_plugin import end_engine_core_without_teardown, run_engine_core_then_exit

    # vLLM's own target, even when an engine built earlier in this process already swapped it
    original = EngineCoreProc.__dict__.get("flashq_run_engine_core", EngineCoreProc.__dict__["run_engine_core"])
    monkeypatch.setattr(EngineCoreProc, "run_engine_core", original)
    monkeypatch.delattr(EngineCoreProc, "flashq_run_engine_core", raising=False)
    original = EngineCoreProc.run_engine_core
    end_engine_core_without_teardown()
    end_engine_core_without_teardown()  # a second engine in the process: still the original underneath
    assert EngineCoreProc.run_engine_core is run_engine_core_then_exit
    assert EngineCoreProc.flashq_run_engine_core is original


RELAY = textwrap.dedent("""
    import queue, signal, threading
    from flashq.engine.vllm_plugin import relay_signals_to_main_thread

    {relay}
    stop = queue.Queue()
    signal.signal(signal.SIGTERM, lambda *_: stop.put("stopped"))  # what vLLM's engine core does
    other = threading.Thread(target=threading.Event().wait, daemon=True)
    other.start()
    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})  # so the signal lands on another thread
    print("waiting", flush=True)
    print(stop.get(), flush=True)  # the engine core's idle wait on its input queue
""")


def test_a_sigterm_caught_on_another_thread_still_wakes_the_main_thread():
    """vLLM's engine core, idle, waits on its input queue in its main thread; its SIGTERM handler
    runs there. Here the signal can only be caught on another thread: without the relay the main
    thread sleeps on (checked by hand: the same script without it never ends)."""
    proc = subprocess.Popen([sys.executable, "-c", RELAY.format(relay="relay_signals_to_main_thread()")],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "waiting\n"
        proc.send_signal(15)
        out, _ = proc.communicate(timeout=60)  # a bound for a hang, not a timing
        assert out == "stopped\n" and proc.returncode == 0
    finally:
        proc.kill()


def test_a_forked_engine_core_ends_as_vllms_does(engine_core, monkeypatch):
    """Forked (vLLM's default off the CPU), the engine core must not run the front end's atexit
    handlers it inherited; multiprocessing ends a forked child without teardown anyway."""
    import multiprocessing

    from flashq.engine.vllm_plugin import run_engine_core_then_exit

    class Forked:
        _start_method = "fork"

    monkeypatch.setattr(multiprocessing, "current_process", lambda: Forked())
    calls = engine_core(raise_(SystemExit(0)))
    with pytest.raises(SystemExit):
        run_engine_core_then_exit()
    assert calls[0] == "relay" and len(calls) == 2
