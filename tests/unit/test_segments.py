"""Agent episodes split into segments (`env.on_rewrite: split`): one `Sample` on the wire and in
the books, one sequence per segment in the batch, and the episode's one advantage for each."""

import json

import numpy as np
import pytest

from flashq.agents.audit import audit_tokens
from flashq.buffer import Group, pack_batch
from flashq.config import load_config
from flashq.roles.trainer import trained_record
from flashq.staleness import Admission
from flashq.trainer.batch_stats import sequence_advantages
from flashq.wire.codec import Decoder, Encoder, RejectedFrame
from flashq.wire.protocol import RewardResult, Sample

PROMPT = np.array([1, 2, 3], np.int32)


def split_sample(rid="g0/1"):
    """Segment 0: prompt [10, 11], tokens [20, 21, 22] (22 a rendered tool message); segment 1:
    prompt [30, 31, 32], tokens [40, 41]."""
    return Sample(rid, "g0", 0, np.array([20, 21, 22, 40, 41], np.int32), np.array([-1, -2, 0, -3, -4], np.float32),
                  np.array([5, 5, 5, 6, 6], np.int32), "stop", prompt_ids=np.array([10, 11, 30, 31, 32], np.int32),
                  loss_mask=np.array([1, 1, 0, 1, 1], np.uint8), env_reward=1.0,
                  segment_ends=np.array([3, 5], np.int32), prompt_ends=np.array([2, 5], np.int32))


def plain_sample(rid, length):
    return Sample(rid, "g0", 0, np.arange(50, 50 + length, dtype=np.int32), np.full(length, -1, np.float32),
                  np.full(length, 5, np.int32), "stop", prompt_ids=np.array([9, 9], np.int32))


def group(samples, rewards):
    g = Group(task={}, prompt_ids=PROMPT, size=len(samples), admission=Admission("g0", 0, 0))
    for s, r in zip(samples, rewards):
        g.samples[s.request_id] = s
        g.rewards[s.request_id] = RewardResult(s.request_id, r)
    return g


def unsplit(sample):
    """The same episode as one sequence: its segments' arrays end to end."""
    return Sample(sample.request_id, sample.group_id, 0, sample.token_ids, sample.logprobs, sample.versions, "stop",
                  prompt_ids=sample.prompt_ids[:2], loss_mask=sample.loss_mask)


def test_a_split_sample_travels_whole_and_names_its_segments():
    s = split_sample()
    s.validate()
    back = Decoder().decode(Encoder().encode(s))
    assert back.segment_ends.tolist() == [3, 5] and back.prompt_ends.tolist() == [2, 5]
    assert [(p.start, p.stop, r.start, r.stop) for p, r in back.segments()] == [(0, 2, 0, 3), (2, 5, 3, 5)]
    assert [(p.stop, r.stop) for p, r in plain_sample("g0/0", 4).segments()] == [(2, 4)]


@pytest.mark.parametrize("segment_ends, prompt_ends, why", [
    ([3, 3, 5], [2, 3, 5], "segment_ends must increase"),  # an empty segment
    ([0, 5], [2, 5], "segment_ends must increase"),
    ([3, 4], [2, 5], r"segment_ends must end at len\(token_ids\) \(5\), not 4"),
    ([3, 5], [2], "prompt_ends must be int32, one per segment end"),
    ([3, 5], [3, 2], "prompt_ends must increase"),
    ([3, 5], [2, 6], r"prompt_ends must end at len\(prompt_ids\) \(5\), not 6"),
    ([], [2, 5], "prompt_ends must be int32, one per segment end"),
])
def test_malformed_segment_arrays_are_refused_naming_the_field(segment_ends, prompt_ends, why):
    s = split_sample()
    s.segment_ends, s.prompt_ends = np.array(segment_ends, np.int32), np.array(prompt_ends, np.int32)
    with pytest.raises(ValueError, match=why):
        s.validate()
    with pytest.raises(RejectedFrame, match=why):  # as a rollout worker's message, refused by the coordinator
        Decoder().decode(Encoder().encode(s))
    s.segment_ends = np.array(segment_ends, np.int64)
    with pytest.raises(ValueError, match="segment_ends must be 1-D int32"):
        s.validate()


def test_pack_batch_gives_each_segment_a_sequence_under_the_episodes_reward():
    batch = pack_batch([group([plain_sample("g0/0", 4), split_sample()], [0.0, 1.0])], 0)
    batch.validate()
    assert batch.request_ids == ["g0/0", "g0/1", "g0/1"]
    assert batch.group_index.tolist() == [0, 0, 0] and batch.rewards.tolist() == [0.0, 1.0, 1.0]
    assert batch.finish_reasons == ["stop"] * 3
    po, ro = batch.prompt_offsets, batch.response_offsets
    assert [batch.prompt_ids[po[i] : po[i + 1]].tolist() for i in range(3)] == [[9, 9], [10, 11], [30, 31, 32]]
    assert [batch.response_ids[ro[i] : ro[i + 1]].tolist() for i in range(3)] == [[50, 51, 52, 53], [20, 21, 22], [40, 41]]
    assert batch.loss_mask.tolist() == [1, 1, 1, 1, 1, 1, 0, 1, 1]
    assert batch.logprobs[4:].tolist() == [-1, -2, 0, -3, -4] and batch.versions[4:].tolist() == [5, 5, 5, 6, 6]
    assert batch.sample_index().tolist() == [0, 1, 1]


def test_a_batch_whose_segments_disagree_or_are_apart_is_refused():
    batch = pack_batch([group([plain_sample("g0/0", 4), split_sample()], [0.0, 1.0])], 0)
    batch.rewards[2] = 0.5
    with pytest.raises(ValueError, match="share its group index and reward"):
        batch.validate()
    batch.rewards[2] = 1.0
    batch.request_ids = ["g0/1", "g0/0", "g0/1"]
    with pytest.raises(ValueError, match="must be consecutive"):
        batch.validate()


@pytest.mark.parametrize("overrides", [["trainer.loss.advantage=grpo"], ["trainer.loss.advantage=rloo"],
                                       ["trainer.loss.advantage=drgrpo"],
                                       ["trainer.loss.overlong=penalty", "trainer.loss.overlong_margin=4", "sampling.max_tokens=6"]])
def test_a_split_episode_counts_once_in_its_group_and_each_segment_gets_its_advantage(overrides):
    """Four episodes, one split in two: the advantages are those of the four unsplit, the split
    one's on both its sequences (counted per sequence, its reward would pull the mean twice)."""
    lc = load_config(None, overrides).trainer.loss
    rewards = [0.0, 1.0, 1.0, 0.25]
    lengths = [3, 6, 5]
    samples = [plain_sample("g0/0", lengths[0]), split_sample("g0/1"), plain_sample("g0/2", lengths[1]), plain_sample("g0/3", lengths[2])]
    split, _ = sequence_advantages(pack_batch([group(samples, rewards)], 0), lc, 6)
    whole, _ = sequence_advantages(pack_batch([group([unsplit(s) if s.request_id == "g0/1" else s for s in samples], rewards)], 0), lc, 6)
    assert len(split) == 5 and len(whole) == 4
    assert split.tolist() == pytest.approx(whole[[0, 1, 1, 2, 3]].tolist())
    assert float(whole[1]) != 0


def test_the_trained_record_holds_a_split_episode_once_with_its_ids_in_segment_order(tmp_path):
    batch = pack_batch([group([plain_sample("g0/0", 2), split_sample()], [0.0, 1.0])], 6)
    record = trained_record(batch, 7, tokens=True)
    assert record["requests"] == [["g0/0", 5, 5, 2, [50, 51]], ["g0/1", 5, 6, 5, [20, 21, 40, 41]]]
    assert record["segments"] == {"g0/1": 2}
    (tmp_path / "trained.jsonl").write_text(json.dumps(record) + "\n")
    (tmp_path / "sampled-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"request_id": "g0/1@2.0", "ids": [40, 41]}, {"request_id": "g0/1@0.0", "ids": [20]}, {"request_id": "g0/1@1.0", "ids": [21]},
        {"request_id": "g0/0@0.0", "ids": [50, 51]}]))
    assert audit_tokens(tmp_path) == {"episodes_checked": 2, "tokens_checked": 6, "retokenized_tokens": 0}
    assert "segments" not in trained_record(pack_batch([group([plain_sample("g0/0", 2)], [0.0])], 6), 7)


def test_a_real_step_trains_a_split_episodes_segments_and_counts_it_once(tiny_model):
    from flashq.trainer.learner import Learner

    learner = Learner(load_config(None, ["async_ratio=2"]), tiny_model)
    samples = [plain_sample("g0/0", 3), split_sample("g0/1"), plain_sample("g0/2", 5), plain_sample("g0/3", 4)]
    for s in samples:
        s.versions[:] = 0
    m = learner.train_step(pack_batch([group(samples, [0.0, 1.0, 1.0, 0.0])], 0))
    assert np.isfinite(m["loss"]) and m["grad_norm"] > 0
    assert m["train/sequences"] == 5 and m["train/samples"] == 4 and m["reward/mean"] == 0.5
    assert m["response/max_tokens"] == 5 and m["response/mean_tokens"] == (3 + 4 + 5 + 4) / 4  # the split one: 2 + 2 trained
    assert m["train/tokens"] == 3 + 4 + 5 + 4 and m["staleness/violations"] == 0
