"""The reward worker's sample log: one scored response in every N kept as text, a torn line from a
killed worker cut off, and `flashq samples` printing the model's text verbatim."""

import json
import subprocess
import sys

import numpy as np

from flashq.reporting.samples import SampleLog, latest_samples
from flashq.wire.protocol import RewardResult, Sample, ScoreRequest


def request(i: int, versions=(3, 4)) -> ScoreRequest:
    ids = np.array([51, 52, 53], np.int32)
    s = Sample(f"g{i}/0", f"g{i}", 0, ids, np.zeros(3, np.float32), np.array([versions[0], versions[0], versions[1]], np.int32), "stop")
    return ScoreRequest(s, {"id": f"t{i}", "prompt": f"What is {i} + 1?", "answer": str(i + 1)})


def test_one_response_in_every_n_is_kept_with_its_reward_and_versions(tmp_path):
    path = tmp_path / "samples-reward-0.jsonl"
    log = SampleLog(path, every=3)
    for i in range(7):
        if log.due():
            log.write(request(i), f"[b]{i}[/b] <answer>{i + 1}</answer>", RewardResult(f"g{i}/0", float(i % 2), error="boom" if i == 6 else ""))
    log.close()
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["task_id"] for r in kept] == ["t0", "t3", "t6"]  # the first, then every third
    assert kept[1] | {"time": 0} == {"time": 0, "request_id": "g3/0", "task_id": "t3", "prompt": "What is 3 + 1?",
                                     "response": "[b]3[/b] <answer>4</answer>", "reward": 1.0, "error": "", "tokens": 3,
                                     "versions": [3, 4]}
    assert kept[2]["error"] == "boom"


def test_a_torn_line_is_cut_and_the_latest_come_from_every_worker(tmp_path):
    first = tmp_path / "samples-reward-0.jsonl"
    log = SampleLog(first, every=1)
    log.write(request(0), "zero", RewardResult("g0/0", 0.0))
    log.close()
    with first.open("a") as f:
        f.write('{"time": 1, "requ')  # killed mid-line
    log = SampleLog(first, every=1)  # the restarted worker appends after cutting the fragment
    log.write(request(2), "two", RewardResult("g2/0", 0.0))
    log.close()
    other = SampleLog(tmp_path / "samples-reward-1.jsonl", every=1)
    other.write(request(1), "one", RewardResult("g1/0", 1.0))
    other.close()
    assert [r["response"] for r in latest_samples(tmp_path, 2)] == ["two", "one"]
    assert [r["response"] for r in latest_samples(tmp_path, 10)] == ["zero", "two", "one"]


def test_flashq_samples_prints_the_text_as_written(tmp_path):
    log = SampleLog(tmp_path / "samples-reward-0.jsonl", every=1)
    log.write(request(5), "[bold]not markup[/bold] <answer>6</answer>", RewardResult("g5/0", 1.0))
    log.close()
    out = subprocess.run([sys.executable, "-m", "flashq.cli", "samples", str(tmp_path), "--count", "1"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "[bold]not markup[/bold] <answer>6</answer>" in out.stdout and "reward 1.000" in out.stdout
    empty = subprocess.run([sys.executable, "-m", "flashq.cli", "samples", str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert empty.returncode == 2 and "no such run directory" in empty.stderr
