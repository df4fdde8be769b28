"""Trainer side of the weight broadcast: vLLM's trainer weight-transfer engines, driven through
the coordinator.

vLLM's `TrainerWeightTransferEngine` talks to the inference side through a
`VLLMWeightSyncClient` (four calls: init, start, update, finish). flashq's rollout engines live
in other processes behind the coordinator, so `CoordinatorSyncClient` turns each call into a
`WeightSyncCall` message that the coordinator fans out to every rollout worker; it returns when
all of them have done it. The bytes themselves go trainer -> engines directly, over NCCL on GPUs
(vLLM's own engine) or gloo on CPU (`gloo_transfer`), never through a checkpoint file.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
from vllm.distributed.weight_transfer.base import ModuleSource, ParamMeta, materialize_full_tensor

from flashq.config import WeightSyncConfig

Rpc = Callable[[str, Any, int], None]


class CoordinatorSyncClient:
    """`VLLMWeightSyncClient` over flashq's messages; `version` labels the next push.

    vLLM's trainer engines call start, update (on a helper thread, while they broadcast) and
    finish. Each flashq call is a round trip through the coordinator to every rollout worker,
    and the engines are paused from start to finish; so start is folded into update, which the
    workers answer only once the weights are loaded and labelled (`push_weights`), and finish
    has nothing left to do. One round trip a push instead of three."""

    def __init__(self, rpc: Rpc):
        self.rpc = rpc
        self.version = 0

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.rpc("init_weight_transfer_engine", init_info, -1)

    def start_weight_update(self) -> None:
        """Nothing to send: the workers pause when `push_weights` reaches them."""

    def update_weights(self, update_info) -> None:
        from flashq.engine import ipc_handles

        self.rpc("push_weights", ipc_handles.encode(update_info), self.version)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Nothing to send: `push_weights` returned once the engines served the new version."""


class TrainerSource(ModuleSource):
    """The trainer's parameters as the engines serve them: floating-point ones cast to `dtype`
    (float32 masters pushed to bfloat16 engines send half the bytes). On a sharded trainer each
    parameter is gathered by a collective all ranks join in order; if rank 0's push breaks off
    (a rollout worker died), `drain` joins the gathers the other ranks still expect. With LoRA
    (`adapter`) the source is the adapter's parameters alone, by the names vLLM reads."""

    def __init__(self, module: torch.nn.Module, dtype: torch.dtype | None, adapter: bool = False):
        super().__init__(module)
        self.dtype = dtype
        self.adapter = adapter
        self._left = None  # the current pass's parameters not yet gathered

    def _wire(self, dtype: torch.dtype) -> torch.dtype:
        return self.dtype if self.dtype is not None and dtype.is_floating_point else dtype

    def _named(self) -> list[tuple[str, torch.nn.Parameter]]:
        if self.adapter:
            from flashq.trainer.lora import adapter_parameters

            return adapter_parameters(self._module)
        return list(self._module.named_parameters())

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, self._wire(p.dtype), tuple(p.shape)) for name, p in self._named()]

    def begin(self) -> None:
        """Start a push: every parameter is owed a gather until it is sent or drained."""
        self._left = iter(self._named())

    def __iter__(self):
        if self._left is None:
            self.begin()
        for name, param in self._left:
            tensor = materialize_full_tensor(param)
            yield name, tensor.to(self._wire(tensor.dtype))
        self._left = None

    def drain(self) -> None:
        for _, param in self._left or ():
            materialize_full_tensor(param)
        self._left = None


def choose_backend(cfg: WeightSyncConfig, device: torch.device, colocate: bool = False) -> str:
    """As the engines choose (`vllm_engine.choose_engine_backend`): gloo on a CPU; on CUDA, NCCL,
    or CUDA IPC to an engine on the same device (placement.colocate)."""
    if cfg.backend != "auto":
        return cfg.backend
    if device.type != "cuda":
        return "gloo"
    return "ipc" if colocate else "nccl"


class WeightPusher:
    """Owns the trainer's end of the transfer group and pushes a new version after each step."""

    def __init__(
        self, cfg: WeightSyncConfig, model: torch.nn.Module, rpc: Rpc | None, inference_world_size: int, port: int,
        device: torch.device, rank: int = 0, wire_dtype: torch.dtype | None = None, adapter: bool = False,
        colocate: bool = False,
    ):
        """`rank` > 0: a trainer rank that only joins the gathers of sharded parameters; rank 0
        sends and drives the inference side through `rpc`. `wire_dtype`: the engines' dtype,
        which floating-point weights are cast to before they are sent. `adapter`: push the LoRA
        adapter alone. `colocate`: the engine shares this device (CUDA IPC on a GPU)."""
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        from flashq.engine.gloo_transfer import GlooTrainerInitInfo, register

        self.client = CoordinatorSyncClient(rpc)
        self.bytes: float | None = None
        self.source = source = TrainerSource(model, wire_dtype, adapter)
        self.backend = choose_backend(cfg, device, colocate)
        self.deadline_s = cfg.timeout_s
        world_size = 1 + inference_world_size
        if self.backend == "gloo":
            register()
            info = GlooTrainerInitInfo(
                master_address=cfg.host, master_port=port, world_size=world_size, rank=rank,
                bucket_bytes=cfg.bucket_mb << 20, timeout_s=cfg.timeout_s, any_port=cfg.port == 0,
            )
        elif self.backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            info = NCCLTrainerInitInfo(
                master_address=cfg.host, master_port=port, world_size=world_size, rank=rank,
                packed_buffer_size_bytes=cfg.bucket_mb << 20,
            )
        elif self.backend == "ipc":
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

            # unpacked: the whole model's handles in one update, so one push (one pause, one label) carries it
            info = IPCTrainerInitInfo(rank=rank, packed=False)
        else:
            raise ValueError(f"unknown weight_sync.backend {self.backend!r}")
        self.engine = WeightTransferTrainerFactory.trainer_init(info, client=self.client, source=source)

    def push(self, version: int) -> float:
        """Send the current weights labelled `version`; returns seconds taken. On NCCL the push
        has a deadline (`weight_sync.timeout_s`, `push_deadline`); gloo's collectives have their own."""
        from flashq.engine.push_deadline import under_nccl_deadline

        t0 = time.monotonic()
        self.client.version = version
        self.source.begin()
        try:
            under_nccl_deadline(self.engine, self.deadline_s, f"weight push {version}", self.engine.send_weights)
        finally:
            self.source.drain()  # a pass that broke off: the other trainer ranks still gather
        return time.monotonic() - t0

    def phases(self) -> dict[str, float]:
        """Seconds of the last push by phase, where the backend reports them (gloo), and the
        bytes each push sends."""
        from flashq.engine.gloo_group import nbytes

        if self.bytes is None:
            self.bytes = float(sum(nbytes(m.dtype, m.shape) for m in self.source.metadata()))
        return {**getattr(self.engine, "phases", {}), "bytes": self.bytes}

    def close(self) -> None:
        self.engine.shutdown()
