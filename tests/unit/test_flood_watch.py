"""bench/flood.py's MetricTail: how bench/chaos.py knows the hub has judged every frame of a flood
(the run's metrics.jsonl, read on from where it stopped while the coordinator is still writing it)."""

import json

from bench.flood import MetricTail


def test_the_tail_reads_the_last_value_and_waits_out_a_half_written_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = MetricTail(path, "rejected_frames")
    assert tail() == 0.0  # no file yet: nothing judged
    path.write_text(json.dumps({"step": 1, "rejected_frames": 5}) + "\n" + '{"step": 2, "rejec')
    assert tail() == 5
    with path.open("a") as f:
        f.write('ted_frames": 9}\n' + json.dumps({"step": 3}) + "\n")
    assert tail() == 9  # the torn line completed; a record without the key keeps the last value
    with path.open("a") as f:
        f.write(json.dumps({"step": 4, "rejected_frames": 12}) + "\n")
    assert tail() == 12
