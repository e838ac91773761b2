# syntax=docker/dockerfile:1.7
# The ddpjob trainer image: `python -m trainer` on CUDA, as a non-root user.
#
#   make image IMAGE=ghcr.io/you/ddpjob TAG=v0.1.0 && make push IMAGE=... TAG=...
#
# Base: the official PyTorch runtime image. Its torch wheel was built against exactly this CUDA
# 12.8 + cuDNN 9 + NCCL, and they ship together, so the image carries one copy of the CUDA
# libraries. (An nvidia/cuda base plus `pip install torch` carries two: pip's torch brings its
# own nvidia-* wheels, ~3 GB, and ignores the base's.) "runtime", not "devel": no compiler needed.
# Pinned by tag; to pin by digest too, append @sha256:... from
# `docker buildx imagetools inspect pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime`.
FROM pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime

# Stamped by `make image` (OCI annotations: https://github.com/opencontainers/image-spec).
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
      org.opencontainers.image.base.name="pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime"

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

# Install ddpjob[trainer] from the build context without leaving the sources in a layer (a rw
# bind mount: setuptools' build/ and egg-info writes are thrown away). The base's torch already
# satisfies `torch>=2.5,<3`, so pip keeps it; the check after fails the build if anything
# replaced it (e.g. a CPU wheel) or if the trainer does not import.
RUN --mount=type=bind,source=.,target=/src,rw \
    pip install --no-cache-dir "/src[trainer]" \
    && python -c "import torch, trainer, trainer.config; assert torch.__version__.startswith('2.8.0'), torch.__version__; assert torch.version.cuda, 'CPU-only torch'"

WORKDIR /workspace
# Numeric, so the kubelet can verify runAsNonRoot without reading /etc/passwd.
USER 1000:1000

# Always the trainer; when PET_NPROC_PER_NODE > 1 it re-launches itself under torchrun, so one
# entrypoint serves every pod shape. Settings come as `key=value` arguments.
ENTRYPOINT ["python", "-m", "trainer"]
