"""Running a test's Python script in namespaces of its own (``unshare``): the machine's network,
mounts and ports stay untouched, and nothing else on the machine (the cluster the e2e tests run
beside the offline ones) shares the test's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_unshared(flags: list[str], script: str, *args: str) -> str:
    """Run the Python ``script`` (with ``args``) from the repository under ``unshare`` with
    ``flags``; assert it exited 0 (its stderr's tail if not) and return its stdout."""
    proc = subprocess.run(
        ["unshare", *flags, sys.executable, "-c", script, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout
