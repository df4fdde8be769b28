"""The memory-bounded logprob path against the naive one, in float64 on a small Qwen2."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from flashq.trainer.logprobs import LogprobHead, install_logprob_head, naive_token_logprobs, token_logprobs


def small_model(tied: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=tied)
    return Qwen2ForCausalLM(cfg).double()


def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (3, 11), generator=g)
    attn = torch.ones_like(ids)
    attn[1, 8:] = 0  # padding
    select = torch.zeros(3, 10, dtype=torch.bool)
    select[0, 4:] = True
    select[1, 2:7] = True
    select[2, 9] = True
    return ids, attn, select


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("temperature, banned", [(1.0, None), (0.7, torch.tensor([3, 5]))])
@pytest.mark.parametrize("keep_logits_bytes", [0, 1 << 20], ids=["recomputed", "kept"])
def test_chunked_logprobs_entropy_and_gradients_equal_the_naive_path(tied, temperature, banned, keep_logits_bytes):
    ids, attn, select = batch()
    adv = torch.linspace(-1, 1, 10, dtype=torch.float64)

    model = small_model(tied)
    logp_ref, ent_ref = naive_token_logprobs(model, ids, attn, temperature, banned)
    mask = select.double()
    ((logp_ref * mask * adv).sum()).backward()
    want = grads(model)

    head = install_logprob_head(model, chunk_tokens=3)  # 12 selected positions: chunks of 3, 3, 3, 3
    head.keep_logits_bytes = keep_logits_bytes  # 0: every chunk checkpointed; 1 MiB: all 12 rows' logits kept
    model.zero_grad()
    logp, ent = token_logprobs(model, ids, attn, temperature, select, banned)
    ((logp * mask * adv).sum()).backward()
    got = grads(model)

    assert torch.allclose(logp[select], logp_ref[select], atol=1e-12)
    assert torch.allclose(ent[select], ent_ref[select], atol=1e-12)
    assert torch.all(logp[~select] == 0) and torch.all(ent[~select] == 0)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-12), name


def test_the_head_keeps_tied_weights_and_state_dict_names():
    model = small_model(tied=True)
    names = set(model.state_dict())
    head = install_logprob_head(model, 4)
    assert isinstance(model.lm_head, LogprobHead) and head.weight is model.model.embed_tokens.weight
    assert set(model.state_dict()) == names
    ids, attn, _ = batch()
    plain = model(input_ids=ids, attention_mask=attn).logits  # unbound: ordinary logits
    assert plain.shape == (3, 11, 97)


def test_an_empty_selection_still_reaches_every_parameter():
    """A sharded rank's padding micro-batch trains nothing but must run backward through every
    layer (FSDP's gradient reduction pairs up across ranks)."""
    model = small_model(tied=True)
    install_logprob_head(model, 4)
    ids, attn, select = batch()
    logp, _ = token_logprobs(model, ids, attn, 1.0, torch.zeros_like(select))
    logp.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
