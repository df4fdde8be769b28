"""W&B (offline) and trackio get the run's records under TensorBoard's names; both run locally."""

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.helpers import ROOT

WRITE = textwrap.dedent("""
    import sys
    from pathlib import Path
    from flashq.reporting.metrics import MetricsLog
    from flashq.reporting.trackers import make_trackers

    run_dir = Path(sys.argv[1])
    trackers = make_trackers(["wandb", "trackio"], "flashq-test", run_dir, {"trainer": {"lr": 1e-4}})
    log = MetricsLog(run_dir, tensorboard=False, trackers=trackers)
    log.write(1, {"reward/mean": 0.25, "hist/staleness": [3, 1], "loss": -0.5})
    log.write(2, {"reward/mean": 0.5, "hist/staleness": [2, 2], "loss": -0.25})
    log.write(0, {"pass@1": 0.75, "greedy_accuracy": 1.0}, kind="eval")  # logged after step 2, at version 0
    log.close()
""")


def wandb_history(path: Path) -> list[dict]:
    """The history rows of an offline W&B run file (a LevelDB-style log of protobuf records: a
    7-byte file header, 32 KiB blocks, each record framed by crc32, length and a part type)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, rows, pending = path.read_bytes(), 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        length, part = struct.unpack("<HB", data[pos + 4 : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if part in (2, 3):  # first, middle
            pending += chunk
            continue
        record = wandb_internal_pb2.Record()
        record.ParseFromString(pending + chunk)
        pending = b""
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
    return rows


def test_wandb_offline_and_trackio_get_every_record_under_the_same_names(tmp_path):
    run_dir = tmp_path / "run-7"
    env = dict(os.environ, WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true",
               TRACKIO_DIR=str(tmp_path / "trackio"), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", WRITE, str(run_dir)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[2])["kind"] == "eval"

    runs = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    rows = wandb_history(runs[0])
    assert [(r.get("step"), r.get("reward/mean"), r.get("loss")) for r in rows[:2]] == [(1, 0.25, -0.5), (2, 0.5, -0.25)]
    assert rows[0]["hist/staleness/_type"] == "histogram" and rows[0]["hist/staleness/values"] == [3, 1]
    assert rows[2]["eval/pass@1"] == 0.75 and rows[2]["eval/step"] == 0  # on its own axis: not dropped as "in the past"

    read = textwrap.dedent("""
        import json
        from trackio.sqlite_storage import SQLiteStorage
        print(json.dumps(SQLiteStorage.get_logs("flashq-test", "run-7"), default=str))
    """)
    out = subprocess.run([sys.executable, "-c", read], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    logs = json.loads(out.stdout.strip().splitlines()[-1])
    by_step = {}
    for row in logs:
        by_step.setdefault(row["step"], {}).update(row)
    assert by_step[1]["reward/mean"] == 0.25 and by_step[2]["loss"] == -0.25 and by_step[0]["eval/pass@1"] == 0.75


def test_a_tracker_that_is_not_installed_says_how_to_install_it(monkeypatch):
    from flashq.reporting.trackers import make_trackers

    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without it gives import
    with pytest.raises(RuntimeError, match=r"pip install 'flashq\[wandb\]'"):
        make_trackers(["wandb"], "p", ROOT, {})
