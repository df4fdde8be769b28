"""LoRA on the trainer: real peft adapters on the tiny model, real torch steps."""

import numpy as np
import pytest
import torch

from flashq.config import ConfigError, load_config
from flashq.trainer import lora
from flashq.trainer.learner import Learner, load_causal_lm
from flashq.trainer.logprobs import install_logprob_head, token_logprobs

from tests.unit.test_learner import make_batch

LORA = ["trainer.lora.rank=4", "trainer.lora.alpha=8", "trainer.lr=0.01"]


def _logprobs(model, ids):
    with torch.no_grad():
        return token_logprobs(model, ids, torch.ones_like(ids), 1.0)[0]


@pytest.fixture
def learner(tiny_model):
    return Learner(load_config(None, LORA), tiny_model)


def test_only_the_adapter_trains_and_the_optimizer_holds_it_alone(learner):
    adapter = {id(p) for _, p in lora.adapter_parameters(learner.model)}
    held = {id(p) for group in learner.optimizer.param_groups for p in group["params"]}
    assert held == adapter and adapter
    base = {n: p.detach().clone() for n, p in learner.model.named_parameters() if id(p) not in adapter}
    assert not any(p.requires_grad for n, p in learner.model.named_parameters() if id(p) not in adapter)
    trained = {n: p.detach().clone() for n, p in lora.adapter_parameters(learner.model)}
    m = learner.train_step(make_batch(learner, [1, 0, 0, 1]))
    assert m["loss/is_weight_mean"] == pytest.approx(1.0, abs=1e-5)  # fresh adapter: the policy is the base
    after = dict(learner.model.named_parameters())
    assert all(torch.equal(base[n], after[n]) for n in base)
    changed = [n for n, p in lora.adapter_parameters(learner.model) if not torch.equal(trained[n], p)]
    assert changed and all(".lora_B." in n for n in changed)  # B starts at 0, so A gets no gradient at first


def test_adapter_names_are_the_ones_vllm_reads(learner):
    from vllm.lora.utils import parse_fine_tuned_lora_name

    names = [n for n, _ in lora.adapter_parameters(learner.model)]
    layers = learner.model.config.num_hidden_layers
    assert len(names) == layers * 7 * 2  # q k v o gate up down, A and B each
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names
    assert parse_fine_tuned_lora_name(names[0]) == ("model.layers.0.self_attn.q_proj", True)


def test_checkpoint_holds_adapter_optimizer_and_a_merged_model_that_is_the_policy(learner, tiny_model, tmp_path):
    for b in range(2):
        learner.train_step(make_batch(learner, [1, 0, 0, 1], batch_index=b))
    learner.save(tmp_path, tiny_model)
    assert (tmp_path / "adapter" / "adapter_config.json").exists()
    ids = torch.tensor([[2, 121, 119, 14, 53, 47, 54, 65, 70, 71, 72]])
    merged = load_causal_lm(tmp_path, torch.float32, torch.device("cpu"))
    install_logprob_head(merged, 1024)
    torch.testing.assert_close(_logprobs(merged, ids), _logprobs(learner.model, ids), atol=1e-5, rtol=0)

    resumed = Learner(load_config(None, LORA), tmp_path, tiny_model)
    resumed.load_state(tmp_path)
    assert resumed.version == 2
    torch.testing.assert_close(_logprobs(resumed.model, ids), _logprobs(learner.model, ids), atol=1e-6, rtol=0)
    old = [s["exp_avg_sq"] for s in learner.optimizer.state.values()]
    new = [s["exp_avg_sq"] for s in resumed.optimizer.state.values()]
    assert len(old) == len(new) > 0 and all(torch.equal(a, b) for a, b in zip(old, new))
    a = resumed.train_step(make_batch(resumed, [1, 0, 0, 1], batch_index=2))
    b = learner.train_step(make_batch(learner, [1, 0, 0, 1], batch_index=2))
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)


def test_a_checkpoint_of_another_adapter_is_refused(learner, tiny_model, tmp_path):
    learner.save(tmp_path, tiny_model)
    with pytest.raises(ValueError, match="r.*4, 8"):
        Learner(load_config(None, [*LORA, "trainer.lora.rank=8"]), tmp_path, tiny_model)


def test_kl_reference_is_the_base_with_the_adapter_off(tiny_model):
    learner = Learner(load_config(None, [*LORA, "trainer.loss.kl_coef=0.1"]), tiny_model)
    assert learner.reference is None
    for b in range(2):
        m = learner.train_step(make_batch(learner, [1, 0, 0, 1], batch_index=b))
    assert m["loss/ref_kl"] > 0
    base = load_causal_lm(tiny_model, torch.float32, torch.device("cpu"))
    install_logprob_head(base, 1024)
    ids = torch.tensor([[2, 121, 119, 14, 53, 47, 54, 65, 70]])
    with learner.model.disable_adapter():
        torch.testing.assert_close(_logprobs(learner.model, ids), _logprobs(base, ids))
    assert not torch.allclose(_logprobs(learner.model, ids), _logprobs(base, ids))


def test_bad_lora_configs_are_named(tiny_model):
    with pytest.raises(ConfigError, match="world_size"):
        load_config(None, [*LORA, "trainer.world_size=2"])
    with pytest.raises(ValueError, match="qkv"):
        Learner(load_config(None, [*LORA, "trainer.lora.target_modules=[qkv]"]), tiny_model)


def test_engine_rank_is_the_smallest_vllm_accepts():
    assert load_config(None, ["trainer.lora.rank=4"]).trainer.lora.engine_rank == 8
    assert load_config(None, ["trainer.lora.rank=16"]).trainer.lora.engine_rank == 16
    assert np.all([load_config(None, [f"trainer.lora.rank={r}"]).trainer.lora.engine_rank >= r for r in (1, 9, 300)])


def test_the_merged_export_is_written_shard_by_shard_and_loads_as_the_policy(learner, tmp_path):
    learner.train_step(make_batch(learner, [1, 0, 0, 1]))
    lora.save_merged(learner.model, tmp_path, shard_bytes=64 << 10)
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 3
    merged = load_causal_lm(tmp_path, torch.float32, torch.device("cpu"))
    install_logprob_head(merged, 1024)
    ids = torch.tensor([[2, 121, 119, 14, 53, 47, 54, 65, 70, 71, 72]])
    torch.testing.assert_close(_logprobs(merged, ids), _logprobs(learner.model, ids), atol=1e-5, rtol=0)
    assert merged.get_output_embeddings().weight is merged.get_input_embeddings().weight  # still tied


def test_merged_serving_deltas_are_peft_s_and_a_malformed_push_is_refused(learner):
    """What an engine adds to its base weights (flashq.engine.adapter.LoRADeltas) is peft's own
    delta for every adapted layer, rsLoRA scale included; names that are not adapter pairs are refused."""
    from flashq.engine.adapter import LoRADeltas

    learner.train_step(make_batch(learner, [1, 0, 0, 1]))
    layers = dict(lora._lora_layers(learner.model))
    for rslora in (False, True):
        peft_config = {**learner.cfg.trainer.lora.peft_dict(), "use_rslora": rslora}
        for layer in layers.values():
            layer.scaling["default"] = 8 / (4 ** 0.5 if rslora else 4)
        deltas = LoRADeltas({n: p.detach() for n, p in lora.adapter_parameters(learner.model)}, peft_config)
        assert set(deltas) == {n.removeprefix("base_model.model.") for n in layers}
        for name, layer in layers.items():
            torch.testing.assert_close(deltas.delta(name.removeprefix("base_model.model.")), layer.get_delta_weight("default"))
    pushed = {n: p.detach() for n, p in lora.adapter_parameters(learner.model)}
    with pytest.raises(ValueError, match="without both lora_A and lora_B"):
        LoRADeltas({n: t for n, t in pushed.items() if ".lora_B." not in n}, peft_config)
    with pytest.raises(ValueError, match="is not a lora_A or lora_B weight"):
        LoRADeltas({"model.layers.0.mlp.up_proj.weight": torch.zeros(2, 2)}, peft_config)


def test_auto_serving_merges_for_float32_engines_and_keeps_the_adapter_apart_in_bfloat16():
    """In bfloat16, base + B@A would round away updates below a bfloat16 step of the weight."""
    assert load_config(None, LORA).trainer.lora.serve == "merged"
    assert load_config(None, [*LORA, "model.dtype=bfloat16"]).trainer.lora.serve == "adapter"
    assert load_config(None, [*LORA, "model.dtype=bfloat16", "trainer.lora.serve=merged"]).trainer.lora.serve == "merged"
