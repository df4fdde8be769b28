"""`flashq sft` on the tiny model: the stop at a reached greedy accuracy."""

import json

import pytest
import torch
from safetensors.torch import load_file

from flashq.config import ConfigError, load_config
from flashq.sft import run_sft

HALF = "reward.function=tests.unit.reward_fixtures:async_half"  # every answer scores 0.5


def sft(tiny_model, tmp_path, name, *overrides):
    cfg = load_config("configs/quickstart.yaml", [f"model.name={tiny_model}", f"model.cache_dir={tmp_path}", "sft.steps=7",
                                                  "sft.warmup_steps=0", "sft.eval_prompts=2", "sft.check_every=3", HALF,
                                                  f"sft.output_dir={tmp_path / name}", *overrides])
    out = run_sft(cfg)
    return json.loads((out / "flashq_sft.json").read_text()), load_file(out / "model.safetensors")


def test_sft_stops_at_the_first_check_that_reaches_the_accuracy_and_checks_change_nothing_else(tiny_model, tmp_path):
    reached, _ = sft(tiny_model, tmp_path, "reached", "sft.stop_at_greedy_accuracy=0.5")
    assert reached["steps"] == 3 and reached["stop_checks"] == [[3, 0.5]]

    unreached, checked = sft(tiny_model, tmp_path, "unreached", "sft.stop_at_greedy_accuracy=0.6")
    assert unreached["steps"] == 7 and unreached["stop_checks"] == [[3, 0.5], [6, 0.5]]
    plain, unchecked = sft(tiny_model, tmp_path, "plain", "sft.stop_at_greedy_accuracy=null")
    assert plain["steps"] == 7 and "stop_checks" not in plain
    # greedy checks draw no random numbers: the run that never stopped trained exactly as one without checks
    assert checked.keys() == unchecked.keys() and all(torch.equal(checked[k], unchecked[k]) for k in checked)


def test_stopping_at_an_accuracy_needs_answers_to_check():
    env = ["env={name: flashq.envs.guess:GuessNumberEnv}", "sft.stop_at_greedy_accuracy=0.5"]
    with pytest.raises(ConfigError, match="sft.stop_at_greedy_accuracy checks answers"):
        load_config(None, [*env, "sft.warm_start=true"])
    assert load_config(None, env).env is not None  # no SFT in the run: nothing to refuse


def test_an_accuracy_check_leaves_the_model_in_the_mode_it_found(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flashq.rewards import load_reward_fn
    from flashq.sft import evaluate

    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(str(tiny_model))
    source = type("Sums", (), {"task": lambda self, i: {"prompt": f"{i}+1=", "answer": str(i + 1)}})()
    for training in (False, True):
        model.train(training)
        evaluate(model, tokenizer, source, None, load_reward_fn("flashq.rewards.builtin:exact_match"), 2, 2, "cpu", modes=("greedy",))
        assert model.training is training


def test_sft_trains_a_model_named_by_a_hub_id_from_the_cache(tiny_model, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from tests.hub_cache import prefill

    prefill(tmp_path / "hub", "acme/tiny-chat", tiny_model)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    summary, weights = sft("acme/tiny-chat", tmp_path, "from-hub", "sft.stop_at_greedy_accuracy=null")
    base = load_file(tiny_model / "model.safetensors")
    assert summary["steps"] == 7 and weights.keys() == base.keys()
    assert not torch.equal(weights["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
