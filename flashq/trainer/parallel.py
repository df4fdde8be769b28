"""Data-parallel training over several trainer ranks, the model sharded with FSDP2.

One trainer role may be `trainer.world_size` processes (the launcher starts them with torchrun;
one per GPU, or CPU processes on gloo - the twin that runs in tests). Rank 0 alone talks to the
coordinator; before each collective step (train a batch, push weights, save) it names the step to
the other ranks here, every rank trains on its share of the sequences, and FSDP2 reduces the
gradients. The weight broadcast to the engines gathers
each sharded parameter (`full_tensor()`, a collective all ranks join) and rank 0 sends it.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from flashq.config import TrainerConfig


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.world_size > 1


def ranks_from_env() -> Ranks:
    """torchrun's RANK / WORLD_SIZE / LOCAL_RANK; a single process without them."""
    return Ranks(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0)))


def init_distributed(tc: TrainerConfig, device: torch.device) -> Ranks:
    ranks = ranks_from_env()
    if ranks.world_size != tc.world_size:
        raise RuntimeError(
            f"trainer.world_size is {tc.world_size} but this process was started with WORLD_SIZE={ranks.world_size}; "
            "start the trainer with `torchrun --nproc-per-node N -m flashq.cli role trainer ...` (flashq launch does)"
        )
    if ranks.sharded and not dist.is_initialized():
        backend = tc.dist_backend if tc.dist_backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        dist.init_process_group(backend, timeout=timedelta(seconds=tc.dist_timeout_s))
    return ranks


def shard_model(model: torch.nn.Module, mixed_precision: tuple[torch.dtype, torch.dtype] | None = None) -> None:
    """FSDP2: each decoder layer its own unit (its parameters gathered only while it runs), then
    the root for the embeddings and head. `mixed_precision` = (compute, reduce) dtypes: the
    sharded float32 masters are gathered in the compute dtype, gradients reduced in the other."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: FSDP sharding expects a Hugging Face decoder with model.layers")
    kwargs = {}
    if mixed_precision is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=mixed_precision[0], reduce_dtype=mixed_precision[1])
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


@contextmanager
def parameters_on_meta():
    """Build a module whose parameters take no memory (meta device) while its buffers are real:
    tables such as rotary frequencies are computed at construction, not loaded from checkpoints."""
    original = torch.nn.Module.register_parameter

    def register(module, name, param):
        if param is not None and param.device.type != "meta":
            param = type(param)(param.to("meta"), requires_grad=param.requires_grad)
        original(module, name, param)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original


def load_sharded_model(path, dtype: torch.dtype, device: torch.device, ranks: Ranks, prepare, mixed_precision) -> torch.nn.Module:
    """A sharded causal LM without any rank holding the whole model on its device: each rank
    builds the model's skeleton (parameters on meta), `prepare(model)` adapts it (the logprob
    head), FSDP2 shards it, and rank 0 alone reads the checkpoint and sends each rank its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)
    prepare(model)
    shard_model(model, mixed_precision)
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    full = read_checkpoint(path) if ranks.is_leader else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False))
    return model


def read_checkpoint(path) -> dict[str, torch.Tensor]:
    """A Hugging Face checkpoint directory's tensors (safetensors, one file or several)."""
    from pathlib import Path

    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f))
    return state


def broadcast_command(ranks: Ranks, kind: str | None = None, payload=None) -> tuple[str, object]:
    """Rank 0 names the next collective every rank runs (("train", TrainBatch), ("push",
    version), ("save", version), ("stop", None)); the others pass None and get it. Every rank
    then runs the same collectives in the same order, whatever rank 0 was waiting for."""
    if not ranks.sharded:
        return kind, payload
    from flashq.wire.codec import Decoder, Encoder

    if ranks.is_leader and kind == "train":  # the codec's frames, copied to bytes for pickling
        payload = [bytes(f) for f in Encoder().encode(payload)]
    message = [(kind, payload)]
    dist.broadcast_object_list(message, src=0)
    kind, payload = message[0]
    return kind, (Decoder().decode(payload) if kind == "train" else payload)


def shares(indices: np.ndarray, lengths: np.ndarray, world_size: int) -> list[np.ndarray]:
    """Split sequences across ranks with balanced token counts: longest first, each to the rank
    with the fewest tokens so far (every rank computes the same split)."""
    load = np.zeros(world_size)
    out: list[list[int]] = [[] for _ in range(world_size)]
    for j in np.argsort(-lengths, kind="stable"):
        r = int(np.argmin(load))
        out[r].append(int(indices[j]))
        load[r] += lengths[j]
    return [np.array(sorted(o), dtype=np.int64) for o in out]


def all_reduce_sum(values: dict[str, float], ranks: Ranks) -> dict[str, float]:
    if not ranks.sharded or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return dict(zip(keys, t.cpu().tolist()))


def full_model_state(model: torch.nn.Module, ranks: Ranks) -> dict | None:
    """The unsharded weights on CPU for the Hugging Face export (a collective; None off rank 0
    of a sharded trainer, whose export rank 0 writes)."""
    if not ranks.sharded:
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


@contextmanager
def _single_process_is_meant():
    """A one-rank trainer checkpoints without a process group, as intended: not worth a warning."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path) -> None:
    """torch.distributed.checkpoint: each rank writes its own shard of the optimizer state (no
    rank gathers it), in a layout any world size can load."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    with _single_process_is_meant():
        dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(path), no_dist=not dist.is_initialized())


def load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path) -> None:
    """Read what `save_optimizer` wrote, resharded to this trainer's ranks."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # the layout to fill (state initialised)
    with _single_process_is_meant():
        dcp.load(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optimizer"])


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict, ranks: Ranks) -> None:
    """An optimizer state saved whole (checkpoints from before `save_optimizer`)."""
    if not ranks.sharded:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=StateDictOptions(full_state_dict=True))


def barrier(ranks: Ranks) -> None:
    if ranks.sharded:
        dist.barrier()


def leave(ranks: Ranks) -> None:
    """End of a sharded run, on every rank: a barrier, so no rank tears its group down while a
    peer still has a collective in flight with it, then `destroy_process_group`, so gloo's worker
    threads end here rather than during the interpreter's exit, where they can abort the process."""
    if ranks.sharded and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def scalar(t: torch.Tensor) -> float:
    """A DTensor reduction (e.g. the gradient norm under FSDP) as a plain float."""
    full = getattr(t, "full_tensor", None)
    return float(full() if callable(full) else t)
