# megatron-seed GPU image: a CUDA 13 base, Python 3.12, and the pinned engine stack
# (torch 2.13.0, vLLM 0.32.0, Transformer Engine 2.11.0, megatron-core 0.16.1) with Ray,
# NeMo-Run, alfworld and this package.
#
# The dependencies come from the same files as the CPU install: tools/install.sh gpu reads
# requirements-gpu.in (the engine stack) and requirements.txt (shared) under the constraints
# of requirements-gpu.lock, the full resolution for Python 3.12 that `python
# tools/gpu_lock.py` checks; TE's PyTorch extension is compiled here against that torch.
# Nothing is pip-installed here directly, so the two installs cannot drift apart.
#
# Build:  docker build -t megatron-seed:gpu .
# Run:    docker run --rm -it --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 \
#             -v "$PWD/runs:/home/seed/runs" megatron-seed:gpu seed --help
# Slurm:  enroot import -o /shared/megatron-seed.sqsh dockerd://megatron-seed:gpu
#         seed launch qwen2.5-7b --executor slurm --nodes 2 --container-image /shared/megatron-seed.sqsh
# More in docs/launch.md ("## Launch").

# the devel flavour: nvcc and the CUDA headers compile TE's PyTorch extension
ARG BASE_IMAGE=nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04
FROM ${BASE_IMAGE}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    RAY_USAGE_STATS_ENABLED=0 \
    DEBIAN_FRONTEND=noninteractive \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    NVTE_FRAMEWORK=pytorch \
    MAX_JOBS=8

# Python 3.12 is Ubuntu 24.04's; the venv keeps pip off the system interpreter (PEP 668).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-dev python3-venv git ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

WORKDIR /opt/megatron-seed

# 1. Dependencies. Only the files the install reads are copied, so this layer (the slow one)
#    is rebuilt when a requirement changes, not when the source does. The package's
#    top-level __init__ files let the editable install register its packages now.
COPY requirements.txt requirements-gpu.in requirements-gpu.lock requirements-dev.txt pyproject.toml ./
COPY tools/install.sh tools/install.sh
COPY tools/leptonai_v1_compat tools/leptonai_v1_compat
COPY megatron_seed/__init__.py megatron_seed/__init__.py
COPY envs/__init__.py envs/__init__.py
COPY launch/__init__.py launch/__init__.py
RUN bash tools/install.sh gpu

# 2. The source; the editable install above already points here.
COPY . .

# Fail the build, not the first job, when the engine stack does not import together.
RUN python -c "import torch, transformer_engine.pytorch, vllm, megatron.core, ray, nemo_run, alfworld, megatron_seed.cli, launch.commands" \
    && python -m pip check \
    && seed --help > /dev/null

# 3. A non-root user for jobs; Ray writes its token and logs under $HOME and /tmp. (Under
#    pyxis/enroot the job runs as the submitting user instead; the image works for both.)
ARG SEED_UID=2000
RUN useradd --create-home --uid "${SEED_UID}" --user-group --shell /bin/bash seed
USER ${SEED_UID}:${SEED_UID}
WORKDIR /home/seed
CMD ["seed", "--help"]
