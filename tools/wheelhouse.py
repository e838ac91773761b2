"""Wheel files of a view of the lock, for an image's Python: one download per machine, kept in
``~/.cache/ddpjob/wheelhouse/<view>-<hash>``.

The stand-in base image installs torch's (``requirements/torch-base.txt``) from a build volume
(``tools.base.base_image``), and the clean-venv test of ``ddpjob[trainer]`` installs offline from
those and the image view's (``requirements/image.txt``). uv's cache cannot serve them (it keeps
unpacked wheels, not files), and pip's own HTTP cache cannot be relied on: a proxy that strips
Cache-Control leaves it empty.

Standard library only.

    python -m tools.wheelhouse            # fill torch's (if empty); print its path
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from .cache import cache_dir, file_lock, short_digest

HERE = Path(__file__).resolve().parent
#: torch at the locked version and exactly what it pulls in, pinned with hashes: uv.lock's view
#: (tools/lock.py; no numpy: the image build then proves that ddpjob[trainer] declares what
#: the trainer needs).
BASE_REQUIREMENTS = HERE.parent / "requirements" / "torch-base.txt"
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


def wheelhouse(log=sys.stderr, view: Path = BASE_REQUIREMENTS) -> Path:
    """The folder of ``view``'s pinned wheels, filled once (``pip download`` for the image's
    Python, every hash checked).

    Wheels that an older wheelhouse already holds are hard-linked in first (pip checks their
    hashes and skips them), so a change of pins downloads only what changed.
    """
    requirements = view.read_bytes()
    stem = view.stem
    house = cache_dir() / "wheelhouse" / f"{stem}-{short_digest(requirements, *WHEEL_TARGET)}"
    done = house / ".complete"
    if done.exists():
        return house
    with file_lock(cache_dir() / "locks" / f"wheelhouse-{stem}.lock"):
        if done.exists():
            return house
        start = time.monotonic()
        house.mkdir(parents=True, exist_ok=True)
        _link_known_wheels(house, view)
        argv = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "--progress-bar=off",
            "--no-deps",
            "--dest",
            str(house),
            *WHEEL_TARGET,
            "--require-hashes",
            "--requirement",
            str(view),
        ]
        print(f"[images] pip download {view.name}'s wheels into {house}", file=log, flush=True)
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise WheelhouseError(
                f"tools.wheelhouse: pip download failed (got exit {proc.returncode}): "
                f"{proc.stderr.strip()[-1500:]}\nHint: pip needs PyPI (or your index in pip.conf)"
            )
        (house / "requirements.txt").write_bytes(requirements)
        done.write_text(f"{time.monotonic() - start:.1f}\n")
        print(f"[images] wheelhouse {house} in {time.monotonic() - start:.0f}s", file=log)
    return house


def _link_known_wheels(house: Path, view: Path) -> None:
    """Hard-link into ``house`` the pinned wheels that sibling wheelhouses already hold."""
    pins = re.findall(r"^([A-Za-z0-9._-]+)==([^\s;]+)", view.read_text(), re.M)
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


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m tools.wheelhouse", description=__doc__).parse_args(argv)
    try:
        print(wheelhouse())
    except WheelhouseError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
