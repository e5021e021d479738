#!/usr/bin/env bash
# Set-up + build + the main job on CPU:
#   bash scripts/quickstart.sh         real text (bundled corpus, GPT-2 tokenizer): preprocess_data,
#                                      then pretrain_gpt with validation (examples/quickstart_real_data.sh)
#   bash scripts/quickstart.sh --mock  Megatron's mock data, no tokenizer files (examples/quickstart_tiny_gpt.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
if [[ "${1:-}" == "--mock" ]]; then
  shift
  bash examples/quickstart_tiny_gpt.sh "$@"
else
  bash examples/quickstart_real_data.sh "$@"
fi
