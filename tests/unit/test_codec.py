import random

import msgspec
import numpy as np
import pytest

from flashq.wire import protocol as P
from flashq.wire.codec import Decoder, Encoder, RejectedFrame


def sample(n=2000, **kw):
    args = dict(
        request_id="g1/0",
        group_id="g1",
        worker=0,
        token_ids=np.arange(n, dtype=np.int32),
        logprobs=-np.linspace(0, 1, n, dtype=np.float32),
        versions=np.full(n, 3, np.int32),
        finish_reason="stop",
    )
    args.update(kw)
    return P.Sample(**args)


def batch():
    return P.TrainBatch(
        batch_index=4,
        request_ids=["g1/0", "g1/1"],
        group_index=np.zeros(2, np.int32),
        rewards=np.array([1, 0], np.float32),
        prompt_ids=np.arange(6, dtype=np.int32),
        prompt_offsets=np.array([0, 3, 6], np.int64),
        response_ids=np.arange(5, dtype=np.int32),
        response_offsets=np.array([0, 2, 5], np.int64),
        logprobs=np.zeros(5, np.float32),
        versions=np.array([3, 3, 3, 4, 4], np.int32),
        finish_reasons=["stop", "length"],
    )


ALL_MESSAGES = [
    P.Hello("rollout", 1, 123, "host", engine_ranks=2),
    P.Start("run", 3, 1),
    P.Heartbeat(1.5),
    P.Shutdown("done"),
    P.Fatal("trainer", "boom"),
    P.GenerateRequest("g1/0", "g1", np.array([1, 2, 3], np.int32), 16, 4, 0.7, 0.9, 11),
    sample(),
    sample(0),
    P.ScoreRequest(sample(10), {"answer": "3", "id": "t"}),
    P.RewardResult("g1/0", 1.0, "", 0.1),
    P.BatchRequest(2),
    batch(),
    P.StepStats(3, {"loss": 0.5}),
    P.WeightSyncCall(7, "push_weights", {"names": ["w"], "shapes": [[2, 2]]}, 5),
    P.WeightSyncReply(7, False, "rollout-1: oops", 0.2),
    P.WorkerStats("rollout", 0, {"tokens": 10.0}),
]


@pytest.mark.parametrize("msg", ALL_MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg):
    out = Decoder().decode(Encoder().encode(msg))
    assert type(out) is type(msg)
    for field in msg.__struct_fields__:
        a, b = getattr(msg, field), getattr(out, field)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        elif isinstance(a, P.Sample):
            assert np.array_equal(a.token_ids, b.token_ids)
        else:
            assert a == b


def test_large_arrays_travel_as_their_own_frames_without_copies():
    frames = Encoder().encode(sample(16_000))
    assert len(frames) == 4  # envelope + token_ids, logprobs, versions
    assert all(memoryview(f).nbytes == 64_000 for f in frames[1:])
    raw = [bytearray(memoryview(f)) for f in frames]
    out = Decoder().decode(raw)
    assert np.shares_memory(out.token_ids, np.frombuffer(raw[1], np.int32))


def test_wire_field_order_is_pinned():
    # array_like structs: field order is the schema. Changing it needs a SCHEMA_VERSION bump.
    assert P.Sample.__struct_fields__ == (
        "request_id", "group_id", "worker", "token_ids", "logprobs", "versions", "finish_reason", "gen_seconds",
        "prompt_ids", "loss_mask", "env_reward", "turns", "error", "env_seconds",  # appended for episodes, with defaults
        "segment_ends", "prompt_ends",  # appended for split agent episodes, with defaults
        "text",  # appended: the response decoded by the rollout worker, default None
    )
    assert P.GenerateRequest.__struct_fields__[:4] == ("request_id", "group_id", "prompt_ids", "max_tokens")
    assert P.SCHEMA_VERSION == 1


def reject_reason(frames):
    with pytest.raises(RejectedFrame) as err:
        Decoder().decode(frames)
    return err.value.reason


def test_rejections_say_what_was_wrong():
    enc = Encoder()
    good = enc.encode(sample())
    assert "malformed msgpack" in reject_reason([b"\xc1garbage"])
    assert "invalid message" in reject_reason([msgspec.msgpack.encode([1, ["nosuchkind"]])])
    assert "schema version 99" in reject_reason([msgspec.msgpack.encode([99, ["heartbeat", 1.0]])])
    assert "missing or reused" in reject_reason(good[:2])
    assert "data frames sent" in reject_reason([*good, b"extra"])
    assert "empty message" in reject_reason([])
    short = [good[0], bytes(memoryview(good[1]))[:-4], good[2], good[3]]
    assert "needs 8000 bytes" in reject_reason(short)
    assert "logprobs must be float32" in reject_reason(enc.encode(sample(logprobs=np.zeros(3, np.float32))))
    assert "NaN" in reject_reason(enc.encode(sample(logprobs=np.full(2000, np.nan, np.float32))))
    assert "unknown finish_reason" in reject_reason(enc.encode(sample(finish_reason="bored")))
    assert "unknown weight sync method" in reject_reason(enc.encode(P.WeightSyncCall(1, "rm -rf", None)))
    big = Decoder(max_message_bytes=1000)
    with pytest.raises(RejectedFrame, match="exceeds the 1000-byte limit"):
        big.decode(good)


def test_unsendable_dtype_is_refused_at_encode():
    with pytest.raises(TypeError, match="cannot be sent"):
        Encoder().encode(sample(token_ids=np.zeros(3, np.complex64)))


def test_fuzzed_frames_are_rejected_never_crash():
    """Random and mutated frames: every one either decodes to a valid message or is rejected."""
    rng = random.Random(0)
    enc, dec = Encoder(), Decoder()
    seeds = [[bytes(memoryview(f)) for f in enc.encode(m)] for m in ALL_MESSAGES]
    rejected = decoded = 0
    for i in range(3000):
        if i % 3 == 0:
            frames = [rng.randbytes(rng.randint(0, 64)) for _ in range(rng.randint(1, 3))]
        else:
            frames = [bytearray(f) for f in rng.choice(seeds)]
            for _ in range(rng.randint(1, 4)):
                f = frames[rng.randrange(len(frames))]
                if f:
                    f[rng.randrange(len(f))] = rng.randrange(256)
            frames = [bytes(f) for f in frames]
        try:
            dec.decode(frames)
            decoded += 1
        except RejectedFrame:
            rejected += 1
    assert rejected > 1500 and rejected + decoded == 3000


def test_episode_messages_round_trip_and_bad_masks_are_rejected():
    enc, dec = Encoder(), Decoder()
    req = P.EpisodeRequest("g3/9", "g3", {"id": "t", "seed": 5}, seed=5, max_tokens=32)
    assert dec.decode(enc.encode(req)) == req
    assert dec.decode(enc.encode(P.Cancel(["g3/8", "g3/9"], "group g3 is full"))).request_ids == ["g3/8", "g3/9"]
    ep = sample(prompt_ids=np.arange(7, dtype=np.int32), loss_mask=np.ones(2000, np.uint8), env_reward=1.0, turns=3)
    got = dec.decode(enc.encode(ep))
    assert got.turns == 3 and got.env_reward == 1.0 and got.loss_mask.shape == (2000,) and list(got.prompt_ids) == list(range(7))
    assert "loss_mask must be uint8" in reject_reason(enc.encode(sample(loss_mask=np.ones(5, np.uint8))))
    assert "only 0 and 1" in reject_reason(enc.encode(sample(loss_mask=np.full(2000, 2, np.uint8))))
    assert "env_reward is not finite" in reject_reason(enc.encode(sample(env_reward=float("nan"))))


def test_the_message_limit_fits_the_largest_batch_the_config_can_make():
    from flashq.config import load_config

    cfg = load_config(None, ["transport.max_message_mb=1", "trainer.batch_groups=4", "sampling.group_size=8",
                             "rollout.max_model_len=4096", "sampling.max_tokens=4000"])
    n, p, r = 32, 96, 4000  # every sequence as long as the engine allows, ids as long as they come
    largest = P.TrainBatch(
        batch_index=123456, request_ids=[f"g{100000 + i // 8}/{i % 8}" for i in range(n)],
        group_index=np.repeat(np.arange(4), 8).astype(np.int32), rewards=np.zeros(n, np.float32),
        prompt_ids=np.zeros(n * p, np.int32), prompt_offsets=np.arange(n + 1, dtype=np.int64) * p,
        response_ids=np.zeros(n * r, np.int32), response_offsets=np.arange(n + 1, dtype=np.int64) * r,
        logprobs=np.zeros(n * r, np.float32), versions=np.zeros(n * r, np.int32), finish_reasons=["length"] * n,
        loss_mask=np.ones(n * r, np.uint8),
    )
    frames = Encoder().encode(largest)
    with pytest.raises(RejectedFrame, match="exceeds"):
        Decoder(max_message_bytes=1 << 20).decode(frames)  # what max_message_mb alone allowed
    assert Decoder(max_message_bytes=cfg.message_limit_bytes).decode(frames).batch_index == 123456
