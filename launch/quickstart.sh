#!/usr/bin/env bash
# Set up, then run the quickstart end to end: the built-in tiny model trained with async GRPO on
# a verifiable arithmetic task, every role its own process. Extra key=value arguments override
# the config, e.g. `bash launch/quickstart.sh async_ratio=0`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/flashq launch configs/quickstart.yaml "$@"
