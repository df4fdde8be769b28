"""The plug-in examples the README and docs show as files (a python block opening with
`# NAME.py`), written out and imported as a user would, each run on a tiny case: a reward
function scores a task, an environment class plays an episode to its end. A block that is an
excerpt of a file in the repository (it names `(examples/....py)`) stands for that file, which
must import and define what the block defines."""

import asyncio
import importlib
import inspect
import re
import sys
from pathlib import Path

import pytest

from flashq.envs.base import StepResult

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FILE_BLOCK = re.compile(r"```python\n# (\w+)\.py\b([^\n]*)\n(.*?)```", re.DOTALL)


def examples() -> list:
    found = []
    for page in PAGES:
        for name, comment, body in FILE_BLOCK.findall(page.read_text()):
            where = str(page.relative_to(ROOT))
            found.append(pytest.param(where, name, comment, body, id=f"{where}:{name}.py"))
    return found


def call(fn, *args):
    out = fn(*args)
    return asyncio.run(out) if inspect.isawaitable(out) else out


def play(env_class, max_turns: int = 20) -> list[StepResult]:
    env = env_class()
    opening = call(env.reset, {"prompt": "1+1=", "answer": "2", "id": "t0"}, 0)
    assert isinstance(opening, list) and opening and all({"role", "content"} <= set(m) for m in opening)
    results = []
    for turn in range(1, max_turns + 1):
        result = call(env.step, {"role": "assistant", "content": str(turn)})
        assert isinstance(result, StepResult)
        results.append(result)
        if result.terminated or result.truncated:
            return results
    raise AssertionError(f"{env_class.__name__} did not end within {max_turns} turns")


@pytest.mark.parametrize("page,name,comment,body", examples())
def test_a_plugin_example_imports_and_runs_on_a_tiny_case(page, name, comment, body, tmp_path, monkeypatch):
    excerpt = re.search(r"\((examples/\w+\.py)\)", comment)
    if excerpt:  # an excerpt: the file it comes from is what a user runs
        module = importlib.import_module(excerpt.group(1).removesuffix(".py").replace("/", "."))
        defined = re.findall(r"^(?:async )?def (\w+)|^class (\w+)", body, re.MULTILINE)
        for fn, cls in defined:
            assert hasattr(module, fn or cls), f"{page}: {excerpt.group(1)} has no {fn or cls}, which the block shows"
        return
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))  # the directory flashq is launched from
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)
    ran = 0
    for attr, obj in vars(module).items():
        if getattr(obj, "__module__", None) != name:
            continue
        if inspect.isclass(obj) and hasattr(obj, "reset") and hasattr(obj, "step"):
            assert play(obj)[-1].terminated
            ran += 1
        elif inspect.isfunction(obj) and list(inspect.signature(obj).parameters)[:2] == ["task", "response"]:
            task = {"prompt": "What is 6 times 7?", "answer": "42", "id": "t0"}
            assert call(obj, task, "It is 42") == 1.0 and call(obj, task, "no idea") == 0.0
            ran += 1
    assert ran, f"{page}: {name}.py defines no reward function or environment class to run"
