"""The lock and its views: what ``make lock`` writes, and the offline check that they are current.

``uv.lock`` (uv's own lock, made by ``uv lock`` from pyproject.toml) pins everything any install
of this project uses, with hashes: the venv with every extra (``uv sync --frozen``), the image's
packages and the GPU machines' wheels. Installs that cannot read uv.lock (pip inside an image
build, ``pip download`` for another Python) read a requirements file exported from it, never
edited by hand (:data:`VIEWS`). Exporting is offline (``uv export --frozen``), so the test that
holds the views to the lock (``tests/test_generated.py``) needs no registry.

    python -m tools.lock            # uv lock (keeps the pins that still fit), then the views
    python -m tools.lock --upgrade  # re-resolve every pin to the newest that fits the ranges

pyproject.toml keeps the ranges users get from ``pip install ddpjob``; ``[tool.uv]`` names torch's
version (the one place) and the environments the lock covers.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "uv.lock"

#: Each exported view: its path in the repo -> ``uv export`` selection. ``--no-emit-project``:
#: the project itself is installed from its own wheel or checkout, never from a registry.
VIEWS: dict[str, tuple[str, ...]] = {
    # uv itself, for the bootstrap: `make venv` pip-installs it with its hash, then uv syncs.
    "requirements/uv.txt": ("--only-group", "uv"),
    # torch and exactly what it pulls in: the stand-in base image (tools/base.py) and the
    # wheelhouse its build reads. numpy is not among them: the image build then proves that
    # ddpjob[trainer] declares what the trainer needs.
    "requirements/torch-base.txt": ("--only-group", "torch-base"),
    # ddpjob[trainer] but torch: what the Dockerfile installs on top of a base that has torch.
    "requirements/image.txt": ("--extra", "trainer", "--prune", "torch"),
    # What a lent GPU machine's image lacks (make gpu-wheels, bench/gpu/env.sh, docs/gpu.md).
    "requirements/gpu-wheels.txt": ("--only-group", "gpu-wheels"),
}

#: uv must never fetch a Python of its own: the lock covers the interpreters already here.
UV_ENV = {"UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}


class LockError(RuntimeError):
    """uv is missing or failed; the message says which command and why."""


def uv_binary() -> str:
    """The uv next to this interpreter (the venv's, installed from requirements/uv.txt), else
    one on PATH."""
    here = Path(sys.executable).with_name("uv")
    found = str(here) if here.exists() else shutil.which("uv")
    if not found:
        raise LockError(
            "tools.lock: uv not found (got none beside python or on PATH). Run `make venv`."
        )
    return found


def run_uv(*args: str, cwd: Path = REPO, capture: bool = True) -> subprocess.CompletedProcess:
    """``uv ARGS`` in ``cwd`` (the project), never raising on its exit code."""
    env = {**os.environ, **UV_ENV}
    return subprocess.run(
        [uv_binary(), *args], cwd=cwd, env=env, capture_output=capture, text=True, check=False
    )


def _uv(*args: str, capture: bool = True) -> str:
    proc = run_uv(*args, capture=capture)
    if proc.returncode != 0:
        detail = (proc.stderr or "").strip().splitlines()[-3:] if capture else []
        raise LockError(f"tools.lock: `uv {' '.join(args)}` failed: {' / '.join(detail)}")
    return proc.stdout if capture else ""


def export(selection: tuple[str, ...]) -> str:
    """One view of uv.lock as a hashed requirements file (offline: ``--frozen``)."""
    fmt = ("--format", "requirements-txt")
    return _uv("export", "--frozen", "--no-emit-project", *fmt, *selection)


def write_views(root: Path = REPO) -> list[Path]:
    """Write every view under ``root``; return their paths."""
    written = []
    for rel, selection in VIEWS.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(export(selection))
        written.append(path)
    return written


def check_lock() -> None:
    """Raise LockError when uv.lock no longer matches pyproject.toml. Offline: when nothing
    changed, uv checks the lock against the requirements without resolving; when they changed,
    it resolves from its cache, and on a fresh machine (whose cache holds only what was
    installed) it fails saying the network is disabled. Either way: `make lock`."""
    _uv("lock", "--check", "--offline")


def pinned(view: str) -> dict[str, list[str]]:
    """A view's pins: normalized name -> its versions (a package may have one per Python)."""
    pins: dict[str, list[str]] = {}
    text = (REPO / view).read_text()
    for name, version in re.findall(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)", text, re.M):
        pins.setdefault(re.sub(r"[-_.]+", "-", name).lower(), []).append(version)
    return pins


def torch_version() -> str:
    """torch's version, as pyproject.toml's ``[tool.uv]`` names it (and uv.lock pins it)."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    (pin,) = [c for c in project["tool"]["uv"]["constraint-dependencies"] if c.startswith("torch")]
    return pin.split("==", 1)[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.lock", description=__doc__)
    parser.add_argument(
        "--upgrade", action="store_true", help="re-resolve every pin, not only what changed"
    )
    args = parser.parse_args(argv)
    try:
        _uv("lock", *(["--upgrade"] if args.upgrade else []), capture=False)
        for path in write_views():
            print(f"[lock] {path.relative_to(REPO)}")
    except LockError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
