"""A batch that crashes the trainer every time is set aside: the trainer leaves each crashed
batch's request ids and error in failed_batches.jsonl, and a resuming coordinator quarantines a
held group named by `trainer.max_batch_failures` of them (listed with its samples, dropped,
another prompt admitted in its place). Before, every resume met the same batch again."""

import json

import numpy as np

from flashq.checkpoint import decode_state, encode_state
from flashq.failed_batches import FILE, record_failure, suspects
from flashq.wire.protocol import GenerateRequest, RewardResult, ScoreRequest
from tests.unit.test_orchestrator import drain, finish, make


def held_complete_groups(orch):
    """Generate and score everything the first pump sends: complete groups wait for the trainer."""
    orch.pump()
    for peer, req in drain(orch):
        if isinstance(req, GenerateRequest):
            finish(orch, req, peer)
    orch.pump()
    for peer, msg in drain(orch):
        if isinstance(msg, ScoreRequest):
            k = int(msg.sample.request_id.split("/")[1])
            orch.on_reward(peer, RewardResult(msg.sample.request_id, float(k % 2)))
    drain(orch)
    return sorted(orch.buffer.complete)


def test_a_group_in_two_crashed_batches_is_quarantined_on_resume(tmp_path):
    orch = make(["async_ratio=1"])
    held = held_complete_groups(orch)
    assert len(held) >= 3
    poison, bystander = held[0], held[1]
    ids = {gid: sorted(orch.buffer.groups[gid].samples) for gid in held}
    record_failure(tmp_path, 0, 0, ids[poison] + ids[bystander], IndexError("index 49152 is out of bounds"))
    record_failure(tmp_path, 0, 0, ids[poison] + ids[held[2]], IndexError("index 49152 is out of bounds"))
    (tmp_path / FILE).write_text((tmp_path / FILE).read_text() + '{"torn')  # the trainer died mid-write once
    lines = [json.loads(line) for line in (tmp_path / FILE).read_text().splitlines()[:2]]
    assert lines[0]["error"] == "IndexError: index 49152 is out of bounds" and lines[0]["request_ids"][:4] == ids[poison]

    resumed = make(["async_ratio=1"])
    resumed.restore(decode_state(encode_state(orch.snapshot(0))))
    found = suspects(tmp_path, {gid: list(g.samples) for gid, g in resumed.buffer.groups.items()}, failures=2)
    assert list(found) == [poison]  # the bystanders were in one crashed batch each
    admitted = resumed.ledger.groups_admitted
    resumed.quarantine_groups(found)
    assert poison not in resumed.buffer.groups and bystander in resumed.buffer.complete
    assert resumed.ledger.groups_quarantined == 1 and resumed.ledger.groups_dropped_by_reason["poison batch"] == 1
    assert resumed.ledger.quarantined[-1] == {"group_id": poison, "request_ids": ids[poison],
                                              "reasons": ["IndexError: index 49152 is out of bounds"] * 2}
    resumed.on_weights_served(0)  # the engines serve the checkpoint's weights: generation goes on
    resumed.pump()
    assert resumed.ledger.groups_admitted == admitted + 1  # another prompt takes its admission
    assert np.all([isinstance(m, GenerateRequest) for _, m in drain(resumed)])


def test_one_failure_is_not_enough_and_no_file_means_no_suspects(tmp_path):
    assert suspects(tmp_path, {"g0": ["g0/0"]}, failures=2) == {}
    record_failure(tmp_path, 3, 3, ["g0/0", "g1/0"], MemoryError())
    assert suspects(tmp_path, {"g0": ["g0/0"]}, failures=2) == {}
    assert suspects(tmp_path, {"g0": ["g0/0"]}, failures=1) == {"g0": ["MemoryError: "]}
