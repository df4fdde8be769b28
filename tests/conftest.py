"""Shared fixtures. Tests run offline; the tiny model is built once per session."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """Where tests build the tiny model: the repo's cache, shared with the quickstart."""
    return ROOT / ".cache" / "flashq"


@pytest.fixture(scope="session")
def tiny_model(model_cache) -> Path:
    from flashq.models.tiny import TinyModelSpec, ensure_tiny_model

    return ensure_tiny_model(TinyModelSpec(), model_cache)
