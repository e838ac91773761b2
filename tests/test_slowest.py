"""The order ``make test`` runs the cluster phase in: the tests ``tests/slowest.json`` names
first, longest first (``tests/conftest.py``), each naming a test that exists."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import SLOWEST

REPO = Path(__file__).resolve().parents[1]


def test_the_slowest_tests_are_collected_first_longest_first():
    files = sorted({nodeid.split("::")[0] for nodeid in SLOWEST})
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    missing = [nodeid for nodeid in SLOWEST if nodeid not in collected]
    assert not missing, f"tests/slowest.json names tests that do not exist: {missing}"
    first = collected[: len(SLOWEST)]
    assert first == list(SLOWEST), first
    seconds = list(SLOWEST.values())
    assert seconds == sorted(seconds, reverse=True), seconds
    assert len(collected) > len(SLOWEST)  # the files' other tests follow
