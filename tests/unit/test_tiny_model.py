"""The tiny model's tokenizer: one token per chat role, and SFT caches that follow its build."""

import subprocess
import sys

from flashq.config import load_config
from flashq.models import tiny
from flashq.models.tiny import ROLE_TOKENS, TinyModelSpec, build_tokenizer, ensure_tiny_model, padded_vocab_size, tiny_vocab, vocab
from flashq.sft import output_dir

TOK = build_tokenizer()


def test_a_sum_prompt_is_its_five_bytes_and_three_chat_tokens():
    ids = TOK.apply_chat_template([{"role": "user", "content": "12+7="}], add_generation_prompt=True, tokenize=True, return_dict=False)
    assert TOK.convert_ids_to_tokens(ids) == ["<|user|>", "1", "2", "+", "7", "=", "<|im_end|>", "<|assistant|>"]
    assert TOK.decode(ids, skip_special_tokens=True) == "12+7="
    assert max(ids) < padded_vocab_size()


def test_role_tokens_follow_the_bytes_and_other_roles_are_spelled_out():
    ids = [TOK.convert_tokens_to_ids(t) for t in ROLE_TOKENS.values()]
    assert ids == [260, 261, 262]
    assert tiny_vocab().items() >= vocab().items()  # special tokens and bytes keep real_size.py's ids
    text = TOK.apply_chat_template([{"role": "system", "content": "S"}, {"role": "tool", "content": "x"}], tokenize=False)
    assert text == "<|system|>S<|im_end|><|im_start|>tool\nx<|im_end|>"


def test_earlier_turns_render_the_same_when_a_turn_is_added():
    turns = [{"role": "user", "content": "12+7="}, {"role": "assistant", "content": "19"}, {"role": "user", "content": "1+1="}]
    opened = TOK.apply_chat_template(turns[:1], add_generation_prompt=True, tokenize=False)
    assert TOK.apply_chat_template(turns, tokenize=False).startswith(opened + "19<|im_end|>")


def test_the_sft_cache_follows_the_tiny_build(monkeypatch, tmp_path):
    cfg = load_config(None, [f"model.cache_dir={tmp_path}"])
    before = output_dir(cfg)
    monkeypatch.setattr(TinyModelSpec, "fingerprint", lambda self: "another-build")
    assert output_dir(cfg) != before  # an SFT checkpoint of the old tokenizer is never reused


def test_the_build_fingerprint_follows_the_tokenizer(monkeypatch):
    spec = TinyModelSpec()
    before = spec.fingerprint()
    monkeypatch.setattr(tiny, "CHAT_TEMPLATE", tiny.CHAT_TEMPLATE.replace("<|im_end|>", "<|endoftext|>"))
    assert spec.fingerprint() != before  # a cached build of the other template is not reused


def test_the_build_fingerprint_follows_the_role_tokens(monkeypatch):
    before = TinyModelSpec().fingerprint()
    monkeypatch.setattr(tiny, "ROLE_TOKENS", {**ROLE_TOKENS, "tool": "<|tool|>"})
    assert TinyModelSpec().fingerprint() != before


def test_finding_a_built_tiny_model_imports_no_transformers(tmp_path):
    built = ensure_tiny_model(TinyModelSpec(), tmp_path)
    code = ("import sys; from flashq.models.tiny import TinyModelSpec, ensure_tiny_model; "
            f"print(ensure_tiny_model(TinyModelSpec(), {str(tmp_path)!r}), 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(built), "False"]  # every role resolves the model at start-up; the coordinator needs no transformers
