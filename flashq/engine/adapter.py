"""LoRA on the engines: the trainer's adapter, received in memory and served by vLLM's LoRA layers.

vLLM 0.32 loads adapters only from files (`LoRARequest.lora_path`, read when a request first
names an adapter the worker does not hold). flashq pushes the adapter's tensors through the same
transfer group as full weights, then builds vLLM's `LoRAModel` from them and puts it in the
worker's adapter cache under one fixed id, replacing the previous version in place: the steps
`LRUCacheWorkerLoRAManager.add_adapter` takes after reading a file. Every request names that id,
so once the first push has arrived no request makes vLLM look for a file; the coordinator holds
generation until it has (see `Orchestrator.generation_paused`).
"""

from __future__ import annotations

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
    """The adapter's tensors of one push, through the worker's weight-transfer engine."""
    engine = worker.weight_transfer_engine
    if engine is None:
        raise RuntimeError("adapter push before the weight-transfer group was initialised")
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
