"""A vLLM weight-transfer backend over torch.distributed gloo: the CPU twin of vLLM's NCCL one.

vLLM 0.32 ships NCCL and CUDA-IPC backends behind `WeightTransferEngine` (worker side, built
inside the engine process from `weight_transfer_config`) and `TrainerWeightTransferEngine`
(trainer side). Neither runs without a GPU, so this module supplies the same two classes over
gloo. The trainer and every rollout worker join one process group (trainer rank 0); each round
the trainer broadcasts the weights in fixed-size buckets and the workers load them with vLLM's
layerwise reload, exactly as the NCCL engine does. On GPUs flashq selects "nccl" instead and this
file is not used.

Both sides cut buckets from the same metadata with `plan_buckets`, so they always agree on
where one bucket ends and the next begins.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from flashq.engine.gloo_group import (
    DEFAULT_BUCKET_BYTES,
    broadcast,
    close_group,
    dtype_from_name,
    group_on,
    host_store,
    nbytes,
    open_group,
    plan_buckets,
)

if TYPE_CHECKING:
    from vllm.distributed.weight_transfer.base import VLLMWeightSyncClient

log = logging.getLogger(__name__)

BACKEND = "gloo"


@dataclass
class GlooWeightTransferInitInfo(WeightTransferInitInfo):
    """Worker-side rendezvous: the trainer's store address and this worker's place in the group."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    timeout_s: float = 300.0


@dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    """One round's parameter list, in the order the trainer sends them."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not (len(self.names) == len(self.dtype_names) == len(self.shapes)):
            raise ValueError(
                "weight update metadata: names, dtype_names and shapes differ in length "
                f"({len(self.names)}, {len(self.dtype_names)}, {len(self.shapes)})"
            )


class GlooWeightTransferEngine(
    WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]
):
    """Inference-worker side: receives broadcast buckets and loads them into the model."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group = None
        self.store = None
        self.bucket_bytes = DEFAULT_BUCKET_BYTES

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        pc = self.parallel_config
        rank = pc.data_parallel_index * pc.world_size + pc.rank + init_info.rank_offset
        self.bucket_bytes = init_info.bucket_bytes
        self.group, self.store = open_group(
            init_info.master_address, init_info.master_port, rank, init_info.world_size, init_info.timeout_s
        )
        log.info("gloo weight transfer: joined as rank %d of %d", rank, init_info.world_size)

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        self._repack_tied_lm_head()

    def _repack_tied_lm_head(self) -> None:
        """On the CPU backend the LM head multiplies with a pre-packed copy of its weight. With
        tied embeddings the reload refreshes the shared weight but not that copy (the head gets
        no weights of its own), so logits would come from the old policy; pack it again."""
        lm_head = getattr(self.model, "lm_head", None)
        tied = getattr(self.model_config.hf_config, "tie_word_embeddings", False)
        if lm_head is None or not tied or getattr(lm_head, "quant_method", None) is None:
            return
        lm_head.quant_method.process_weights_after_loading(lm_head)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which raises on a CPU-only
        # host; gloo's broadcast has completed when `wait()` returns, so nothing is pending.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer not initialised: call init_weight_transfer_engine first")
        dtypes = [dtype_from_name(n) for n in update_info.dtype_names]
        sizes = [nbytes(d, s) for d, s in zip(dtypes, update_info.shapes)]
        for bucket in plan_buckets(sizes, self.bucket_bytes):
            flat = torch.empty(sum(sizes[i] for i in bucket), dtype=torch.uint8)
            broadcast(self.group, flat)
            offset = 0
            weights = []
            for i in bucket:
                raw = flat[offset : offset + sizes[i]]
                weights.append((update_info.names[i], raw.view(dtypes[i]).view(update_info.shapes[i])))
                offset += sizes[i]
            self.model.load_weights(weights)

    def shutdown(self) -> None:
        close_group(self.group)
        self.group = None
        self.store = None


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer side: where to host the rendezvous and how big the group is (1 + engine ranks)."""

    backend: ClassVar[str] = BACKEND

    master_address: str
    master_port: int
    world_size: int
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    timeout_s: float = 300.0
    any_port: bool = False  # master_port was picked free, not configured: another will do if it was taken since


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer side: drives the round trip through `client` and broadcasts as rank 0."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client, source: WeightSource, is_sender: bool, bucket_bytes: int) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.bucket_bytes = bucket_bytes
        self.group = None
        self.store = None
        self.phases: dict[str, float] = {}

    @classmethod
    def trainer_init(
        cls,
        init_info: GlooTrainerInitInfo,
        *,
        client: VLLMWeightSyncClient,
        source: WeightSource | None = None,
    ) -> GlooTrainerWeightTransferEngine:
        if source is None:
            raise ValueError("gloo trainer weight transfer needs a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender, bucket_bytes=init_info.bucket_bytes)
        if not engine.is_sender:
            return engine
        store = host_store(init_info.master_address, init_info.master_port, init_info.world_size, init_info.timeout_s,
                           init_info.any_port)
        worker_info = GlooWeightTransferInitInfo(
            master_address=init_info.master_address,
            master_port=store.port,
            rank_offset=1,
            world_size=init_info.world_size,
            bucket_bytes=init_info.bucket_bytes,
            timeout_s=init_info.timeout_s,
        )
        # Workers block in the rendezvous inside init_weight_transfer_engine, so the RPC and this
        # process's side of it (rank 0, hosting the store) run on two threads. If a worker fails
        # to join, the RPC says so at once: raise then rather than wait out the store's timeout.
        pool = ThreadPoolExecutor(max_workers=2)
        try:
            rpc = pool.submit(client.init_weight_transfer_engine, asdict(worker_info))
            opening = pool.submit(group_on, store, 0, init_info.world_size, init_info.timeout_s, init_info.master_address)
            wait([rpc, opening], return_when=FIRST_EXCEPTION)
            if rpc.done() and rpc.exception() is not None:
                raise rpc.exception()
            engine.group, engine.store = opening.result(), store
            rpc.result()
        finally:
            pool.shutdown(wait=False)
        return engine

    def send_weights(self) -> None:
        assert self.source is not None
        meta = self.source.metadata()
        if not self.is_sender:
            for _ in self.source:
                pass
            return
        info = GlooWeightTransferUpdateInfo(
            names=[m.name for m in meta],
            dtype_names=[str(m.dtype).removeprefix("torch.") for m in meta],
            shapes=[list(m.shape) for m in meta],
        )
        t0 = time.monotonic()
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            receiving = pool.submit(self.client.update_weights, asdict(info))
            self._broadcast(meta)
            t1 = time.monotonic()
            receiving.result()
        finally:
            # If the broadcast failed the workers are stuck in theirs until gloo's timeout;
            # joining the RPC thread here would only turn the error into a wait.
            pool.shutdown(wait=False)
        self.client.finish_weight_update()
        # where a push's time goes: until the last bucket left (the engines pausing and joining
        # the broadcast included), then until they had loaded, labelled and resumed
        self.phases = {"send_s": t1 - t0, "drain_s": time.monotonic() - t1}

    def _broadcast(self, meta) -> None:
        """Bucket k is sent on a helper thread while bucket k+1 is gathered, cast and packed."""
        sizes = [nbytes(m.dtype, m.shape) for m in meta]
        tensors = iter(self.source)
        sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flashq-send")
        try:
            sending = None
            for bucket in plan_buckets(sizes, self.bucket_bytes):
                flat = self._pack(bucket, meta, tensors)
                if sending is not None:
                    sending.result()
                sending = sender.submit(broadcast, self.group, flat)
            if sending is not None:
                sending.result()
        finally:
            sender.shutdown(wait=False)  # after a failure a send may wait out gloo's timeout

    @staticmethod
    def _pack(bucket: list[int], meta, tensors) -> torch.Tensor:
        parts = []
        for i in bucket:
            name, tensor = next(tensors)
            if name != meta[i].name or tuple(tensor.shape) != tuple(meta[i].shape) or tensor.dtype != meta[i].dtype:
                raise ValueError(
                    f"weight source disagrees with its metadata at {i}: declared {meta[i].name!r} "
                    f"{meta[i].dtype} {tuple(meta[i].shape)}, got {name!r} {tensor.dtype} {tuple(tensor.shape)}"
                )
            parts.append(tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8))
        # one tensor goes as it is (no training runs during a push, so it cannot change meanwhile)
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def shutdown(self) -> None:
        close_group(self.group)
        self.group = None
        self.store = None


def register() -> None:
    """Register both sides with vLLM's factories (idempotent)."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, GlooWeightTransferEngine)
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, GlooTrainerWeightTransferEngine)
