"""The vLLM plugin's log filters: loading a float32 checkpoint into the bf16 parameters that
`model.dtype` asks for says so once, not once per tensor (270 lines for SmolLM2-135M), while
any other dtype mismatch still warns per tensor."""

import logging

import torch

from flashq.engine.vllm_plugin import _NarrowingToServingDtype

NOTICE = _NarrowingToServingDtype.NOTICE


def _logger(caplog) -> logging.Logger:
    logger = logging.getLogger("test.flashq.narrowing")
    logger.propagate = True
    logger.filters.clear()
    logger.addFilter(_NarrowingToServingDtype())
    caplog.set_level(logging.WARNING, logger=logger.name)
    return logger


def test_float32_into_bf16_is_said_once(caplog):
    logger = _logger(caplog)
    for layer in range(30):
        for part in ("q_proj", "k_proj", "v_proj"):
            logger.warning(NOTICE, f"layers.{layer}.self_attn.{part}.weight", torch.float32, torch.bfloat16)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["Loading torch.float32 weights into torch.bfloat16 parameters (model.dtype); one notice for all tensors"]


def test_other_mismatches_still_warn_per_tensor(caplog):
    logger = _logger(caplog)
    logger.warning(NOTICE, "layers.0.mlp.up_proj.weight", torch.float32, torch.bfloat16)
    logger.warning(NOTICE, "layers.0.mlp.down_proj.weight", torch.bfloat16, torch.float16)
    logger.warning(NOTICE, "layers.1.mlp.down_proj.weight", torch.float16, torch.int8)
    logger.warning("Attempted to load weight (%s) into parameter (%s)", "a", "b")
    assert len(caplog.records) == 4
    assert "layers.0.mlp.down_proj.weight" in caplog.records[1].getMessage()
    assert "torch.int8" in caplog.records[2].getMessage()
