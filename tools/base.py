"""The local stand-in for the trainer image's base: ``localhost/torch-base:<torch>``.

Upstream's base (the Dockerfile's ``BASE_IMAGE``, pytorch/pytorch) cannot be pulled where there is
no Docker Hub. The stand-in keeps its contract (``python3`` and pip on PATH, torch at the locked
version built for CUDA, no compiler): Debian bookworm minbase (mmdebstrap) with a venv at
/opt/conda and torch from the :func:`~tools.wheelhouse.wheelhouse`, fed in as a build volume.
docs/image.md says how it differs from upstream.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path

from .cache import short_digest
from .lock import torch_version
from .podman import ImageError, build_once, podman_build, require, run
from .wheelhouse import BASE_REQUIREMENTS, wheelhouse

HERE = Path(__file__).resolve().parent
BASE_CONTAINERFILE = HERE / "torch-base.Containerfile"
#: Debian for the stand-in's root filesystem. ca-certificates: pip over HTTPS in derived images;
#: passwd: the Dockerfile's groupadd/useradd.
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd")
DEBIAN_MIRRORS = (
    f"deb http://deb.debian.org/debian {DEBIAN_SUITE} main",
    f"deb http://deb.debian.org/debian {DEBIAN_SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {DEBIAN_SUITE}-security main",
)
MMDEBSTRAP = (
    "mmdebstrap",
    "--variant=minbase",
    f"--include={','.join(DEBIAN_PACKAGES)}",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    DEBIAN_SUITE,
)


def base_ref() -> str:
    """The stand-in's reference, without building it."""
    return f"localhost/torch-base:{torch_version()}"


def base_image(log=sys.stderr) -> str:
    """Build (if missing or stale) the stand-in base; return ``localhost/torch-base:<torch>``.

    Rebuilt only when its inputs change: the Containerfile, the pinned requirements, the Debian
    suite, packages and mirrors.
    """
    version = torch_version()
    containerfile = BASE_CONTAINERFILE.read_text()
    if not re.search(rf"^torch=={re.escape(version)} ", BASE_REQUIREMENTS.read_text(), re.M):
        raise ImageError(
            f"images: {BASE_REQUIREMENTS.name} does not pin torch {version} (the version "
            "pyproject.toml names). Run `make lock`."
        )
    inputs = short_digest(
        containerfile, version, BASE_REQUIREMENTS.read_bytes(), *MMDEBSTRAP, *DEBIAN_MIRRORS
    )
    ref = base_ref()

    def build() -> None:
        require("mmdebstrap", "Install it: `make node-deps` (root, apt).")
        house = wheelhouse(log)
        with tempfile.TemporaryDirectory(prefix="ddpjob-base-") as tmp:
            ctx = Path(tmp)
            start = time.monotonic()
            print(f"[images] {' '.join(MMDEBSTRAP)}", file=log, flush=True)
            run([*MMDEBSTRAP, str(ctx / "rootfs.tar"), *DEBIAN_MIRRORS], log=log)
            print(
                f"[images] Debian root filesystem in {time.monotonic() - start:.0f}s",
                file=log,
                flush=True,
            )
            (ctx / "Containerfile").write_text(containerfile)
            podman_build(
                ref,
                ctx,
                ctx / "Containerfile",
                inputs,
                # --no-cache: the wheels come in by a volume, which buildah's cache ignores.
                args=[
                    "--no-cache",
                    "--volume",
                    f"{house}:/wheels:ro",
                    "--build-arg",
                    f"TORCH_VERSION={version}",
                ],
                log=log,
            )

    return build_once(ref, inputs, build, log=log)
