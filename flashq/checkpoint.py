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

Durability: before the rename every file is fsynced and the checkpoint is read back (`problem`:
the state decodes, every weights file is as long as its header says, the trainer's files are
there and not empty); the directory is fsynced after it. Older checkpoints are deleted only then,
and `latest` skips a checkpoint that does not pass, falling back to the newest one that does.
A full disk stops the run (`DiskFull`, naming the path) instead of resuming into the same wall.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from flashq.jsonl import fsync_path

log = logging.getLogger(__name__)
from flashq.wire.protocol import RewardResult, Sample

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
    """The newest complete checkpoint that reads back whole (see `problem`), or None."""
    root = run_dir / "checkpoints"
    if not root.exists():
        return None
    done = sorted((p for p in root.iterdir() if p.name.startswith("step-") and not p.name.endswith(".tmp")), reverse=True)
    return next((p for p in done if problem(p) is None), None)


EXIT_DISK_FULL = 3  # a role's exit status: the launcher stops the run instead of resuming into the same full disk


class DiskFull(OSError):
    """No space to write a checkpoint: resuming would hit the same wall, so the run stops."""


def disk_full(tmp: Path, cause: BaseException | None = None) -> DiskFull:
    """The error that stops the run, after removing the half-written checkpoint at `tmp` (it
    may be what fills the disk)."""
    shutil.rmtree(tmp, ignore_errors=True)
    detail = f": {cause}" if cause is not None else ""
    return DiskFull(errno.ENOSPC, f"no space left to write checkpoint {tmp} (free space on its disk, or lower "
                                  f"trainer.keep_checkpoints){detail}")


def is_disk_full(error: BaseException) -> bool:
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error)  # torch.save and safetensors report a failed write as a RuntimeError
    return "No space left on device" in text or "file write failed" in text


def problem(path: Path) -> str | None:
    """Why the checkpoint at `path` cannot be resumed from, or None when it can."""
    try:
        decode_state((path / "coordinator.msgpack").read_bytes())
    except (OSError, ValueError, msgspec.DecodeError) as e:
        return f"coordinator.msgpack: {e}"
    trainer = path / "trainer"
    # optimizer/ (torch.distributed.checkpoint, written last of it: .metadata); a checkpoint from
    # before the optimizer state was sharded keeps it inside trainer_state.pt and has no folder
    needed = ["trainer_state.pt"] + (["optimizer/.metadata"] if (trainer / "optimizer").exists() else [])
    for name in needed:
        if not (trainer / name).is_file() or (trainer / name).stat().st_size == 0:
            return f"trainer/{name} is missing or empty"
    weights = sorted(trainer.glob("*.safetensors")) + sorted((trainer / "adapter").glob("*.safetensors"))
    if not weights:
        return "no *.safetensors weights in trainer/"
    for file in weights:
        if why := _torn_safetensors(file):
            return f"{file.relative_to(path)}: {why}"
    return None


def _torn_safetensors(file: Path) -> str | None:
    """A safetensors file is an 8-byte header length, a JSON header, then the tensors' bytes; a
    torn write leaves it shorter than its header says."""
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes, no header"
        n = int.from_bytes(head, "little")
        if n > size - 8:
            return f"header of {n} bytes in a file of {size}"
        try:
            header = json.loads(f.read(n))
        except ValueError:
            return "unreadable header"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    return None if size == 8 + n + end else f"{size} bytes, its header says {8 + n + end}"


def fsync_tree(directory: Path) -> None:
    for folder, _, files in os.walk(directory):
        for name in files:
            fsync_path(Path(folder) / name)
        fsync_path(Path(folder))


def version_of(path: Path) -> int:
    return int(path.name.removeprefix("step-").removesuffix(".tmp"))


def complete(run_dir: Path, version: int, state: OrchestratorState, keep: int) -> Path:
    """The coordinator's half: write the state beside the trainer's, make the whole durable, read
    it back, make it final, and only then delete the oldest beyond `keep`."""
    tmp = step_dir(run_dir, version, tmp=True)
    if not (tmp / "trainer" / "trainer_state.pt").exists():
        raise FileNotFoundError(f"trainer half of checkpoint {version} is missing at {tmp}")
    try:
        (tmp / "coordinator.msgpack").write_bytes(encode_state(state))
        fsync_tree(tmp)
    except OSError as e:
        if is_disk_full(e):
            raise disk_full(tmp) from e
        raise
    if why := problem(tmp):
        raise RuntimeError(f"checkpoint {tmp} does not read back: {why}")
    final = step_dir(run_dir, version)
    if final.exists():  # one `latest` fell back past (torn): this run resumed before it, and has come back to its step
        log.warning("replacing checkpoint %s, which did not read back (%s)", final, problem(final))
        shutil.rmtree(final)
    tmp.rename(final)
    fsync_path(final.parent)
    # only older ones: the trainer may already be writing a newer step-M.tmp
    old = sorted(p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-") and version_of(p) < version)
    for p in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(p, ignore_errors=True)
    return final
