# syntax=docker/dockerfile:1.7
# The ddpjob trainer image: `python -m trainer` on CUDA, as a non-root user.
#
#   make image IMAGE=ghcr.io/you/ddpjob TAG=v0.1.0 && make push IMAGE=... TAG=...
#
# `make image` builds with Docker (BuildKit) where a daemon answers, else with podman/buildah;
# both run this file the same way. See docs/image.md.
#
# Base: the official PyTorch runtime image. Its torch wheel was built against exactly this CUDA
# 13.2 + cuDNN 9 + NCCL, and they ship together, so the image carries one copy of the CUDA
# libraries. (An nvidia/cuda base plus `pip install torch` carries two: pip's torch brings its
# own nvidia-* wheels, several GB, and ignores the base's.) "runtime", not "devel": no compiler.
# TORCH_VERSION is pyproject.toml's [tool.uv] pin (uv.lock); tests/test_generated.py holds the two
# equal. CUDA 13.2 is the CUDA of torch's default PyPI wheel, which the lock and the local
# stand-in base install; it needs an NVIDIA driver >= 580.65.06 (docs/image.md).
# Pinned by tag; to pin by digest too, append @sha256:... from
# `docker buildx imagetools inspect pytorch/pytorch:<tag>`.
# Another base must keep the contract: `python3` and pip, torch at TORCH_VERSION built for CUDA.
# podman builds on the local stand-in localhost/torch-base:<version> when this one cannot be pulled.
ARG TORCH_VERSION=2.15.0
ARG BASE_IMAGE=pytorch/pytorch:${TORCH_VERSION}-cuda13.2-cudnn9-runtime

# The project's wheel, built from exactly the package files. COPY honours .dockerignore under
# BuildKit and buildah alike; a bind mount of the context does not under buildah (the whole
# checkout is mounted, and `rw` writes build/ and egg-info through to it).
FROM ${BASE_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY trainer/ trainer/
COPY controller/ controller/
# --no-build-isolation: the base's setuptools builds it (the stand-in's is the locked one), so the
# build fetches no build backend from a registry on the day.
RUN python3 -m pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheel .
# The trainer extra's packages but torch, pinned with hashes: a view of uv.lock.
COPY requirements/image.txt /wheel/

FROM ${BASE_IMAGE}

# PYTHONUNBUFFERED: the controller reads rank 0's JSON events line by line from the pod log.
# Caches that torch.compile/triton write go under HOME, which the user below owns.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    HOME=/home/trainer \
    XDG_CACHE_HOME=/home/trainer/.cache

# uid/gid 1000 = the runAsUser/runAsGroup/fsGroup that the chart and `controller render` set,
# so a pod under the `restricted` Pod Security profile runs as the owner of these directories.
# /checkpoints is where the checkpoint PVC mounts; /workspace is the working directory, so the
# trainer's default relative checkpoint.dir also lands somewhere writable.
RUN groupadd --gid 1000 trainer \
    && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/trainer \
       --shell /usr/sbin/nologin trainer \
    && mkdir -p /workspace /checkpoints /data \
    && chown 1000:1000 /workspace /checkpoints /data \
    && chmod 1777 /tmp

# Install ddpjob[trainer] from the wheel stage, which leaves nothing in this layer: first its
# requirements but torch, exactly as uv.lock pins them (hashes checked; nothing resolved on the
# day), then the wheel itself. The base's torch is kept; the check after fails the build if
# anything replaced it (e.g. a CPU wheel) or if the trainer does not import.
# PIP_BREAK_SYSTEM_PACKAGES (above): upstream's base installs torch into the system Python.
# With podman/buildah, build with --layers=false (`make image` does): their layer cache gets this
# mount wrong both ways, reusing an install after the wheel changed (buildah#4522) and mounting
# an empty stage when the wheel stage came from the cache (podman#16281, podman 4.3).
ARG TORCH_VERSION
RUN --mount=type=bind,from=wheel,source=/wheel,target=/wheel \
    python3 -m pip install --no-cache-dir --no-deps --require-hashes --requirement /wheel/image.txt \
    && python3 -m pip install --no-cache-dir --no-deps /wheel/ddpjob-*.whl \
    && python3 -c "import torch, trainer, trainer.config; assert torch.__version__.startswith('${TORCH_VERSION}'), torch.__version__; assert torch.version.cuda, 'CPU-only torch'"

WORKDIR /workspace
# Numeric, so the kubelet can verify runAsNonRoot without reading /etc/passwd.
USER 1000:1000

# Stamped by `make image` (OCI annotations: https://github.com/opencontainers/image-spec). Last,
# so a new date or revision re-runs none of the steps above.
ARG BASE_IMAGE
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="ddpjob-trainer" \
      org.opencontainers.image.description="ddpjob DDP trainer (python -m trainer) on PyTorch + CUDA, non-root" \
      org.opencontainers.image.source="https://github.com/ddpjob/ddpjob" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"

# Always the trainer; when PET_NPROC_PER_NODE > 1 it re-launches itself under torchrun, so one
# entrypoint serves every pod shape. Settings come as `key=value` arguments.
ENTRYPOINT ["python3", "-m", "trainer"]
