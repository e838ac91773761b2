"""Every generated file is what `make generate` writes now (controller/generate.py), and the lock
is what `make lock` would write (tools/lock.py).

The generator runs into a temporary folder and each file it makes is compared with the checked-in
one, so a file added to the generator later is covered too. The other way round: every file in
the checkout that carries the generated mark is one the generator still makes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from controller import generate
from tools import base, image, lock

REPO = Path(__file__).resolve().parents[1]
FIX = "run `make generate` and review the diff"
# Folders that hold no sources (.gitignore's, and dot folders such as .git and .venv).
NOT_SOURCES = {"__pycache__", "runs", "checkpoints", "build", "dist"}


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("generated")
    assert generate.main(["--out", str(out)]) == 0
    return out


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_the_generator_makes_each_kind_of_file(generated):
    made = _files(generated)
    for expected in (
        "controller/spec.schema.json",
        "charts/ddpjob/values.schema.json",
        "charts/ddpjob/ci/quickstart-values.yaml",
        "k8s/pytorchjob.yaml",
        "tests/controller/golden/quickstart.yaml",
    ):
        assert expected in made, (expected, made)


def test_every_generated_file_is_current(generated):
    stale = [
        rel
        for rel in _files(generated)
        if not (REPO / rel).is_file() or (REPO / rel).read_text() != (generated / rel).read_text()
    ]
    assert not stale, f"stale generated files: {stale}; {FIX}"


def test_every_file_marked_generated_is_still_generated(generated):
    marked = []
    for folder, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in NOT_SOURCES]
        for name in files:
            path = Path(folder, name)
            with path.open("rb") as f:
                head = f.read(200).decode("utf-8", errors="replace")
            if generate.is_generated(head):
                marked.append(path.relative_to(REPO).as_posix())
    orphans = sorted(set(marked) - set(_files(generated)))
    assert not orphans, f"marked as generated but no longer made: {orphans}; {FIX}"
    # Every generated file carries the mark (so the check above can find it).
    assert sorted(marked) == _files(generated)


def test_the_mark_is_on_top_of_every_file(generated):
    assert "make generate" in generate.MARK
    for rel in _files(generated):
        first = (generated / rel).read_text().splitlines()[:2]
        assert generate.MARK in " ".join(first), rel


def test_generate_removes_a_marked_file_it_no_longer_makes(tmp_path):
    files = {"a/one.yaml": f"# {generate.MARK}\nx: 1\n"}
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "old.yaml").write_text(f"# {generate.MARK}\nx: 0\n")
    (tmp_path / "a" / "mine.yaml").write_text("# written by hand\nx: 2\n")
    written, removed = generate.write(files, tmp_path)
    assert (written, removed) == (["a/one.yaml"], ["a/old.yaml"])
    assert _files(tmp_path) == ["a/mine.yaml", "a/one.yaml"]
    assert generate.write(files, tmp_path) == ([], [])  # nothing to do the second time


# ------------------------------------------------------------------ the lock (make lock)


def test_the_lock_matches_pyproject():
    """uv.lock still satisfies pyproject.toml (`uv lock --check --offline`: no registry asked)."""
    try:
        lock.check_lock()
    except lock.LockError as exc:
        pytest.fail(f"{exc}; run `make lock` and review the diff", pytrace=False)


def test_every_view_of_the_lock_is_current(tmp_path):
    lock.write_views(tmp_path)
    stale = [
        rel
        for rel in lock.VIEWS
        if not (REPO / rel).is_file() or (REPO / rel).read_text() != (tmp_path / rel).read_text()
    ]
    assert not stale, f"stale views of uv.lock: {stale}; run `make lock` and review the diff"


def test_a_changed_requirement_makes_the_lock_stale(tmp_path):
    """The check bites: a copy of the project with one more dependency fails it, saying the lock
    needs updating. uv re-resolves to say so, and on a machine whose uv cache holds only what
    `uv sync` installed (a fresh machine) an offline resolution cannot finish and fails for that
    instead; so this one asks the registry. What it serves does not matter: any `six`
    makes the lock stale."""
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        (tmp_path / name).write_bytes((REPO / name).read_bytes())
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"PyYAML>=6,<7",', '"PyYAML>=6,<7", "six",'))
    proc = lock.run_uv("lock", "--check", cwd=tmp_path)
    assert proc.returncode != 0
    assert "update" in proc.stderr.lower() or "lockfile" in proc.stderr.lower(), proc.stderr


def test_torch_is_named_once_and_the_rest_follow():
    """pyproject.toml's [tool.uv] pin is torch's version; the lock, the views, the Dockerfile's
    default and the stand-in base follow it."""
    version = lock.torch_version()
    assert lock.pinned("requirements/torch-base.txt")["torch"] == [version]
    assert image.dockerfile_args()["TORCH_VERSION"] == version
    assert image.upstream_base().startswith(f"pytorch/pytorch:{version}-cuda")
    assert version not in base.BASE_CONTAINERFILE.read_text()
    fix = "pin it in pyproject.toml's [tool.uv] only, then `make lock`"
    for doc in ("docs/image.md", "README.md"):
        text = (REPO / doc).read_text()
        others = set(re.findall(r"\btorch[ =]=?(2\.\d+\.\d+)\b", text)) - {version}
        assert not others, f"{doc} names torch {others}, not {version}; {fix}"
