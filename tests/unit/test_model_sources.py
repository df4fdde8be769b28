"""model.name resolved to one local folder (flashq/models/sources.py): hub ids from the cache,
local folders, GGUF files, and a clear error naming the model for everything else."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flashq.config import ModelConfig
from flashq.models.sources import ModelSourceError, model_path
from tests.hub_cache import prefill

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_a_hub_id_resolves_offline_to_its_cached_snapshot(tiny_model, hub_cache, tmp_path):
    snapshot = prefill(hub_cache, "acme/tiny-chat", tiny_model)
    assert model_path(ModelConfig(name="acme/tiny-chat", cache_dir=tmp_path)) == snapshot
    # with fetch on, a complete cached snapshot is used as it is (HF_HUB_OFFLINE is set in tests)
    assert model_path(ModelConfig(name="acme/tiny-chat", cache_dir=tmp_path), fetch=True) == snapshot


def test_a_pinned_revision_is_the_one_resolved(tiny_model, hub_cache, tmp_path):
    prefill(hub_cache, "acme/tiny-chat", tiny_model)
    other = prefill(hub_cache, "acme/tiny-chat", tiny_model, commit="f" * 40)
    (hub_cache / "models--acme--tiny-chat" / "refs" / "main").write_text("0123456789abcdef0123456789abcdef01234567")
    assert model_path(ModelConfig(name="acme/tiny-chat", revision="f" * 40, cache_dir=tmp_path)) == other


def test_a_hub_id_missing_from_the_cache_is_named_with_and_without_fetching(hub_cache, tmp_path):
    with pytest.raises(ModelSourceError, match=r"'acme/absent' is not in the Hugging Face cache .*flashq launch. fetches it"):
        model_path(ModelConfig(name="acme/absent", cache_dir=tmp_path))
    with pytest.raises(ModelSourceError, match=r"'acme/absent' is not in the Hugging Face cache .* could not be fetched from the hub"):
        model_path(ModelConfig(name="acme/absent", cache_dir=tmp_path), fetch=True)  # offline here


def test_a_cached_snapshot_without_weights_is_not_taken_for_a_model(tiny_model, hub_cache, tmp_path):
    snapshot = prefill(hub_cache, "acme/tiny-chat", tiny_model)
    for f in snapshot.glob("*.safetensors"):
        f.unlink()  # what a config-only download (AutoConfig.from_pretrained) leaves
    with pytest.raises(ModelSourceError, match="'acme/tiny-chat' is not in the Hugging Face cache"):
        model_path(ModelConfig(name="acme/tiny-chat", cache_dir=tmp_path))


def test_local_folders_and_files_resolve_or_say_what_is_wrong(tiny_model, tmp_path):
    assert model_path(ModelConfig(name=str(tiny_model))) == tiny_model
    with pytest.raises(ModelSourceError, match="no such folder or file"):
        model_path(ModelConfig(name=str(tmp_path / "nowhere")))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelSourceError, match="is a file but not a .gguf file"):
        model_path(ModelConfig(name=str(tmp_path / "weights.bin")))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "model.gguf").write_bytes(b"x")
    with pytest.raises(ModelSourceError, match=r"holds no config.json.*for its GGUF file give model.name=.*model.gguf"):
        model_path(ModelConfig(name=str(tmp_path / "empty")))
    with pytest.raises(ModelSourceError, match="is not a readable GGUF file"):
        model_path(ModelConfig(name=str(tmp_path / "empty" / "model.gguf"), cache_dir=tmp_path))


def _gguf(path: Path, arch: str, tensor: np.ndarray) -> Path:
    import gguf

    w = gguf.GGUFWriter(path, arch)
    w.add_tensor("token_embd.weight", tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_gguf_file_that_cannot_be_converted_is_refused_naming_why(tmp_path, monkeypatch):
    foreign = _gguf(tmp_path / "foreign.gguf", "rwkv9", np.zeros((4, 32), dtype=np.float32))
    with pytest.raises(ModelSourceError, match=r"architecture 'rwkv9' has no GGUF conversion in transformers \(supported: .*llama"):
        model_path(ModelConfig(name=str(foreign), cache_dir=tmp_path))
    integers = _gguf(tmp_path / "integers.gguf", "llama", np.zeros((4, 32), dtype=np.int64))
    with pytest.raises(ModelSourceError, match="tensor token_embd.weight is quantized as I64, which the installed gguf package"):
        model_path(ModelConfig(name=str(integers), cache_dir=tmp_path))
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if not installed
    with pytest.raises(ModelSourceError, match=r"needs the `gguf` package: pip install"):
        model_path(ModelConfig(name=str(integers), cache_dir=tmp_path))
    assert not (tmp_path / "gguf").exists() or not any((tmp_path / "gguf").iterdir())  # nothing half-converted left


def test_launch_stops_before_any_role_naming_a_model_it_cannot_get(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "flashq.cli", "launch", "configs/quickstart.yaml", "model.name=acme/absent",
         f"log.root={tmp_path / 'runs'}", "sft.warm_start=false", "--no-progress"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "model 'acme/absent' is not in the Hugging Face cache" in proc.stderr
    assert "could not be fetched from the hub" in proc.stderr
    logs = list((tmp_path / "runs").glob("*/logs/*.log"))
    assert logs == [], f"roles started: {logs}"
