"""The README's "Train your own model", followed as a user would in an empty directory: its data
script runs, its reward module imports from the directory launched from and scores the data's
records, and its config loads and reads that data (no run is started)."""

import os
import re
import subprocess
import sys
from pathlib import Path

from flashq.config import load_config
from flashq.data import make_task_source
from flashq.rewards import load_reward_fn

ROOT = Path(__file__).resolve().parents[2]


def section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"```(\w*)\n(.*?)```", text, re.DOTALL)


def test_the_readme_own_model_steps_work_as_written(tmp_path, monkeypatch):
    fences = blocks(section((ROOT / "README.md").read_text(), "Train your own model"))
    data_script = next(body for lang, body in fences if lang == "bash" and "python -" in body)
    reward_module = next(body for lang, body in fences if lang == "python")
    config = next(body for lang, body in fences if lang == "yaml")
    name = re.match(r"# (\S+\.py)", reward_module).group(1)
    config_name = re.match(r"# (\S+\.ya?ml)", config).group(1)

    subprocess.run(["bash", "-c", data_script.replace("python -", f"{sys.executable} -")], cwd=tmp_path, check=True,
                   env=dict(os.environ))
    run_dir = tmp_path / "my_run"
    (run_dir / name).write_text(reward_module)
    (run_dir / config_name).write_text(config)
    monkeypatch.chdir(run_dir)
    monkeypatch.syspath_prepend(str(run_dir))  # what `flashq launch` run from there sees: the cwd on sys.path

    cfg = load_config(run_dir / config_name)
    task = make_task_source(cfg.task).task(0)
    assert {"prompt", "answer", "id"} <= set(task)
    reward = load_reward_fn(cfg.reward.function)
    assert reward(task, f"The answer is {task['answer']}") == 1.0
    assert reward(task, "I do not know") == 0.0
