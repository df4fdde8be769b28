"""The built-in tiny model: a Qwen2 causal LM and a character-level tokenizer, made offline.

Nothing can be downloaded on the machines flashq is tested on, so the quickstart and the tests
build their own model. It is a real Hugging Face checkpoint directory (config, safetensors,
tokenizer with a ChatML chat template) that both vLLM and transformers load by path.

The tokenizer is a Qwen2 byte-level BPE with no merges: every byte is one token. transformers
loads any `qwen2` checkpoint with `Qwen2Tokenizer` (its own pre-tokenizer), so the tokenizer must
be of that shape; without merges it is character-level for ASCII, which keeps sampled ids and
text in one-to-one correspondence and needs no training.

The chat template opens a system, user or assistant turn with one token of its own (`<|user|>`)
and closes it with `<|im_end|>`; other roles are spelled out ChatML's way. Spelled in bytes,
ChatML's "<|im_start|>user\n12+7=<|im_end|>\n<|im_start|>assistant\n" is 24 tokens where a real
BPE vocabulary (Qwen's) needs 13, and on two cores the prompt's prefill is most of what the engine
computes for a sum: here it is 8 tokens ("<|user|>12+7=<|im_end|><|assistant|>").
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

PAD, EOS, IM_START, IM_END = "<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, EOS, IM_START, IM_END]
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}  # after the bytes

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] in ['system', 'user', 'assistant'] %}{{ '<|' + message['role'] + '|>' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' }}{% endif %}"
    "{{ message['content'] + '<|im_end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


class TinyModelSpec(BaseModel):
    """Shape of the built-in model. Defaults are small enough to train on two CPU cores."""

    model_config = ConfigDict(extra="forbid")

    hidden_size: int = Field(128, ge=32, description="Width; head_dim = hidden_size / heads.")
    intermediate_size: int = Field(256, ge=32, description="Width of each MLP.")
    num_hidden_layers: int = Field(2, ge=1, description="Decoder layers.")
    num_attention_heads: int = Field(4, ge=1, description="Query heads.")
    num_key_value_heads: int = Field(2, ge=1, description="Key and value heads (grouped-query attention below num_attention_heads).")
    max_position_embeddings: int = Field(2048, ge=64, description="Longest sequence the model takes.")
    seed: int = Field(0, description="Seeds the random initial weights.")

    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def fingerprint(self) -> str:
        """Of the shape and of what makes the tokenizer (its special and role tokens, the 256 bytes
        after them, the chat template), so a build of another tokenizer is never taken for this one.
        Without `tiny_vocab()` itself: that imports transformers, which every role resolving the
        model would then pay for at start-up."""
        payload = json.dumps([self.model_dump(), SPECIAL_TOKENS, ROLE_TOKENS, CHAT_TEMPLATE], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def vocab() -> dict[str, int]:
    """Special tokens first, then the 256 byte symbols in byte order."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_symbols = bytes_to_unicode()
    tokens = SPECIAL_TOKENS + [byte_symbols[b] for b in range(256)]
    return {tok: i for i, tok in enumerate(tokens)}


def tiny_vocab() -> dict[str, int]:
    """`vocab()` and the role tokens after it (the byte ids stay where real_size.py's are)."""
    base = vocab()
    return base | {tok: len(base) + i for i, tok in enumerate(ROLE_TOKENS.values())}


def padded_vocab_size() -> int:
    """Embedding rows: the vocabulary rounded up to a multiple of 64."""
    return (len(tiny_vocab()) + 63) // 64 * 64


def build_tokenizer():
    """A byte-level `Qwen2Tokenizer` without merges, with ChatML's special tokens and the role tokens."""
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer(
        vocab=tiny_vocab(),
        merges=[],
        unk_token=EOS,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[EOS, IM_START, *ROLE_TOKENS.values()],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _validate(spec: TinyModelSpec) -> None:
    if spec.hidden_size % spec.num_attention_heads:
        raise ValueError("model.tiny.hidden_size must be divisible by num_attention_heads")
    if spec.num_attention_heads % spec.num_key_value_heads:
        raise ValueError("model.tiny.num_attention_heads must be divisible by num_key_value_heads")
    head_dim = spec.head_dim()
    if head_dim < 32 or head_dim % 8:
        raise ValueError(
            f"model.tiny: head_dim = hidden_size / num_attention_heads = {head_dim}; "
            "vLLM's CPU attention needs head_dim >= 32 and a multiple of 8"
        )


def build_tiny_model(spec: TinyModelSpec, out_dir: Path) -> Path:
    """Write a randomly initialised checkpoint (seeded, so identical on every machine)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _validate(spec)
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=padded_vocab_size(),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "flashq_tiny.json").write_text(json.dumps(spec.model_dump(), indent=2))
    return out_dir


def ensure_tiny_model(spec: TinyModelSpec, cache_dir: Path) -> Path:
    """Return the checkpoint directory for `spec`, building it once (atomically) if absent."""
    return build_once(Path(cache_dir) / f"tiny-{spec.fingerprint()}", "flashq_tiny.json", lambda out: build_tiny_model(spec, out))


def build_once(target: Path, marker: str, build) -> Path:
    """`target`, built by `build(tmp_dir)` into a temporary directory and renamed into place
    unless it already holds `marker`; concurrent builders race harmlessly."""
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / marker).exists():  # lost a race to another builder: fine
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
