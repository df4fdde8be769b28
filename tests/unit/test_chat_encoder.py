"""The coordinator's prompt encoder against transformers' own apply_chat_template + encode, on
the built-in tiny model's real tokenizer files."""

import json
import subprocess
import sys

import pytest

from flashq.data import chat_messages
from flashq.data.chat_encoder import ChatEncoder, cache_path

MESSAGES = [
    [{"role": "user", "content": "What is 17 + 4?"}],
    [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "12+9= ?"}],
    [{"role": "user", "content": "Write the letter q 7 times.\n  Then stop. ü ß 漢字 🙂 <|im_end|> tab\there"}],
    [{"role": "user", "content": ""}],
]


@pytest.fixture()
def model_dir(tiny_model, tmp_path):
    import shutil

    copy = tmp_path / "model"
    shutil.copytree(tiny_model, copy)
    return copy


def test_the_cached_encoder_gives_transformers_ids_and_imports_no_torch(model_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    expected = [tokenizer(tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
                for m in MESSAGES + [chat_messages({"prompt": "3 + 4 ="}, "Be brief.")]]
    cache = tmp_path / "cache"
    cold = ChatEncoder(model_dir, cache)  # through transformers, and the cache learns it
    assert not cold.light and cache_path(model_dir, cache).is_file()
    warm = ChatEncoder(model_dir, cache)
    assert warm.light
    messages = MESSAGES + [chat_messages({"prompt": "3 + 4 ="}, "Be brief.")]
    assert [cold.encode(m) for m in messages] == expected
    assert [warm.encode(m) for m in messages] == expected

    code = ("import sys, json; from flashq.data.chat_encoder import ChatEncoder; "
            f"e = ChatEncoder({str(model_dir)!r}, {str(cache)!r}); "
            f"print(json.dumps([e.light, e.encode({MESSAGES[0]!r}), 'torch' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [True, expected[0], False]


def test_a_changed_tokenizer_file_is_a_different_tokenizer(model_dir, tmp_path):
    cache = tmp_path / "cache"
    ChatEncoder(model_dir, cache)
    config = model_dir / "tokenizer_config.json"
    config.write_text(config.read_text() + "\n")  # the same settings, but not the same bytes
    assert not ChatEncoder(model_dir, cache).light  # the saved pipeline is not used for it
    assert ChatEncoder(model_dir, cache).light


def test_sft_leaves_the_rl_runs_coordinator_the_light_path(tiny_model, tmp_path):
    from flashq.config import load_config
    from flashq.sft import run_sft

    cfg = load_config("configs/quickstart.yaml", [f"model.name={tiny_model}", f"model.cache_dir={tmp_path}", "sft.steps=2",
                                                  "sft.warmup_steps=0", "sft.eval_prompts=2", f"sft.output_dir={tmp_path / 'sft'}"])
    out = run_sft(cfg)
    assert ChatEncoder(out, tmp_path).light


def test_an_unreadable_cache_file_is_named_and_rebuilt(model_dir, tmp_path, caplog):
    cache = tmp_path / "cache"
    expected = ChatEncoder(model_dir, cache).encode(MESSAGES[0])
    cache_path(model_dir, cache).write_text('{"pipeline": "not a tokenizer"')  # cut short
    with caplog.at_level("WARNING"):
        encoder = ChatEncoder(model_dir, cache)
    assert not encoder.light and encoder.encode(MESSAGES[0]) == expected
    assert str(cache_path(model_dir, cache)) in caplog.text and "unreadable" in caplog.text
    assert ChatEncoder(model_dir, cache).light  # written again, whole
