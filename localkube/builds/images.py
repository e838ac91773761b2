"""The local cluster's images, built on this machine (no registry, no Docker daemon).

    pause_image()      localhost/pause:<tag>: Kubernetes' pause.c, static, FROM scratch, uid 65535
    init_image()       localhost/busybox:<version>: busybox-static FROM scratch, for the training
                       operator's worker init container (sh, seq, nslookup)
    trainer_image()    localhost/ddpjob-trainer:dev-<checkout>: the Dockerfile, for the cluster
                       (trainer_ref() names it without building)

Each builds with podman through ``tools.podman.build_once`` when the image is missing or its
inputs changed, and returns the full reference (never ``:latest``, which would make the kubelet
pull). The trainer image is the product's (``tools/image.py``) on the base it chooses. The node
imports them into its containerd (``node/images.py``).

    python -m localkube.builds.images pause|init|trainer
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tools import image as product
from tools.base import base_image, base_ref
from tools.cache import short_digest
from tools.podman import ImageError, build_once, podman_build, require, run

from .. import versions
from ..procs import LocalkubeError
from .gocmd import module_download

ROOT = Path(__file__).resolve().parents[2]

PAUSE_CFLAGS = ("-Os", "-Wall", "-Werror", "-static")
# As build/pause/Dockerfile upstream (BASE=scratch for Linux), COPY for ADD.
PAUSE_CONTAINERFILE = """\
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
"""
# Every applet as a symlink in /bin, so `sh -c '... $(seq N) ... nslookup ...'` finds them, except
# sh and nslookup (see NSLOOKUP). uid 65534 (nobody): the pod's runAsUser wins; without one the
# container is still not root.
INIT_CONTAINERFILE = """\
FROM scratch
COPY rootfs/ /
ENV PATH=/bin
USER 65534:65534
"""
# busybox >= 1.31 sends the query under every `search` domain of resolv.conf and exits 1 when any
# of them is NXDOMAIN (https://bugs.busybox.net/show_bug.cgi?id=14671). In a pod (search
# <ns>.svc.cluster.local svc.cluster.local cluster.local) `nslookup <job>-master-0` then fails
# although the name resolves, and the operator's init container loops until MaxTries: that is why
# upstream's default is alpine:3.10 (busybox 1.30). This /bin/nslookup exits 0 when an answer came
# back. It needs a shell that looks commands up in PATH: busybox's ash runs its own nslookup applet
# first, so /bin/sh is Debian's static mksh.
NSLOOKUP = """\
#!/bin/sh
# busybox nslookup, but exit 0 when the name resolved under some search domain (busybox bug 14671).
out=$(/bin/busybox nslookup "$@")
rc=$?
printf '%s\\n' "$out"
case $rc:$out in
0:* | *"
Name:"*) exit 0 ;;
esac
exit "$rc"
"""


# --- pause ---------------------------------------------------------------------------------------


def _kubernetes_module_dir() -> Path:
    """The k8s.io/kubernetes module at the pinned version, from the Go module cache."""
    require("go", "Install Go >= 1.24 (https://go.dev/dl/); the local cluster needs it too.")
    return Path(module_download(f"k8s.io/kubernetes@{versions.KUBERNETES}")["Dir"])


def pause_image(log=sys.stderr) -> str:
    """Build (if missing or stale) the pause image from the pinned Kubernetes' own pause.c.

    Compiled as upstream does (``gcc -Os -Wall -Werror -static``), packed FROM scratch, user
    65535, tagged with the version in build/pause/Makefile. Returns ``localhost/pause:<tag>``.
    """
    src = _kubernetes_module_dir() / "build" / "pause"
    match = re.search(r"^TAG \?= (\S+)$", (src / "Makefile").read_text(), re.M)
    if not match:
        raise ImageError(
            f"localkube images: no `TAG ?=` line in {src / 'Makefile'} (got none). "
            "Has the pause build moved in this Kubernetes version?"
        )
    tag = match.group(1)
    pause_c = src / "linux" / "pause.c"
    require("gcc", "Install gcc and the static C library: apt-get install gcc libc6-dev.")
    gcc = run(["gcc", "--version"]).splitlines()[0]
    cflags = [*PAUSE_CFLAGS, f"-DVERSION=v{tag}-{versions.KUBERNETES}"]
    inputs = short_digest(pause_c.read_bytes(), " ".join(cflags), gcc, PAUSE_CONTAINERFILE)
    ref = f"localhost/pause:{tag}"

    def build() -> None:
        with tempfile.TemporaryDirectory(prefix="ddpjob-pause-") as tmp:
            ctx = Path(tmp)
            run(["gcc", *cflags, "-o", str(ctx / "pause"), str(pause_c)])
            (ctx / "Containerfile").write_text(PAUSE_CONTAINERFILE)
            # --timestamp 0: the same binary gives the same image ID on every machine.
            podman_build(
                ref, ctx, ctx / "Containerfile", inputs, args=["--timestamp", "0"], log=log
            )

    return build_once(ref, inputs, build, log=log)


# --- init (busybox) ------------------------------------------------------------------------------


def _is_static_elf(path: Path) -> bool:
    """True for a 64-bit little-endian ELF without a PT_INTERP header (no dynamic loader)."""
    with open(path, "rb") as handle:
        head = handle.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return False
        phoff = int.from_bytes(head[32:40], "little")
        phentsize = int.from_bytes(head[54:56], "little")
        phnum = int.from_bytes(head[56:58], "little")
        handle.seek(phoff)
        table = handle.read(phentsize * phnum)
    pt_interp = 3
    return all(
        int.from_bytes(table[i : i + 4], "little") != pt_interp
        for i in range(0, len(table), phentsize)
    )


def _static_binary(name: str, candidates: Sequence[str], hint: str) -> Path:
    """The first of ``candidates`` (or ``name`` on PATH) that is a static binary."""
    for path in (*candidates, shutil.which(name)):
        if path and Path(path).exists() and _is_static_elf(Path(path).resolve()):
            return Path(path).resolve()
    raise ImageError(
        f"localkube images: no static {name} (got none among {[*candidates, name]}; a "
        f"dynamically linked one cannot run FROM scratch). {hint}"
    )


def init_image(log=sys.stderr) -> str:
    """Build (if missing or stale) the worker init container image from Debian's busybox-static.

    The training operator's init container runs ``sh -c 'for i in $(seq N); do if nslookup
    MASTER; ...'`` (pkg/controller.v1/pytorch/initcontainer.go): busybox's applets in /bin,
    /bin/sh is static mksh and /bin/nslookup fixes busybox's exit status (see ``NSLOOKUP``).
    Returns ``localhost/busybox:<busybox version>``.
    """
    hint = "Install it: `make node-deps` (apt-get install busybox-static mksh)."
    busybox = _static_binary("busybox", ["/bin/busybox"], hint)
    mksh = _static_binary("mksh-static", ["/bin/mksh-static"], hint)
    proc = subprocess.run([busybox], capture_output=True, text=True, check=False)
    match = re.search(r"BusyBox v(\d+(?:\.\d+)+)", proc.stdout + proc.stderr)
    if not match:
        raise ImageError(
            f"localkube images: cannot read the busybox version of {busybox} "
            f"(got {(proc.stdout + proc.stderr)[:80]!r}). {hint}"
        )
    applets = run([str(busybox), "--list"]).split()
    inputs = short_digest(
        busybox.read_bytes(), mksh.read_bytes(), " ".join(applets), NSLOOKUP, INIT_CONTAINERFILE
    )
    ref = f"localhost/busybox:{match.group(1)}"

    def build() -> None:
        with tempfile.TemporaryDirectory(prefix="ddpjob-busybox-") as tmp:
            ctx = Path(tmp)
            bindir = ctx / "rootfs" / "bin"
            bindir.mkdir(parents=True)
            shutil.copy2(busybox, bindir / "busybox")
            shutil.copy2(mksh, bindir / "sh")
            (bindir / "nslookup").write_text(NSLOOKUP)
            (bindir / "nslookup").chmod(0o755)
            for applet in applets:
                if not (bindir / applet).exists():
                    (bindir / applet).symlink_to("busybox")
            (ctx / "Containerfile").write_text(INIT_CONTAINERFILE)
            podman_build(
                ref, ctx, ctx / "Containerfile", inputs, args=["--timestamp", "0"], log=log
            )

    return build_once(ref, inputs, build, log=log)


# --- the trainer image, for the cluster ---------------------------------------------------------


#: Where the project publishes the trainer image (the Makefile's IMAGE, the examples, the chart).
PUBLISHED_REPOSITORY = "ghcr.io/ddpjob/trainer"


def published_ref() -> str:
    """The name the examples and the chart give the trainer image: the published repository at
    the project's version. The local cluster's node holds this checkout's image under it too (as
    ``kind load`` would), so the examples run as written there."""
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return f"{PUBLISHED_REPOSITORY}:{version}"


#: What every checkout's trainer image is named by, before its checkout's part (trainer_ref).
TRAINER_REF_PREFIX = "localhost/ddpjob-trainer:dev-"


def trainer_ref() -> str:
    """The reference :func:`trainer_image` builds, without building anything: what the local
    cluster's objects name (the torch-distributed runtime) before or without the image."""
    checkout = hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]
    return f"{TRAINER_REF_PREFIX}{checkout}"


def trainer_image(log=sys.stderr) -> str:
    """Build (if missing or stale) the trainer image for the local cluster; return its reference.

    ``localhost/ddpjob-trainer:dev-<checkout>`` (:func:`trainer_ref`): one tag per checkout, so
    worktrees beside each other never run each other's code, and a rebuild replaces the image
    rather than piling up. Stale means: the build context, the Dockerfile or the base image
    changed.
    """
    ref = trainer_ref()
    base, _ = product.resolve_base()
    if base == base_ref():
        base = base_image(log)
    return build_once(
        ref,
        product.trainer_inputs(base),
        lambda: product.build_trainer(ref, base=base, version="dev", log=log),
        log=log,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m localkube.builds.images pause|init|trainer``: build the image if stale and
    print its reference. Exit 1 when a build fails, 2 for bad arguments (argparse)."""
    parser = argparse.ArgumentParser(prog="python -m localkube.builds.images")
    parser.add_argument("image", choices=("pause", "init", "trainer"))
    args = parser.parse_args(argv)
    build = {"pause": pause_image, "init": init_image, "trainer": trainer_image}[args.image]
    try:
        print(build())
    except (ImageError, LocalkubeError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
