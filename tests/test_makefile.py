"""The Makefile's front door: `make` alone is `make help`, which lists every target with the
one-line description on its `## ...` comment."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _make(*args: str) -> str:
    if shutil.which("make") is None:
        pytest.fail(
            "test_makefile: needs make, the project's front door (got none on PATH). "
            "Install it: apt-get install make",
            pytrace=False,
        )
    return subprocess.run(
        ["make", "-s", "-C", str(REPO), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def _phony_targets() -> set[str]:
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith(".PHONY:")]
    return set(line.removeprefix(".PHONY:").split())


def test_make_help_lists_every_target_with_its_description():
    listed = dict(line.strip().split(maxsplit=1) for line in _make("help").splitlines())
    assert set(listed) == _phony_targets()
    assert {"generate", "test", "demo", "image", "cluster-up"} <= set(listed)
    for target, description in listed.items():
        assert len(description) > 10, target


def test_make_alone_is_make_help():
    assert _make() == _make("help")
