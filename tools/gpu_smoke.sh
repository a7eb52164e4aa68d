#!/usr/bin/env bash
# The GPU smoke (tools/gpu_smoke.py) on a bare GPU node: a Python with its own torch and CUDA,
# nothing else installed, no package index. Two steps:
#
#   bash tools/gpu_smoke.sh fetch [PYTHON_VERSION]   # here, with an index: the pure-Python
#        and small binary wheels the smoke needs besides torch (megatron-core, transformers
#        and what they import), for the node's Python (default 3.12) on Linux x86-64, at the
#        GPU lock's versions, into bench/wheels (checked to stay under 60 MiB)
#   bash tools/gpu_smoke.sh run [SMOKE ARGS...]      # on the node: those wheels installed
#        with --no-deps into bench/site beside the node's own torch, then the smoke; its JSON
#        (bench/gpu_smoke.json unless --out) is rewritten after every phase
#
# `run` prints the versions it found first, so a node that lacks something fails in its first
# seconds, not after the model is built.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
wheels="$here/bench/wheels"
site="$here/bench/site"
# what the smoke imports besides torch and the standard library (megatron-core, transformers,
# their tokenizer, weights and hub code), as the GPU lock pins them
PACKAGES=(
  megatron-core transformers tokenizers safetensors huggingface-hub regex pyyaml tqdm
  packaging numpy einops filelock fsspec typing-extensions httpx2 httpcore2 h11 anyio
  sniffio idna certifi truststore psutil
)
MAX_MIB=60

lock_pin() {  # name -> name==version from requirements-gpu.lock
  local pin
  pin="$(grep -i -E "^$1==" "$here/requirements-gpu.lock" | cut -d' ' -f1 || true)"
  if [[ -z "$pin" ]]; then echo "gpu_smoke.sh: $1 is not in requirements-gpu.lock" >&2; exit 2; fi
  echo "$pin"
}

case "${1:-}" in
  fetch)
    py="${2:-3.12}"
    reqs=()
    for p in "${PACKAGES[@]}"; do reqs+=("$(lock_pin "$p")"); done
    rm -rf "$wheels" && mkdir -p "$wheels"
    platforms=()
    for tag in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
      platforms+=(--platform "$tag")
    done
    PIP_CONFIG_FILE=/dev/null python -m pip download -q --no-deps --only-binary=:all: \
      --python-version "$py" --implementation cp "${platforms[@]}" -d "$wheels" "${reqs[@]}"
    mib=$(( $(du -sk "$wheels" | cut -f1) / 1024 ))
    echo "gpu_smoke.sh: $(ls "$wheels" | wc -l) wheels for Python $py in bench/wheels ($mib MiB)"
    if (( mib > MAX_MIB )); then echo "gpu_smoke.sh: over $MAX_MIB MiB" >&2; exit 1; fi
    ;;
  run)
    shift
    if ! compgen -G "$wheels/*.whl" > /dev/null; then
      echo "gpu_smoke.sh: no wheels in bench/wheels: run 'bash tools/gpu_smoke.sh fetch' where an index is" >&2
      exit 2
    fi
    rm -rf "$site" && mkdir -p "$site"
    if python -m pip --version > /dev/null 2>&1; then
      python -m pip install -q --no-deps --no-index --disable-pip-version-check \
        --target "$site" "$wheels"/*.whl
    else  # no pip on the node: a wheel is a zip of its installed files
      for w in "$wheels"/*.whl; do python -m zipfile -e "$w" "$site"; done
    fi
    export PYTHONPATH="$site:$here${PYTHONPATH:+:$PYTHONPATH}"
    python - <<'EOF'
import importlib.metadata as md, platform, torch
cuda = torch.version.cuda or "none"
print(f"gpu_smoke.sh: Python {platform.python_version()}, torch {torch.__version__} (CUDA {cuda}),"
      f" GPU: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}", flush=True)
for name in ("megatron-core", "transformers", "transformer-engine", "vllm"):
    try:
        print(f"gpu_smoke.sh: {name} {md.version(name)}", flush=True)
    except md.PackageNotFoundError:
        print(f"gpu_smoke.sh: {name} not installed", flush=True)
EOF
    cd "$here"
    exec python tools/gpu_smoke.py "$@"
    ;;
  *)
    echo "usage: bash tools/gpu_smoke.sh fetch [PYTHON_VERSION] | run [SMOKE ARGS...]" >&2
    exit 2
    ;;
esac
