"""A run killed mid-write leaves a torn last line in metrics.jsonl or trained.jsonl; every role
start, `--resume` and the report must get past it, and appending must not glue the next record
onto the fragment. A bad line elsewhere is named, not skipped."""

import json

import pytest

from flashq.jsonl import CorruptRecord, cut_torn_tail, keep_records, read_records
from flashq.reporting.metrics import MetricsLog, read_metrics
from flashq.roles.coordinator import truncate_metrics
from flashq.roles.trainer import open_trained_record

WHOLE = "".join(json.dumps({"kind": "step", "step": s, "reward": s / 10}) + "\n" for s in range(1, 4))
TORN = WHOLE + '{"kind": "step", "step": 4, "rew'


def test_a_torn_last_line_is_skipped_and_a_bad_middle_line_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(TORN)
    assert [r["step"] for r in read_records(path)] == [1, 2, 3]
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]
    path.write_text(WHOLE.replace('"step": 2', '"step": 2,,', 1))
    with pytest.raises(CorruptRecord, match=r"metrics.jsonl:2: not a JSON record"):
        read_records(path)


def test_cutting_the_tail_leaves_whole_records_ready_for_appending(tmp_path):
    path = tmp_path / "trained.jsonl"
    path.write_text(TORN)
    assert cut_torn_tail(path) == len(TORN) - len(WHOLE)
    assert path.read_text() == WHOLE
    path.write_text(WHOLE.rstrip("\n"))  # torn just before the newline: the record is whole
    assert cut_torn_tail(path) == 0 and path.read_text() == WHOLE
    assert cut_torn_tail(tmp_path / "absent.jsonl") == 0


def test_rewrites_are_atomic_and_drop_the_torn_tail(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(TORN)
    assert keep_records(path, lambda r: r["step"] != 2) == 2
    assert [r["step"] for r in read_records(path)] == [1, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temporary left behind


def test_resume_gets_past_torn_records(tmp_path):
    metrics, trained = tmp_path / "metrics.jsonl", tmp_path / "trained.jsonl"
    metrics.write_text(TORN)
    truncate_metrics(metrics, version=2)  # the coordinator resuming from step 2
    assert [r["step"] for r in read_records(metrics)] == [1, 2]
    trained.write_text("".join(json.dumps({"trainer_version": v, "requests": []}) + "\n" for v in range(3)) + '{"trainer_ver')
    with open_trained_record(trained, version=2) as f:
        f.write(json.dumps({"trainer_version": 2, "requests": []}) + "\n")
    assert [r["trainer_version"] for r in read_records(trained)] == [0, 1, 2]


def test_metrics_appended_after_a_crash_start_on_their_own_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(TORN)
    log = MetricsLog(tmp_path, tensorboard=False)
    log.write(4, {"reward": 0.4})
    log.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
