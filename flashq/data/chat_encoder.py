"""Chat prompts to token ids, as transformers would make them, without importing its tokenizer stack.

`AutoTokenizer` imports torch and most of transformers: 3.0 s of CPU at the coordinator's start on
this 2-core host, while vLLM starts on the same cores. The coordinator only renders each task's
chat template and encodes the result, which needs two small pieces: transformers' template
renderer (its module imports in 0.7 s, without torch) and the `tokenizers` pipeline.

That pipeline must be the one transformers builds, not tokenizer.json as it lies on disk: some
tokenizer classes rebuild theirs from the vocabulary with their own pre-tokenizer. So the first
process that loads a model's tokenizer through transformers saves what it built (the pipeline as
JSON, the chat template, the special tokens) in flashq's cache, under a hash of the tokenizer's
files and transformers' version; later processes encode from that file. `flashq sft` saves it for
the checkpoint it writes, so an RL run after SFT starts on the light path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from importlib.metadata import version
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# every file a tokenizer may be built from; a change to any of them is a different tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model")


def fingerprint(model_dir: Path) -> str:
    h = hashlib.sha256(f"transformers {version('transformers')}".encode())
    for name in TOKENIZER_FILES:
        path = model_dir / name
        if path.is_file():
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:24]


def cache_path(model_dir: Path, cache_dir: Path) -> Path:
    return Path(cache_dir) / "chat-encoders" / f"{fingerprint(model_dir)}.json"


def remember(tokenizer: Any, model_dir: Path | str, cache_dir: Path) -> Path | None:
    """Save what transformers built for `model_dir`'s tokenizer, for later processes to encode
    from; nothing for a tokenizer without a chat template or without a `tokenizers` pipeline."""
    model_dir = Path(model_dir)
    template = getattr(tokenizer, "chat_template", None)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not model_dir.is_dir() or not isinstance(template, str) or backend is None:
        return None
    path = cache_path(model_dir, cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"pipeline": backend.to_str(), "chat_template": template, "special_tokens": tokenizer.special_tokens_map}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)  # readers see the whole file or none
    return path


class ChatEncoder:
    """`encode(messages)`: the ids of `apply_chat_template(messages, add_generation_prompt=True)`,
    from the cache when it holds this tokenizer (`light` is then True), else through transformers
    (and the cache learns it)."""

    def __init__(self, model: Path | str, cache_dir: Path):
        model_dir = Path(model)
        path = cache_path(model_dir, cache_dir) if model_dir.is_dir() else None
        self.light = path is not None and path.is_file() and self._load(path)
        if not self.light:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(model))
            if path is not None:
                remember(self.tokenizer, model_dir, cache_dir)

    def _load(self, path: Path) -> bool:
        """Read a saved tokenizer; one that cannot be read is named in the log and rebuilt."""
        from tokenizers import Tokenizer
        from transformers.utils.chat_template_utils import render_jinja_template

        try:
            record = json.loads(path.read_text())
            self.pipeline = Tokenizer.from_str(record["pipeline"])
            self.template = record["chat_template"]
            self.special_tokens = dict(record["special_tokens"])
        except Exception as e:  # noqa: BLE001 - json, a missing key, or the tokenizers library (which raises plain Exception)
            log.warning("chat encoder cache %s is unreadable (%s: %s); loading the tokenizer through transformers", path,
                        type(e).__name__, e)
            return False
        self.pipeline.no_padding()  # transformers turns both off for an unpadded, untruncated call
        self.pipeline.no_truncation()
        self.render = render_jinja_template
        return True

    def encode(self, messages: list[dict]) -> list[int]:
        if not self.light:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        rendered, _ = self.render(conversations=[messages], chat_template=self.template,
                                  add_generation_prompt=True, **self.special_tokens)
        return self.pipeline.encode(rendered[0], add_special_tokens=False).ids
