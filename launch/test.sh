#!/usr/bin/env bash
# Set up, then run the test suite (all of it, slow integration tests included; they start real
# processes and vLLM engines). Extra arguments go to pytest, e.g. `-m "not slow"` for the fast part.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest "$@"
