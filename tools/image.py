"""The trainer image built from the project's Dockerfile with podman: what ``make image`` runs
where no Docker daemon answers.

    python -m tools.image trainer --ref IMAGE:TAG [--version V] [--base REF] [--dry-run]
    python -m tools.image base          # the local stand-in base (tools/base.py), if stale
    python -m tools.image wheelhouse    # fill the stand-in base's wheelhouse, if empty

The base is upstream's when podman has it or its registry answers, else the local stand-in
(:func:`resolve_base`). podman runs with ``tools/containers.conf``, pip inside the build with the
host's trust store and pip.conf. docs/image.md has the why: the base rule, buildah's cache bugs.
"""

from __future__ import annotations

import argparse
import functools
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from .base import base_image, base_ref
from .cache import short_digest
from .lock import LockError, torch_version
from .podman import CONTAINERS_CONF, INPUTS_LABEL, ImageError, inspect, require, run
from .wheelhouse import WheelhouseError, wheelhouse

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


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
            f"images: no `ARG BASE_IMAGE=...` default in {DOCKERFILE} (got none). "
            "The stand-in base is named after it."
        )
    return base


@functools.lru_cache(maxsize=8)
def registry_answers(ref: str, timeout_s: float = 30) -> tuple[bool, str]:
    """Whether ``ref``'s registry serves its manifest now (``skopeo inspect``), and why not;
    asked once per process."""
    require("skopeo", "Install it: `make node-deps` (root, apt).")
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
    4. else the local stand-in (:func:`tools.base.base_image`, built if missing).

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
    return base_ref(), f"{upstream} cannot be pulled: {why}"


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
    return short_digest(
        *(str(f.relative_to(ROOT)) for f in files), *(f.read_bytes() for f in files)
    )


def trainer_inputs(base: str) -> str:
    """What the trainer image is built from: context files, Dockerfile, .dockerignore, the base
    (its image ID when podman has it)."""
    base_info = inspect(base)
    return short_digest(
        source_digest(),
        DOCKERFILE.read_bytes(),
        (ROOT / ".dockerignore").read_bytes(),
        base_info["Id"] if base_info else base,
    )


def _git_revision() -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() or "unknown"


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
        # A failed step's working container would keep what it wrote (see podman.podman_build).
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
    base_chosen, why = resolve_base(base)
    print(f"[images] base {base_chosen} ({why})", file=log, flush=True)
    if base is None and base_chosen == base_ref() and not dry_run:
        base_chosen = base_image(log)
    argv = trainer_build_argv(
        ref,
        base_chosen,
        version=version,
        revision=_git_revision(),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        inputs=trainer_inputs(base_chosen),
    )
    if dry_run:
        print(f"CONTAINERS_CONF={CONTAINERS_CONF} {shlex.join(argv)}")
        return ref
    run(argv, log=log)
    return ref


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.image COMMAND``; prints the image reference (or the wheelhouse's path).

    Exit 1 when a build fails, 2 for bad arguments (argparse).
    """
    parser = argparse.ArgumentParser(prog="python -m tools.image")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("base", help="build the stand-in torch base (if stale)")
    sub.add_parser("wheelhouse", help="fill the stand-in base's wheelhouse (if empty)")
    trainer = sub.add_parser("trainer", help="build the Dockerfile with podman (make image)")
    trainer.add_argument("--ref", required=True, help="the image reference to tag")
    trainer.add_argument("--version", default="dev", help="the version label")
    trainer.add_argument("--base", default="", help="the base image (default: see resolve_base)")
    trainer.add_argument("--dry-run", action="store_true", help="print the command, build nothing")
    args = parser.parse_args(argv)
    try:
        if args.command == "trainer":
            start = time.monotonic()
            ref = build_trainer(
                args.ref, base=args.base or None, version=args.version, dry_run=args.dry_run
            )
            if not args.dry_run:
                print(f"[images] built {ref} in {time.monotonic() - start:.0f}s", file=sys.stderr)
                print(ref)
        elif args.command == "wheelhouse":
            print(wheelhouse())
        else:
            print(base_image())
    except (ImageError, WheelhouseError, LockError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
