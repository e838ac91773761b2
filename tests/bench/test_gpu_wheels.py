"""bench/gpu/wheels.txt: the wheels a lent GPU machine lacks, pinned to what the tests run.

The GPU machines' image (the device tool's KINDS.md, package list read 2026-11-17) holds torch,
PyYAML, nvidia-ml-py, tqdm, numpy, packaging and typing-extensions, and not pydantic. The
trainer's dependencies must each be on that image or in the wheel list, and the wheels' own
requirements too, or the GPU run stops at an import.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
ON_THE_IMAGE = {"torch", "pyyaml", "nvidia-ml-py", "tqdm", "numpy", "packaging"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> tuple[dict[str, str], dict[str, str]]:
    """(always, if-older): name -> pinned version."""
    always, if_older = {}, {}
    for line in (REPO / "bench" / "gpu" / "wheels.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        spec, _, comment = line.partition("#")
        name, version = spec.strip().split("==")
        (if_older if "if-older" in comment else always)[_norm(name)] = version
    return always, if_older


def test_pins_are_the_versions_the_tests_run() -> None:
    always, if_older = _pins()
    assert "pydantic" in always
    for name, version in (always | if_older).items():
        assert importlib.metadata.version(name) == version, name


def test_the_trainer_and_the_wheels_need_nothing_else() -> None:
    always, if_older = _pins()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    needed = [*project["dependencies"], *project["optional-dependencies"]["trainer"]]
    for name in always:
        needed += importlib.metadata.distribution(name).requires or []
    covered = set(always) | set(if_older) | ON_THE_IMAGE
    for line in needed:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's or another platform's requirement
        assert _norm(req.name) in covered, f"{line}: neither on the GPU image nor a wheel"


def test_the_wheel_folder_is_ignored_by_git() -> None:
    """.whl/ travels to the device only as a carried path, never in a commit."""
    p = subprocess.run(
        ["git", "check-ignore", "-q", ".whl/pydantic-2-py3-none-any.whl"], cwd=REPO, check=False
    )
    assert p.returncode == 0
