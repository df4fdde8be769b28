"""bench/gpu_check.py, the device check a session runs first when it is lent a GPU, in its smoke
mode: every section at toy width on this CPU, so the script a lent device runs is known to work
before the device's minutes are spent on it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_every_section_of_the_device_check_runs_at_toy_size(tmp_path):
    save = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench/gpu_check.py"), "--smoke", "--out", "none", "--device", "cpu",
                           "--cache-dir", str(tmp_path / "cache"), "--save", str(save)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(save.read_text())
    figures, rows = doc["figures"], doc["rows"]
    assert figures["sections_failed"] == [] and set(rows) == {
        "ceiling", "step-1.5b", "race", "fsdp-mp", "step-7b", "lora-1.5b", "packed-1.5b"}
    for name in ("step-1.5b", "step-7b", "lora-1.5b", "packed-1.5b"):
        assert rows[name]["step_s"] > 0 and rows[name]["grad_finite"] and rows[name]["grad_norm"] > 0, name
    assert rows["lora-1.5b"]["trained_params"] < rows["step-1.5b"]["trained_params"] / 10  # the adapter alone trains
    assert rows["step-1.5b"]["host_syncs"]["aten::nonzero"] > 0  # the profile read the step's events
    assert figures["race_fenced_trials_stale"] == 0 and figures["race_trials_per_mode"] > 0
    assert rows["fsdp-mp"]["sharded"].startswith("FSDP")  # the one-rank group really sharded the model
    assert figures["fsdp_mp_master_changed_frac_step1"] > 0.5 and figures["fsdp_mp_bf16_changed_frac_step1"] > 0
