# syntax=docker/dockerfile:1.7
# The ddpjob trainer image: `python -m trainer` on CUDA, as a non-root user.
#
#   make image IMAGE=ghcr.io/you/ddpjob TAG=v0.1.0 && make push IMAGE=... TAG=...
#
# `make image` builds with Docker (BuildKit) where a daemon answers, else with podman/buildah;
# both run this file the same way. See docs/image.md.
#
# Base: the official PyTorch runtime image. Its torch wheel was built against exactly this CUDA
# 12.8 + cuDNN 9 + NCCL, and they ship together, so the image carries one copy of the CUDA
# libraries. (An nvidia/cuda base plus `pip install torch` carries two: pip's torch brings its
# own nvidia-* wheels, ~3 GB, and ignores the base's.) "runtime", not "devel": no compiler needed.
# Pinned by tag; to pin by digest too, append @sha256:... from
# `docker buildx imagetools inspect pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime`.
# Another base must keep the contract: `python` and `pip` on PATH, torch 2.8.0 built for CUDA.
# podman builds on the local stand-in localhost/torch-base:2.8.0 when this one cannot be pulled.
ARG BASE_IMAGE=pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime

# The project's wheel, built from exactly the package files. COPY honours .dockerignore under
# BuildKit and buildah alike; a bind mount of the context does not under buildah (the whole
# checkout is mounted, and `rw` writes build/ and egg-info through to it).
FROM ${BASE_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY trainer/ trainer/
COPY controller/ controller/
# requirements.txt names the wheel with the extra the image installs: ddpjob[trainer] @ file://...
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheel . \
    && printf 'ddpjob[trainer] @ file://%s\n' /wheel/ddpjob-*.whl > /wheel/requirements.txt

FROM ${BASE_IMAGE}

# PYTHONUNBUFFERED: the controller reads rank 0's JSON events line by line from the pod log.
# Caches that torch.compile/triton write go under HOME, which the user below owns.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
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

# Install ddpjob[trainer] from the wheel stage, which leaves nothing in this layer. The base's
# torch already satisfies `torch>=2.5,<3`, so pip keeps it; the check after fails the build if
# anything replaced it (e.g. a CPU wheel) or if the trainer does not import.
# With podman/buildah, build with --layers=false (`make image` does): their layer cache gets this
# mount wrong both ways, reusing an install after the wheel changed (buildah#4522) and mounting
# an empty stage when the wheel stage came from the cache (podman#16281, podman 4.3).
RUN --mount=type=bind,from=wheel,source=/wheel,target=/wheel \
    pip install --no-cache-dir --requirement /wheel/requirements.txt \
    && python -c "import torch, trainer, trainer.config; assert torch.__version__.startswith('2.8.0'), torch.__version__; assert torch.version.cuda, 'CPU-only torch'"

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
ENTRYPOINT ["python", "-m", "trainer"]
