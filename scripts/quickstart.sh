#!/usr/bin/env bash
# Set-up + build + the main job: a tiny GPT trained on CPU with Megatron's flags and log lines.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
bash examples/quickstart_tiny_gpt.sh "$@"
