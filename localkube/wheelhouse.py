"""One torch download per machine: the wheels of torch at the image's version, kept in
``~/.cache/ddpjob/wheelhouse/torch-base-<hash>``.

The stand-in base image installs them (``images.base_image``), ``make venv`` installs them into
``.venv`` first (so the tests run the torch the image ships, and pip fetches the CUDA stack once),
and the clean-venv test of ``ddpjob[trainer]`` finds them here. pip's own HTTP cache cannot do
this on every machine: a proxy that strips Cache-Control leaves it empty.

Standard library only: ``make venv`` runs this before anything else is installed.

    python -m localkube.wheelhouse            # fill it (if empty); print its path
    python -m localkube.wheelhouse --install  # and install torch from it into this Python
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from .procs import cache_dir, file_lock, short_digest

HERE = Path(__file__).resolve().parent
#: torch at the version the Dockerfile asserts and exactly what it pulls in, pinned with hashes
#: (no numpy: the image build then proves that ddpjob[trainer] declares what the trainer needs).
BASE_REQUIREMENTS = HERE / "torch-base.txt"
#: The wheels' target: bookworm's CPython 3.11 on glibc 2.36, x86_64 (the stand-in base's Python).
WHEEL_TARGET = (
    "--only-binary=:all:",
    "--python-version=3.11",
    "--implementation=cp",
    "--abi=cp311",
    *(f"--platform=manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)),
    "--platform=manylinux2014_x86_64",
)


class WheelhouseError(RuntimeError):
    """pip could not fill or install from the wheelhouse."""


def wheelhouse(log=sys.stderr) -> Path:
    """The folder of the pinned wheels, filled once (``pip download`` for the image's Python).

    Wheels that an older wheelhouse already holds are hard-linked in first (pip checks their
    hashes and skips them), so a change of pins downloads only what changed.
    """
    requirements = BASE_REQUIREMENTS.read_bytes()
    house = cache_dir() / "wheelhouse" / f"torch-base-{short_digest(requirements, *WHEEL_TARGET)}"
    done = house / ".complete"
    if done.exists():
        return house
    with file_lock(cache_dir() / "locks" / "image-wheelhouse.lock"):
        if done.exists():
            return house
        start = time.monotonic()
        house.mkdir(parents=True, exist_ok=True)
        _link_known_wheels(house)
        argv = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "--progress-bar=off",
            "--dest",
            str(house),
            *WHEEL_TARGET,
            "--require-hashes",
            "--requirement",
            str(BASE_REQUIREMENTS),
        ]
        print(f"[images] pip download torch's wheels into {house}", file=log, flush=True)
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise WheelhouseError(
                f"localkube.wheelhouse: pip download failed (got exit {proc.returncode}): "
                f"{proc.stderr.strip()[-1500:]}\nHint: pip needs PyPI (or your index in pip.conf)"
            )
        (house / "requirements.txt").write_bytes(requirements)
        done.write_text(f"{time.monotonic() - start:.1f}\n")
        print(f"[images] wheelhouse {house} in {time.monotonic() - start:.0f}s", file=log)
    return house


def _link_known_wheels(house: Path) -> None:
    """Hard-link into ``house`` the pinned wheels that sibling wheelhouses already hold."""
    pins = re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", BASE_REQUIREMENTS.read_text(), re.M)
    prefixes = tuple(f"{re.sub(r'[-_.]+', '_', n).lower()}-{v}-" for n, v in pins)
    for wheel in house.parent.glob("*/*.whl"):
        target = house / wheel.name
        if (
            wheel.parent != house
            and wheel.name.lower().startswith(prefixes)
            and not target.exists()
        ):
            with contextlib.suppress(OSError):
                os.link(wheel, target)


def matches_this_python() -> bool:
    """The wheels fit the running interpreter (CPython 3.11 on Linux x86_64)."""
    return (
        sys.implementation.name == "cpython"
        and sys.version_info[:2] == (3, 11)
        and sys.platform == "linux"
        and platform.machine() == "x86_64"
    )


def install(log=sys.stderr) -> bool:
    """Install the pinned torch into this interpreter's environment from the wheelhouse
    (offline, hashes checked). False, with a note, where the wheels do not fit this Python:
    pip then gets torch from the index like any other dependency."""
    if not matches_this_python():
        print(
            "[images] the wheelhouse holds CPython 3.11 x86_64 wheels (got "
            f"{platform.python_version()} {platform.machine()}): torch comes from the index "
            "instead",
            file=log,
        )
        return False
    house = wheelhouse(log)
    argv = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--no-index",
        "--find-links",
        str(house),
        "--require-hashes",
        "--requirement",
        str(BASE_REQUIREMENTS),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise WheelhouseError(
            f"localkube.wheelhouse: pip install from {house} failed (got exit "
            f"{proc.returncode}): {proc.stderr.strip()[-1500:]}"
        )
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localkube.wheelhouse", description=__doc__)
    parser.add_argument(
        "--install", action="store_true", help="also install torch from it into this Python"
    )
    args = parser.parse_args(argv)
    try:
        if args.install:
            install()
        print(wheelhouse())
    except WheelhouseError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
