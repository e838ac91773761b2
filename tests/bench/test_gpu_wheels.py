"""requirements/gpu-wheels.txt: the wheels a lent GPU machine lacks, a view of uv.lock.

The GPU machines' image (the device tool's KINDS.md, package list read 2026-11-17) holds torch,
PyYAML, nvidia-ml-py, tqdm, numpy, packaging and typing-extensions, and not pydantic, boto3 nor
prometheus-client. The trainer's dependencies must each be on that image or in the wheel list,
and the wheels' own requirements too, or the GPU run stops at an import. The list is exported
from the lock (the `gpu-wheels` group), so the GPU runs the versions the tests run.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

from tools.lock import pinned

REPO = Path(__file__).resolve().parents[2]
VIEW = "requirements/gpu-wheels.txt"
ON_THE_IMAGE = {"torch", "pyyaml", "nvidia-ml-py", "tqdm", "numpy", "packaging"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_pins_are_the_versions_the_tests_run() -> None:
    pins = pinned(VIEW)
    assert "pydantic" in pins and "typing-extensions" in pins
    for name, versions in pins.items():
        assert versions == [importlib.metadata.version(name)], name


def test_the_trainer_and_the_wheels_need_nothing_else() -> None:
    wheels = set(pinned(VIEW))
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    needed = [*project["dependencies"], *project["optional-dependencies"]["trainer"]]
    for name in wheels:
        needed += importlib.metadata.distribution(name).requires or []
    covered = wheels | ON_THE_IMAGE
    for line in needed:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's or another platform's requirement
        assert _norm(req.name) in covered, f"{line}: neither on the GPU image nor a wheel"


def test_make_gpu_wheels_downloads_the_view_with_its_hashes() -> None:
    """The Makefile's recipe reads the view and checks hashes (no resolution on the day)."""
    recipe = subprocess.run(
        ["make", "-n", "-C", str(REPO), "gpu-wheels"], capture_output=True, text=True, check=True
    ).stdout
    assert f"--require-hashes -d .whl -r {VIEW}" in " ".join(recipe.replace("\\\n", " ").split())


def test_the_wheel_folder_is_ignored_by_git() -> None:
    """.whl/ travels to the device only as a carried path, never in a commit."""
    p = subprocess.run(
        ["git", "check-ignore", "-q", ".whl/pydantic-2-py3-none-any.whl"], cwd=REPO, check=False
    )
    assert p.returncode == 0
