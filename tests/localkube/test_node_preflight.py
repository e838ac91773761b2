"""Where the real node cannot run, `python -m localkube up` stops at once with one line that says
why and how to fix it, before building or starting anything.

Each test runs `up` from a scratch copy of the package (its own state folder and cache), so the
cluster of this checkout is not touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def scratch_repo():
    """A copy of localkube/, tools/ and controller/ with a cache folder of its own."""
    root = Path(tempfile.mkdtemp(prefix="ddpjob-preflight-"))
    for package in ("localkube", "tools", "controller"):
        shutil.copytree(
            REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "go")
        )
    (root / "cache").mkdir()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _up(repo: Path, prefix: list[str], **env: str) -> tuple[subprocess.CompletedProcess, float]:
    environ = {**os.environ, "XDG_CACHE_HOME": str(repo / "cache"), **env}
    environ.pop("DDPJOB_NODE", None)
    start = time.monotonic()
    proc = subprocess.run(
        [*prefix, sys.executable, "-m", "localkube", "up"],
        cwd=repo,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return proc, time.monotonic() - start


def _one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr  # no traceback
    return lines[0]


def test_up_without_root_fails_in_one_line(scratch_repo):
    """Not root: a user namespace without a root mapping (euid 65534, like `nobody`)."""
    prefix = ["unshare", "--user"] if os.geteuid() == 0 else []
    proc, seconds = _up(scratch_repo, prefix)
    line = _one_line(proc)
    assert line.startswith("localkube node: the kubelet and containerd need root (got uid ")
    assert "sudo make cluster-up" in line and "DDPJOB_NODE=off" in line
    assert seconds < 20  # before any build
    assert not (scratch_repo / ".cluster").exists()


def test_up_with_missing_packages_names_them_and_the_fix(scratch_repo):
    """No containerd, runc, iptables, ... on PATH (an empty one)."""
    empty = scratch_repo / "empty-bin"
    empty.mkdir()
    proc, seconds = _up(scratch_repo, [], PATH=str(empty))
    line = _one_line(proc)
    assert line.startswith("localkube node: missing packages (got no ")
    for package in ("containerd", "runc", "iptables", "podman"):
        assert package in line, line
    assert "no apt-get here" in line  # the hint fits the machine: no apt-get on this PATH
    assert seconds < 20


@pytest.mark.cluster
def test_a_second_checkout_is_refused_while_this_ones_node_runs(cluster, scratch_repo):
    """One node per machine: another checkout's `up` names the cluster that holds it."""
    from localkube.node import host

    record = host.read_record()
    assert record is not None and record["owner"] == str(REPO), record
    proc, seconds = _up(scratch_repo, [])
    line = _one_line(proc)
    assert line.startswith(f"localkube node: this machine's node belongs to the cluster of {REPO} ")
    assert "make cluster-down" in line and "DDPJOB_NODE=off" in line
    assert host.read_record()["owner"] == str(REPO)  # untouched
    assert seconds < 20
