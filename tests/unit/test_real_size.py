"""The real-size random checkpoint builder: the preset shapes and a tokenizer covering the whole
vocabulary. No 1 GB file is written (the model itself is built by bench/trainer_scale.py)."""

import pytest

from flashq.models.real_size import PRESETS, VOCAB_SIZE, RealSizeSpec, build_config, build_tokenizer, padded_vocab
from flashq.models.tiny import IM_END, IM_START, PAD


def test_preset_configs_match_published_shapes():
    c = build_config(RealSizeSpec("qwen2.5-0.5b"))
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size) == (
        896, 24, 14, 2, 4864)
    assert c.vocab_size == VOCAB_SIZE and c.tie_word_embeddings and c.max_position_embeddings == 32768
    assert c.rope_parameters["rope_theta"] == 1e6 and c.rms_norm_eps == 1e-6
    assert str(c.dtype).endswith("bfloat16")
    c = build_config(RealSizeSpec("qwen2.5-1.5b", num_hidden_layers=2))
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size) == (1536, 2, 12, 8960)
    c = build_config(RealSizeSpec("qwen2.5-7b"))
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size) == (
        3584, 28, 28, 4, 18944)
    assert c.vocab_size == 152064 and not c.tie_word_embeddings  # 7B unties its head; its tokenizer stays 151,936
    assert set(PRESETS) == {"qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen2-smoke"}


def test_spec_fingerprint_and_validation():
    assert RealSizeSpec().fingerprint() != RealSizeSpec(num_hidden_layers=2).fingerprint()
    assert RealSizeSpec().dir_name() != RealSizeSpec(seed=1).dir_name()
    with pytest.raises(ValueError):
        RealSizeSpec("qwen2.5-72b")


def test_padded_vocab_is_distinct_and_dense():
    v = padded_vocab(VOCAB_SIZE)
    assert len(v) == VOCAB_SIZE and sorted(v.values()) == list(range(VOCAB_SIZE))


def test_tokenizer_covers_the_vocabulary():
    tok = build_tokenizer()
    assert len(tok) == VOCAB_SIZE
    ids = build_config(RealSizeSpec())
    assert (tok.eos_token_id, tok.pad_token_id) == (ids.eos_token_id, ids.pad_token_id)
    assert tok.decode([VOCAB_SIZE - 1]) == f"<|filler_{VOCAB_SIZE - 1}|>"
    assert tok.convert_ids_to_tokens(VOCAB_SIZE - 1) != tok.unk_token
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == f"{IM_START}user\nhi{IM_END}\n{IM_START}assistant\n"
    assert tok.decode(tok("abc").input_ids) == "abc"
    assert tok.convert_tokens_to_ids(PAD) == 0
