"""Running podman, buildah and skopeo on these machines, and building an image once.

podman runs with ``tools/containers.conf`` (runc, no default ulimits: see that file). Every image
the project builds here goes through :func:`build_once`: its inputs are hashed into the label
``io.ddpjob.inputs``, so a second call with the same inputs builds nothing (under another tag, as
another checkout's trainer image, it tags the image it finds), and a rebuild removes the image it
took the tag from.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from .cache import cache_dir, file_lock

HERE = Path(__file__).resolve().parent
#: podman/buildah settings this machine needs (runc; no default ulimits).
CONTAINERS_CONF = HERE / "containers.conf"
#: Label holding the hash of everything an image was built from.
INPUTS_LABEL = "io.ddpjob.inputs"


class ImageError(RuntimeError):
    """An image could not be built, found or imported."""


def podman_env() -> dict[str, str]:
    """The environment for podman/buildah/skopeo: ours plus ``CONTAINERS_CONF``."""
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def require(tool: str, hint: str) -> str:
    """The path of ``tool`` on PATH; :class:`ImageError` naming it and ``hint`` if missing."""
    path = shutil.which(tool)
    if path is None:
        raise ImageError(f"images: {tool} is missing (got no `{tool}` on PATH). {hint}")
    return path


def run(
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
        f"images: {Path(argv[0]).name} {' '.join(argv[1:3])} failed "
        f"(got exit {proc.returncode}):\n{tail.rstrip()}\n{hint}".rstrip()
    )


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


def built_from(inputs: str) -> list[str]:
    """The IDs of the images in podman's store labelled with ``inputs``, newest first."""
    proc = subprocess.run(
        ["podman", "images", "--quiet", "--no-trunc", "--filter", f"label={INPUTS_LABEL}={inputs}"],
        env=podman_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    return list(dict.fromkeys(proc.stdout.split())) if proc.returncode == 0 else []


def build_once(ref: str, inputs: str, build: Callable[[], None], *, log) -> str:
    """``ref`` as built from ``inputs``: nothing to do when podman's copy carries that inputs
    label; else ``ref`` tagged onto an image of the same inputs (another checkout's, under its
    own tag), or ``build()`` (which must tag ``ref`` with the label) when there is none. Either
    under a lock of the image's own, so two processes never build it at once. The image ``ref``
    was taken from is removed. Returns ``ref``."""
    if built_inputs(ref) == inputs:
        return ref
    with file_lock(cache_dir() / "locks" / f"image-{ref.replace('/', '_')}.lock"):
        if built_inputs(ref) == inputs:
            return ref
        old = inspect(ref)
        for same in built_from(inputs):
            tagged = subprocess.run(
                ["podman", "tag", same, ref], env=podman_env(), capture_output=True, check=False
            )
            if tagged.returncode == 0 and built_inputs(ref) == inputs:  # not removed meanwhile
                remove_replaced(old, same)
                short = same.removeprefix("sha256:")[:12]
                print(f"[images] tagged {ref}: {short}, built from the same inputs", file=log)
                return ref
        start = time.monotonic()
        build()
        new = inspect(ref)
        got = ((new or {}).get("Labels") or {}).get(INPUTS_LABEL)
        if got != inputs:
            raise ImageError(
                f"images: the build of {ref} did not label it {INPUTS_LABEL}={inputs} (got "
                f"{got!r}). The recipe must pass the inputs to podman build's --label."
            )
        remove_replaced(old, new["Id"])
        print(f"[images] built {ref} in {time.monotonic() - start:.0f}s", file=log, flush=True)
    return ref


def podman_build(
    ref: str,
    context: Path,
    containerfile: Path,
    inputs: str,
    *,
    args: Sequence[str] = (),
    log,
) -> None:
    """``podman build`` ``context`` into ``ref`` labelled with ``inputs``."""
    require("podman", "Install podman and buildah: `make node-deps` (root, apt).")
    with tempfile.TemporaryDirectory(prefix="ddpjob-iid-") as tmp:
        argv = [
            "podman",
            "build",
            "--file",
            str(containerfile),
            "--label",
            f"{INPUTS_LABEL}={inputs}",
            "--iidfile",
            str(Path(tmp) / "iid"),
            "--tag",
            ref,
            # A failed step's working container holds what it wrote (the stand-in base's: the
            # whole torch install, gigabytes): remove it as a successful build does.
            "--force-rm",
            *args,
            str(context),
        ]
        run(argv, log=log)


def remove_replaced(old: dict | None, new_id: str) -> None:
    """Remove the image a rebuild took the tag from, unless something still uses it (podman
    refuses then, and we carry on): no dangling 7 GB images after each rebuild."""
    if old and old["Id"] != new_id:
        subprocess.run(
            ["podman", "rmi", old["Id"]], env=podman_env(), capture_output=True, check=False
        )
