"""Every message that crosses a process boundary, in one place.

Messages are msgspec structs encoded as msgpack arrays (field order is the wire schema: add new
fields only at the end, with defaults). Each carries its kind as a tag, so one typed decoder
validates any frame. Large numeric arrays (token ids, logprobs, per-token versions) are numpy
arrays that travel as raw extra ZeroMQ frames, never as lists of Python ints: see `codec.py`.

Topology: the coordinator binds one ROUTER socket; rollout, reward and trainer processes connect
DEALER sockets to it. Comments name the producer -> consumer of each message.
"""

from __future__ import annotations

import math
from typing import Any, Union

import msgspec
import numpy as np

SCHEMA_VERSION = 1

I32, I64, F32 = np.dtype("<i4"), np.dtype("<i8"), np.dtype("<f4")


class Msg(msgspec.Struct, array_like=True, tag=True, tag_field="kind", forbid_unknown_fields=True):
    """Base of all messages. `validate` checks what types alone cannot (lengths, ranges)."""

    def validate(self) -> None:
        return None


def _require(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(what)


# ---------------------------------------------------------------- control


class Hello(Msg, tag="hello"):
    """Any role -> coordinator, once its engine or model is ready."""

    role: str
    index: int
    pid: int
    host: str
    engine_ranks: int = 0  # rollout: how many inference ranks join the weight-transfer group
    rendezvous: str = ""  # trainer: "host:port" where it hosts the weight-transfer group


class Start(Msg, tag="start"):
    """Coordinator -> any role, after every expected role said hello."""

    run_id: str
    inference_world_size: int  # sum of engine ranks over all rollout workers
    rank_offset: int  # rollout: this worker's first rank in the weight-transfer group


class Heartbeat(Msg, tag="heartbeat"):
    """Both directions, every `transport.heartbeat_s`: proves the sender is alive."""

    sent_at: float


class Shutdown(Msg, tag="shutdown"):
    """Coordinator -> every role: finish cleanly and exit."""

    reason: str


class Fatal(Msg, tag="fatal"):
    """Any role -> coordinator: this role is going down, and why."""

    role: str
    reason: str


# ---------------------------------------------------------------- rollout


class GenerateRequest(Msg, tag="generate"):
    """Coordinator -> rollout worker: one sample of one prompt (prompt replication)."""

    request_id: str
    group_id: str
    prompt_ids: np.ndarray  # int32
    max_tokens: int
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None

    def validate(self) -> None:
        _require(self.prompt_ids.dtype == I32 and self.prompt_ids.ndim == 1, "prompt_ids must be 1-D int32")
        _require(len(self.prompt_ids) > 0, "prompt_ids is empty")
        _require(self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}")
        _require(0 <= self.min_tokens <= self.max_tokens, "min_tokens must be in [0, max_tokens]")
        _require(self.temperature >= 0 and 0 < self.top_p <= 1, "temperature >= 0 and top_p in (0, 1]")


class Sample(Msg, tag="sample"):
    """Rollout worker -> coordinator: one finished response with its behaviour-policy data."""

    request_id: str
    group_id: str
    worker: int
    token_ids: np.ndarray  # int32, the sampled response tokens
    logprobs: np.ndarray  # float32, behaviour logprob of each sampled token
    versions: np.ndarray  # int32, policy version that sampled each token
    finish_reason: str  # "stop" | "length" | "abort" | "error"
    gen_seconds: float = 0.0

    def validate(self) -> None:
        n = len(self.token_ids)
        _require(self.token_ids.dtype == I32 and self.token_ids.ndim == 1, "token_ids must be 1-D int32")
        _require(self.logprobs.dtype == F32 and self.logprobs.shape == (n,), "logprobs must be float32, one per token")
        _require(self.versions.dtype == I32 and self.versions.shape == (n,), "versions must be int32, one per token")
        _require(self.finish_reason in FINISH_REASONS, f"unknown finish_reason {self.finish_reason!r}")
        # one float64 reduction: NaN or inf anywhere makes the sum non-finite
        _require(n == 0 or math.isfinite(self.logprobs.sum(dtype=np.float64)), "logprobs contain NaN or inf")


# ---------------------------------------------------------------- reward


FINISH_REASONS = frozenset(("stop", "length", "abort", "error"))


class ScoreRequest(Msg, tag="score"):
    """Coordinator -> reward worker: score one sample against its task."""

    sample: Sample
    task: dict[str, Any]  # the task record from the prompt source (answer, metadata)

    def validate(self) -> None:
        self.sample.validate()


class RewardResult(Msg, tag="reward"):
    """Reward worker -> coordinator. A reward that raised or timed out scores 0 with `error` set."""

    request_id: str
    reward: float
    error: str = ""
    seconds: float = 0.0

    def validate(self) -> None:
        _require(math.isfinite(self.reward), f"reward is not finite: {self.reward}")


# ---------------------------------------------------------------- trainer


class BatchRequest(Msg, tag="batch_request"):
    """Trainer -> coordinator: the trainer can take `credits` more batches (backpressure)."""

    credits: int = 1

    def validate(self) -> None:
        _require(self.credits >= 1, "credits must be >= 1")


class TrainBatch(Msg, tag="batch"):
    """Coordinator -> trainer: whole groups for one optimizer step, as flat arrays.

    Sequence i has prompt `prompt_ids[prompt_offsets[i]:prompt_offsets[i+1]]` and response
    `response_ids[response_offsets[i]:response_offsets[i+1]]`; `logprobs` and `versions` are
    aligned with `response_ids`. `group_index[i]` says which group sequence i belongs to.
    """

    batch_index: int
    request_ids: list[str]
    group_index: np.ndarray  # int32 per sequence
    rewards: np.ndarray  # float32 per sequence
    prompt_ids: np.ndarray  # int32, concatenated
    prompt_offsets: np.ndarray  # int64, len = sequences + 1
    response_ids: np.ndarray  # int32, concatenated
    response_offsets: np.ndarray  # int64, len = sequences + 1
    logprobs: np.ndarray  # float32, aligned with response_ids
    versions: np.ndarray  # int32, aligned with response_ids
    finish_reasons: list[str] = []

    def validate(self) -> None:
        n = len(self.request_ids)
        _require(self.group_index.shape == (n,) and self.rewards.shape == (n,), "one group index and reward per sequence")
        for name in ("prompt", "response"):
            offsets = getattr(self, f"{name}_offsets")
            ids = getattr(self, f"{name}_ids")
            _require(offsets.shape == (n + 1,), f"{name}_offsets must have sequences + 1 entries")
            _require(n == 0 or (offsets[0] == 0 and offsets[-1] == len(ids)), f"{name}_offsets do not span {name}_ids")
            _require(bool(np.all(np.diff(offsets) >= 0)), f"{name}_offsets are not monotone")
        _require(self.logprobs.shape == self.response_ids.shape, "logprobs must align with response_ids")
        _require(self.versions.shape == self.response_ids.shape, "versions must align with response_ids")


class StepStats(Msg, tag="step_stats"):
    """Trainer -> coordinator after each optimizer step and weight broadcast."""

    step: int  # the policy version the step produced
    metrics: dict[str, float]


# ---------------------------------------------------------------- weight sync


class WeightSyncCall(Msg, tag="wsync_call"):
    """Trainer -> coordinator -> every rollout worker: one call of vLLM's weight-transfer API
    (`init_weight_transfer_engine`, `start_weight_update`, `update_weights`,
    `finish_weight_update`). The coordinator fans it out and gathers the replies."""

    call_id: int
    method: str
    payload: Any = None
    version: int = -1  # finish_weight_update: the version the new weights carry

    def validate(self) -> None:
        _require(self.method in WEIGHT_SYNC_METHODS, f"unknown weight sync method {self.method!r}")


WEIGHT_SYNC_METHODS = ("init_weight_transfer_engine", "start_weight_update", "update_weights", "finish_weight_update")


class WeightSyncReply(Msg, tag="wsync_reply"):
    """Rollout worker -> coordinator, and coordinator -> trainer once every worker replied."""

    call_id: int
    ok: bool
    error: str = ""
    seconds: float = 0.0


# ---------------------------------------------------------------- observability


class WorkerStats(Msg, tag="worker_stats"):
    """Rollout and reward workers -> coordinator, periodically: counters since the start."""

    role: str
    index: int
    metrics: dict[str, float]


Message = Union[
    Hello,
    Start,
    Heartbeat,
    Shutdown,
    Fatal,
    GenerateRequest,
    Sample,
    ScoreRequest,
    RewardResult,
    BatchRequest,
    TrainBatch,
    StepStats,
    WeightSyncCall,
    WeightSyncReply,
    WorkerStats,
]


class Envelope(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """The first frame of every message: schema version, then the message."""

    schema: int
    body: Message
