"""Container images built on this machine (no registry, no Docker daemon), and into containerd.

    pause_image()      localhost/pause:<tag>: Kubernetes' pause.c, static, FROM scratch, uid 65535
    init_image()       localhost/busybox:<version>: busybox-static FROM scratch, for the training
                       operator's worker init container (sh, seq, nslookup)
    base_image()       localhost/torch-base:<torch>: the local stand-in for the trainer's base
    trainer_image()    localhost/ddpjob-trainer:dev-<checkout>: the Dockerfile, for the cluster
                       (trainer_ref() names it without building)
    build_trainer(ref) what `make image` runs when no Docker daemon answers
    import_into_containerd(ref, address, namespace="k8s.io")

Each ``*_image()`` builds with podman when the image is missing or its inputs changed, and returns
the full reference (never ``:latest``, which would make the kubelet pull). The inputs are hashed
into the label ``io.ddpjob.inputs``, so a second call builds nothing. podman runs with
``localkube/containers.conf`` (runc, no default ulimits: see that file). docs/image.md has the
why: the base rule, the stand-in's differences from upstream, buildah's cache bugs.

``import_into_containerd`` copies a podman image into a containerd and sends only what that
containerd lacks: the layers it already holds (the multi-GB torch layer of the trainer image)
become sparse placeholders in a temporary OCI layout, so skopeo skips them and ``ctr images
import`` gets an archive with the new layers only. Same image ID already there: nothing to do.
Nothing there yet: skopeo's docker-archive streams straight into ``ctr images import``.

    python -m localkube.images pause|init|base|wheelhouse|cluster-trainer
    python -m localkube.images trainer --ref IMAGE:TAG [--version V] [--base REF] [--dry-run]
    python -m localkube.images import REF --address /run/.../containerd.sock [--namespace k8s.io]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import tools
from .procs import LocalkubeError, cache_dir, file_lock
from .procs import short_digest as _digest
from .wheelhouse import BASE_REQUIREMENTS, wheelhouse

HERE = Path(__file__).resolve().parent
#: podman/buildah settings this machine needs (runc; no default ulimits).
CONTAINERS_CONF = HERE / "containers.conf"
#: Label holding the hash of everything an image was built from.
INPUTS_LABEL = "io.ddpjob.inputs"

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


class ImageError(LocalkubeError):
    """An image could not be built, found or imported."""


# --- running podman, skopeo, ctr ----------------------------------------------------------------


def podman_env() -> dict[str, str]:
    """The environment for podman/buildah/skopeo: ours plus ``CONTAINERS_CONF``."""
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def _require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise ImageError(f"localkube.images: {tool} is missing (got no `{tool}` on PATH). {hint}")
    return path


def _run(
    argv: Sequence[str],
    *,
    log=None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    hint: str = "",
) -> str:
    """Run ``argv``; return its stdout. With ``log``, stream stdout+stderr there as it comes
    (and return the last 40 lines of them).

    On failure raise :class:`ImageError` with the command, exit status and the output's tail.
    """
    env = env or podman_env()
    if log is None:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            return proc.stdout
        tail = (proc.stderr or proc.stdout)[-3000:]
    else:
        tail_lines: deque[str] = deque(maxlen=40)
        with subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                tail_lines.append(line)
            log.flush()
        if proc.returncode == 0:
            return "".join(tail_lines)
        tail = "".join(tail_lines)
    raise ImageError(
        f"localkube.images: {Path(argv[0]).name} {' '.join(argv[1:3])} failed "
        f"(got exit {proc.returncode}):\n{tail.rstrip()}\n{hint}".rstrip()
    )


def _lock(name: str):
    """Serialise builds of one image between processes (two test sessions, make and pytest)."""
    return file_lock(cache_dir() / "locks" / f"image-{name}.lock")


def inspect(ref: str) -> dict | None:
    """``podman image inspect ref`` as a dict, or None when podman has no such image."""
    proc = subprocess.run(
        ["podman", "image", "inspect", ref],
        env=podman_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    (info,) = json.loads(proc.stdout)
    return info


def built_inputs(ref: str) -> str | None:
    """The ``io.ddpjob.inputs`` label of ``ref`` in podman's store (None: no image or label)."""
    info = inspect(ref)
    if info is None:
        return None
    return (info.get("Labels") or {}).get(INPUTS_LABEL)


def _podman_build(
    ref: str,
    context: Path,
    containerfile: Path,
    inputs: str,
    *,
    args: Sequence[str] = (),
    log,
) -> str:
    """``podman build`` ``context`` into ``ref`` labelled with ``inputs``; return the image ID."""
    _require("podman", "Install podman and buildah: `make node-deps` (root, apt).")
    old = inspect(ref)
    with tempfile.TemporaryDirectory(prefix="ddpjob-iid-") as tmp:
        iidfile = Path(tmp) / "iid"
        argv = [
            "podman",
            "build",
            "--file",
            str(containerfile),
            "--label",
            f"{INPUTS_LABEL}={inputs}",
            "--iidfile",
            str(iidfile),
            "--tag",
            ref,
            # A failed step's working container holds what it wrote (the stand-in base's: the
            # whole torch install, gigabytes): remove it as a successful build does.
            "--force-rm",
            *args,
            str(context),
        ]
        _run(argv, log=log)
        image_id = iidfile.read_text().strip().removeprefix("sha256:")
    _remove_replaced(old, image_id)
    return image_id


def _remove_replaced(old: dict | None, new_id: str) -> None:
    """Remove the image a rebuild took the tag from, unless something still uses it (podman
    refuses then, and we carry on): no dangling 7 GB images after each rebuild."""
    if old and old["Id"] != new_id:
        subprocess.run(
            ["podman", "rmi", old["Id"]], env=podman_env(), capture_output=True, check=False
        )


# --- pause ---------------------------------------------------------------------------------------


def _kubernetes_module_dir() -> Path:
    """The k8s.io/kubernetes module at the pinned version, from the Go module cache."""
    _require("go", "Install Go >= 1.24 (https://go.dev/dl/); the local cluster needs it too.")
    module = f"k8s.io/kubernetes@{tools.VERSIONS['kubernetes']}"
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    out = _run(
        ["go", "mod", "download", "-json", module],
        cwd=tools.GO_DIR,
        env=env,
        hint="Hint: check network access to the Go module proxy.",
    )
    return Path(json.loads(out)["Dir"])


def pause_image(log=sys.stderr) -> str:
    """Build (if missing or stale) the pause image from the pinned Kubernetes' own pause.c.

    Compiled as upstream does (``gcc -Os -Wall -Werror -static``), packed FROM scratch, user
    65535, tagged with the version in build/pause/Makefile. Returns ``localhost/pause:<tag>``.
    """
    src = _kubernetes_module_dir() / "build" / "pause"
    match = re.search(r"^TAG \?= (\S+)$", (src / "Makefile").read_text(), re.M)
    if not match:
        raise ImageError(
            f"localkube.images: no `TAG ?=` line in {src / 'Makefile'} (got none). "
            "Has the pause build moved in this Kubernetes version?"
        )
    tag = match.group(1)
    pause_c = src / "linux" / "pause.c"
    _require("gcc", "Install gcc and the static C library: apt-get install gcc libc6-dev.")
    gcc = _run(["gcc", "--version"]).splitlines()[0]
    cflags = [*PAUSE_CFLAGS, f"-DVERSION=v{tag}-{tools.VERSIONS['kubernetes']}"]
    inputs = _digest(pause_c.read_bytes(), " ".join(cflags), gcc, PAUSE_CONTAINERFILE)
    ref = f"localhost/pause:{tag}"
    if built_inputs(ref) == inputs:
        return ref
    with _lock("pause"):
        if built_inputs(ref) == inputs:
            return ref
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="ddpjob-pause-") as tmp:
            ctx = Path(tmp)
            _run(["gcc", *cflags, "-o", str(ctx / "pause"), str(pause_c)])
            (ctx / "Containerfile").write_text(PAUSE_CONTAINERFILE)
            # --timestamp 0: the same binary gives the same image ID on every machine.
            _podman_build(
                ref, ctx, ctx / "Containerfile", inputs, args=["--timestamp", "0"], log=log
            )
        print(f"[images] built {ref} in {time.monotonic() - start:.1f}s", file=log, flush=True)
    return ref


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
        f"localkube.images: no static {name} (got none among {[*candidates, name]}; a "
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
            f"localkube.images: cannot read the busybox version of {busybox} "
            f"(got {(proc.stdout + proc.stderr)[:80]!r}). {hint}"
        )
    applets = _run([str(busybox), "--list"]).split()
    inputs = _digest(
        busybox.read_bytes(), mksh.read_bytes(), " ".join(applets), NSLOOKUP, INIT_CONTAINERFILE
    )
    ref = f"localhost/busybox:{match.group(1)}"
    if built_inputs(ref) == inputs:
        return ref
    with _lock("busybox"):
        if built_inputs(ref) == inputs:
            return ref
        start = time.monotonic()
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
            _podman_build(
                ref, ctx, ctx / "Containerfile", inputs, args=["--timestamp", "0"], log=log
            )
        print(f"[images] built {ref} in {time.monotonic() - start:.1f}s", file=log, flush=True)
    return ref


# --- the trainer image's base: upstream, or a local stand-in ------------------------------------

ROOT = HERE.parent
DOCKERFILE = ROOT / "Dockerfile"
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


def dockerfile_args() -> dict[str, str]:
    """The Dockerfile's ``ARG NAME=default`` defaults, ``${OTHER}`` expanded as docker does."""
    found: dict[str, str] = {}
    for name, value in re.findall(r"^ARG (\w+)=(\S+)$", DOCKERFILE.read_text(), re.M):
        found.setdefault(name, re.sub(r"\$\{(\w+)\}", lambda m: found.get(m[1], ""), value))
    return found


def upstream_base() -> str:
    """The Dockerfile's default ``BASE_IMAGE`` (what Docker users build on)."""
    base = dockerfile_args().get("BASE_IMAGE")
    if not base:
        raise ImageError(
            f"localkube.images: no `ARG BASE_IMAGE=...` default in {DOCKERFILE} (got none). "
            "The stand-in base is named after it."
        )
    return base


def torch_version() -> str:
    """torch's version: pyproject.toml's ``[tool.uv]`` pin, which uv.lock follows (the Dockerfile's
    ``TORCH_VERSION`` default is held to it by tests/test_generated.py)."""
    from .lock import torch_version as locked

    return locked()


def base_image(log=sys.stderr) -> str:
    """Build (if missing or stale) the stand-in base; return ``localhost/torch-base:<torch>``.

    Debian bookworm minbase (mmdebstrap) with a venv at /opt/conda on PATH and torch from the
    :func:`wheelhouse`, fed in as a build volume. Rebuilt only when its inputs change: the
    Containerfile, the pinned requirements, the Debian suite and packages.
    """
    version = torch_version()
    containerfile = BASE_CONTAINERFILE.read_text()
    if not re.search(rf"^torch=={re.escape(version)} ", BASE_REQUIREMENTS.read_text(), re.M):
        raise ImageError(
            f"localkube.images: {BASE_REQUIREMENTS.name} does not pin torch {version} (the "
            "version pyproject.toml names). Run `make lock`."
        )
    mmdebstrap = [
        "mmdebstrap",
        "--variant=minbase",
        f"--include={','.join(DEBIAN_PACKAGES)}",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        DEBIAN_SUITE,
    ]
    inputs = _digest(
        containerfile, version, BASE_REQUIREMENTS.read_bytes(), *mmdebstrap, *DEBIAN_MIRRORS
    )
    ref = f"localhost/torch-base:{version}"
    if built_inputs(ref) == inputs:
        return ref
    with _lock("torch-base"):
        if built_inputs(ref) == inputs:
            return ref
        _require("mmdebstrap", "Install it: `make node-deps` (root, apt).")
        house = wheelhouse(log)
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="ddpjob-base-") as tmp:
            ctx = Path(tmp)
            print(f"[images] {' '.join(mmdebstrap)}", file=log, flush=True)
            _run([*mmdebstrap, str(ctx / "rootfs.tar"), *DEBIAN_MIRRORS], log=log)
            debian_s = time.monotonic() - start
            (ctx / "Containerfile").write_text(containerfile)
            _podman_build(
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
        print(
            f"[images] built {ref} in {time.monotonic() - start:.0f}s "
            f"(Debian root filesystem {debian_s:.0f}s)",
            file=log,
            flush=True,
        )
    return ref


@functools.lru_cache(maxsize=8)
def registry_answers(ref: str, timeout_s: float = 30) -> tuple[bool, str]:
    """Whether ``ref``'s registry serves its manifest now (``skopeo inspect``), and why not;
    asked once per process."""
    _require("skopeo", "Install it: `make node-deps` (root, apt).")
    try:
        proc = subprocess.run(
            ["skopeo", "inspect", "--raw", f"docker://{ref}"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, f"no answer in {timeout_s:.0f}s"
    lines = proc.stderr.strip().splitlines() or [""]
    # skopeo: level=fatal msg="Error parsing image name \"docker://...\": pinging ...: <cause>"
    match = re.search(r'msg="(.*)"', lines[-1])
    why = match.group(1).replace('\\"', '"') if match else lines[-1]
    why = re.sub(r'^Error parsing image name "[^"]*": ', "", why)
    return proc.returncode == 0, why[:300]


def resolve_base(base: str | None = None) -> tuple[str, str]:
    """The base the trainer image is built on with podman, and why.

    1. ``base`` when given (``make image BASE_IMAGE=...``);
    2. else upstream's (the Dockerfile default) when podman's store has it;
    3. else upstream's when its registry answers (podman pulls it);
    4. else the local stand-in (:func:`base_image`, built if missing).

    Returns (reference, reason); a stand-in not built yet is named, not built.
    """
    if base:
        return base, "asked for"
    upstream = f"docker.io/{upstream_base()}"
    if inspect(upstream) is not None:
        return upstream, "in podman's store"
    ok, why = registry_answers(upstream)
    if ok:
        return upstream, "its registry answers"
    return f"localhost/torch-base:{torch_version()}", f"{upstream} cannot be pulled: {why}"


# --- the trainer image ---------------------------------------------------------------------------


def context_files() -> list[Path]:
    """The build context the Dockerfile sees: .dockerignore's whitelist, caches left out."""
    allowed = [
        line[1:].strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    files: list[Path] = []
    for name in allowed:
        path = ROOT / name
        found = sorted(path.rglob("*")) if path.is_dir() else [path]
        files += [
            f
            for f in found
            if f.is_file()
            and "__pycache__" not in f.parts
            and f.suffix != ".pyc"
            and not any(p.endswith(".egg-info") for p in f.parts)
        ]
    return files


def source_digest() -> str:
    """A hash of the build context's files (names and bytes)."""
    files = context_files()
    return _digest(*(str(f.relative_to(ROOT)) for f in files), *(f.read_bytes() for f in files))


def _git_revision() -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() or "unknown"


def _trainer_inputs(base_ref: str) -> str:
    """What the trainer image is built from: context files, Dockerfile, .dockerignore, the base
    (its image ID when podman has it)."""
    base_info = inspect(base_ref)
    return _digest(
        source_digest(),
        DOCKERFILE.read_bytes(),
        (ROOT / ".dockerignore").read_bytes(),
        base_info["Id"] if base_info else base_ref,
    )


def trainer_build_argv(
    ref: str, base: str, *, version: str, revision: str, created: str, inputs: str
) -> list[str]:
    """The ``podman build`` command line for the project Dockerfile."""
    volumes = []
    # pip inside the build reaches PyPI like pip on the host: same trust store (a TLS-
    # intercepting proxy's CA is trusted on the host only) and the same pip.conf (an index).
    for path in ("/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf"):
        if Path(path).is_file():
            volumes += ["--volume", f"{path}:{path}:ro"]
    build_args = {
        "BASE_IMAGE": base,
        "TORCH_VERSION": torch_version(),
        "VERSION": version,
        "REVISION": revision,
        "CREATED": created,
    }
    return [
        "podman",
        "build",
        # No layer cache: buildah 1.28 mishandles RUN --mount=from=<stage> with it (a stale
        # install after a code change, or an empty mount when the stage came from the cache),
        # and caches LABEL steps by their text before ARG substitution. Only the base's layers
        # are reused, as they are; the trainer's own steps become one layer.
        "--layers=false",
        # A failed step's working container would keep what it wrote (see _podman_build).
        "--force-rm",
        "--file",
        str(DOCKERFILE),
        "--tag",
        ref,
        "--label",
        f"{INPUTS_LABEL}={inputs}",
        *(arg for k, v in build_args.items() for arg in ("--build-arg", f"{k}={v}")),
        *volumes,
        str(ROOT),
    ]


def build_trainer(
    ref: str,
    *,
    base: str | None = None,
    version: str = "dev",
    dry_run: bool = False,
    log=sys.stderr,
) -> str:
    """Build the project Dockerfile into ``ref`` with podman (what ``make image`` runs without
    a Docker engine); the base per :func:`resolve_base`. With ``dry_run``, print the command."""
    base_ref, why = resolve_base(base)
    print(f"[images] base {base_ref} ({why})", file=log, flush=True)
    stand_in = base is None and base_ref.startswith("localhost/torch-base:")
    if stand_in and not dry_run:
        base_ref = base_image(log)
    argv = trainer_build_argv(
        ref,
        base_ref,
        version=version,
        revision=_git_revision(),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        inputs=_trainer_inputs(base_ref),
    )
    if dry_run:
        print(f"CONTAINERS_CONF={CONTAINERS_CONF} {shlex.join(argv)}")
        return ref
    start = time.monotonic()
    _run(argv, log=log)
    print(f"[images] built {ref} in {time.monotonic() - start:.0f}s", file=log, flush=True)
    return ref


#: Where the project publishes the trainer image (the Makefile's IMAGE, the examples, the chart).
PUBLISHED_REPOSITORY = "ghcr.io/ddpjob/trainer"


def published_ref() -> str:
    """The name the examples and the chart give the trainer image: the published repository at
    the project's version. The local cluster's node holds this checkout's image under it too (as
    ``kind load`` would), so the examples run as written there."""
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return f"{PUBLISHED_REPOSITORY}:{version}"


def trainer_ref() -> str:
    """The reference :func:`trainer_image` builds, without building anything: what the local
    cluster's objects name (the torch-distributed runtime) before or without the image."""
    checkout = hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]
    return f"localhost/ddpjob-trainer:dev-{checkout}"


def trainer_image(log=sys.stderr) -> str:
    """Build (if missing or stale) the trainer image for the local cluster; return its reference.

    ``localhost/ddpjob-trainer:dev-<checkout>`` (:func:`trainer_ref`): one tag per checkout, so
    worktrees beside each other never run each other's code, and a rebuild replaces the image
    rather than piling up. Stale means: the build context, the Dockerfile or the base image
    changed.
    """
    checkout = hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]
    ref = trainer_ref()
    base_ref, _ = resolve_base()
    with _lock(f"trainer-{checkout}"):
        if base_ref.startswith("localhost/torch-base:"):
            base_ref = base_image(log)
        if built_inputs(ref) == _trainer_inputs(base_ref):
            return ref
        old = inspect(ref)
        build_trainer(ref, base=base_ref, version="dev", log=log)
        _remove_replaced(old, inspect(ref)["Id"])
    return ref


# --- into containerd -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ImportResult:
    """What :func:`import_into_containerd` did."""

    ref: str
    image_id: str
    #: Layers (and their bytes) streamed into containerd; config and manifest not counted.
    layers_sent: int
    bytes_sent: int
    #: Layers containerd already held, left out of the archive.
    layers_reused: int
    bytes_reused: int
    seconds: float

    @property
    def skipped(self) -> bool:
        """True when containerd already had this image ID under ``ref``: nothing was imported."""
        return self.layers_sent == 0 and self.layers_reused == 0


def chain_id(diff_ids: Sequence[str]) -> str:
    """The OCI ChainID of a layer stack: the key of its top snapshot in containerd."""
    chain = diff_ids[0]
    for diff_id in diff_ids[1:]:
        chain = "sha256:" + hashlib.sha256(f"{chain} {diff_id}".encode()).hexdigest()
    return chain


class _Ctr:
    """The few ``ctr`` calls the import needs, against one containerd and namespace."""

    def __init__(self, address: str, namespace: str) -> None:
        self.base = ["ctr", "--address", address, "--namespace", namespace]
        self.address = address

    def run(self, *args: str) -> str:
        return _run(
            [*self.base, *args],
            hint=f"Hint: is containerd serving on {self.address}?",
        )

    def ok(self, *args: str) -> bool:
        proc = subprocess.run([*self.base, *args], capture_output=True, check=False)
        return proc.returncode == 0

    def images(self) -> dict[str, str]:
        """Image name -> target digest."""
        rows = self.run("images", "ls").splitlines()[1:]
        return {f[0]: f[2] for f in (row.split() for row in rows) if len(f) >= 3}

    def manifests(self, digest: str) -> list[dict]:
        """The image manifests under ``digest`` (itself, or an index's children held here)."""
        try:
            doc = json.loads(self.run("content", "get", digest))
        except (ImageError, ValueError):
            return []
        if "manifests" in doc:
            return [m for child in doc["manifests"] for m in self.manifests(child["digest"])]
        return [doc]

    def blobs(self) -> set[str]:
        return set(self.run("content", "ls", "--quiet").split())


def import_into_containerd(
    ref: str, address: str, namespace: str = "k8s.io", *, log=sys.stderr
) -> ImportResult:
    """Make the containerd at ``address`` hold podman's ``ref`` under the same name and ID.

    - ``ref`` there already is this image ID, unpacked: nothing to do.
    - containerd holds some of its layers (the sizes come from the manifests it holds, the
      presence from its content store): only the others are sent.
    - none: skopeo's docker-archive is streamed straight in, with no copy on disk.

    Unpacks into the default snapshotter, so CRI can run it.
    """
    start = time.monotonic()
    for tool in ("ctr", "skopeo"):
        _require(tool, "Install it: `make node-deps` (root, apt).")
    info = inspect(ref)
    if info is None:
        raise ImageError(
            f"localkube.images: no image {ref} in podman's store (got none). "
            "Build it first (pause_image(), init_image(), ...)."
        )
    image_id = "sha256:" + info["Id"]
    diff_ids: list[str] = info["RootFS"]["Layers"]
    ctr = _Ctr(address, namespace)
    targets = ctr.images()
    snapshot = chain_id(diff_ids)
    if ref in targets:
        configs = {m["config"]["digest"] for m in ctr.manifests(targets[ref])}
        if configs == {image_id} and ctr.ok("snapshots", "info", snapshot):
            return ImportResult(ref, image_id, 0, 0, 0, 0, time.monotonic() - start)
    known = {
        layer["digest"]: layer["size"]
        for target in targets.values()
        for manifest in ctr.manifests(target)
        for layer in manifest.get("layers", [])
    }
    held = ctr.blobs()
    reuse = {d: known[d] for d in diff_ids if d in held and d in known}
    # Import under a name of its own, then move ``ref``: replacing ``ref`` first would leave
    # the reused layers' snapshots referenced by nothing while the new image unpacks on top of
    # them, and containerd's GC removes them under it ("parent snapshot ... does not exist").
    staging = f"{ref}-importing-{os.getpid()}"
    try:
        if reuse:
            _import_missing_layers(staging, info["Id"], reuse, ctr)
        else:
            _import_whole(staging, info["Id"], ctr)
        ctr.run("images", "tag", "--force", staging, ref)
    finally:
        ctr.ok("images", "rm", staging)
    manifests = ctr.manifests(ctr.images().get(ref, ""))
    if {m["config"]["digest"] for m in manifests} != {image_id} or not ctr.ok(
        "snapshots", "info", snapshot
    ):
        raise ImageError(
            f"localkube.images: {ref} is not in containerd as imported (got "
            f"{[m['config']['digest'] for m in manifests]}, expected config {image_id} with "
            f"snapshot {snapshot}). Hint: did something delete it meanwhile? Import again."
        )
    sent = [(d, layer["size"]) for d, layer in zip(diff_ids, manifests[0]["layers"], strict=True)]
    result = ImportResult(
        ref,
        image_id,
        layers_sent=len(diff_ids) - len(reuse),
        bytes_sent=sum(size for d, size in sent if d not in reuse),
        layers_reused=len(reuse),
        bytes_reused=sum(reuse.values()),
        seconds=time.monotonic() - start,
    )
    print(
        f"[images] imported {ref} into {address}: {result.layers_sent} layers "
        f"({result.bytes_sent / 2**20:.1f} MiB) sent, {result.layers_reused} "
        f"({result.bytes_reused / 2**20:.1f} MiB) reused, {result.seconds:.1f}s",
        file=log,
        flush=True,
    )
    return result


def _import_whole(name: str, image_id: str, ctr: _Ctr) -> None:
    """Nothing to reuse: stream skopeo's docker-archive straight into ``ctr images import``.

    No temporary copy of the layers on disk. skopeo keeps the config bytes (the image ID) and
    the uncompressed layers (digest = diff ID), so a later import finds them reusable.
    """
    _pipe_into_ctr(
        ["skopeo", "copy", "--quiet", f"containers-storage:{image_id}",
         f"docker-archive:/dev/stdout:{name}"],
        ctr,
        env=podman_env(),
    )  # fmt: skip


def _import_missing_layers(name: str, image_id: str, reuse: dict[str, int], ctr: _Ctr) -> None:
    """skopeo into a temporary OCI layout where the reused layers are sparse placeholders (its
    OCI destination takes an existing blob of that digest as copied, and reads its size for the
    manifest); ``ctr images import`` of that layout without them."""
    with tempfile.TemporaryDirectory(prefix="ddpjob-import-") as tmp:
        layout = Path(tmp)
        blobdir = layout / "blobs" / "sha256"
        blobdir.mkdir(parents=True)
        for digest, size in reuse.items():
            with open(blobdir / digest.removeprefix("sha256:"), "wb") as handle:
                handle.truncate(size)
        _run(
            [
                "skopeo",
                "copy",
                "--quiet",
                "--dest-oci-accept-uncompressed-layers",
                f"containers-storage:{image_id}",
                f"oci:{layout}:{name}",
            ]
        )
        _name_and_check_layout(layout, "sha256:" + image_id)
        send = ["oci-layout", "index.json"] + [
            f"blobs/sha256/{p.name}" for p in blobdir.iterdir() if f"sha256:{p.name}" not in reuse
        ]
        _pipe_into_ctr(
            ["tar", "--create", "--file", "-", "--directory", str(layout), "--", *send], ctr
        )


def _name_and_check_layout(layout: Path, image_id: str) -> None:
    """Check skopeo's OCI layout holds podman's image (config = image ID); name it for containerd.

    The reference goes into both annotations ``ctr images import`` reads, so the image is
    created under exactly that name (not ``import-<date>``).
    """
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text())
    (desc,) = index["manifests"]
    manifest = json.loads((layout / "blobs" / "sha256" / desc["digest"][7:]).read_text())
    if manifest["config"]["digest"] != image_id:
        raise ImageError(
            f"localkube.images: the OCI copy is not podman's image (got config "
            f"{manifest['config']['digest']}, expected {image_id}). Hint: was it rebuilt meanwhile?"
        )
    ref = desc["annotations"]["org.opencontainers.image.ref.name"]
    desc["annotations"]["io.containerd.image.name"] = ref
    index_path.write_text(json.dumps(index))


def _pipe_into_ctr(producer: list[str], ctr: _Ctr, env: dict[str, str] | None = None) -> None:
    """Run ``producer`` (an image archive on stdout) into ``ctr images import -``."""
    source = subprocess.Popen(
        producer, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or os.environ
    )
    assert source.stdout is not None and source.stderr is not None
    proc = subprocess.run(
        [*ctr.base, "images", "import", "-"],
        stdin=source.stdout,
        capture_output=True,
        text=True,
        check=False,
    )
    source.stdout.close()
    source_err = source.stderr.read().decode(errors="replace")
    source_rc = source.wait()
    if proc.returncode != 0 or source_rc != 0:
        raise ImageError(
            f"localkube.images: {Path(producer[0]).name} | ctr images import failed (got exit "
            f"{source_rc} | {proc.returncode}): {(source_err + proc.stderr).strip()[-2000:]}. "
            f"Hint: is containerd serving on {ctr.address}, with room on its disk?"
        )


@contextlib.contextmanager
def scratch_containerd(
    workdir: Path, timeout_s: float = 30, root: Path | None = None
) -> Iterator[str]:
    """A throwaway containerd with its root, state and socket under ``workdir`` (no CRI), for
    tests and benchmarks; yields its address, then stops it and removes ``workdir``'s contents.

    Never the real node's (its root is /var/lib/ddpjob/containerd), except for
    ``node.preload_images``, which gives ``root``: that one is used and kept. Use a namespace
    of your own with ``ctr run``: runc keeps its state in /run/containerd/runc/<namespace> for
    every containerd on the machine.
    """
    _require("containerd", "Install it: `make node-deps` (root, apt).")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config.toml"
    config.write_text(
        "version = 2\n"
        f'root = "{root or workdir / "root"}"\n'
        f'state = "{workdir}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{workdir}/containerd.sock"\n'
        f'[ttrpc]\n  address = "{workdir}/containerd.sock.ttrpc"\n'
        f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{workdir}/opt"\n'
    )
    address = str(workdir / "containerd.sock")
    log_path = workdir / "containerd.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["containerd", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while subprocess.run(
            ["ctr", "--address", address, "version"], capture_output=True, check=False
        ).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ImageError(
                    f"localkube.images: the scratch containerd did not serve on {address} "
                    f"(got: {log_path.read_text()[-600:]!r})."
                )
            time.sleep(0.2)
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for name in ("state", "opt") if root else ("root", "state", "opt"):
            shutil.rmtree(workdir / name, ignore_errors=True)


# --- command line --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m localkube.images COMMAND``; prints the image reference (or the import's JSON).

    Exit 1 when a build or import fails, 2 for bad arguments (argparse).
    """
    parser = argparse.ArgumentParser(prog="python -m localkube.images")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("pause", help="build the pause image (if stale)")
    sub.add_parser("init", help="build the worker init container image (if stale)")
    sub.add_parser("base", help="build the stand-in torch base (if stale)")
    sub.add_parser("wheelhouse", help="fill the stand-in base's wheelhouse (if empty)")
    sub.add_parser("cluster-trainer", help="build the local cluster's trainer image (if stale)")
    trainer = sub.add_parser("trainer", help="build the Dockerfile with podman (make image)")
    trainer.add_argument("--ref", required=True, help="the image reference to tag")
    trainer.add_argument("--version", default="dev", help="the version label")
    trainer.add_argument("--base", default="", help="the base image (default: see resolve_base)")
    trainer.add_argument("--dry-run", action="store_true", help="print the command, build nothing")
    imp = sub.add_parser("import", help="import a podman image into a containerd")
    imp.add_argument("ref")
    imp.add_argument("--address", required=True, help="containerd's socket")
    imp.add_argument("--namespace", default="k8s.io")
    args = parser.parse_args(argv)
    try:
        if args.command == "import":
            result = import_into_containerd(args.ref, args.address, args.namespace)
            print(json.dumps(result.__dict__ | {"skipped": result.skipped}))
        elif args.command == "trainer":
            ref = build_trainer(
                args.ref, base=args.base or None, version=args.version, dry_run=args.dry_run
            )
            if not args.dry_run:
                print(ref)
        elif args.command == "wheelhouse":
            print(wheelhouse())
        else:
            build = {
                "pause": pause_image,
                "init": init_image,
                "base": base_image,
                "cluster-trainer": trainer_image,
            }[args.command]
            print(build())
    except ImageError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
