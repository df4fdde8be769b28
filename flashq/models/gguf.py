"""A GGUF file as a Hugging Face checkpoint folder, dequantized once and cached.

vLLM's CPU backend and flashq's trainer both load plain Hugging Face folders (config, safetensors,
tokenizer, chat template). transformers reads a GGUF file's weights and tokenizer itself
(`from_pretrained(folder, gguf_file=name)`), dequantizing to float; the loaded model keeps a
`quantization_config` that `save_pretrained` refuses, so the weights move into a plain model of
the same config before saving. Weights are saved in float32: a dequantized value is `d * q + m`
with float16 scales, which bfloat16 would round again.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from flashq.models.tiny import build_once

MARKER = "flashq_gguf.json"


class ModelSourceError(RuntimeError):
    """A model that cannot be found, fetched or converted; the message names it and says why."""


def fingerprint(path: Path) -> str:
    """Of the file's resolved path, size and modification time: cheap, and a replaced file is
    converted again."""
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]


def converted_dir(path: Path, cache_dir: Path) -> Path:
    return Path(cache_dir) / "gguf" / f"{path.stem}-{fingerprint(path)}"


def check_convertible(path: Path) -> dict:
    """Read the file's header and refuse, naming the cause, what transformers cannot convert: a
    missing `gguf` package, an architecture it has no mapping for, a quantization type without a
    dequantizer. Returns what the file says it is."""
    try:
        import gguf
        from gguf.quants import _type_traits
    except ImportError:
        raise ModelSourceError(
            f"{path} is a GGUF file, and reading it needs the `gguf` package: pip install 'gguf>=0.10'"
        ) from None
    from importlib.metadata import version

    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file: say which
        raise ModelSourceError(f"{path} is not a readable GGUF file: {e}") from None

    def field(key: str):
        f = reader.fields.get(key)
        return None if f is None else bytes(f.parts[f.data[0]]).decode()

    arch = field("general.architecture")
    supported = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}  # sections of its mapping, not models
    if arch not in supported:
        raise ModelSourceError(
            f"{path}: architecture {arch!r} has no GGUF conversion in transformers "
            f"(supported: {', '.join(sorted(supported))})"
        )
    plain = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16}
    types: dict[str, int] = {}
    for t in reader.tensors:
        if t.tensor_type not in plain and t.tensor_type not in _type_traits:
            raise ModelSourceError(
                f"{path}: tensor {t.name} is quantized as {t.tensor_type.name}, which the installed gguf package "
                f"({version('gguf')}) cannot dequantize"
            )
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    return {"architecture": arch, "name": field("general.name"), "tensor_types": types}


def convert_gguf(path: Path, out: Path, provenance: dict | None = None) -> Path:
    """Dequantize `path` into the Hugging Face folder `out` (model, tokenizer, chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    about = check_convertible(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 - transformers' own words, with the file named
        raise ModelSourceError(f"could not convert {path}: {type(e).__name__}: {e}") from e
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = type(loaded)(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    if set(missing) - tied or unexpected:
        raise ModelSourceError(f"could not convert {path}: weights missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / MARKER).write_text(json.dumps({"source": str(path), **about, **(provenance or {})}, indent=2))
    return out


def ensure_converted(path: Path, cache_dir: Path, provenance: dict | None = None, target: Path | None = None) -> Path:
    """The cached Hugging Face folder of the GGUF file `path`, converted on first use."""
    path = Path(path)
    if not path.is_file():
        raise ModelSourceError(f"no GGUF file at {path}")
    target = target or converted_dir(path, cache_dir)
    if not (target / MARKER).exists():
        print(f"flashq: converting {path} to a Hugging Face checkpoint in {target} (once)", file=sys.stderr, flush=True)
    return build_once(target, MARKER, lambda out: convert_gguf(path, out, provenance))
