"""The live log's tokens/s and idle shares are averaged over recent steps: one step's values swing
with what happened to finish inside it (the quickstart's log went 0, 7,000, 0 tokens/s)."""

import json

from rich.console import Console

from flashq.reporting.progress import ProgressView
from flashq.reporting.step_window import StepWindow, window_mean
from flashq.roles.coordinator_metrics import progress_line

FLAPPING = [{"time/step_s": 0.5, "rollout/tokens_per_s": 7000.0 * (i % 2), "rollout/idle_share": float(i % 2 == 0)}
            for i in range(20)]


def test_the_mean_is_the_windows_tokens_over_its_seconds():
    assert window_mean(FLAPPING, "rollout/tokens_per_s") == 3500
    # a 3 s step at 1,000 tokens/s and a 1 s step at 5,000: 8,000 tokens in 4 s, not (1,000 + 5,000) / 2
    assert window_mean([{"time/step_s": 3, "r": 1000}, {"time/step_s": 1, "r": 5000}], "r") == 2000
    assert window_mean([{"time/step_s": 1}], "r") is None


def test_the_window_holds_the_last_steps_only():
    window = StepWindow(3)
    for i in range(10):
        window.add({"time/step_s": 1.0, "x": float(i)})
    assert window.mean("x") == 8 and window.label() == "last 3 steps"
    assert StepWindow().mean("x", default=-1) == -1


def test_the_progress_line_shows_the_window_not_the_last_step():
    window = StepWindow(10)
    for rec in FLAPPING:
        window.add(rec)
    line = progress_line(20, 100, {**FLAPPING[-1], "reward/mean": 0.5, "hist/staleness/0": 3}, window)
    assert line == "step 20/100  reward 0.500  staleness [3]  last 10 steps: 3,500 tok/s, rollout idle 50%"


def test_the_progress_panel_shows_the_window_not_the_last_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"kind": "step", "step": i + 1, "reward/mean": 0.5, **r}) + "\n" for i, r in enumerate(FLAPPING)))
    console = Console(record=True, width=200)
    console.print(ProgressView(path, 100, "quickstart"))
    text = console.export_text()
    assert "3,500 (last 10 steps)" in text and "rollout: 50%" in text
