"""Real-size checkpoints with random weights: Qwen2.5-0.5B's, 1.5B's or 7B's published architecture, made offline.

The tiny model (flashq/models/tiny.py) is what the tests train, but memory and time at its size say
nothing about a real model: the 151,936-token vocabulary alone makes a [tokens x vocab] float32
logits tensor 0.6 MB per token, and 0.5B float32 master weights, gradients and Adam state take
~8 GB. Nothing can be downloaded here, so this builds a checkpoint directory of the published
shape (config, bfloat16 safetensors, tokenizer) with seeded random weights: what it computes is
meaningless, what it costs in memory and time is honest.

The tokenizer is tiny.py's byte-level `Qwen2Tokenizer` without merges (same special tokens, ChatML
chat template), its vocabulary padded with distinct filler tokens up to the model's 151,936 rows,
so every id a random model samples decodes (transformers and vLLM load it by path).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from flashq.models.tiny import EOS, IM_END, IM_START, PAD, build_once, vocab

VOCAB_SIZE = 151936
CHATML_TEMPLATE = (  # Qwen's own: the real tokenizer spends 3 tokens on "<|im_start|>user\n", this one 7
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_COMMON = dict(vocab_size=VOCAB_SIZE, tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6,
               max_position_embeddings=32768, hidden_act="silu")
PRESETS: dict[str, dict] = {
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, **_COMMON),
    "qwen2.5-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         intermediate_size=8960, **_COMMON),
    "qwen2.5-7b": dict(_COMMON, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
    # the same architecture at toy width: smoke runs of the GPU scripts on a CPU, in seconds
    "qwen2-smoke": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=128, **_COMMON),
}
MARKER = "flashq_real_size.json"


@dataclass(frozen=True)
class RealSizeSpec:
    """`num_hidden_layers` overrides the preset's depth (smoke tests); everything else is the preset's."""

    preset: str = "qwen2.5-0.5b"
    num_hidden_layers: int | None = None
    seed: int = 0

    def __post_init__(self):
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; one of {sorted(PRESETS)}")
        if self.num_hidden_layers is not None and self.num_hidden_layers < 1:
            raise ValueError("num_hidden_layers must be >= 1")

    def fingerprint(self) -> str:
        payload = json.dumps(asdict(self), sort_keys=True) + "|v1"
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    def dir_name(self) -> str:
        layers = f"-L{self.num_hidden_layers}" if self.num_hidden_layers else ""
        return f"{self.preset}{layers}-random-{self.fingerprint()}"


def padded_vocab(size: int = VOCAB_SIZE) -> dict[str, int]:
    """tiny.py's vocabulary (special tokens, then the 256 bytes) and distinct fillers up to `size` ids.
    Fillers are plain ASCII, so the byte-level decoder turns each into its own text."""
    base = vocab()
    return base | {f"<|filler_{i}|>": i for i in range(len(base), size)}


def build_tokenizer(size: int = VOCAB_SIZE):
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer(vocab=padded_vocab(size), merges=[], unk_token=EOS, eos_token=IM_END, pad_token=PAD,
                         additional_special_tokens=[EOS, IM_START])
    tok.chat_template = CHATML_TEMPLATE
    return tok


def build_config(spec: RealSizeSpec, tokenizer=None):
    """The preset's `Qwen2Config` (bfloat16 weights), special token ids from the tokenizer's layout."""
    from transformers import Qwen2Config

    ids = vocab()
    kw = dict(PRESETS[spec.preset])
    if spec.num_hidden_layers:
        kw["num_hidden_layers"] = spec.num_hidden_layers
    config = Qwen2Config(**kw, bos_token_id=ids[EOS], eos_token_id=ids[IM_END], pad_token_id=ids[PAD],
                         dtype="bfloat16")
    config.architectures = ["Qwen2ForCausalLM"]
    return config


def build_real_size_model(spec: RealSizeSpec, out_dir: Path) -> Path:
    """Write a seeded random bfloat16 checkpoint of the preset's shape into `out_dir`."""
    import torch
    from transformers import Qwen2ForCausalLM

    tokenizer = build_tokenizer()
    config = build_config(spec)
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM._from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (Path(out_dir) / MARKER).write_text(json.dumps(asdict(spec), indent=2))
    return Path(out_dir)


def ensure_real_size_model(spec: RealSizeSpec, cache_dir: Path = Path(".cache/flashq")) -> Path:
    """The checkpoint directory for `spec`, built once (atomically) into `cache_dir` if absent."""
    return build_once(Path(cache_dir) / spec.dir_name(), MARKER, lambda out: build_real_size_model(spec, out))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Build (once) a real-size random-weight checkpoint; print its path.")
    ap.add_argument("--preset", default="qwen2.5-0.5b", choices=sorted(PRESETS))
    ap.add_argument("--layers", type=int, default=None, help="override the preset's layer count")
    ap.add_argument("--cache-dir", type=Path, default=Path(".cache/flashq"))
    a = ap.parse_args()
    print(ensure_real_size_model(RealSizeSpec(a.preset, a.layers), a.cache_dir))
