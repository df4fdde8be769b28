"""LoRA on the trainer: the base model frozen in the compute dtype, peft adapters whose parameters
alone the optimizer holds and the weight push sends.

Names: peft calls an adapter's parameters `...q_proj.lora_A.default.weight`; vLLM (and peft's own
adapter files) call them `...q_proj.lora_A.weight`. `adapter_parameters` gives them by the latter,
so a push carries names the engine's LoRA loader reads as they are.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from flashq.config import LoRAConfig

ADAPTER_DIR = "adapter"  # inside a checkpoint's trainer/ directory
_ADAPTER_NAME = re.compile(r"\.(lora_[AB])\.default\.weight$")


def wrap(model: torch.nn.Module, lc: LoRAConfig, adapter_dtype: torch.dtype, adapter_dir: Path | None = None):
    """`model` with adapters on `lc.target_modules`: fresh ones (B = 0, so the policy starts as
    the base model), or those a checkpoint saved in `adapter_dir`. Only they train."""
    from peft import LoraConfig, PeftModel, get_peft_model

    model.requires_grad_(False)
    if adapter_dir is None:
        settings = {k: v for k, v in lc.peft_dict().items() if k != "peft_type"}
        peft_model = get_peft_model(model, LoraConfig(**settings))
    else:
        check_saved_adapter(adapter_dir, lc)
        peft_model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
    missing = [m for m in lc.target_modules if not any(n.endswith(f".{m}") for n, _ in _lora_layers(peft_model))]
    if missing:
        raise ValueError(f"trainer.lora.target_modules: {missing} match no linear layer of {type(model).__name__}")
    for _, param in adapter_parameters(peft_model):
        param.data = param.data.to(adapter_dtype)
    return peft_model


def check_saved_adapter(adapter_dir: Path, lc: LoRAConfig) -> None:
    """A checkpoint's adapter must be the one this config trains (same rank, scale, layers)."""
    path = adapter_dir / "adapter_config.json"
    if not path.exists():
        raise FileNotFoundError(f"{adapter_dir}: no adapter_config.json (was this checkpoint written by a trainer.lora run?)")
    saved = json.loads(path.read_text())
    want = lc.peft_dict()
    diff = {k: (saved.get(k), want[k]) for k in ("r", "lora_alpha") if saved.get(k) != want[k]}
    if sorted(saved.get("target_modules") or []) != sorted(want["target_modules"]):
        diff["target_modules"] = (saved.get("target_modules"), want["target_modules"])
    if diff:
        raise ValueError(f"{adapter_dir}: the saved adapter differs from trainer.lora (saved, configured): {diff}")


def _lora_layers(peft_model):
    from peft.tuners.lora import LoraLayer

    return [(name, m) for name, m in peft_model.named_modules() if isinstance(m, LoraLayer)]


def adapter_parameters(peft_model) -> list[tuple[str, torch.nn.Parameter]]:
    """The adapter's parameters, named as vLLM and peft's files name them."""
    out = []
    for name, param in peft_model.named_parameters():
        if _ADAPTER_NAME.search(name):
            out.append((_ADAPTER_NAME.sub(r".\1.weight", name), param))
    return out


def merged_tensors(peft_model):
    """(name, tensor) of the base model's state dict with each adapted weight replaced by
    W + (alpha / r) B A in float32 (in a bfloat16 base the adapter's small updates would round
    away), one at a time; a tied output projection is left out, as Hugging Face checkpoints do."""
    base = peft_model.get_base_model()
    layers = {f"{name.removeprefix('base_model.model.')}.weight": m for name, m in _lora_layers(peft_model)}
    tied = getattr(base.config, "tie_word_embeddings", False)
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        if tied and name == "lm_head.weight":
            continue
        if name in layers:
            with torch.no_grad():
                tensor = tensor.float() + layers[name].get_delta_weight("default").float()
        yield name, tensor.detach().cpu().contiguous()


def save_merged(peft_model, directory: Path, shard_bytes: int = 512 << 20) -> None:
    """The merged model as a sharded Hugging Face checkpoint, written shard by shard, so the
    export holds one shard beyond the model in memory, not a merged copy of all of it."""
    from safetensors.torch import save_file

    base = peft_model.get_base_model()
    directory.mkdir(parents=True, exist_ok=True)
    base.config.save_pretrained(directory)
    if base.generation_config is not None:
        base.generation_config.save_pretrained(directory)
    weight_map, shard, size, total, files = {}, {}, 0, 0, 0

    def flush():
        nonlocal shard, size, files
        if shard:
            files += 1
            filename = f"model-{files:05d}.safetensors"
            save_file(shard, str(directory / filename), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, filename))
            shard, size = {}, 0

    for name, tensor in merged_tensors(peft_model):
        nbytes = tensor.numel() * tensor.element_size()
        if shard and size + nbytes > shard_bytes:
            flush()
        shard[name], size, total = tensor, size + nbytes, total + nbytes
    flush()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def save(peft_model, directory: Path, merged: bool) -> None:
    """The adapter in peft's format (directory/adapter) and, if `merged`, the merged model as a
    plain Hugging Face checkpoint in `directory` itself."""
    peft_model.save_pretrained(str(directory / ADAPTER_DIR))
    if merged:
        save_merged(peft_model, directory)
