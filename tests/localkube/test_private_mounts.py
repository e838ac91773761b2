"""A process in a mount namespace of its own (``procs.in_private_mounts``, how the Trainer and
Kueue controllers get the fixed paths they read): no bind hides another bind's source or a folder
the process reads, whatever the order, and the host sees none of it.

The layout is a checkout under the folder a bind covers, as a checkout under /tmp is for the
Trainer controller (its own /tmp and /run both come from that checkout's state). For real, as
root, with ``unshare``; the targets are folders of the test's own, not the host's /tmp and /run.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from localkube import procs

REPO = Path(__file__).resolve().parents[2]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def checkout_under_tmp(tmp_path):
    """``tmp`` (the /tmp a bind covers) holding a checkout whose state holds both bind sources
    and the controller's config; ``run`` (the /run a bind covers)."""
    if os.geteuid() != 0:
        pytest.fail(f"needs root for mount namespaces (got uid {os.geteuid()})")
    tmp, run = tmp_path / "tmp", tmp_path / "run"
    state = tmp / "checkout" / ".cluster"
    for folder, text in (
        (state / "trainer" / "tmp", "its own tmp"),
        (state / "trainer" / "run", "its own run"),
        (run, "the host's run"),
    ):
        folder.mkdir(parents=True)
        (folder / "what").write_text(text)
    (state / "config.yaml").write_text("its config")
    return tmp, run, state


@pytest.mark.parametrize("order", ["tmp first", "run first"])
def test_no_bind_hides_a_source_or_a_kept_folder(checkout_under_tmp, order):
    tmp, run, state = checkout_under_tmp
    binds = [(state / "trainer" / "tmp", tmp), (state / "trainer" / "run", run)]
    if order == "run first":
        binds.reverse()
    before = _tree(tmp.parent)
    shown = f"cat {tmp}/what; echo; cat {run}/what; echo; cat {state}/config.yaml"
    argv = procs.in_private_mounts(binds, [state], ["sh", "-c", shown])
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["its own tmp", "its own run", "its config"]
    # The host sees none of the mounts; what binding the state back needed (its mount point
    # under the new "tmp") was made inside the state, nowhere else.
    assert (run / "what").read_text() == "the host's run"
    made = _tree(tmp.parent) - before
    assert made and all(p.startswith("tmp/checkout/.cluster/trainer/tmp/") for p in made), made


def test_a_bind_that_cannot_be_made_says_which_in_one_line(checkout_under_tmp):
    tmp, _run, state = checkout_under_tmp
    missing = tmp / "no-such-target"
    argv = procs.in_private_mounts([(state, missing)], [], ["true"])
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"localkube: cannot bind {state} over {missing} (No such file or directory) for true"
    )
