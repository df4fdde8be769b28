"""Checkpoints that resume a run exactly: no sample trained twice, none skipped.

A checkpoint is a directory `<run_dir>/checkpoints/step-NNNNNN/`, written in two halves at the
same step boundary (policy version N):
  trainer/            the model (Hugging Face format), optimizer and RNG state, version N
  coordinator.msgpack the prompt source position, the staleness gate, and every admitted group
                      not yet trained: its task, prompt, the samples already generated (with
                      their behaviour logprobs and token versions) and the scores already given
The trainer writes its half first into `step-N.tmp/`; the coordinator adds its half and renames
the directory. A directory without its final name is incomplete and ignored.

On resume, requests that were in flight are generated again and samples not yet scored are
scored again; everything already generated is reused as it was.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from flashq.protocol import RewardResult, Sample

STATE_SCHEMA = 1


class GroupState(msgspec.Struct, forbid_unknown_fields=True):
    group_id: str
    task: dict[str, Any]
    prompt_ids: np.ndarray
    size: int
    admitted_version: int
    deadline: int
    samples: list[Sample]
    rewards: list[RewardResult]


class OrchestratorState(msgspec.Struct, forbid_unknown_fields=True):
    schema: int
    version: int  # policy version the trainer reached when this was taken
    next_task: int
    next_group: int
    admitted: int
    groups: list[GroupState]
    ledger: dict[str, Any]


def _enc_hook(obj):
    if isinstance(obj, np.ndarray):
        return [obj.dtype.str, list(obj.shape), obj.tobytes()]
    raise TypeError(f"cannot store {type(obj).__name__}")


def _dec_hook(typ, obj):
    if typ is np.ndarray:
        dtype, shape, data = obj
        return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()
    raise NotImplementedError(typ)


def encode_state(state: OrchestratorState) -> bytes:
    return msgspec.msgpack.Encoder(enc_hook=_enc_hook).encode(state)


def decode_state(data: bytes) -> OrchestratorState:
    state = msgspec.msgpack.Decoder(OrchestratorState, dec_hook=_dec_hook).decode(data)
    if state.schema != STATE_SCHEMA:
        raise ValueError(f"checkpoint state schema {state.schema}; this build reads {STATE_SCHEMA}")
    return state


def step_dir(run_dir: Path, version: int, tmp: bool = False) -> Path:
    return run_dir / "checkpoints" / (f"step-{version:06d}" + (".tmp" if tmp else ""))


def latest(run_dir: Path) -> Path | None:
    root = run_dir / "checkpoints"
    if not root.exists():
        return None
    done = sorted(p for p in root.iterdir() if p.name.startswith("step-") and not p.name.endswith(".tmp") and (p / "coordinator.msgpack").exists())
    return done[-1] if done else None


def version_of(path: Path) -> int:
    return int(path.name.removeprefix("step-").removesuffix(".tmp"))


def complete(run_dir: Path, version: int, state: OrchestratorState, keep: int) -> Path:
    """The coordinator's half: write the state beside the trainer's, then make it final."""
    tmp = step_dir(run_dir, version, tmp=True)
    if not (tmp / "trainer" / "trainer_state.pt").exists():
        raise FileNotFoundError(f"trainer half of checkpoint {version} is missing at {tmp}")
    (tmp / "coordinator.msgpack").write_bytes(encode_state(state))
    final = step_dir(run_dir, version)
    tmp.rename(final)
    # only older ones: the trainer may already be writing a newer step-M.tmp
    old = sorted(p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-") and version_of(p) < version)
    for p in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return final
